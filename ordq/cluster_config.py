"""The shape of a local cluster (``ordq up`` flags) and the files that record it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import attrs

from ordq.cluster_folder import DEFAULT_FOLDER as DEFAULT_FOLDER
from ordq.cluster_folder import STATE_FILE as STATE_FILE
from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.zk_server import free_ports, port_free

OWN_CREDENTIALS = "credentials.json"  # the cluster's own entry, for its own processes
COORDINATOR_HOST = "127.0.0.1"  # where a local cluster's coordinators listen


def _ports(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(p) for p in value)


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """Shape of a local cluster. ``zk_port`` None picks free ports (tests, drills)."""

    groups: int = 3
    zk_nodes: int = 1
    zk_port: int | None = None
    coordinators: int = 2
    root: str = "/ordq"
    session_timeout_s: float = 1.0  # broker ZooKeeper sessions: how fast a dead process is noticed
    tls: bool = True  # mutual TLS on every gRPC hop, with a CA made in <folder>/tls (ordq/common/security.py)
    tokens: bool = True  # enforce access tokens; start() makes an admin token (<folder>/admin.token)
    # ZooKeeper ACLs on the root (docs/SECURITY.md): admin and client digest credentials are
    # generated into <folder>/zk-auth/; brokers and coordinators act as admin.
    zk_acl: bool = True
    # ZooKeeper serves clients over TLS only (its secureClientPort), with a certificate of the
    # cluster CA, and requires theirs; every ordq client finds this in the credentials file and
    # connects with one SSL context per process (coordinator/zk_tls.py: a handshake, ~10-30 ms
    # on a quiet machine, where kazoo's own connect loaded the system CA bundle at every attempt).
    # On in `ordq up` unless --no-zk-tls or --insecure; off here, for the clusters tests and
    # drills build themselves.
    zk_tls: bool = False
    # The coordinators' ports (127.0.0.1), one each: picked at the cluster's first start and
    # kept, so its bootstrap list (what clients find it by, issue 37) never changes; () until then.
    coordinator_ports: tuple[int, ...] = attrs.field(default=(), converter=_ports)
    # An operator's Prometheus (http://HOST:PORT) the coordinators' status pages read their charts
    # from (``ordq coordinator run --prometheus-url``, issue 42); None: their own samples only.
    prometheus_url: str | None = None

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.groups <= 26:
            raise ConfigError(f"groups must be 1..26, not {self.groups}")
        if self.zk_nodes not in (1, 3):
            raise ConfigError(f"a local ZooKeeper has 1 or 3 nodes, not {self.zk_nodes}")
        if not 0 <= self.coordinators <= 5:
            raise ConfigError(f"coordinators must be 0..5, not {self.coordinators}")
        if self.zk_port is not None and not 1 <= self.zk_port <= 65533:
            raise ConfigError(f"zk_port must be 1..65533, not {self.zk_port}")
        if self.session_timeout_s <= 0:
            raise ConfigError("session_timeout_s must be > 0")
        if self.coordinator_ports and len(self.coordinator_ports) != self.coordinators:
            raise ConfigError(f"{self.coordinators} coordinators need as many ports, not {self.coordinator_ports}")
        if any(not 1 <= p <= 65535 for p in self.coordinator_ports):
            raise ConfigError(f"coordinator ports must be 1..65535, not {self.coordinator_ports}")
        if self.zk_tls and not self.tls:
            raise ConfigError("TLS to ZooKeeper needs the cluster's certificates (tls)")

    @property
    def gids(self) -> tuple[str, ...]:
        return tuple(f"g{i + 1}" for i in range(self.groups))


def shape(cfg: ClusterConfig) -> tuple[Any, ...]:
    # zk_port None means "any": it does not contradict a saved port.
    return (cfg.groups, cfg.zk_nodes, cfg.coordinators, cfg.root)


def describe(cfg: ClusterConfig) -> str:
    zk = "3-node ZooKeeper" if cfg.zk_nodes == 3 else "standalone ZooKeeper"
    return f"{cfg.groups} groups, {zk}, {cfg.coordinators} coordinators, root {cfg.root}"


def with_coordinator_ports(cfg: ClusterConfig, exclude: Collection[int] = ()) -> ClusterConfig:
    """``cfg`` with a port for each coordinator: those it keeps, else free ones picked now."""
    if cfg.coordinator_ports or not cfg.coordinators:
        return cfg
    return attrs.evolve(cfg, coordinator_ports=tuple(free_ports(cfg.coordinators, exclude, host=COORDINATOR_HOST)))


def coordinator_addresses(cfg: ClusterConfig) -> list[str]:
    """The coordinators' addresses (``host:port``), in order: the cluster's bootstrap list."""
    return [f"{COORDINATOR_HOST}:{p}" for p in cfg.coordinator_ports]


def check_coordinator_port(name: str, port: int, folder: Path) -> None:
    """ExternalProcessError naming the port when another process listens on ``port``: the
    coordinator ``name`` keeps it (clients find the cluster by it), so it never moves."""
    if not port_free(port, COORDINATOR_HOST):
        raise ExternalProcessError(
            f"cannot start {name}: its port {COORDINATOR_HOST}:{port} is taken by another process; the cluster "
            f"keeps it ({folder / STATE_FILE}: clients find its coordinators there), so stop what listens on it "
            f"(ss -ltnp 'sport = :{port}'), or ordq down --wipe --dir {folder} to start anew on other ports")
