"""What ``ordq status`` sees of any cluster, local or deployed by hand (issue 42: it knew only
clusters started by ``ordq up``): the processes registered in ZooKeeper, each asked live.

- ZooKeeper: every server of the connection string, by ``srvr`` (its mode and version).
- Brokers: every registered group's master and slave, by their liveness nodes (the address)
  and their ``Health`` RPC (health and version). A role without a liveness node is down.
- Coordinators: the contenders of the coordinator election, by their identifiers
  (``host-pid@metrics-url@service-address``, ordq/commands/coordinator.py) and their /health
  page (leader or standby, version).

Rules: read-only; every question is bounded by a short timeout, so a hung process shows as
"no answer" instead of stalling the status. Nothing here knows of a local cluster's folder.
"""

from __future__ import annotations

from typing import Any

import attrs

from ordq.cluster_health import ROLES, ProcessStatus, broker_status, coordinator_health, no_leader_unhealthy
from ordq.common.errors import OrdqError
from ordq.common.security import Credentials
from ordq.zk_server import four_letter_word

ZK_SERVING = ("standalone", "leader", "follower")


@attrs.frozen
class Contender:
    """One coordinator in the election, from its identifier."""

    name: str  # host-pid
    address: str  # where its service answers ("" when the identifier names none)
    metrics_url: str | None  # its /metrics URL (None: it serves no metrics, or predates issue 42)

    @classmethod
    def parse(cls, identifier: str) -> Contender:
        """``host-pid[@metrics-url]@address`` (the address after the last '@', as clients read it;
        the name before the first)."""
        head, at, address = identifier.rpartition("@")
        if not at:
            head, address = identifier, ""
        name, _, url = head.partition("@")
        return cls(name=name, address=address, metrics_url=url.strip() or None)


def zk_servers(hosts: str) -> list[tuple[str, int]]:
    """The (host, port) of each server of a connection string (a chroot suffix dropped)."""
    out = []
    for part in hosts.split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if port.isdigit():
            out.append((host or "127.0.0.1", int(port)))
    return out


def parse_srvr(answer: str) -> tuple[str | None, str]:
    """(mode, version) from a ``srvr`` answer; mode None when the server does not serve."""
    mode, version = None, ""
    for line in answer.splitlines():
        key, _, value = line.partition(":")
        if key == "Mode":
            mode = value.strip()
        elif key == "Zookeeper version":
            version = value.strip().split("-", 1)[0].split(",", 1)[0]
    return mode, version


def zk_status(hosts: str, credentials: Credentials, *, timeout_s: float = 1.0) -> list[ProcessStatus]:
    tls = credentials if credentials.zk_tls else None
    out = []
    for i, (host, port) in enumerate(zk_servers(hosts), start=1):
        try:
            mode, version = parse_srvr(four_letter_word(port, tls=tls, host=host, timeout_s=timeout_s))
        except OSError as exc:
            out.append(ProcessStatus(name=f"zk{i}", kind="zookeeper", pid=None, listen=f"{host}:{port}",
                                     state="no answer", healthy=False, detail=exc.strerror or type(exc).__name__))
            continue
        out.append(ProcessStatus(name=f"zk{i}", kind="zookeeper", pid=None, listen=f"{host}:{port}",
                                 state=mode or "not serving", healthy=mode in ZK_SERVING, version=version))
    return out


def contenders(client: Any, path: str, *, timeout_s: float = 2.0) -> list[Contender]:
    """The coordinators in the election at ``path``, the leader first."""
    from kazoo.exceptions import NoNodeError

    from ordq.coordinator.service_leases import LOCK_NODE

    try:
        children = client.get_children_async(path).get(timeout=timeout_s)
    except NoNodeError:
        return []
    out = []
    for _, child in sorted((int(m.group(1)), c) for c in children if (m := LOCK_NODE.search(c)) is not None):
        try:
            data, _ = client.get_async(f"{path}/{child}").get(timeout=timeout_s)
        except NoNodeError:
            continue  # gone meanwhile
        out.append(Contender.parse(data.decode("utf-8", "replace") if data else ""))
    return out


def coordinator_status(found: list[Contender], *, timeout_s: float = 1.0) -> list[ProcessStatus]:
    """A row per contender (one saying "none" when there is none: nobody fails heads over)."""
    if not found:
        return [ProcessStatus(name="coordinator", kind="coordinator", pid=None, listen=None, state="none",
                              healthy=False, detail="no coordinator in the election (ordq coordinator run)")]
    out = []
    for i, c in enumerate(found):
        pid = _pid_of(c.name)
        if c.metrics_url is None:  # it serves no /health: its place in the election is all we know
            out.append(ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address,
                                     state="leader" if i == 0 else "standby", healthy=True,
                                     detail="no health page (started without --metrics)"))
            continue
        health = coordinator_health(c.metrics_url, timeout_s=timeout_s)
        if not health:
            out.append(ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address, state="no answer",
                                     healthy=False, detail=f"{c.metrics_url.rsplit('/', 1)[0]}/health does not answer"))
            continue
        detail = f"rounds {int(health.get('rounds', 0))}, errors {int(health.get('errors', 0))}, {c.metrics_url}"
        out.append(ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address,
                                 state="leader" if health.get("leader") is True else "standby", healthy=True,
                                 detail=detail, version=str(health.get("version", ""))))
    return out


def _pid_of(name: str) -> int | None:
    pid = name.rpartition("-")[2]
    return int(pid) if pid.isdigit() else None


def live_status(store: Any, hosts: str, credentials: Credentials, *, rpc_timeout_s: float = 1.0) -> list[ProcessStatus]:
    """Every process of the cluster of ``store`` (a ``ZkStore``) with its health, asked live."""
    from ordq.wire.client import GrpcTransport

    out = zk_status(hosts, credentials, timeout_s=rpc_timeout_s)
    transport = GrpcTransport(rpc_timeout_s=rpc_timeout_s, credentials=credentials)
    try:
        for gid in store.list_groups():
            live = store.live_members(gid)
            for role in ROLES:
                name = f"{gid}/{role}"
                info = live.get(role)
                if info is None:
                    out.append(ProcessStatus(name=name, kind="broker", pid=None, listen=None, state="not live",
                                             healthy=False, detail="no liveness node in ZooKeeper: down, or cut off"))
                    continue
                try:
                    health = transport.health(info.address)
                except OrdqError as exc:
                    out.append(ProcessStatus(name=name, kind="broker", pid=info.pid, listen=info.address,
                                             state="no answer", healthy=False, detail=str(exc)))
                    continue
                out.append(broker_status(name, info.pid, info.address, health))
    finally:
        transport.close()
    out += coordinator_status(contenders(store.client, store.paths.coordinator_leader), timeout_s=rpc_timeout_s)
    return no_leader_unhealthy(out)
