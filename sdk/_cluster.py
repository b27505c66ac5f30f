"""How an SDK client reaches its cluster — one way for producers, consumers and group members.

A client needs the coordinators' addresses (``bootstrap``, as Kafka's ``bootstrap.servers``),
its TLS client certificate and its token: nothing of ZooKeeper (issue 37). ``zk_hosts`` and
``root`` may instead *name* a cluster that ``ordq up`` (or a test harness) registered in the
credentials file with its coordinators' addresses: a name looked up in a local file, never a
connection.

Rules: no I/O but reading the credentials file; the CoordinatorClient made here is the client's
only line to the control plane.
"""

from __future__ import annotations

from ordq.common.errors import ConfigError
from ordq.common.security import Credentials, lookup, lookup_bootstrap, registered_bootstrap
from ordq.coordinator.client import CoordinatorClient, parse_bootstrap
from ordq.coordinator.paths import Paths

DEFAULT_LEASE_TTL_S = 3.0  # a client's lease (coordinator/leases.py): a dead holder's successor waits ~this


def check_cluster(bootstrap: str | None, zk_hosts: str | None, root: str) -> None:
    """ConfigError unless the client names its cluster: ``bootstrap`` (host:port,...) or a
    registered ``zk_hosts`` and ``root``."""
    Paths(root)  # InvalidName for a bad root
    if bootstrap is not None:
        parse_bootstrap(bootstrap)
    elif not zk_hosts or not isinstance(zk_hosts, str):
        raise ConfigError("give bootstrap='host:port[,host:port...]' (the coordinators' addresses; "
                          "`ordq status` prints them), or zk_hosts naming a cluster `ordq up` registered")


def resolve(bootstrap: str | None, zk_hosts: str | None, root: str) -> str:
    """The bootstrap list of the cluster the client names."""
    if bootstrap is not None:
        return bootstrap
    assert zk_hosts is not None
    found = registered_bootstrap(zk_hosts, root)
    if found is None:
        raise ConfigError(f"no coordinators are registered for the cluster {zk_hosts}{root}: give "
                          "bootstrap='host:port,...' (`ordq status` prints them), or start it with `ordq up`")
    return found


def open_coordinator(bootstrap: str | None, zk_hosts: str | None, root: str,
                     credentials: Credentials | None) -> tuple[CoordinatorClient, Credentials]:
    """The client of the cluster's coordinators and the credentials it presents (as given, else
    as registered for that cluster)."""
    addresses = resolve(bootstrap, zk_hosts, root)
    if credentials is None:
        credentials = lookup(zk_hosts, root) if bootstrap is None and zk_hosts else lookup_bootstrap(addresses)
    return CoordinatorClient(bootstrap=addresses, credentials=credentials), credentials
