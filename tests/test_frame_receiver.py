"""A blocking connection's frames (ordq/wire/lean_read.py ``FrameReceiver``), over a real socket
pair: every frame comes out whole and in order however the sender's bytes are split (frames
shorter and longer than one receive, headers torn across sends); a frame past the limit is
refused from its length; a peer gone mid-frame and a deadline passed raise."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.common.security import issue, make_ca
from ordq.wire import lean_read
from ordq.wire.lean_frames import HEADER
from ordq.wire.lean_read import FrameReceiver


def _framed(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):  # small buffers: a large frame arrives in many receives
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return a, b


def _send_in_pieces(sock: socket.socket, data: bytes, cuts: list[int]) -> threading.Thread:
    def run() -> None:
        last = 0
        for c in sorted({c % (len(data) + 1) for c in cuts}) + [len(data)]:
            sock.sendall(data[last:c])
            last = c
        sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _frames(receiver: FrameReceiver, sock: socket.socket, n: int) -> Iterator[bytes]:
    for _ in range(n):
        yield bytes(receiver.frame(sock))


def _large(n: int) -> bytes:
    """``n`` bytes that tell their positions apart (a shifted copy would not compare equal)."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


# small frames, and frames around and past one receive's buffer
_BODIES = st.one_of(st.binary(max_size=300),
                    st.integers(lean_read._RECV_BYTES - 8, 3 * lean_read._RECV_BYTES).map(_large))


@settings(max_examples=40, deadline=None)
@given(st.lists(_BODIES, min_size=1, max_size=6), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_frames_come_out_whole_and_in_order(bodies: list[bytes], cuts: list[int]) -> None:
    a, b = _pair()
    with a, b:
        sender = _send_in_pieces(a, b"".join(map(_framed, bodies)), cuts)
        receiver = FrameReceiver()
        receiver.deadline = time.monotonic() + 30
        assert list(_frames(receiver, b, len(bodies))) == bodies
        with pytest.raises(ConnectionResetError):  # then the sender's end: no more frames
            receiver.frame(b)
        sender.join()


def test_a_frame_past_the_limit_is_refused_from_its_length() -> None:
    a, b = _pair()
    with a, b:
        a.sendall(HEADER.pack(lean_read.ANSWER_LIMIT + 1))  # no body follows: none is waited for
        receiver = FrameReceiver()
        receiver.deadline = time.monotonic() + 30
        with pytest.raises(ConfigError, match="over the limit"):
            receiver.frame(b)


def test_a_peer_gone_mid_frame_and_a_deadline_passed_raise() -> None:
    a, b = _pair()
    with a, b:
        sender = _send_in_pieces(a, _framed(b"x" * 100_000)[:50_000], [])  # a large frame, torn
        receiver = FrameReceiver()
        receiver.deadline = time.monotonic() + 30
        with pytest.raises(ConnectionResetError):
            receiver.frame(b)
        sender.join()
    a, b = _pair()
    with a, b:
        a.sendall(_framed(b"y" * 10)[:3])  # a header, torn; nothing more comes
        receiver = FrameReceiver()
        receiver.deadline = time.monotonic() + 0.2
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            receiver.frame(b)
        assert time.monotonic() - started < 5


def _tls_pair(tmp_path: Path) -> tuple[ssl.SSLSocket, ssl.SSLSocket]:
    """A TLS connection over a socket pair (the cluster's own kind of certificate): sender, reader."""
    make_ca(tmp_path / "ca")
    server = issue(tmp_path / "ca", tmp_path, "broker", ips=["127.0.0.1"])
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(server.cert_file, server.key_file)
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.load_verify_locations(server.ca_file)
    a, b = socket.socketpair()
    served: list[ssl.SSLSocket] = []
    handshake = threading.Thread(target=lambda: served.append(sctx.wrap_socket(a, server_side=True)), daemon=True)
    handshake.start()
    reader = cctx.wrap_socket(b, server_hostname="127.0.0.1")
    handshake.join(10)
    return served[0], reader


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_what_came_is_read_past_the_deadline_and_only_nothing_times_out(tmp_path: Path, tls: bool) -> None:
    """A reader back late (its thread away in a call to a coordinator that did not answer) takes
    the answers that are waiting; it times out only when nothing came. Failing first: a
    TimeoutError with the answer in the socket, and the consumer read from the other replica
    with a warning every 5 s while every coordinator was stopped (stop 98)."""
    sender, reader = _tls_pair(tmp_path) if tls else socket.socketpair()  # buffers that hold both frames
    larger = _large(lean_read._RECV_BYTES + 100)  # past one receive: read into a buffer of its own
    with sender, reader:
        # (a Unix socket pair: once sendall returns, all of it is in the reader's buffer)
        sender.sendall(_framed(b"waiting") + _framed(larger))
        receiver = FrameReceiver()
        receiver.deadline = time.monotonic() - 1.0  # and the reader is late
        assert bytes(receiver.frame(reader)) == b"waiting"
        assert bytes(receiver.frame(reader)) == larger
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no answer within the stream's deadline"):
            receiver.frame(reader)
        assert time.monotonic() - started < 1.0  # past the deadline: no wait
