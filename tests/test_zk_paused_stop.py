"""Brokers and a coordinator stop promptly while ZooKeeper is paused (SIGSTOP: it takes
connections and answers nothing), and cleanly.

Seen in a drive (stops 96-97): `ordq down` with ZooKeeper paused took its whole 10 s grace and
SIGKILLed the brokers. Each of a process's sessions (a broker has two, a coordinator three)
waited, one after the other, for the answer to its close, or for a TLS handshake, up to a
session or 5 s. Guards: ``ZkBase.close`` cuts a connection whose server does not answer the
close within ``CLOSE_GRACE_S`` (``zk_tls.cut_connection``), and ``close_all`` closes a
process's sessions side by side. A slave's stop also logged "Exception in callback ...
CancelledError" for its master's lean link (``TaskServer._connection``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.zk_server import ZkServer
from tests.cluster import Cluster

pytestmark = pytest.mark.zk

# A process that waits out its sessions one after the other takes longer (10 s and more
# before); a prompt one ~2 s, a few more on a loaded box.
STOP_WITHIN_S = 8.0


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on a ZooKeeper server of this test's own: pausing it stops no other test."""
    server = ZkServer(tmp_path / "zk")
    server.start(timeout_s=90)
    cluster = Cluster(server, f"/t{uuid.uuid4().hex[:8]}", tmp_path / "cluster")
    try:
        yield cluster
    finally:
        try:
            for proc in server.processes:
                proc.resume()
        finally:
            try:
                cluster.close()
            finally:
                server.destroy()


def test_brokers_and_a_coordinator_stop_promptly_while_zookeeper_is_paused(own_cluster: Cluster) -> None:
    cluster = own_cluster
    cluster.add_groups("g1")
    cluster.create_queue("q")  # a coordinator serves from here on
    group = cluster.groups["g1"]
    [zk] = cluster.zk.processes
    zk.pause()
    for name, proc in (("slave", group.slave.proc), ("master", group.master.proc),
                       ("coordinator", cluster.coordinators[0])):
        started = time.monotonic()
        code = proc.stop(timeout_s=STOP_WITHIN_S)  # SIGTERM; SIGKILL after the grace
        took = time.monotonic() - started
        assert code == 0, f"the {name} exited {code} after {took:.1f} s with ZooKeeper paused"
    log = group.slave.proc.log_tail(200)
    assert "STOPPED" in log and "Exception in callback" not in log, log
