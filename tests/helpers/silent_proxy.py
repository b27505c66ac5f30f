"""A TCP proxy of a test that can go silent, as a partition does (tests/test_session_guard.py,
tests/test_group_absence.py): without root, a broker reaches ZooKeeper through it and can be
cut off from ZooKeeper while every other link stays."""

from __future__ import annotations

import contextlib
import socket
import threading


class SilentProxy:
    """Forwards TCP connections on a free loopback port to ``target``; ``silent`` drops every
    byte both ways while the connections stay open; ``hold_replies`` holds what ``target``
    sends (ZooKeeper hears its clients, they hear nothing: its answers come late) and delivers
    it once cleared; ``reset()`` closes every connection (a healed partition's resets).
    ``forwarded``: the bytes forwarded to ``target`` so far (what its clients got through)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.silent = threading.Event()
        self.hold_replies = threading.Event()
        self.forwarded = 0
        self._count_lock = threading.Lock()
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
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:  # the target is gone (stopped by the test): refuse this one as it would
                conn.close()
                continue
            self._sockets += [conn, upstream]
            for a, b, replies in ((conn, upstream, False), (upstream, conn, True)):
                t = threading.Thread(target=self._pump, args=(a, b, replies), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        held = bytearray()  # replies held while ``hold_replies`` is set
        try:
            src.settimeout(0.05)
        except OSError:  # closed by reset() or close() before this thread first ran (a loaded box:
            return       # the loaded tier's teardown raised EBADF here)
        while not self._stop.is_set():
            if held and not self.hold_replies.is_set():
                with contextlib.suppress(OSError):
                    dst.sendall(held)
                held.clear()
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            if self.silent.is_set():
                continue
            if replies and (self.hold_replies.is_set() or held):
                held += data
                continue
            with contextlib.suppress(OSError):
                dst.sendall(data)
                if not replies:
                    with self._count_lock:
                        self.forwarded += len(data)

    def reset(self) -> None:
        """Close every connection made so far (new ones are still forwarded)."""
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            t.join(timeout=2)
