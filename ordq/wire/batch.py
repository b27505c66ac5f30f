"""The batch: ordq's unit on the wire and on disk, its byte layout, encoding and checks.

The bytes of an encoded batch are the same on the wire and on disk: the producer encodes a
batch once (``encode_batch``), the master stamps ``first_offset`` (outside the CRC, like
Kafka's base offset, because only the master knows it), appends the bytes verbatim and
forwards the same bytes to the slave. Only whole, CRC-valid batches are ever stored or served.

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

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import attrs

from ordq.common.errors import CorruptLog

MAGIC = 0xA1  # format version 1; any other value is corruption (or a newer format)
WIRE = "<wire>"  # the ``path`` of a CorruptLog raised for a buffer that is not a file
MAX_BATCH_BYTES = (1 << 32) - 1  # the length field is a u32

PREFIX = struct.Struct("<IIQ")  # length, crc, first_offset
_BODY_HEAD = struct.Struct("<BBQQI")  # magic, flags, epoch, first_seq, count
HEAD = struct.Struct("<IIQBBQQI")  # prefix + body head, read in one call
_MSG = struct.Struct("<qiII")  # timestamp_us, key_len, headers_len, payload_len
_OFFSET = struct.Struct("<Q")
_LEN = struct.Struct("<I")  # the batch length field alone
_HDR_NAME = struct.Struct("<H")
_HDR_VALUE = struct.Struct("<I")

PREFIX_BYTES = PREFIX.size  # 16: where the CRC-covered body starts
HEAD_BYTES = HEAD.size  # 38: smallest possible batch (count 0 is still invalid)
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
    return PREFIX.pack(length, zlib.crc32(body), 0) + body


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


def header_problem(length: int, magic: int, flags: int, count: int, available: int) -> str | None:
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


def first_seqs(batches: Iterable[BytesLike]) -> list[int]:
    """The first seq of each batch, read from its header unchecked (stage stamps' keys:
    ordq/common/stages.py; raises on bytes too short to hold a header)."""
    return [HEAD.unpack_from(b)[6] for b in batches]


def parse_header(batch: BytesLike, *, path: str = WIRE, position: int = 0, verify_crc: bool = True) -> BatchHeader:
    """Check length, magic and CRC of one encoded batch and return its header.

    ``batch`` must be exactly one batch (any bytes-like object). Raises CorruptLog (with
    ``path``/``position`` for the message) when it is not. Message structure is not walked
    here (``decode_batch`` and ``check_messages`` do that). ``verify_crc=False`` skips only
    the CRC (~0.35 µs per 1 KiB message), for bytes whose CRC the caller checked already.
    """
    if len(batch) < HEAD_BYTES:
        raise CorruptLog(path, position, f"short batch: {len(batch)} bytes")
    length, crc, first_offset, magic, flags, epoch, first_seq, count = HEAD.unpack_from(batch)
    problem = header_problem(length, magic, flags, count, len(batch))
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
