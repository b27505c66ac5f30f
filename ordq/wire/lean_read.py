"""A consumer's Read streams on a master's lean link (issue 39): the client's end, blocking, for
the one thread that reads (``StreamedReads``, wire/client.py). The master's end is
broker_group/lean_produce.py (the same link as the produce streams: a hello with ``read``).

Why: over gRPC every Read answer cost the master's event loop more than the rest of a batch
(py-spy at 2,000 msgs/s: ~40 % of its loop's Python time was the Read stream's gRPC write),
and the consumer one gRPC message and a hand-off from gRPC's threads per answer.

Protocol (proto/ordq/wire/ordq.proto, ``ProduceLinkHello``/``ReadLinkAnswer``): after the hello
(token, ``read``) the client sends one ``FetchRequest`` per Read stream; the master answers it
with ``ReadLinkAnswer`` frames, as a gRPC Read call answers (each answer from where the last
ended, until an empty one, the sealed end or ``stream_ms``), then ``end``. A refusal (the kind
and fields of gRPC's ``ordq-error`` trailer) ends the link; it raises the same error as over
gRPC. So does every guard: the master serves each stream with the gRPC call's own code.

Guarantee: the same answers as the gRPC ``Read`` call, in order; every failure of the link is
BrokerUnavailable naming the master's gRPC address (the reader then tries the slave, as after a
failed gRPC stream); a stream not ended within its deadline (``STREAM_S`` + the wait + the
transport's RPC timeout) closes the link. A link that cannot be opened is not used for
``LINK_RETRY_S`` (the caller reads over gRPC meanwhile).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import TypeVar

from ordq.common.addresses import split_host_port
from ordq.common.errors import BrokerUnavailable, ConfigError
from ordq.common.security import Credentials
from ordq.common.tls_socket import wrap_owned
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import from_error_json
from ordq.wire.lean_frames import HEADER, frame, frame_length
from ordq.wire.lean_produce import ANSWER_LIMIT, CONNECT_TIMEOUT_S, REACH_TIMEOUT_S, tls_context

T = TypeVar("T")

LINK_RETRY_S = 30.0  # a link that could not be opened is tried again after this long
_RECV_BYTES = 1 << 16  # a frame's header and small frames; a large one goes to its own buffer


class LeanReadLink:
    """One connection to a master's lean link carrying Read streams, one after the other.
    ``open`` starts a stream, ``next_answer`` returns its next answer (None: it ended).
    Raises BrokerUnavailable (``address``: the master's gRPC address) when the link fails,
    or the master's typed refusal; either way the link is closed."""

    def __init__(self, link: str, address: str, creds: Credentials) -> None:
        """Connect (TCP within REACH_TIMEOUT_S, TLS within CONNECT_TIMEOUT_S) and say hello;
        OSError (ssl.SSLError, TimeoutError) when the link cannot be opened."""
        self.link, self.address = link, address
        host, port = split_host_port(link)
        host = host.strip("[]")
        sock = socket.create_connection((host, port), timeout=REACH_TIMEOUT_S)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            ctx = tls_context(creds, ssl.Purpose.SERVER_AUTH)
            if ctx is not None:
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock = wrap_owned(ctx, sock, host)
            sock.sendall(frame(pb.ProduceLinkHello(token=creds.token or "", read=True)))
        except BaseException:
            sock.close()
            raise
        self._sock: socket.socket | None = sock
        self._frames = FrameReceiver()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def open(self, req: pb.FetchRequest, deadline_s: float) -> None:
        """Start a Read stream with ``req``; its answers must come within ``deadline_s``."""
        self._frames.deadline = time.monotonic() + deadline_s

        def send(sock: socket.socket) -> None:
            sock.settimeout(deadline_s)  # a read past the last deadline left it non-blocking
            sock.sendall(frame(req))

        self._io(send)

    def next_answer(self) -> pb.FetchResponse | None:
        """The open stream's next answer; None when it ended (``open`` the next one)."""
        body = self._io(self._frames.frame)
        answer = pb.ReadLinkAnswer.FromString(body)
        if answer.error_json or answer.error_text:
            self.close()
            raise from_error_json(answer.error_json, answer.error_text, self.address)
        if answer.end:
            return None
        return answer.response

    def _io(self, step: Callable[[socket.socket], T]) -> T:
        sock = self._sock
        if sock is None:
            raise BrokerUnavailable(self.address, "the Read link is closed")
        try:
            return step(sock)
        except (OSError, ConfigError) as exc:  # ssl.SSLError and TimeoutError are OSErrors
            self.close()
            raise BrokerUnavailable(self.address, f"Read link {self.link}: {exc!r}") from exc

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


class FrameReceiver:
    """The frames (ordq/wire/lean_frames.py: a length, then the body) of one blocking
    connection, each read by ``deadline`` (monotonic). What TLS decrypts goes into buffers kept
    or made to size (``recv_into``): ``recv(n)`` allocated n bytes for each TLS record it
    returned (16 KiB at most), and with the copies after it that was a third of a pipelined
    consumer's time (stop 82, py-spy). A frame longer than what is buffered is read straight
    into a buffer of its own, its only copy on this side.

    Raises ConfigError for a frame longer than ``ANSWER_LIMIT`` (from its length, before its
    body is read), TimeoutError past the deadline, ConnectionResetError when the peer closed
    (mid-frame too), and the socket's OSErrors."""

    def __init__(self) -> None:
        self.deadline = 0.0
        self._buf = bytearray()  # what was received past the last frame
        self._scratch = memoryview(bytearray(_RECV_BYTES))  # what one recv_into takes, then appended to _buf

    def frame(self, sock: socket.socket) -> bytes | bytearray:
        """The next frame's body."""
        buf = self._buf
        while len(buf) < HEADER.size:
            buf += self._scratch[:self._recv_into(sock, self._scratch)]
        n = frame_length(buf, ANSWER_LIMIT, "Read answer")
        whole = HEADER.size + n
        if len(buf) >= whole:
            with memoryview(buf) as view:
                body = bytes(view[HEADER.size:whole])
            del buf[:whole]
            return body
        got = len(buf) - HEADER.size
        large = bytearray(n)
        with memoryview(large) as view:
            view[:got] = memoryview(buf)[HEADER.size:]
            buf.clear()
            while got < n:
                got += self._recv_into(sock, view[got:])
        return large

    def _recv_into(self, sock: socket.socket, into: memoryview) -> int:
        """Bytes received into ``into`` (at least one), by the deadline. Past it, what has
        already arrived is still taken: a reader that comes back late (its thread was away,
        e.g. in a call to a coordinator that did not answer) finds the broker's answers
        waiting; only a broker that sent nothing in time is a timeout."""
        left = self.deadline - time.monotonic()
        sock.settimeout(left if left > 0 else 0.0)  # 0: non-blocking, only what is there
        try:
            got = sock.recv_into(into)
        except (BlockingIOError, ssl.SSLWantReadError):
            raise TimeoutError("no answer within the stream's deadline") from None
        if not got:
            raise ConnectionResetError("the master closed the Read link")
        return got
