"""What ``ordq status`` and ``ordq up`` see of a local cluster: each process, where it listens
and whether it is healthy, asked live (ZooKeeper ``srvr``, each broker's liveness node and
``Health`` RPC, each coordinator's /health page); and waiting until everything is.

Rules: read-only; every question is bounded by a short timeout, so a hung process shows as
"no answer" instead of stalling the status.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs

from ordq.broker_group.process import BrokerProcess
from ordq.common.errors import ExternalProcessError, OrdqError
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials
from ordq.coordinator.store import ZkStore
from ordq.zk_server import ZkServer

ROLES = ("master", "slave")


@attrs.frozen
class ProcessStatus:
    """One process of the cluster as seen now."""

    name: str  # zk1 | g1/master | coordinator-1
    kind: str  # zookeeper | broker | coordinator
    pid: int | None
    listen: str | None
    state: str  # e.g. standalone, leader, live, standby, down
    healthy: bool
    detail: str = ""
    version: str = ""  # what the process reports of itself ("" when it does not say)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Observed(Protocol):
    """What the health checks read of a cluster (``ordq.local_cluster.LocalCluster``)."""

    folder: Path
    zk: ZkServer
    coordinators: list[ManagedProcess]
    credentials: Credentials

    @property
    def gids(self) -> tuple[str, ...]: ...

    def processes(self) -> list[tuple[str, ManagedProcess]]: ...

    def brokers(self) -> Iterator[tuple[str, BrokerProcess]]: ...

    def broker(self, gid: str, role: str) -> BrokerProcess: ...

    def store(self, timeout_s: float = 10.0) -> contextlib.AbstractContextManager[ZkStore]: ...

    def metrics_url(self, name: str) -> str | None: ...

    def saved_address(self, name: str) -> str | None: ...


class ClusterHealth:
    def __init__(self, cluster: Observed) -> None:
        self.c = cluster

    def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        """Wait until every process runs, every group is live in ZooKeeper (both roles, with
        the incarnation that runs now) and one coordinator leads. ExternalProcessError naming
        what is not healthy on timeout, or at once when a process died."""
        deadline = time.monotonic() + timeout_s
        interval = 0.02
        while True:
            dead = [name for name, p in self.c.processes() if not p.alive()]
            if dead:
                name, proc = next((n, p) for n, p in self.c.processes() if n == dead[0])
                raise ExternalProcessError(
                    f"{name} is not running (pid file {proc.pid_path}); last lines of {proc.log_path}:\n"
                    f"{proc.log_tail(20)}"
                )
            problem = self.health_problem()
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise ExternalProcessError(
                    f"local cluster in {self.c.folder} not healthy after {timeout_s:g}s: {problem}"
                )
            time.sleep(interval)
            interval = min(interval * 1.5, 0.25)

    def health_problem(self) -> str | None:
        try:
            with self.c.store(timeout_s=5.0) as store:
                for gid in self.c.gids:
                    live = store.live_members(gid)
                    for role in ROLES:
                        member = self.c.broker(gid, role)
                        info = live.get(role)
                        if info is None:
                            return f"{gid}/{role} is not live in ZooKeeper"
                        if member.incarnation is not None and info.incarnation != member.incarnation:
                            return f"{gid}/{role}: ZooKeeper still shows a previous incarnation"
        except OrdqError as exc:
            return f"ZooKeeper: {exc}"
        if self.c.coordinators and self.coordinator_leader() is None:
            return "no coordinator daemon leads yet"
        return None

    def coordinator_leader(self) -> str | None:
        """Name of the coordinator daemon that reports itself leader (its /health page)."""
        for proc in self.c.coordinators:
            if proc.alive() and coordinator_health(self.c.metrics_url(proc.name)).get("leader") is True:
                return proc.name
        return None

    def status(self, *, rpc_timeout_s: float = 1.0) -> list[ProcessStatus]:
        """Every process with its pid, where it listens and its health, asked live:
        ZooKeeper ``srvr``, each broker's liveness node and ``Health`` RPC, each coordinator's
        /health page."""
        out: list[ProcessStatus] = []
        for st, proc in zip(self.c.zk.status(), self.c.zk.processes, strict=True):
            mode = st.mode
            out.append(ProcessStatus(name=proc.name, kind="zookeeper", pid=st.pid, listen=f"127.0.0.1:{st.port}",
                                     state=st.state, healthy=mode in ("standalone", "leader", "follower")))
        live: dict[str, dict[str, Any]] = {}
        zk_error = None
        try:
            with self.c.store(timeout_s=2.0) as store:
                live = {gid: store.live_members(gid) for gid in self.c.gids}
        except OrdqError as exc:
            zk_error = str(exc)
        out += self._broker_status(live, zk_error, rpc_timeout_s)
        for proc in self.c.coordinators:
            pid = proc.pid
            url = self.c.metrics_url(proc.name)
            if pid is None:
                out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=None, listen=None, state="down",
                                         healthy=False))
                continue
            health = coordinator_health(url, timeout_s=rpc_timeout_s)
            if not health:
                out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=pid, listen=url, state="no answer",
                                         healthy=False, detail="health endpoint does not answer"))
                continue
            leader = health.get("leader") is True
            detail = f"rounds {int(health.get('rounds', 0))}, errors {int(health.get('errors', 0))}"
            out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=pid, listen=url,
                                     state="leader" if leader else "standby", healthy=True, detail=detail,
                                     version=str(health.get("version", ""))))
        return no_leader_unhealthy(out)

    def _broker_status(self, live: dict[str, dict[str, Any]], zk_error: str | None,
                       rpc_timeout_s: float) -> list[ProcessStatus]:
        from ordq.wire.client import GrpcTransport

        out = []
        transport = GrpcTransport(rpc_timeout_s=rpc_timeout_s, credentials=self.c.credentials)
        try:
            for name, member in self.c.brokers():
                gid, role = name.split("/")
                pid = member.proc.pid
                info = live.get(gid, {}).get(role)
                address = info.address if info is not None else self.c.saved_address(name)
                if pid is None:
                    out.append(ProcessStatus(name=name, kind="broker", pid=None, listen=address, state="down",
                                             healthy=False, detail="live in ZooKeeper (session not expired yet)"
                                             if info is not None else ""))
                    continue
                if info is None:
                    why = zk_error or "not registered live in ZooKeeper"
                    out.append(ProcessStatus(name=name, kind="broker", pid=pid, listen=address, state="not live",
                                             healthy=False, detail=why))
                    continue
                try:
                    health = transport.health(info.address)
                except OrdqError as exc:
                    out.append(ProcessStatus(name=name, kind="broker", pid=pid, listen=info.address,
                                             state="no answer", healthy=False, detail=str(exc)))
                    continue
                out.append(broker_status(name, pid, info.address, health))
        finally:
            transport.close()
        return out


def broker_status(name: str, pid: int | None, address: str, health: Any) -> ProcessStatus:
    """A live broker's row from its ``Health`` answer (``pb.HealthResponse``): degraded when a
    master has no slave connected or a segment is corrupt."""
    role = name.rpartition("/")[2]
    stats = json.loads(health.stats_json or "{}")
    problems = []
    if role == "master" and not health.slave_connected:
        problems.append("slave not connected")
    if stats.get("corrupt"):
        problems.append(f"corrupt segments {','.join(stats['corrupt'])}")
    detail = f"segments {stats.get('segments', 0)}"
    if stats.get("torn_bytes_truncated"):
        detail += f", torn tail bytes truncated {stats['torn_bytes_truncated']}"
    if stats.get("reconciled"):
        detail += f", reconciled {stats['reconciled']}"
    return ProcessStatus(name=name, kind="broker", pid=pid, listen=address,
                         state="live" if not problems else "degraded", healthy=not problems,
                         detail="; ".join([*problems, detail]), version=str(stats.get("version", "")))


def health_url(metrics_url: str) -> str:
    """A coordinator's /health page, served beside its /metrics."""
    return metrics_url.rsplit("/", 1)[0] + "/health"


def coordinator_health(url: str | None, *, timeout_s: float = 1.0) -> dict[str, Any]:
    """A coordinator's /health document (``CoordinatorMetrics.health``: leader, term, rounds,
    errors, queues), given its metrics URL; {} when it does not answer within ``timeout_s``.
    Never the /metrics page: its size grows with the queues (issue 43)."""
    if not url:
        return {}
    try:
        with urllib.request.urlopen(health_url(url), timeout=timeout_s) as resp:  # noqa: S310 - our own http URL
            doc = json.loads(resp.read(64 << 10))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def no_leader_unhealthy(statuses: list[ProcessStatus]) -> list[ProcessStatus]:
    """Coordinators all up but none leading (e.g. every election thread stuck) is not a
    healthy cluster: nobody fails heads over or seals (issue 23: both showed "standby yes")."""
    coordinators = [s for s in statuses if s.kind == "coordinator"]
    if not coordinators or any(s.state == "leader" for s in coordinators):
        return statuses
    return [attrs.evolve(s, healthy=False, detail="; ".join(filter(None, [s.detail, "no coordinator leads"])))
            if s.kind == "coordinator" else s for s in statuses]
