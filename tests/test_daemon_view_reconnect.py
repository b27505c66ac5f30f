"""The daemon's view after its ZooKeeper connection drops and comes back on the same session:
ZooKeeper forgot the connection's watches and kazoo does not set them again (it fires each once,
with no path). The view must read every queue again, else a change is seen only when the sweep
reaches that queue (minutes at 10^5 queues, issue 43). Real ZooKeeper; the drop is the socket
shut down under kazoo."""

from __future__ import annotations

import socket
import time

import pytest

from ordq.coordinator.daemon_view import DaemonView
from ordq.coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk


def test_a_dropped_connection_makes_the_view_read_and_watch_every_queue_again(zk_server, zk_root) -> None:
    with ZkStore.connect(zk_server.connection_string, zk_root, timeout_s=10.0) as store, \
            ZkStore.connect(zk_server.connection_string, zk_root, timeout_s=10.0) as other:
        store.add_group("g1")
        store.create_queues([f"q-{i}" for i in range(20)])
        view = DaemonView(store, lambda: None)
        try:
            assert len(view.refresh(time.monotonic())) == 20  # read and watched
            assert view.refresh(time.monotonic()) == []
            states: list[str] = []
            store.client.add_listener(states.append)
            store.client._connection._socket.shutdown(socket.SHUT_RDWR)  # the connection, not the session
            wait_until(lambda: states[-2:] == ["SUSPENDED", "CONNECTED"], timeout_s=30, what="reconnected")
            data, stat = other.client.get(other.paths.state("q-7"))
            other.client.set(other.paths.state("q-7"), data, version=stat.version)  # the same bytes, a new version
            version = stat.version
            wait_until(lambda: "q-7" in view.refresh(time.monotonic()), timeout_s=10,
                       what="the change after the reconnection seen")
            assert view.entries["q-7"].version == version + 1
            # and watched again: a later change is seen by itself
            other.client.set(other.paths.state("q-9"), other.client.get(other.paths.state("q-9"))[0])
            wait_until(lambda: "q-9" in view.refresh(time.monotonic()), timeout_s=10, what="a later change seen")
        finally:
            view.close()
