"""One broker group of real processes (g1: a master and a slave, with TLS) serving queue ``Q``
at producer epoch 1, for the tests that drive brokers below the SDK (test_broker.py,
test_session_guard.py, where the brokers reach ZooKeeper through a proxy; test_control_calls.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import attrs

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.common.security import Credentials, ensure_coordinator_pki, provision
from ordq.coordinator import state as sm
from ordq.coordinator.store import ZkStore
from ordq.wire.client import GrpcTransport
from tests.util import wait_until

Q = "q"


@attrs.define
class Group:
    store: ZkStore
    procs: BrokerGroupProcesses
    # With the coordinators' certificate: these tests drive the brokers' control calls (Fence,
    # Seal, Reconcile) as a coordinator does; no client certificate may make them.
    transport: GrpcTransport
    client: Credentials  # the client certificate ``ordq up`` issues (an insider past TLS)
    broker_tls: Credentials  # the brokers' own certificate (a test acting as a master)
    coordinator_tls: Credentials  # the coordinators' certificate (the Seal protocol's caller)

    def address(self, role: str) -> str:
        return self.store.live_members("g1")[role].address


@contextlib.contextmanager
def one_group(zk_hosts: str, root: str, folder: Path, *, brokers_zk: str | None = None,
              session_timeout_s: float = 1.0, log_lines: int = 30) -> Iterator[Group]:
    """The group in ``folder`` under ``root``; its brokers connect to ``brokers_zk`` (default:
    ``zk_hosts``, which the test's store uses). Killed on the way out, their logs' last
    ``log_lines`` printed (pytest shows them when the test failed)."""
    store = ZkStore.connect(zk_hosts, root)
    broker_tls, client_tls = provision(folder / "tls", zk_hosts, root)
    procs = BrokerGroupProcesses("g1", zk_hosts=brokers_zk or zk_hosts, root=root, base_dir=folder,
                                 tls=broker_tls, session_timeout_s=session_timeout_s)
    coordinator_tls = ensure_coordinator_pki(folder / "tls")
    transport = GrpcTransport(credentials=coordinator_tls)
    try:
        store.add_group("g1")
        procs.start()
        wait_until(lambda: store.live_groups(["g1"]), what="g1 live")
        store.create_queue(Q, ["g1"])
        store.apply(Q, lambda st, _f: sm.bump_epoch(st))  # epoch 1: the raw streams write with it
        yield Group(store, procs, transport, client_tls, broker_tls, coordinator_tls)
    finally:
        for p in procs.members:
            print(f"--- {p.gid} {p.role} log tail ---\n{p.log_tail(log_lines)}")
        transport.close()
        procs.kill()
        store.close()
