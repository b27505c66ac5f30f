"""A unary gRPC call made by hand over HTTP/2 (mutual TLS, or plaintext), whose request is
announced whole and written from one small buffer: the ``security-control-plane`` drill's huge
``Pop`` (drills/control_plane_attacks.py).

Why by hand (stop m): gRPC's Python client copies a request whole into a slice before it sends a
byte, holding the GIL: a 200 MiB queue name cost the attacker's process ~0.17 s of CPU and
~400 MiB of fresh memory a call, and at the placed attacker's ~0.05 core the copy held every
other thread of the process, its stop included, through the window and 3.6-6.1 s past its end.

What the server sees is what gRPC's client sends: the call's HEADERS, then DATA beginning with the
gRPC message prefix that announces the whole request's length (``length`` bytes of field
``field``), then as much of that body as the stream's flow-control window lets in, as the server
asks for it. The body's bytes come from one 16 KiB buffer: nothing of the request's size is held
here, and ``close`` ends a call in flight at once (its socket shut).

Guarantees: one call at a time per ``HugeCall`` (one connection, made by ``open`` or the first
call, reopened after it broke; a stream per call); ``call`` returns the answer's message bytes,
or raises ``CallEnded`` with the gRPC status and trailers of a refusal, ``DEADLINE_EXCEEDED`` at
its timeout, ``CANCELLED`` once ``close`` was called, ``UNAVAILABLE`` when the connection broke.
The answer's headers are read with the static HPACK table only: this client's SETTINGS give the
server's encoder no dynamic table, and gRPC writes no Huffman-coded text value (one would be told as ``?``).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterable

import grpc

from ordq.common.security import Credentials
from ordq.drills.neighbour import field_header

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 4, 5
CANCEL = 0x8  # RST_STREAM's error code for a call this side gave up
MAX_WINDOW = (1 << 31) - 1
CHUNK = 16 << 10  # the one buffer the body is written from; the default (and least) frame size
# RFC 7541, appendix A: the static table (index 1..61), "name=value" or a name with no value
# (accept-encoding's "gzip, deflate" without its space: a header gRPC never sends).
_STATIC_TEXT = (
    ":authority :method=GET :method=POST :path=/ :path=/index.html :scheme=http :scheme=https :status=200 "
    ":status=204 :status=206 :status=304 :status=400 :status=404 :status=500 accept-charset "
    "accept-encoding=gzip,deflate accept-language accept-ranges accept access-control-allow-origin age allow "
    "authorization cache-control content-disposition content-encoding content-language content-length "
    "content-location content-range content-type cookie date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified link location max-forwards "
    "proxy-authenticate proxy-authorization range referer refresh retry-after server set-cookie "
    "strict-transport-security transfer-encoding user-agent vary via www-authenticate")
STATIC = [(name, value) for name, _, value in (e.partition("=") for e in _STATIC_TEXT.split())]
RESET_STATUS = {0x7: grpc.StatusCode.UNAVAILABLE, CANCEL: grpc.StatusCode.CANCELLED}  # REFUSED_STREAM, CANCEL


class CallEnded(grpc.RpcError):
    """A hand-made call that ended without an answer: its gRPC status and trailers (read as
    ``grpc.Call``'s, for the drill's outcome of a refusal)."""

    def __init__(self, status: grpc.StatusCode, trailers: dict[str, str] | None = None, why: str = "") -> None:
        super().__init__(f"{status.name}: {why or (trailers or {}).get('grpc-message', '')}")
        self.status, self.trailers = status, dict(trailers or {})

    def code(self) -> grpc.StatusCode:
        return self.status

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.trailers.items())


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 5.1), ``first`` the prefix byte's high bits."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first | value])
    out, value = bytearray([first | top]), value - top
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*out, value])


def encode_headers(headers: Iterable[tuple[str, str]]) -> bytes:
    """Each header a literal field without indexing, its name and value as raw strings."""
    out = bytearray()
    for name, value in headers:
        out.append(0)
        for text in (name.encode(), value.encode()):
            out += _integer(len(text), 7) + text
    return bytes(out)


def _read_integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """HPACK's integer at ``block[at]`` with an N-bit prefix: (its value, where the next field begins)."""
    top = (1 << prefix_bits) - 1
    value, at = block[at] & top, at + 1
    if value < top:
        return value, at
    shift = 0
    while True:
        byte, at = block[at], at + 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _read_string(block: bytes, at: int) -> tuple[str, int]:
    huffman = bool(block[at] & 0x80)
    n, at = _read_integer(block, at, 7)
    return ("?" if huffman else block[at:at + n].decode("latin-1")), at + n


