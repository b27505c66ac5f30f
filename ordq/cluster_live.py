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
    return [zk_row(i, host, port, credentials, timeout_s=timeout_s)
            for i, (host, port) in enumerate(zk_servers(hosts), start=1)]


def zk_row(i: int, host: str, port: int, credentials: Credentials, *, timeout_s: float = 1.0) -> ProcessStatus:
    """ZooKeeper server ``i`` of the connection string, by ``srvr``."""
    try:
        answer = four_letter_word(port, tls=credentials if credentials.zk_tls else None, host=host,
                                  timeout_s=timeout_s)
    except OSError as exc:
        return ProcessStatus(name=f"zk{i}", kind="zookeeper", pid=None, listen=f"{host}:{port}", state="no answer",
                             healthy=False, detail=exc.strerror or type(exc).__name__)
    mode, version = parse_srvr(answer)
    return ProcessStatus(name=f"zk{i}", kind="zookeeper", pid=None, listen=f"{host}:{port}",
                         state=mode or "not serving", healthy=mode in ZK_SERVING, version=version)


def contenders(client: Any, path: str, *, timeout_s: float = 2.0) -> list[Contender]:
    """The coordinators in the election at ``path``, the leader first."""
    from kazoo.exceptions import NoNodeError

    from ordq.coordinator.service_leases import LOCK_NODE
    from ordq.coordinator.zk_answer import zk_answer

    try:
        children = zk_answer(client.get_children_async(path), timeout_s)
    except NoNodeError:
        return []
    out = []
    for _, child in sorted((int(m.group(1)), c) for c in children if (m := LOCK_NODE.search(c)) is not None):
        try:
            data, _ = zk_answer(client.get_async(f"{path}/{child}"), timeout_s)
        except NoNodeError:
            continue  # gone meanwhile
        out.append(Contender.parse(data.decode("utf-8", "replace") if data else ""))
    return out


def coordinator_status(found: list[Contender], *, timeout_s: float = 1.0) -> list[ProcessStatus]:
    """A row per contender (one saying "none" when there is none: nobody fails heads over)."""
    if not found:
        return [ProcessStatus(name="coordinator", kind="coordinator", pid=None, listen=None, state="none",
                              healthy=False, detail="no coordinator in the election (ordq coordinator run)")]
    return [coordinator_row(c, leads=i == 0, timeout_s=timeout_s) for i, c in enumerate(found)]


def coordinator_row(c: Contender, *, leads: bool, timeout_s: float = 1.0) -> ProcessStatus:
    """One contender's row, from its /health page (``leads``: first in the election, all that is
    known of one that serves no page)."""
    pid = _pid_of(c.name)
    if c.metrics_url is None:  # it serves no /health: its place in the election is all we know
        return ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address,
                             state="leader" if leads else "standby", healthy=True,
                             detail="no health page (started without --metrics)")
    health = coordinator_health(c.metrics_url, timeout_s=timeout_s)
    if not health:
        return ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address, state="no answer",
                             healthy=False, detail=f"{c.metrics_url.rsplit('/', 1)[0]}/health does not answer")
    detail = f"rounds {int(health.get('rounds', 0))}, errors {int(health.get('errors', 0))}, {c.metrics_url}"
    return ProcessStatus(name=c.name, kind="coordinator", pid=pid, listen=c.address,
                         state="leader" if health.get("leader") is True else "standby", healthy=True,
                         detail=detail, version=str(health.get("version", "")))


def _pid_of(name: str) -> int | None:
    pid = name.rpartition("-")[2]
    return int(pid) if pid.isdigit() else None


def live_status(store: Any, hosts: str, credentials: Credentials, *, rpc_timeout_s: float = 1.0,
                transport: Any = None) -> list[ProcessStatus]:
    """Every process of the cluster of ``store`` (a ``ZkStore``) with its health, asked live.
    What ZooKeeper registers is read first (a few reads); then every process is asked at once,
    each question bounded by ``rpc_timeout_s``: the sweep takes about its slowest answer, not the
    sum of them (issue 42: one after the other, ``ordq status`` took 2.4 s beside six busy loops,
    and a hung process added a second each). ``transport``: a ``GrpcTransport`` whose channels
    the caller keeps (the coordinator's: no TLS handshake per status); else one made and closed
    here."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from ordq.wire.client import GrpcTransport

    members = [(gid, store.live_members(gid)) for gid in store.list_groups()]
    found = contenders(store.client, store.paths.coordinator_leader)
    servers = zk_servers(hosts)
    zk_credentials = zk_tls_credentials(hosts, credentials)
    own = transport is None
    if own:
        transport = GrpcTransport(rpc_timeout_s=rpc_timeout_s, credentials=credentials)
    asked = len(servers) + 2 * len(members) + len(found)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(asked, MAX_ASKED_AT_ONCE)),
                                thread_name_prefix="ordq-status") as pool:
            rows: list[ProcessStatus | Future[ProcessStatus]] = [
                pool.submit(zk_row, i, host, port, zk_credentials, timeout_s=rpc_timeout_s)
                for i, (host, port) in enumerate(servers, start=1)]
            for gid, live in members:
                for role in ROLES:
                    info = live.get(role)
                    rows.append(pool.submit(_broker_row, transport, f"{gid}/{role}", info) if info is not None
                                else ProcessStatus(name=f"{gid}/{role}", kind="broker", pid=None, listen=None,
                                                   state="not live", healthy=False,
                                                   detail="no liveness node in ZooKeeper: down, or cut off"))
            if found:
                rows += [pool.submit(coordinator_row, c, leads=i == 0, timeout_s=rpc_timeout_s)
                         for i, c in enumerate(found)]
            else:
                rows += coordinator_status(found)
            out = [r.result() if isinstance(r, Future) else r for r in rows]
    finally:
        if own:
            transport.close()
    return no_leader_unhealthy(out)


def zk_tls_credentials(hosts: str, credentials: Credentials) -> Credentials:
    """What ``srvr`` presents to ZooKeeper: ``credentials`` when they say ZooKeeper speaks TLS,
    else what this process's ZooKeeper client presents there (``zk_tls_options``: a coordinator's
    own credentials do not say it, its session finds it registered), else ``credentials``
    (plaintext)."""
    if credentials.zk_tls:
        return credentials
    from ordq.common.security import zk_tls_options

    options = zk_tls_options(hosts)
    if not options:
        return credentials
    return Credentials(ca_file=options["ca"], cert_file=options["certfile"], key_file=options["keyfile"], zk_tls=True)


# Processes asked at once by one sweep: a cluster of 26 groups has 52 brokers; more threads
# than this only queue for the GIL.
MAX_ASKED_AT_ONCE = 16


def _broker_row(transport: Any, name: str, info: Any) -> ProcessStatus:
    try:
        health = transport.health(info.address)
    except OrdqError as exc:
        return ProcessStatus(name=name, kind="broker", pid=info.pid, listen=info.address, state="no answer",
                             healthy=False, detail=str(exc))
    return broker_status(name, info.pid, info.address, health)
