"""The shape of a local cluster (``ordq up`` flags) and the files that record it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import ConfigError

STATE_FILE = "ordq-cluster.json"
OWN_CREDENTIALS = "credentials.json"  # the cluster's own entry, for its own processes
DEFAULT_FOLDER = Path(".ordq")


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
