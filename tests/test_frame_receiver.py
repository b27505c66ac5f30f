"""A blocking connection's frames (ordq/wire/lean_read.py ``FrameReceiver``), over a real socket
pair: every frame comes out whole and in order however the sender's bytes are split (frames
shorter and longer than one receive, headers torn across sends); a frame past the limit is
refused from its length; a peer gone mid-frame and a deadline passed raise."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
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
