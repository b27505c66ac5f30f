"""A segment's key and time index: where a key's messages are, and where time T begins.

Guarantee: an index answers only for the log it was built from. It records the message count
(``end``), the synced bytes and the first seq of that log; a file whose CRC, or whose record of
the log, does not match the log it sits beside is not used (the broker rebuilds it from the
log: broker_group/finder.py). Answers are candidates the caller confirms by reading the
batches they name: a key's hash may collide, and a time block says where to look, not what
is there. So a stale or damaged index can cost a read, never a wrong answer.

Rules: pure code. No file, clock, thread or network here: the builder is fed batch bytes, the
codec turns an index into bytes and back.

The form (docs/LOG_FORMAT.md, "Key and time index"):
- **keys**: one u64 per keyed message, ``crc32(key) << 32 | offset``, sorted. A lookup is two
  binary searches; the matching offsets come out in offset order. 8 bytes per keyed message.
- **time**: a sparse index of blocks of at least ``block_messages`` messages, each starting
  at a batch boundary: the block's first offset and the running maximum of timestamps up to
  the block's last message. The running maximum never decreases, so the first message with
  ``timestamp_us >= T`` is in the first block whose maximum is ``>= T`` (exactly, even when
  producer clocks disagree after a failover): one binary search, then a scan of one block.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from bisect import bisect_left
from typing import Final

import attrs

from ordq.wire.batch import BytesLike

MAGIC: Final = b"OQX1"
INDEX_FILE: Final = "index.oqx"  # beside segment.log
BLOCK_MESSAGES: Final = 128  # a time block spans at least this many messages (a whole batch at least)
_HEAD = struct.Struct("<4sIHHIQQqII")  # magic, crc, version, flags, block, end, log_bytes, first_seq, n_keys, n_blocks
_CRC_FROM = 8  # the CRC covers every byte after magic and crc
_BATCH = struct.Struct("<IIQBBQQI")  # wire/batch.py HEAD: length, crc, first_offset, magic, flags, epoch, seq, count
_MSG = struct.Struct("<qiII")  # timestamp_us, key_len, headers_len, payload_len
_OFFSET_MASK: Final = 0xFFFFFFFF
MAX_OFFSET: Final = _OFFSET_MASK  # offsets must fit 32 bits: a segment of 4 billion messages is not indexed


class IndexFormatError(ValueError):
    """Bytes that are not an index (bad magic, version, length or CRC)."""


def key_hash(key: bytes) -> int:
    """The 32-bit hash a key is filed under (CRC-32: in C, and distinct for keys that differ
    in at most 32 consecutive bits)."""
    return zlib.crc32(key)


def _native(a: array, code: str) -> array:  # type: ignore[type-arg]
    if sys.byteorder != "little":  # pragma: no cover - every machine we run on is little-endian
        a.byteswap()
    return a


@attrs.frozen(eq=False)
class SegmentIndex:
    """The index of messages [0, end) of one segment copy (immutable once built)."""

    end: int  # messages covered
    log_bytes: int  # bytes of segment.log they take
    first_seq: int  # -1 when empty
    keys: array  # type: ignore[type-arg]  # 'Q', sorted: key_hash << 32 | offset
    block_offsets: array  # type: ignore[type-arg]  # 'Q': first offset of each time block
    block_max_ts: array  # type: ignore[type-arg]  # 'q': running max timestamp up to each block's end
    block_messages: int = BLOCK_MESSAGES

    def key_offsets(self, key: bytes, *, upto: int | None = None) -> list[int]:
        """Offsets (ascending, below ``upto``) whose key hashes like ``key``: candidates."""
        h = key_hash(key) << 32
        lo = bisect_left(self.keys, h)
        hi = bisect_left(self.keys, h + (1 << 32), lo)
        offsets = [k & _OFFSET_MASK for k in self.keys[lo:hi]]
        return offsets if upto is None else [o for o in offsets if o < upto]

    def time_block(self, t_us: int) -> tuple[int, int] | None:
        """[start, stop) offsets of the block that holds the first message with
        ``timestamp_us >= t_us``; None when every indexed message is older."""
        k = bisect_left(self.block_max_ts, t_us)
        if k >= len(self.block_offsets):
            return None
        stop = self.block_offsets[k + 1] if k + 1 < len(self.block_offsets) else self.end
        return self.block_offsets[k], stop

    @property
    def max_ts(self) -> int | None:
        return self.block_max_ts[-1] if len(self.block_max_ts) else None

    def nbytes(self) -> int:
        return _HEAD.size + 8 * (len(self.keys) + 2 * len(self.block_offsets))


def encode_index(ix: SegmentIndex) -> bytes:
    """The file form: a 48-byte header (little-endian), then the three arrays."""
    body = b"".join(_native(array(code, a), code).tobytes()
                    for code, a in (("Q", ix.keys), ("Q", ix.block_offsets), ("q", ix.block_max_ts)))
    head = _HEAD.pack(MAGIC, 0, 1, 0, ix.block_messages, ix.end, ix.log_bytes, ix.first_seq,
                      len(ix.keys), len(ix.block_offsets))
    crc = zlib.crc32(body, zlib.crc32(head[_CRC_FROM:]))
    return head[:4] + struct.pack("<I", crc) + head[_CRC_FROM:] + body


def decode_index(raw: BytesLike) -> SegmentIndex:
    """Back from ``encode_index``. IndexFormatError for anything else."""
    if len(raw) < _HEAD.size:
        raise IndexFormatError(f"{len(raw)} bytes: shorter than an index header")
    magic, crc, version, flags, block, end, log_bytes, first_seq, n_keys, n_blocks = _HEAD.unpack_from(raw)
    if magic != MAGIC or version != 1 or flags != 0:
        raise IndexFormatError(f"not an index (magic {bytes(magic)!r}, version {version}, flags {flags})")
    want = _HEAD.size + 8 * (n_keys + 2 * n_blocks)
    if len(raw) != want:
        raise IndexFormatError(f"{len(raw)} bytes, the header says {want}")
    with memoryview(raw) as view:
        if zlib.crc32(view[_CRC_FROM:]) != crc:
            raise IndexFormatError("CRC mismatch")
        parts = []
        pos = _HEAD.size
        for code, n in (("Q", n_keys), ("Q", n_blocks), ("q", n_blocks)):
            a = array(code)
            a.frombytes(view[pos:pos + 8 * n])
            parts.append(_native(a, code))
            pos += 8 * n
    return SegmentIndex(end=end, log_bytes=log_bytes, first_seq=first_seq, keys=parts[0], block_offsets=parts[1],
                        block_max_ts=parts[2], block_messages=block)


class IndexBuilder:
    """Builds a ``SegmentIndex`` from a segment's batches, fed in offset order from offset 0.

    ``add(batch)`` takes one stamped batch (bytes whose CRC the log already checked);
    ``snapshot()`` is the index of everything added so far (cheap to call again: the sorted
    keys are kept and only the newly added ones are merged in).
    """

    def __init__(self, *, block_messages: int = BLOCK_MESSAGES) -> None:
        self.block_messages = block_messages
        self.end = 0
        self.log_bytes = 0
        self.first_seq = -1
        self._sorted: array = array("Q")  # type: ignore[type-arg]
        self._tail: list[int] = []  # keys added since the last snapshot
        self._block_offsets: array = array("Q")  # type: ignore[type-arg]
        self._block_max: array = array("q")  # type: ignore[type-arg]
        self._max_ts = -(1 << 63)
        self._snapshot: SegmentIndex | None = None

    def add(self, batch: BytesLike) -> None:
        """Index one batch; ValueError if it does not continue what was added."""
        length, _crc, first_offset, _magic, _flags, _epoch, first_seq, count = _BATCH.unpack_from(batch)
        if first_offset != self.end:
            raise ValueError(f"batch at offset {first_offset} does not continue the index at {self.end}")
        if first_offset + count > MAX_OFFSET:
            raise ValueError("segment too long to index (offsets past 2^32)")
        if self.first_seq < 0:
            self.first_seq = first_seq
        if not self._block_offsets or first_offset - self._block_offsets[-1] >= self.block_messages:
            self._block_offsets.append(first_offset)
            self._block_max.append(self._max_ts)
        mx, tail, unpack, crc = self._max_ts, self._tail, _MSG.unpack_from, zlib.crc32
        pos = _BATCH.size
        with memoryview(batch) as view:
            for offset in range(first_offset, first_offset + count):
                ts, klen, hlen, plen = unpack(view, pos)
                pos += 20
                if ts > mx:
                    mx = ts
                if klen >= 0:
                    tail.append(crc(view[pos:pos + klen]) << 32 | offset)
                    pos += klen
                pos += hlen + plen
        if pos != length:
            raise ValueError(f"batch at offset {first_offset}: messages end at byte {pos}, not {length}")
        self._max_ts = mx
        self._block_max[-1] = mx
        self.end = first_offset + count
        self.log_bytes += length
        self._snapshot = None

    def snapshot(self) -> SegmentIndex:
        if self._snapshot is None:
            if self._tail:
                # timsort finds the sorted run and the tail's runs: close to a merge
                merged = self._sorted.tolist()
                merged.extend(self._tail)
                merged.sort()
                self._sorted, self._tail = array("Q", merged), []
            self._snapshot = SegmentIndex(end=self.end, log_bytes=self.log_bytes, first_seq=self.first_seq,
                                          keys=self._sorted, block_offsets=array("Q", self._block_offsets),
                                          block_max_ts=array("q", self._block_max),
                                          block_messages=self.block_messages)
        return self._snapshot


def message_at(batch: BytesLike, offset: int) -> tuple[int, int, bytes | None]:
    """(seq, timestamp_us, key) of the message at ``offset`` of a batch the log checked: a
    walk over the length fields, no message decoded but that one."""
    _length, _crc, first_offset, _magic, _flags, _epoch, first_seq, count = _BATCH.unpack_from(batch)
    if not first_offset <= offset < first_offset + count:
        raise ValueError(f"offset {offset} is not in the batch at {first_offset} (+{count})")
    pos, unpack = _BATCH.size, _MSG.unpack_from
    for _ in range(offset - first_offset):
        _ts, klen, hlen, plen = unpack(batch, pos)
        pos += 20 + max(klen, 0) + hlen + plen
    ts, klen, _hlen, _plen = unpack(batch, pos)
    key = bytes(batch[pos + 20:pos + 20 + klen]) if klen >= 0 else None
    return first_seq + offset - first_offset, ts, key


def first_at_or_after(batch: BytesLike, t_us: int) -> tuple[int, int, int] | None:
    """(offset, seq, timestamp_us) of the batch's first message at or after ``t_us``, or None."""
    _length, _crc, first_offset, _magic, _flags, _epoch, first_seq, count = _BATCH.unpack_from(batch)
    pos, unpack = _BATCH.size, _MSG.unpack_from
    for i in range(count):
        ts, klen, hlen, plen = unpack(batch, pos)
        if ts >= t_us:
            return first_offset + i, first_seq + i, ts
        pos += 20 + max(klen, 0) + hlen + plen
    return None


def build_index(batches: list[bytes], *, block_messages: int = BLOCK_MESSAGES) -> SegmentIndex:
    """The index of a whole segment given as its batches (tests, tools)."""
    b = IndexBuilder(block_messages=block_messages)
    for raw in batches:
        b.add(raw)
    return b.snapshot()
