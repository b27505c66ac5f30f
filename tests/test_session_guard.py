"""The master's session guard (DESIGN §6, issue 28): a master cut off from ZooKeeper takes no
write past its session, though its slave and its producer still reach it.

Without root: the group's brokers reach ZooKeeper through a TCP proxy of this test that can
go silent (it keeps the connections open and drops every byte, as a partition does; a
refused or reset connection would tell kazoo at once). The lab's drill
``part-zk-minority-head-master`` does the same with namespaces and iptables
(drills/partitions.py). Without the guard the master kept acking: in that drill 4.5 s past the
cut (sessions of 2 s), 2 s past the coordinator's failover in ZooKeeper.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.coordinator.store import ZkStore
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport
from ordq.wire.errors import SegmentNotWritable
from tests.helpers.one_group import Q, one_group

pytestmark = pytest.mark.zk
SESSION_S = 1.0


class SilentProxy:
    """Forwards TCP connections on a free loopback port to ``target``; ``silent`` drops every
    byte both ways while the connections stay open."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.silent = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=5)
            self._sockets += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            if not self.silent.is_set():
                with contextlib.suppress(OSError):
                    dst.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            t.join(timeout=2)


@pytest.fixture
def proxied(zk_server, zk_root, tmp_path: Path) -> Iterator[tuple[ZkStore, BrokerGroupProcesses, GrpcTransport,
                                                                  SilentProxy]]:
    host, port = zk_server.connection_string.split(",")[0].rsplit(":", 1)
    proxy = SilentProxy((host, int(port)))
    try:
        with one_group(zk_server.connection_string, zk_root, tmp_path, brokers_zk=f"127.0.0.1:{proxy.port}",
                       session_timeout_s=SESSION_S, log_lines=20) as g:
            yield g.store, g.procs, g.transport, proxy
    finally:
        proxy.close()


def _send(transport: GrpcTransport, master: str, seq: int) -> None:
    """One batch of one message, acked (or the broker's refusal raised)."""
    stream = transport.open_produce(master, Q, 0, 1)
    try:
        stream.send([encode_batch([Message(payload=b"%d" % seq)], epoch=1, first_seq=seq)])
        for ack in stream.acks():
            if ack.last_seq == seq:
                return
    finally:
        stream.close()


def test_a_master_that_cannot_hear_zookeeper_takes_no_write_past_its_session(proxied) -> None:
    store, _procs, transport, proxy = proxied
    master = store.live_members("g1")["master"].address
    _send(transport, master, 0)  # writes flow while ZooKeeper answers
    proxy.silent.set()  # ZooKeeper cut off; the slave and this producer still reach the master
    cut = time.monotonic()
    seq, refused = 1, None
    while refused is None and time.monotonic() - cut < 15:
        try:
            _send(transport, master, seq)
            seq += 1
        except SegmentNotWritable as exc:
            refused = exc
        time.sleep(0.05)
    took = time.monotonic() - cut
    print(f"acked {seq - 1} writes in the {took:.2f}s after the cut; then refused: {refused}")
    assert refused is not None, f"the master still took writes {took:.1f}s after ZooKeeper went silent"
    assert "ZooKeeper" in str(refused), refused
