"""Segment log: append-only, CRC-checked record batches for one (queue, seg) on one replica.

Guarantee: a batch is served (``read``) only after ``sync()`` made it durable, and only whole,
CRC-valid batches are ever stored, served or recovered. On open, a torn tail is truncated and
counted; a bad batch with a valid batch after it raises ``CorruptLog`` — never skipped.

Rules:
- This module owns the byte format of a batch and the file ``segment.log`` of one segment. It
  does not own any metadata (fenced epoch, sealed state, LAC): the broker keeps those in its
  own file beside ``segment.log``. It never talks to the network, ZooKeeper or a clock.
- The bytes of an encoded batch are the same on the wire and on disk: the producer encodes a
  batch once (``encode_batch``), the master stamps ``first_offset`` (outside the CRC, like
  Kafka's base offset, because only the master knows it), appends the bytes verbatim and
  forwards the same bytes to the slave.
- Nothing is durable until ``sync()`` returned; ``synced_end`` is the durable message count.
- Not thread-safe: the broker serialises access to one ``SegmentLog``.

Batch layout (all integers little-endian; full table in docs/LOG_FORMAT.md)::

    prefix (16 bytes, not CRC-covered except through the checks below)
        length u32         total bytes of the batch, prefix included
        crc u32            zlib.crc32 (CRC-32/ISO-HDLC, the zip/PNG one) of the body
        first_offset u64   stamped by the master; checked against the running offset on open
    body (CRC-covered)
        magic u8 (0xA1) | flags u8 (0) | epoch u64 | first_seq u64 | count u32 | messages...
    message
        timestamp_us i64 | key_len i32 (-1 = no key) | headers_len u32 | payload_len u32 |
        key | headers | payload
    headers (headers_len bytes) = repeated: name_len u16 | name (utf-8) | value_len u32 | value

The four length fields of a message come first so one ``struct.unpack_from`` reads them all
(the hot path of every producer and consumer is one pack/unpack per message).

Speed: encode and decode do one ``Struct`` call and a few slices per message, one
``b"".join`` and one ``zlib.crc32`` (C, several GB/s) per batch. ``Message`` is a NamedTuple,
not an attrs class: building one costs a third of a frozen attrs instance, and the consumer
builds one per message. Numbers: docs/BENCHMARKS.md ("Segment log").
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from bisect import bisect_right
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

import attrs

from ordq.common.errors import ClosedError, CorruptLog, DiskFull, SegmentNotFound
from ordq.coordinator.paths import check_name

SEGMENT_FILE = "segment.log"
MAGIC = 0xA1  # format version 1; any other value is corruption (or a newer format)
WIRE = "<wire>"  # the ``path`` of a CorruptLog raised for a buffer that is not a file
MAX_BATCH_BYTES = (1 << 32) - 1  # the length field is a u32

_PREFIX = struct.Struct("<IIQ")  # length, crc, first_offset
_BODY_HEAD = struct.Struct("<BBQQI")  # magic, flags, epoch, first_seq, count
_HEAD = struct.Struct("<IIQBBQQI")  # prefix + body head, read in one call
_MSG = struct.Struct("<qiII")  # timestamp_us, key_len, headers_len, payload_len
_OFFSET = struct.Struct("<Q")
_LEN = struct.Struct("<I")  # the batch length field alone
_HDR_NAME = struct.Struct("<H")
_HDR_VALUE = struct.Struct("<I")

PREFIX_BYTES = _PREFIX.size  # 16: where the CRC-covered body starts
HEAD_BYTES = _HEAD.size  # 38: smallest possible batch (count 0 is still invalid)
MESSAGE_OVERHEAD_BYTES = _MSG.size  # 20 per message, plus key, headers and payload
_OFFSET_AT = 8  # byte position of first_offset in the prefix

_tuple_new = tuple.__new__

BytesLike = bytes | bytearray | memoryview  # what the parsing functions accept


class Message(NamedTuple):
    """One message as produced and delivered. Immutable; compares and hashes by value.

    ``key`` None means "no key" (distinct from ``b""``); ``headers`` is a tuple of
    (name, value) pairs, names are str (utf-8 on the wire, at most 65,535 bytes), order and
    duplicates are kept.
    """

    payload: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_us: int = 0


@attrs.frozen
class BatchHeader:
    length: int  # total bytes of the encoded batch, header included
    first_offset: int
    epoch: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.count


# -- encoding -------------------------------------------------------------------------------


def _encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ValueError(f"header name of {len(raw)} bytes exceeds 65535")
        parts.append(_HDR_NAME.pack(len(raw)))
        parts.append(raw)
        parts.append(_HDR_VALUE.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def encode_batch(messages: Sequence[Message], *, epoch: int, first_seq: int) -> bytes:
    """Encode messages as one batch with ``first_offset`` 0 (the master stamps the real one).

    Args:
        messages: at least one message, in seq order (message ``i`` gets ``first_seq + i``).
        epoch: the producer epoch the batch is written under.
        first_seq: seq of the first message.

    Returns the batch bytes, CRC (``zlib.crc32``) computed over the body. Raises ValueError for
    an empty batch, a batch over 4 GiB or a header name over 65,535 bytes; struct.error or
    TypeError for fields of the wrong type or range (no per-message type checks: speed).
    """
    if not messages:
        raise ValueError("a batch holds at least one message")
    parts: list[bytes] = [_BODY_HEAD.pack(MAGIC, 0, epoch, first_seq, len(messages))]
    append = parts.append
    pack = _MSG.pack
    for m in messages:
        payload, key, headers, ts = m
        if headers:
            hdr = _encode_headers(headers)
            if key is None:
                append(pack(ts, -1, len(hdr), len(payload)))
            else:
                append(pack(ts, len(key), len(hdr), len(payload)))
                append(key)
            append(hdr)
        elif key is None:
            append(pack(ts, -1, 0, len(payload)))
        else:
            append(pack(ts, len(key), 0, len(payload)))
            append(key)
        append(payload)
    body = b"".join(parts)
    length = PREFIX_BYTES + len(body)
    if length > MAX_BATCH_BYTES:
        raise ValueError(f"batch of {length} bytes exceeds {MAX_BATCH_BYTES}")
    return _PREFIX.pack(length, zlib.crc32(body), 0) + body


def stamp_offset(batch: bytes, first_offset: int) -> bytes:
    """Return the batch with ``first_offset`` set (not covered by the CRC, so it stays valid).

    Only the prefix is looked at (length and magic); the CRC is checked by ``append``.
    """
    if len(batch) < HEAD_BYTES or batch[PREFIX_BYTES] != MAGIC:
        raise CorruptLog(WIRE, 0, "not a batch (too short or bad magic)")
    if first_offset < 0:
        raise ValueError(f"first_offset must be >= 0, got {first_offset}")
    if _OFFSET.unpack_from(batch, _OFFSET_AT)[0] == first_offset:
        return batch
    view = memoryview(batch)
    return b"".join((view[:_OFFSET_AT], _OFFSET.pack(first_offset), view[PREFIX_BYTES:]))


def _header_problem(length: int, magic: int, flags: int, count: int, available: int) -> str | None:
    """Why a batch prefix cannot be a valid batch, or None. ``available``: bytes from its start."""
    if magic != MAGIC:
        return f"bad magic 0x{magic:02x}"
    if flags != 0:
        return f"unknown flags 0x{flags:02x}"
    if count < 1:
        return "batch of 0 messages"
    if length < HEAD_BYTES + MESSAGE_OVERHEAD_BYTES * count:
        return f"length {length} too small for {count} messages"
    if length > available:
        return f"short batch: length {length}, only {available} bytes present"
    return None


def parse_header(batch: BytesLike, *, path: str = WIRE, position: int = 0, verify_crc: bool = True) -> BatchHeader:
    """Check length, magic and CRC of one encoded batch and return its header.

    ``batch`` must be exactly one batch (any bytes-like object). Raises CorruptLog (with
    ``path``/``position`` for the message) when it is not. Message structure is not walked
    here (``decode_batch`` and ``check_messages`` do that). ``verify_crc=False`` skips only
    the CRC (~0.35 µs per 1 KiB message), for bytes whose CRC the caller checked already.
    """
    if len(batch) < HEAD_BYTES:
        raise CorruptLog(path, position, f"short batch: {len(batch)} bytes")
    length, crc, first_offset, magic, flags, epoch, first_seq, count = _HEAD.unpack_from(batch)
    problem = _header_problem(length, magic, flags, count, len(batch))
    if problem is None and length != len(batch):
        problem = f"length field {length} but {len(batch)} bytes given"
    if problem is None and verify_crc:
        with memoryview(batch) as view:
            if zlib.crc32(view[PREFIX_BYTES:]) != crc:
                problem = "CRC mismatch"
    if problem is not None:
        raise CorruptLog(path, position, problem)
    return BatchHeader(length=length, first_offset=first_offset, epoch=epoch, first_seq=first_seq, count=count)


def _decode_headers(raw: bytes, path: str, position: int) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    pos, end = 0, len(raw)
    try:
        while pos < end:
            (nlen,) = _HDR_NAME.unpack_from(raw, pos)
            pos += 2
            name = raw[pos : pos + nlen].decode("utf-8")
            pos += nlen
            (vlen,) = _HDR_VALUE.unpack_from(raw, pos)
            pos += 4
            out.append((name, raw[pos : pos + vlen]))
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptLog(path, position, f"bad headers: {exc}") from exc
    if pos != end:
        raise CorruptLog(path, position, "headers overrun their length")
    return tuple(out)


def _decode_messages(buf: bytes, header: BatchHeader, path: str, position: int) -> list[Message]:
    # Hot path (every consumer decodes every message): one unpack_from, two slices and one
    # tuple per message; the common shapes (no headers) take a branch without extra work.
    out: list[Message] = []
    append = out.append
    unpack = _MSG.unpack_from
    new = _tuple_new
    pos = HEAD_BYTES
    try:
        for _ in range(header.count):
            ts, klen, hlen, plen = unpack(buf, pos)
            start = pos + 20
            if not hlen and klen >= 0:
                kend = start + klen
                pos = kend + plen
                append(new(Message, (buf[kend:pos], buf[start:kend], (), ts)))
            elif not hlen and klen == -1:
                pos = start + plen
                append(new(Message, (buf[start:pos], None, (), ts)))
            else:
                pos = start
                key: bytes | None = None
                if klen >= 0:
                    key = buf[pos : pos + klen]
                    pos += klen
                elif klen != -1:
                    raise CorruptLog(path, position, f"bad key length {klen}")
                headers = _decode_headers(buf[pos : pos + hlen], path, position)
                pos += hlen
                append(new(Message, (buf[pos : pos + plen], key, headers, ts)))
                pos += plen
    except struct.error as exc:
        raise CorruptLog(path, position, f"messages overrun the batch: {exc}") from exc
    if pos != header.length:
        raise CorruptLog(path, position, f"messages end at byte {pos} of a {header.length}-byte batch")
    return out


def decode_batch(batch: BytesLike, *, path: str = WIRE, position: int = 0) -> tuple[BatchHeader, list[Message]]:
    """Decode one encoded batch (CRC and structure checked) into its header and messages.

    Accepts any bytes-like object (a memoryview into a file buffer is copied once). Raises
    CorruptLog naming ``path``/``position`` when the batch is not exactly one valid batch.
    """
    if not isinstance(batch, bytes):
        batch = bytes(batch)
    header = parse_header(batch, path=path, position=position)
    return header, _decode_messages(batch, header, path, position)


def decode_messages(batch: bytes, header: BatchHeader, *, path: str = WIRE, position: int = 0) -> list[Message]:
    """The messages of a batch ``parse_header`` checked already (a reader that looks at the
    header first and decodes only the batches it wants)."""
    return _decode_messages(batch, header, path, position)


def message_size(payload: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
    """A message's size as a queue's ``max_message_bytes`` counts it: its key, its headers as
    stored (each: 6 bytes of lengths, the UTF-8 name, the value) and its payload; the same
    number ``largest_message`` reads back from a batch. Not counted: the fixed 20-byte record
    header every message has."""
    size = len(payload) + (len(key) if key else 0)
    if headers:
        size += sum(6 + len(name.encode("utf-8")) + len(value) for name, value in headers)
    return size


def largest_message(batch: BytesLike) -> int:
    """The largest ``message_size`` in a batch that ``check_messages`` accepted (a walk over
    the record headers only)."""
    header = parse_header(batch)
    unpack = _MSG.unpack_from
    pos = HEAD_BYTES
    largest = 0
    for _ in range(header.count):
        _, klen, hlen, plen = unpack(batch, pos)
        size = (klen if klen > 0 else 0) + hlen + plen
        largest = max(largest, size)
        pos += 20 + size
    return largest


def check_messages(batch: BytesLike, *, path: str = WIRE, position: int = 0) -> BatchHeader:
    """``parse_header`` plus a walk over the message lengths (no Message objects built).

    For a receiver that wants to refuse a structurally broken batch whose CRC is valid (a
    foreign or buggy encoder) before storing it. Costs about one ``unpack_from`` per message.
    """
    header = parse_header(batch, path=path, position=position)
    unpack = _MSG.unpack_from
    pos = HEAD_BYTES
    try:
        for _ in range(header.count):
            _, klen, hlen, plen = unpack(batch, pos)
            if klen < -1:
                raise CorruptLog(path, position, f"bad key length {klen}")
            pos += 20 + (klen if klen > 0 else 0) + hlen + plen
    except struct.error as exc:
        raise CorruptLog(path, position, f"messages overrun the batch: {exc}") from exc
    if pos != header.length:
        raise CorruptLog(path, position, f"messages end at byte {pos} of a {header.length}-byte batch")
    return header


def split_batches(buf: BytesLike, *, path: str = WIRE) -> list[bytes]:
    """Split a buffer of concatenated complete batches into single batches (CRC checked).

    Works on any bytes-like object (bytes read from a segment file, a memoryview, a
    bytearray); returns ``bytes``. Raises CorruptLog at the first batch that is short, has a bad
    length/magic/CRC, or at trailing bytes that are not a whole batch. For a file that may
    have a torn tail use ``iter_file_batches`` instead.
    """
    out: list[bytes] = []
    size = len(buf)
    pos = 0
    with memoryview(buf) as view:
        while pos < size:
            if size - pos < HEAD_BYTES:
                raise CorruptLog(path, pos, f"short batch: {size - pos} trailing bytes")
            (length,) = _LEN.unpack_from(view, pos)
            if length < HEAD_BYTES or length > size - pos:
                raise CorruptLog(path, pos, f"bad length {length} ({size - pos} bytes left)")
            raw = view[pos : pos + length].tobytes()
            parse_header(raw, path=path, position=pos)
            out.append(raw)
            pos += length
    return out


# -- scanning a file ------------------------------------------------------------------------

_WINDOW_BYTES = 1 << 20  # read-ahead of the scan; a bigger batch is read in one piece
_SEARCH_CHUNK_BYTES = 1 << 24  # the follow-on search reads the rest of the file in these


def _pread_full(fd: int, n: int, pos: int) -> bytes:
    """Up to ``n`` bytes at ``pos``; fewer only at the end of the file (which may have shrunk)."""
    data = os.pread(fd, n, pos)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Window:
    """Sequential reads of a file through a read-ahead buffer, with pread (not mmap: a reader
    outside the broker must survive the broker truncating the file under it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.start = 0
        self.buf = b""

    def get(self, pos: int, n: int) -> bytes:
        """``n`` bytes at ``pos``, or fewer at the end of the file."""
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            self.buf = _pread_full(self.fd, max(n, _WINDOW_BYTES), pos)
            self.start, off = pos, 0
        return self.buf[off : off + n]


def _valid_batch(raw: bytes, available: int) -> BatchHeader | None:
    """The header of ``raw`` if it starts with a self-consistent batch (first_offset not
    checked). ``raw`` holds at least the whole batch, or everything up to the end of file."""
    if len(raw) < HEAD_BYTES:
        return None
    length, crc, first_offset, magic, flags, epoch, first_seq, count = _HEAD.unpack_from(raw)
    if _header_problem(length, magic, flags, count, min(available, len(raw))) is not None:
        return None
    with memoryview(raw) as view:
        if zlib.crc32(view[PREFIX_BYTES:length]) != crc:
            return None
    return BatchHeader(length=length, first_offset=first_offset, epoch=epoch, first_seq=first_seq, count=count)


def _find_valid_batch(fd: int, start: int, size: int) -> int | None:
    """Position of the first self-consistent batch starting at or after ``start``, or None.

    Candidates are the positions whose magic byte matches (``bytes.find``, in C: ~1 in 256
    bytes of random data, none in zero-filled blocks); a candidate is read and CRC-checked
    only if its header is plausible. Runs only after a bad batch was found.
    """
    magic = bytes((MAGIC,))
    chunk_at = start
    while chunk_at < size:
        # The chunk overlaps the next one by a header, so a candidate starting in this chunk
        # is always seen whole enough to judge its header.
        chunk = _pread_full(fd, min(_SEARCH_CHUNK_BYTES + HEAD_BYTES, size - chunk_at), chunk_at)
        if len(chunk) < HEAD_BYTES:
            return None
        i = chunk.find(magic, PREFIX_BYTES)
        while i != -1 and i - PREFIX_BYTES < _SEARCH_CHUNK_BYTES:
            at = chunk_at + i - PREFIX_BYTES
            head = chunk[i - PREFIX_BYTES : i - PREFIX_BYTES + HEAD_BYTES]
            if len(head) == HEAD_BYTES:
                length, _, _, m, flags, _, _, count = _HEAD.unpack_from(head)
                if _header_problem(length, m, flags, count, size - at) is None:
                    raw = chunk[i - PREFIX_BYTES : i - PREFIX_BYTES + length]
                    if len(raw) < length:
                        raw = _pread_full(fd, length, at)
                    if _valid_batch(raw, size - at) is not None:
                        return at
            i = chunk.find(magic, i + 1)
        chunk_at += _SEARCH_CHUNK_BYTES
    return None


def _scan(fd: int, size: int, path: str) -> Generator[tuple[int, BatchHeader, bytes], None, int]:
    """Yield (position, header, raw batch) of every valid batch of a segment file from its
    start; return the byte position where the valid batches end (== size unless torn).

    The rule that tells a torn tail from corruption: at the first position ``p`` where no
    valid batch starts (short prefix, bad length/magic/flags/count, batch running past the
    end of the file, bad CRC, or a ``first_offset`` that does not continue the previous
    batch), search every later position for a self-consistent batch (magic, plausible
    length within the file, CRC). If one exists, the bad bytes are followed by data that was
    written after them: that is corruption in the middle, raise CorruptLog. If none exists,
    everything from ``p`` is a torn tail (an append that did not complete before a crash).
    The length field is never trusted to find what follows: a corrupt length could point
    past the end of the file and make a middle batch look like a short last one.
    """
    window = _Window(fd)
    pos = 0
    expected = 0
    while pos < size:
        head = window.get(pos, HEAD_BYTES)
        header = None
        raw = b""
        if len(head) == HEAD_BYTES:
            length, _, _, magic, flags, _, _, count = _HEAD.unpack_from(head)
            if _header_problem(length, magic, flags, count, size - pos) is None:  # before reading `length` bytes
                raw = window.get(pos, length)
                header = _valid_batch(raw, size - pos)
        if header is not None and header.first_offset == expected:
            yield pos, header, raw
            expected += header.count
            pos += header.length
            continue
        following = _find_valid_batch(fd, pos + 1, size)
        if following is None:
            return pos
        if header is not None:
            detail = f"first_offset {header.first_offset} where {expected} was expected"
        elif len(head) < HEAD_BYTES:
            detail = f"short batch ({len(head)} bytes)"
        else:
            length, _, _, magic, flags, _, _, count = _HEAD.unpack_from(head)
            detail = _header_problem(length, magic, flags, count, size - pos) or "CRC mismatch"
        raise CorruptLog(path, pos, f"{detail}, yet a valid batch follows at byte {following}")
    return pos


def iter_file_batches(path: str | os.PathLike[str]) -> Iterator[tuple[BatchHeader, list[Message]]]:
    """Read a ``segment.log`` (or any file of batches) outside the broker, batch by batch.

    Yields (header, messages) in offset order. Stops quietly at a torn tail (the file may be
    written to right now by a live broker: a batch being appended looks like one); raises
    CorruptLog at a bad batch that has a valid batch after it, after yielding the batches
    before it. Reads with pread through a 1 MiB window, so memory does not grow with the
    file, and a broker truncating the file meanwhile only shortens what is read.
    Raises FileNotFoundError if there is no such file.
    """
    name = os.fspath(path)
    with open(name, "rb") as f:
        fd = f.fileno()
        for pos, header, raw in _scan(fd, os.fstat(fd).st_size, name):
            yield header, _decode_messages(raw, header, name, pos)


def parse_segment_path(path: str | os.PathLike[str]) -> tuple[str, int]:
    """(queue, seg) of ``<data>/<queue>/<seg:012d>/segment.log`` or of its folder."""
    p = Path(path)
    if p.name == SEGMENT_FILE:
        p = p.parent
    if not (len(p.name) == 12 and p.name.isdigit()):
        raise ValueError(f"{path} is not a segment folder <data>/<queue>/<seg:012d>")
    return p.parent.name, int(p.name)


# -- the log --------------------------------------------------------------------------------


@attrs.frozen
class Written:
    """Batches written by ``SegmentLog.begin_sync``, not yet fdatasynced."""

    fd: int
    size: int


@attrs.frozen
class RecoveryReport:
    batches: int
    messages: int
    truncated_bytes: int  # torn tail removed on open


@attrs.frozen
class LogStatistics:
    end: int
    synced_end: int
    batches: int
    file_bytes: int  # synced bytes in segment.log
    buffered_bytes: int  # appended, not yet synced
    syncs: int
    synced_batches: int  # batches made durable by sync() since open
    recovery: RecoveryReport


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentLog:
    """One (queue, seg) on one replica. Not thread-safe: the broker serialises access.

    Build it with ``SegmentLog.open``. Offsets are message positions from 0; ``end`` counts
    appended messages, ``synced_end`` durable ones. ``read`` never serves past ``synced_end``.
    """

    path: Path
    end: int  # next offset to be assigned (appended, maybe not yet synced)
    synced_end: int  # messages durable on this replica
    first_seq: int | None
    last_seq: int | None  # seq of the last appended message
    recovery: RecoveryReport

    def __init__(self, path: Path, fd: int, recovery: RecoveryReport) -> None:
        # Private: use SegmentLog.open. One entry per batch, in offset order:
        self._offsets: list[int] = []  # first_offset
        self._positions: list[int] = []  # byte position in the file
        self._seqs: list[int] = []  # first_seq
        self._buffer: list[bytes] = []  # appended batches not yet written
        self._buffered_bytes = 0
        self._synced_bytes = 0  # file length covered by sync()
        self._fd: int | None = fd
        self._write_error: OSError | None = None  # set by a failed write other than "no space"
        self._syncs = 0
        self._synced_batches = 0
        self.path = path
        self.end = 0
        self.synced_end = 0
        self.first_seq = None
        self.last_seq = None
        self.recovery = recovery

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, queue: str, seg: int, *, create: bool = False) -> SegmentLog:
        """Open the log of (queue, seg) under the data directory ``directory``.

        Scans the whole file: every batch's CRC and first_offset are checked. A torn tail is
        truncated (durably) and counted in ``recovery.truncated_bytes``. With ``create`` a
        missing segment is created empty (folders fsynced); without it, SegmentNotFound.

        Raises:
            SegmentNotFound: no ``segment.log`` and not ``create``.
            CorruptLog: a bad batch with a valid batch after it (see ``_scan`` for the rule);
                the file is left untouched for inspection or repair from the peer.
            InvalidName: ``queue`` is not a valid queue name.
        """
        check_name("queue", queue)
        if seg < 0:
            raise ValueError(f"segment id must be >= 0, got {seg}")
        folder = segment_dir(Path(directory), queue, seg)
        path = folder / SEGMENT_FILE
        if create and not path.exists():
            private_dir(folder)
            # Messages are the users' data: readable by the broker's user only (the umask can
            # only take bits away from 0600).
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            # Make the new file's name durable: a synced batch in a file whose directory
            # entry was lost would be lost with it.
            for d in (folder, folder.parent, folder.parent.parent):
                _fsync_dir(d)
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise SegmentNotFound(queue, seg) from exc
        try:
            return cls._recover(path, fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _recover(cls, path: Path, fd: int) -> SegmentLog:
        size = os.fstat(fd).st_size
        log = cls(path, fd, RecoveryReport(batches=0, messages=0, truncated_bytes=0))
        scan = _scan(fd, size, str(path))
        while True:
            try:
                pos, header, _ = next(scan)
            except StopIteration as stop:
                valid_end: int = stop.value
                break
            log._index(pos, header)
        if valid_end < size:
            os.ftruncate(fd, valid_end)
            os.fdatasync(fd)
        log._synced_bytes = valid_end
        log.synced_end = log.end
        log.recovery = RecoveryReport(batches=len(log._offsets), messages=log.end, truncated_bytes=size - valid_end)
        return log

    @property
    def synced_bytes(self) -> int:
        """Bytes of the file that are synced: what this segment takes on disk."""
        return self._synced_bytes

    def _index(self, pos: int, header: BatchHeader) -> None:
        self._offsets.append(header.first_offset)
        self._positions.append(pos)
        self._seqs.append(header.first_seq)
        if self.first_seq is None:
            self.first_seq = header.first_seq
        self.end = header.first_offset + header.count
        self.last_seq = header.first_seq + header.count - 1

    def _require_fd(self) -> int:
        if self._fd is None:
            raise ClosedError(f"segment log {self.path} is closed")
        return self._fd

    def _require_writable(self) -> int:
        fd = self._require_fd()
        if self._write_error is not None:
            err = self._write_error
            raise OSError(err.errno, f"{self.path}: writes refused after an I/O error ({err}); reopen to rescan")
        return fd

    # -- writing ----------------------------------------------------------------------------

    def append(self, batch: BytesLike, *, check_structure: bool = False, verify_crc: bool = True) -> BatchHeader:
        """Append one batch (already offset-stamped to ``end``); buffered until sync().

        The CRC and header are checked; with ``check_structure`` the message lengths are
        walked too (``check_messages``), which refuses a CRC-valid batch from a broken
        encoder at ~one unpack per message. ``verify_crc=False`` skips the CRC (the header is
        still checked) for a caller that already ran ``parse_header``/``check_messages`` on
        these bytes: ``stamp_offset`` does not change what the CRC covers. Reads do not see
        the batch before sync().

        Raises:
            CorruptLog: bad length/magic/CRC (path ``<wire>``); nothing is appended.
            ValueError: ``first_offset`` is not ``end``.
            ClosedError: after close().
        """
        self._require_writable()
        header = check_messages(batch) if check_structure else parse_header(batch, verify_crc=verify_crc)
        if header.first_offset != self.end:
            raise ValueError(f"{self.path}: batch first_offset {header.first_offset} != end {self.end}")
        if not isinstance(batch, bytes):
            batch = bytes(batch)
        self._index(self._synced_bytes + self._buffered_bytes, header)
        self._buffer.append(batch)
        self._buffered_bytes += header.length
        return header

    def sync(self) -> int:
        """Write every buffered batch with one write and ``fdatasync``; return the new
        ``synced_end``. A no-op (no syscall) when nothing is buffered.

        Raises:
            DiskFull: ENOSPC/EDQUOT from the write or the fdatasync. Every unsynced batch is
                dropped (``end`` goes back to ``synced_end``) and the file is truncated back
                to the synced length, so nothing half-written is ever read or recovered. The
                log stays usable: append again once there is space.
            OSError: any other I/O error. The unsynced batches are dropped the same way; reads
                of the synced prefix go on, but every later append/sync/truncate raises
                OSError until the log is reopened (and rescanned): after a failed fdatasync
                the kernel may have dropped dirty pages and will not report it again
                (PostgreSQL's "fsyncgate"), so the tail of the file is no longer trusted.
        """
        written = self.begin_sync()
        if written is None:
            return self.synced_end
        try:
            os.fdatasync(written.fd)
        except OSError as exc:
            return self.end_sync(written, exc)
        return self.end_sync(written)

    def begin_sync(self) -> Written | None:
        """The first half of ``sync()``: write every buffered batch (one ``pwrite``), not yet
        durable and not yet readable; None when nothing is buffered. The caller then runs
        ``os.fdatasync(written.fd)`` — without holding its lock, so reads of the synced
        prefix go on meanwhile — and ``end_sync(written, error)``. Nothing may be appended
        or truncated in between. Raises as ``sync()`` does."""
        fd = self._require_writable()
        if not self._buffer:
            return None
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        written = Written(fd=fd, size=len(data))
        try:
            done = 0
            with memoryview(data) as view:
                while done < len(data):
                    done += os.pwrite(fd, view[done:], self._synced_bytes + done)
        except OSError as exc:
            self._sync_failed(written, exc)
        return written

    def end_sync(self, written: Written, error: OSError | None = None) -> int:
        """The second half of ``sync()``, after the caller's fdatasync (``error``: how it
        failed): count the batches synced and return the new ``synced_end``."""
        self._require_fd()
        if error is not None:
            self._sync_failed(written, error)
        self._synced_bytes += written.size
        self._synced_batches += len(self._buffer)
        self._syncs += 1
        self._buffer.clear()
        self._buffered_bytes = 0
        self.synced_end = self.end
        return self.synced_end

    def _sync_failed(self, written: Written, exc: OSError) -> NoReturn:
        dropped = len(self._buffer)
        self._drop_unsynced()
        try:
            os.ftruncate(written.fd, self._synced_bytes)
            os.fdatasync(written.fd)
        except OSError:
            pass  # the scan on the next open treats what is left past synced as a torn tail
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(
                f"{self.path}: no space to write {written.size} bytes; {dropped} unsynced batches dropped"
            ) from exc
        self._write_error = exc
        raise exc

    def _drop_unsynced(self) -> None:
        kept = len(self._offsets) - len(self._buffer)
        self._cut_index(kept)
        self._buffer.clear()
        self._buffered_bytes = 0

    def _cut_index(self, batches: int) -> None:
        """Forget index entries from batch number ``batches`` on and recompute end/seqs."""
        end = self._offsets[batches] if batches < len(self._offsets) else self.end
        del self._offsets[batches:], self._positions[batches:], self._seqs[batches:]
        self.end = end
        if self._offsets:
            self.last_seq = self._seqs[-1] + (end - self._offsets[-1]) - 1
        else:
            self.first_seq = self.last_seq = None

    def truncate(self, end: int) -> None:
        """Drop everything at or after offset ``end`` (a batch boundary) and sync.

        Buffered batches before ``end`` are kept and synced with the truncation.

        Raises:
            ValueError: ``end`` is negative, past ``end``, or inside a batch.
            DiskFull / OSError: as for sync().
        """
        fd = self._require_writable()
        if end < 0 or end > self.end:
            raise ValueError(f"{self.path}: cannot truncate to {end}: log end is {self.end}")
        if end == self.end:
            self.sync()
            return
        i = bisect_right(self._offsets, end) - 1
        if self._offsets[i] != end:
            raise ValueError(f"{self.path}: offset {end} is inside the batch starting at {self._offsets[i]}")
        pos = self._positions[i]
        buffered = len(self._buffer)
        synced_batches = len(self._offsets) - buffered
        if pos >= self._synced_bytes:
            # Only buffered batches go: keep the ones before ``end`` and write them.
            keep = i - synced_batches
            del self._buffer[keep:]
            self._buffered_bytes = pos - self._synced_bytes
            self._cut_index(i)
            self.sync()
            return
        self._buffer.clear()
        self._buffered_bytes = 0
        self._cut_index(i)
        # The cut batches are forgotten before the I/O: if it fails they are not served either.
        self._synced_bytes = pos
        self.synced_end = end
        try:
            os.ftruncate(fd, pos)
            os.fdatasync(fd)
        except OSError as exc:
            self._write_error = exc
            raise

    # -- reading ----------------------------------------------------------------------------

    def read(self, offset: int, *, max_bytes: int, upto: int, verify_crc: bool = False) -> list[bytes]:
        """Whole batches starting at the batch containing ``offset`` and ending at or before
        ``upto`` (exclusive offset bound: the LAC + 1 or the sealed end), at most ``max_bytes``
        in total, but at least one batch if one ends at or before ``upto``.

        ``upto`` is capped at ``synced_end``: unsynced batches are never served. A batch that
        straddles ``upto`` is not returned (and neither is anything after it). Returns []
        when ``offset`` is at or past the readable end. With ``verify_crc`` every batch's CRC
        is checked against the bytes read (one ``zlib.crc32`` per batch, in C, without the
        GIL past 5 KiB): bytes that changed on disk since they were scanned are never served.
        Without it every receiver (slave ``append``, consumer ``decode_batch``) checks them.

        Raises ValueError for a negative ``offset``; CorruptLog if the file is shorter than the
        index says (changed behind the log's back), or, with ``verify_crc``, at the first batch
        whose CRC does not match (``position``: its byte in the file); ClosedError after close().
        """
        fd = self._require_fd()
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        limit = min(upto, self.synced_end)
        if offset >= limit:
            return []
        offsets, positions = self._offsets, self._positions
        n = len(offsets)
        i = bisect_right(offsets, offset) - 1
        start = positions[i]
        j = i  # batches i..j-1 are taken
        while j < n:
            batch_end = offsets[j + 1] if j + 1 < n else self.end
            if batch_end > limit:
                break
            stop = positions[j + 1] if j + 1 < n else self._synced_bytes
            if j > i and stop - start > max_bytes:
                break
            j += 1
        if j == i:
            return []
        stop = positions[j] if j < n else self._synced_bytes
        data = os.pread(fd, stop - start, start)
        if len(data) != stop - start:
            raise CorruptLog(str(self.path), start + len(data), "file shorter than its index")
        if j == i + 1:
            out = [data]
        else:
            out = [data[positions[k] - start : (positions[k + 1] if k + 1 < n else stop) - start]
                   for k in range(i, j)]
        if verify_crc:
            for k, raw in enumerate(out, start=i):
                # The prefix is outside the CRC: its length and offset must match the index.
                length, crc, first_offset = _PREFIX.unpack_from(raw)
                with memoryview(raw) as view:
                    bad = length != len(raw) or first_offset != offsets[k] or zlib.crc32(view[PREFIX_BYTES:]) != crc
                if bad:
                    raise CorruptLog(str(self.path), positions[k], "CRC mismatch on read (or a changed prefix)")
        return out

    def last_message(self) -> tuple[int, Message] | None:
        """(offset, message) of the last appended message (buffered ones included; call
        sync() first for the last durable one), or None when empty."""
        fd = self._require_fd()
        if not self._offsets:
            return None
        pos = self._positions[-1]
        raw = self._buffer[-1] if self._buffer else os.pread(fd, self._synced_bytes - pos, pos)
        header, messages = decode_batch(raw, path=str(self.path), position=pos)
        return header.first_offset + header.count - 1, messages[-1]

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            end=self.end,
            synced_end=self.synced_end,
            batches=len(self._offsets),
            file_bytes=self._synced_bytes,
            buffered_bytes=self._buffered_bytes,
            syncs=self._syncs,
            synced_batches=self._synced_batches,
            recovery=self.recovery,
        )

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        """Close the file. Unsynced batches are dropped (they were never acked). Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._buffer.clear()
            self._buffered_bytes = 0
            os.close(fd)

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SegmentLog {self.path} end={self.end} synced_end={self.synced_end}>"


def private_dir(path: Path) -> None:
    """Make ``path`` (and its missing parents) folders only their owner may list or enter: 0700,
    set with chmod as well because mkdir's mode passes through the umask and leaves a
    folder made by an older version as it was."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    os.chmod(missing[0] if missing else path, 0o700)


def segment_dir(data_dir: Path, queue: str, seg: int) -> Path:
    """Where a replica keeps (queue, seg): <data>/<queue>/<seg:012d>/."""
    return data_dir / queue / f"{seg:012d}"
