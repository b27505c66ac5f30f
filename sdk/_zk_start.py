"""How an SDK client starts on ZooKeeper — one way for the producer and the consumer.

Connect within the client's own timeout (``connect_timeout_s``), check its ZooKeeper
credential against the cluster's (a wrong one is refused here, before anything is written:
ZooKeeper itself accepts any digest and refuses only the first write), then run the start's
steps through ``ZkSteps``, which rides out transient errors with a bound (coordinator/zk_retry.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from kazoo.client import KazooClient

from ordq.common.errors import CoordinationUnavailable
from ordq.common.security import Credentials
from ordq.coordinator.acl_client import check_identity
from ordq.coordinator.store_base import new_client
from ordq.coordinator.zk_retry import retry_zk

T = TypeVar("T")


class ZkSteps:
    """``steps(call, what)``: ``call()`` with transient ZooKeeper errors retried (bounded), its
    one-line failure naming the client (``who``) and the step (``what``)."""

    def __init__(self, who: str, hosts: str, stopped: Callable[[], bool]) -> None:
        self.who, self.hosts, self.stopped = who, hosts, stopped

    def __call__(self, call: Callable[[], T], what: str) -> T:
        return retry_zk(call, f"{self.who}: {what}", hosts=self.hosts, stopped=self.stopped)


def connect(hosts: str, root: str, creds: Credentials, *, session_timeout_s: float, connect_timeout_s: float,
            who: str, stopped: Callable[[], bool]) -> tuple[KazooClient, ZkSteps]:
    """A started client whose credential the cluster knows, and the steps runner; on any
    failure nothing is left connected. It authenticates with ``creds.zk_auth`` (on a protected
    root only the cluster's own identities are let in: until the clients are on leases, this
    path serves only unprotected roots and the cluster's own processes; coordinator/acl.py)."""
    zk_auth = creds.zk_auth
    client = new_client(hosts, session_timeout_s=session_timeout_s, auth=zk_auth)
    try:
        client.start(timeout=connect_timeout_s)
    except Exception as exc:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
        raise CoordinationUnavailable(f"cannot reach ZooKeeper at {hosts}") from exc
    steps = ZkSteps(who, hosts, stopped)
    try:
        steps(lambda: check_identity(client, root, zk_auth, required=True), "check the ZooKeeper credential")
    except BaseException:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
        raise
    return client, steps
