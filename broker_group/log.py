"""Segment log: append-only, CRC-checked record batches for one (queue, seg) on one replica.

STUB: the interface agreed between the log, the broker service and the SDK. The log owner
replaces the bodies; signatures may grow keyword arguments but not change meaning.

Rules:
- The bytes of an encoded batch are the same on the wire and on disk: the producer encodes a
  batch once (``encode_batch``), the master stamps ``first_offset`` (outside the CRC, like
  Kafka's base offset, because only the master knows it), appends the bytes verbatim and
  forwards the same bytes to the slave.
- Nothing is durable until ``sync()`` returned; ``synced_end`` is the durable message count.
- A torn tail is truncated on open and counted; a bad batch before the tail raises
  ``CorruptLog`` and the segment is not served.

Batch layout (little-endian), see docs/LOG_FORMAT.md:
    length u32 | crc32c-or-crc32 u32 | first_offset u64 | <crc-covered body>
    body = magic u8 | flags u8 | epoch u64 | first_seq u64 | count u32 | messages...
    message = timestamp_us i64 | key_len i32 (-1 = no key) | key | headers_len u32 | headers |
              payload_len u32 | payload
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs


@attrs.frozen
class Message:
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


def encode_batch(messages: Sequence[Message], *, epoch: int, first_seq: int) -> bytes:
    """Encode messages as one batch with first_offset 0 (the master stamps the real one)."""
    raise NotImplementedError


def stamp_offset(batch: bytes, first_offset: int) -> bytes:
    """Return the batch with ``first_offset`` set (not covered by the CRC)."""
    raise NotImplementedError


def parse_header(batch: bytes) -> BatchHeader:
    """Check length, magic and CRC of one encoded batch; raise CorruptLog/ValueError if bad."""
    raise NotImplementedError


def decode_batch(batch: bytes) -> tuple[BatchHeader, list[Message]]:
    """Decode one encoded batch (CRC checked) into its header and messages."""
    raise NotImplementedError


def split_batches(buf: bytes) -> list[bytes]:
    """Split a buffer of concatenated complete batches into single batches (CRC checked)."""
    raise NotImplementedError


@attrs.frozen
class RecoveryReport:
    batches: int
    messages: int
    truncated_bytes: int  # torn tail removed on open


class SegmentLog:
    """One (queue, seg) on one replica. Not thread-safe: the broker serialises access."""

    path: Path
    end: int  # next offset to be assigned (appended, maybe not yet synced)
    synced_end: int  # messages durable on this replica
    first_seq: int | None
    last_seq: int | None  # seq of the last appended message
    recovery: RecoveryReport

    @classmethod
    def open(cls, directory: Path, queue: str, seg: int, *, create: bool = False) -> SegmentLog:
        """Open (scan, truncate torn tail) or create; CorruptLog for a bad middle batch."""
        raise NotImplementedError

    def append(self, batch: bytes) -> BatchHeader:
        """Append one batch (already offset-stamped to ``end``); buffered until sync()."""
        raise NotImplementedError

    def sync(self) -> int:
        """Write buffered batches and fdatasync; return the new synced_end. DiskFull on ENOSPC
        (the unsynced batches are dropped, the file truncated back to synced_end)."""
        raise NotImplementedError

    def read(self, offset: int, *, max_bytes: int, upto: int) -> list[bytes]:
        """Whole batches starting at the batch containing ``offset`` and ending at or before
        ``upto`` (LAC or sealed end), at most ~max_bytes (at least one batch if any)."""
        raise NotImplementedError

    def truncate(self, end: int) -> None:
        """Drop everything at or after offset ``end`` (must be a batch boundary) and sync."""
        raise NotImplementedError

    def last_message(self) -> tuple[int, Message] | None:
        """(offset, message) of the last stored message, or None when empty."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def segment_dir(data_dir: Path, queue: str, seg: int) -> Path:
    """Where a replica keeps (queue, seg): <data>/<queue>/<seg:012d>/."""
    return data_dir / queue / f"{seg:012d}"