def decode_headers(block: bytes) -> list[tuple[str, str]]:
    """An HPACK header block, with the static table only (``SETTINGS_HEADER_TABLE_SIZE`` 0: no
    dynamic table; its size updates are read and skipped)."""
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(block):
        byte = block[at]
        if byte & 0x80:  # an indexed field
            index, at = _read_integer(block, at, 7)
            out.append(STATIC[index - 1])
            continue
        if byte & 0xE0 == 0x20:  # a dynamic table size update
            _size, at = _read_integer(block, at, 5)
            continue
        index, at = _read_integer(block, at, 6 if byte & 0x40 else 4)  # a literal, indexed or not
        if index:
            name = STATIC[index - 1][0]
        else:
            name, at = _read_string(block, at)
        value, at = _read_string(block, at)
        out.append((name, value))
    return out


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class HugeCall:
    """``call()``: a unary call of ``path`` at ``address`` whose request is ``length`` bytes of
    protobuf field ``field`` (a length-delimited one), written from one ``CHUNK`` buffer as the
    server's windows let it in (the module doc)."""

    def __init__(self, address: str, creds: Credentials, path: str, field: int, length: int) -> None:
        self.address, self.creds, self.path = address, creds, path
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        head = field_header(field, length)
        self.head = b"\x00" + struct.pack(">I", len(head) + length) + head  # gRPC's message prefix, then the field's
        self.total = len(self.head) + length
        self.chunk = b"a" * CHUNK
        self.pushed = 0  # body bytes written, over every call (what the server let in)
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._busy = False  # a call in flight
        self._next_stream = 1
        self._rx = bytearray()
        # HTTP/2's defaults until the server's SETTINGS and window updates say otherwise
        self._conn_window, self._initial_window, self._max_frame = 65535, 65535, CHUNK

    def close(self) -> None:
        """End the call in flight now (``CANCELLED``), and every later one; the socket is closed
        here, or by the call in flight as it ends (not under its feet)."""
        with self._lock:
            self._closed.set()
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
                if not self._busy:
                    self._drop()

    def open(self, timeout_s: float) -> None:
        """Connect now, the server's SETTINGS read and acknowledged (else the first call connects):
        a client whose connection outlives its calls (the drill's attacker, connected once before
        its first window) makes no handshake when its calls begin."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._closed.is_set() or self._sock is not None:
                return
            sock = self._connect(deadline)
            try:
                while True:
                    kind, flags, on, payload = self._read_frame(sock, deadline)
                    if kind == SETTINGS and not flags & ACK:
                        self._apply(payload)
                        sock.sendall(frame(SETTINGS, ACK, 0))
                        break
                    if kind == WINDOW_UPDATE and on == 0:
                        self._conn_window += struct.unpack(">I", payload)[0] & MAX_WINDOW
            except BaseException:
                with contextlib.suppress(OSError):
                    sock.close()
                raise
            self._sock = sock

    def _connect(self, deadline: float) -> socket.socket:
        host = self.host.strip("[]")
        raw = socket.create_connection((host, self.port), timeout=max(0.01, deadline - time.monotonic()))
        sock: socket.socket = raw
        if self.creds.ca_file is not None:
            ctx = ssl.create_default_context(cafile=self.creds.ca_file)
            if self.creds.cert_file is not None and self.creds.key_file is not None:
                ctx.load_cert_chain(self.creds.cert_file, self.creds.key_file)
            ctx.set_alpn_protocols(["h2"])
            sock = ctx.wrap_socket(raw, server_hostname=host)
        sock.settimeout(None)
        # No dynamic HPACK table (the answer is read with the static one), no push; this side
        # takes any answer without a window update.
        settings = struct.pack(">HIHIHI", HEADER_TABLE_SIZE, 0, ENABLE_PUSH, 0, INITIAL_WINDOW_SIZE, MAX_WINDOW)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings)
                     + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))
        self._rx.clear()
        self._next_stream = 1
        self._conn_window, self._initial_window, self._max_frame = 65535, 65535, CHUNK
        return sock

    def _read_frame(self, sock: socket.socket, deadline: float) -> tuple[int, int, int, bytes]:
        """The next frame (kind, flags, stream, payload); ``DEADLINE_EXCEEDED`` past ``deadline``."""
        while True:
            if len(self._rx) >= 9:
                n = int.from_bytes(self._rx[:3], "big")
                if len(self._rx) >= 9 + n:
                    kind, flags = self._rx[3], self._rx[4]
                    stream = int.from_bytes(self._rx[5:9], "big") & MAX_WINDOW
                    payload = bytes(self._rx[9:9 + n])
                    del self._rx[:9 + n]
                    return kind, flags, stream, payload
            pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
            if not pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallEnded(grpc.StatusCode.DEADLINE_EXCEEDED, why="the call's deadline")
                readable, _, _ = select.select([sock], [], [], left)
                if not readable:
                    continue
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the connection was closed")
            self._rx += data

    def __call__(self, _request: object = None, *, timeout: float,
                 metadata: Iterable[tuple[str, str]] = ()) -> bytes:
        """One call (``_request`` ignored: the request is the one announced at construction)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed.is_set():
                raise CallEnded(grpc.StatusCode.CANCELLED, why="closed")
            self._busy = True
        try:
            if self._sock is None:
                self._sock = self._connect(deadline)
            return self._call(self._sock, deadline, metadata)
        except CallEnded:
            raise
        except (OSError, ValueError, ConnectionError) as exc:
            self._drop()
            status = grpc.StatusCode.CANCELLED if self._closed.is_set() else grpc.StatusCode.UNAVAILABLE
            raise CallEnded(status, why=f"{type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self._busy = False
                if self._closed.is_set():
                    self._drop()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _call(self, sock: socket.socket, deadline: float, metadata: Iterable[tuple[str, str]]) -> bytes:
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        scheme = "https" if self.creds.ca_file is not None else "http"
        ms = max(1, int((deadline - time.monotonic()) * 1000))
        headers = [(":method", "POST"), (":scheme", scheme), (":path", self.path), (":authority", self.address),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", f"{ms}m"),
                   *metadata]
        sock.sendall(frame(HEADERS, END_HEADERS, stream, encode_headers(headers)))
        window, sent = self._initial_window, 0
        got: list[tuple[str, str]] = []
        block, answer, finished = b"", bytearray(), False
        try:
            while True:
                # As much of the body as both windows let in, a frame at a time from one buffer.
                while sent < self.total and min(window, self._conn_window) > 0:
                    n = min(window, self._conn_window, self._max_frame, self.total - sent)
                    body = self.head[sent:sent + n]
                    body += self.chunk[:n - len(body)]
                    sent += n
                    sock.sendall(frame(DATA, END_STREAM if sent == self.total else 0, stream, body))
                    window, self._conn_window = window - n, self._conn_window - n
                    self.pushed += n
                kind, flags, on, payload = self._read_frame(sock, deadline)
                if kind == SETTINGS and not flags & ACK:
                    window += self._apply(payload)
                    sock.sendall(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    sock.sendall(frame(PING, ACK, 0, payload))
                elif kind == WINDOW_UPDATE:
                    grow = struct.unpack(">I", payload)[0] & MAX_WINDOW
                    if on == 0:
                        self._conn_window += grow
                    elif on == stream:
                        window += grow
                elif kind == GOAWAY and stream > struct.unpack(">I", payload[:4])[0] & MAX_WINDOW:
                    raise ConnectionError("GOAWAY before this call's stream")
                elif on != stream:
                    continue  # an earlier call's late frames
                elif kind in (HEADERS, CONTINUATION):
                    block += _unpadded(kind, flags, payload)
                    finished = finished or (kind == HEADERS and bool(flags & END_STREAM))
                    if flags & END_HEADERS:
                        got += decode_headers(block)
                        block = b""
                        if finished:
                            break
                elif kind == DATA:
                    answer += _unpadded(kind, flags, payload)
                    if flags & END_STREAM:
                        break
                elif kind == RST_STREAM:
                    if any(k == "grpc-status" for k, _ in got):  # answered, then reset: the answer stands
                        break
                    code = struct.unpack(">I", payload)[0]
                    raise CallEnded(RESET_STATUS.get(code, grpc.StatusCode.INTERNAL), why=f"RST_STREAM {code}")
        except CallEnded:
            with contextlib.suppress(OSError):  # the server is told this side gave up
                sock.sendall(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
            raise
        if sent < self.total:  # answered before its whole body: the rest is not sent
            with contextlib.suppress(OSError):
                sock.sendall(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
        return _answer(dict(got), bytes(answer))

    def _apply(self, payload: bytes) -> int:
        """The server's SETTINGS taken; returns how much its new initial window grew a stream's."""
        grew = 0
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack(">HI", payload[i:i + 6])
            if key == INITIAL_WINDOW_SIZE:
                grew, self._initial_window = value - self._initial_window, value
            elif key == MAX_FRAME_SIZE:
                self._max_frame = min(value, CHUNK)
        return grew


_STATUS = {s.value[0]: s for s in grpc.StatusCode}


def _answer(headers: dict[str, str], answer: bytes) -> bytes:
    """The answer's message, or ``CallEnded`` with its status and trailers."""
    status = headers.get("grpc-status", "")
    if not status.isdigit():
        raise CallEnded(grpc.StatusCode.UNKNOWN, headers, why=f"no grpc-status (:status {headers.get(':status')})")
    if int(status):
        raise CallEnded(_STATUS.get(int(status), grpc.StatusCode.UNKNOWN), headers)
    return answer[5:]


def _unpadded(kind: int, flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding (and a HEADERS frame's priority fields)."""
    if flags & PADDED:
        payload = payload[1:len(payload) - payload[0]]
    if kind == HEADERS and flags & PRIORITY_FLAG:
        payload = payload[5:]
    return payload
