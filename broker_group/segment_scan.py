"""Reading a segment file batch by batch: the scan behind recovery (``SegmentLog`` on open)
and behind reading a file offline (``iter_file_batches``: the verifier, tests).

Rules: reads only; finds where valid batches are and where they stop (a torn tail, or a bad
batch followed by a valid one, which is corruption and never skipped unless it is the one write
a power cut tore: ``scan_batches``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterator

from ordq.common.errors import CorruptLog
from ordq.wire.batch import HEAD, HEAD_BYTES, MAGIC, PREFIX_BYTES, BatchHeader, Message, decode_messages, header_problem

_WINDOW_BYTES = 1 << 20  # read-ahead of the scan; a bigger batch is read in one piece
_SEARCH_CHUNK_BYTES = 1 << 24  # the follow-on search reads the rest of the file in these
# Every batch of one write (one group commit) starts within this many bytes of the write's start
# (``SegmentLog.begin_sync``), so nothing a torn write left starts farther from where it went bad.
TEAR_WINDOW = 4 << 20
SECTOR = 512  # the unit a disk writes whole: a power cut leaves each one old or new
_ZEROS = bytes(SECTOR)


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
    length, crc, first_offset, magic, flags, epoch, first_seq, count = HEAD.unpack_from(raw)
    if header_problem(length, magic, flags, count, min(available, len(raw))) is not None:
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
                length, _, _, m, flags, _, _, count = HEAD.unpack_from(head)
                if header_problem(length, m, flags, count, size - at) is None:
                    raw = chunk[i - PREFIX_BYTES : i - PREFIX_BYTES + length]
                    if len(raw) < length:
                        raw = _pread_full(fd, length, at)
                    if _valid_batch(raw, size - at) is not None:
                        return at
            i = chunk.find(magic, i + 1)
        chunk_at += _SEARCH_CHUNK_BYTES
    return None


def lost_sector(fd: int, start: int, stop: int) -> bool:
    """Whether the bytes from ``start`` to ``stop`` hold a sector that a write into zeros did
    not reach: zeros from ``start`` to the end of its sector, or a whole sector of zeros.
    (A sector of zeros inside a batch's own bytes, a message of zeros, reads the same: a bad
    batch around one is taken for torn. Bit rot leaves other bytes.)"""
    data = _pread_full(fd, stop - start, start)
    at = 0  # where the sector from ``start + at`` to its boundary begins in ``data``
    boundary = (start // SECTOR + 1) * SECTOR - start  # the end of ``start``'s sector, in ``data``
    while boundary <= len(data):
        if data[at:boundary] == _ZEROS[: boundary - at]:
            return True
        at, boundary = boundary, boundary + SECTOR
    return False


def scan_batches(fd: int, size: int, path: str) -> Generator[tuple[int, BatchHeader, bytes], None, int]:
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

    One exception (log.py's rules: the file runs ahead with zeros, and a power cut can keep a
    later sector of the unsynced write without an earlier one): a torn tail all the same when
    the bad bytes hold a sector the write did not reach (``lost_sector``: the zeros it was to
    replace) and no valid batch starts ``TEAR_WINDOW`` or more past ``p``.
    """
    window = _Window(fd)
    pos = 0
    expected = 0
    while pos < size:
        head = window.get(pos, HEAD_BYTES)
        header = None
        raw = b""
        if len(head) == HEAD_BYTES:
            length, _, _, magic, flags, _, _, count = HEAD.unpack_from(head)
            if header_problem(length, magic, flags, count, size - pos) is None:  # before reading `length` bytes
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
        if following - pos < TEAR_WINDOW and lost_sector(fd, pos, following) \
                and _find_valid_batch(fd, pos + TEAR_WINDOW, size) is None:
            return pos
        if header is not None:
            detail = f"first_offset {header.first_offset} where {expected} was expected"
        elif len(head) < HEAD_BYTES:
            detail = f"short batch ({len(head)} bytes)"
        else:
            length, _, _, magic, flags, _, _, count = HEAD.unpack_from(head)
            detail = header_problem(length, magic, flags, count, size - pos) or "CRC mismatch"
        raise CorruptLog(path, pos, f"{detail}, yet a valid batch follows at byte {following}")
    return pos


def iter_file_batches(path: str | os.PathLike[str]) -> Iterator[tuple[BatchHeader, list[Message]]]:
    """Read a ``segment.log`` (or any file of batches) outside the broker, batch by batch.

    Yields (header, messages) in offset order. Stops quietly at a torn tail (the file may be
    written to right now by a live broker: a batch being appended looks like one); raises
    CorruptLog at a bad batch that has a valid batch after it (but a torn write:
    ``scan_batches``), after yielding the batches before it. Reads with pread through a 1 MiB
    window, so memory does not grow with the file, and a broker truncating the file meanwhile
    only shortens what is read.
    Raises FileNotFoundError if there is no such file.
    """
    name = os.fspath(path)
    with open(name, "rb") as f:
        fd = f.fileno()
        for pos, header, raw in scan_batches(fd, os.fstat(fd).st_size, name):
            yield header, decode_messages(raw, header, path=name, position=pos)
