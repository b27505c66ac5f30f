"""A slow handshake is waited for up to the call's deadline (issue 25/26).

At load 22-30 the security drills' calls to a head master failed at once with UNAVAILABLE
"connection attempt timed out before receiving SETTINGS frame": gRPC core takes
``grpc.min_reconnect_backoff_ms`` (then 100 ms) as the minimum time a connection attempt may
take, so any TCP+TLS+HTTP/2 handshake slower than 100 ms failed the call, whatever its deadline.
Here a forwarder holds the server's first bytes back 0.5 s, as a busy server would."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc

from ordq.wire.framing import GRPC_OPTIONS

HELD_S = 0.5  # how long the server's first bytes (its TLS/HTTP2 handshake) are held back


def _echo_server() -> tuple[grpc.Server, int]:
    handler = grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)})
    server = grpc.server(futures.ThreadPoolExecutor(2), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _pump(src: socket.socket, dst: socket.socket, hold_s: float) -> None:
    with contextlib.suppress(OSError):
        first = True
        while data := src.recv(65536):
            if first:
                time.sleep(hold_s)
                first = False
            dst.sendall(data)
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _slow_handshake_in_front_of(port: int) -> Iterator[int]:
    """A loopback forwarder to ``port`` that delays the server's first bytes by HELD_S."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    opened: list[socket.socket] = []  # closed at the end (each pump only shuts its two down)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            opened.extend((client, upstream))
            upstream.settimeout(None)
            client.settimeout(None)
            threading.Thread(target=_pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, HELD_S), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        thread.join(5)
        for s in opened:
            s.close()


def test_a_handshake_slower_than_the_reconnect_backoff_is_waited_for_within_the_calls_deadline() -> None:
    server, port = _echo_server()
    try:
        with _slow_handshake_in_front_of(port) as slow_port:
            channel = grpc.insecure_channel(f"127.0.0.1:{slow_port}", options=GRPC_OPTIONS)
            try:
                echo = channel.unary_unary("/t.T/Echo")
                began = time.monotonic()
                assert echo(b"hello", timeout=5.0) == b"hello"  # before: UNAVAILABLE after ~0.1 s
                assert time.monotonic() - began >= HELD_S
            finally:
                channel.close()
    finally:
        server.stop(None)
