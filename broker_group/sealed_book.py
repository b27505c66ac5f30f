"""The book of segments sealed empty that this replica never held (issue 43): one append-only
file in the data folder, ``sealed-empty.log``, instead of a folder, a log, a meta file and a
queue-folder claim per segment.

Why a segment needs no folder: a replica that never held a segment (no folder, and its data
folder older than the segment: ``SegmentStore.vouches_for_absent``) never synced a batch of it,
and every ack needs both replicas' syncs, so nothing in it was acked; sealed here, it is sealed
empty. What must survive a crash is only *that it is sealed* (a replica must never answer a
seal and forget it). A record says so: (queue, seg, the queue's incarnation), one line each.

Guarantees:
- ``append`` returns only once its records are durable (one ``write`` and one ``fdatasync``
  for the whole call, plus one sync of the data folder when the file is new): a SealMany is
  answered after it, so a seal answered survives a power cut.
- A crash in the middle of an append leaves a torn last line: it was never answered, and it is
  dropped when the book is read (and cut off, so later appends never follow garbage). A record
  read once stays until ``forget`` (its segment popped or its queue deleted) and a compaction,
  which replaces the file by a rename of a synced copy holding every live record: a crash
  during it leaves the old book or the new one, both holding every live record. So no crash
  un-seals a segment.
- A line that does not check out before the last (a bad disk, not a crash) is skipped with an
  error: its segment was empty here, so nothing acked is lost; the coordinator seals it again.

Rules: the pure part (``encode``/``decode``) does no I/O; ``SealedBook`` owns the file and its
lock, and knows nothing of segments in memory (``segments.py`` does).
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from ordq.broker_group.log import sync_dir

log = logging.getLogger("ordq.broker")

BOOK_FILE = "sealed-empty.log"
# Dropped records the file may keep before ``compact`` rewrites it (and at least as many as live).
COMPACT_AFTER = 1000
NO_INCARNATION = "-"  # a queue state from before incarnations were kept


@attrs.frozen
class Record:
    queue: str
    seg: int
    incarnation: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.queue, self.seg)


def encode(r: Record) -> bytes:
    """One line: ``<crc32 of the rest, 8 hex> <queue> <seg> <incarnation>\\n`` (no name holds a space)."""
    body = f"{r.queue} {r.seg} {r.incarnation or NO_INCARNATION}".encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _line(raw: bytes) -> Record | None:
    crc, _, body = raw.partition(b" ")
    try:
        # Compared as written (``encode``), not parsed: int(b"\t0c1d2e3", 16) strips the tab,
        # so a line whose leading 0 became white space checked out (found by hypothesis).
        if crc != b"%08x" % zlib.crc32(body):
            return None
        queue, seg, incarnation = body.decode().split(" ")
        if not queue or not seg.isdigit():
            return None
    except ValueError:
        return None
    return Record(queue, int(seg), "" if incarnation == NO_INCARNATION else incarnation)


@attrs.frozen
class Decoded:
    records: list[Record]
    valid_bytes: int  # where the last whole, checked line ends: a torn tail starts there
    skipped: int  # lines before the tail that did not check out


def decode(data: bytes) -> Decoded:
    """The records of a book's bytes, in order. The last line without its newline, or not
    checking out, is a torn tail (not counted); a bad line before it is skipped and counted."""
    records: list[Record] = []
    skipped = 0
    valid = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # torn: the rest of a line a crash cut short
        got = _line(data[pos:nl])
        if got is None:
            if data.find(b"\n", nl + 1) < 0 and not data[nl + 1:]:
                break  # the last line: torn (a crash can leave it whole in length, not content)
            skipped += 1
        else:
            records.append(got)
        pos = nl + 1
        valid = pos
    return Decoded(records, valid, skipped)


class SealedBook:
    """The file ``sealed-empty.log`` in ``data_dir`` and the live records it holds."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / BOOK_FILE
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._live: dict[str, dict[int, str]] = {}  # queue -> seg -> incarnation
        self._dropped = 0  # records in the file that no longer count
        self.syncs = 0  # file system syncs made by appends and compactions

    def load(self) -> list[Record]:
        """Read the book at start (cutting a torn tail off, durably); its live records."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        got = decode(data)
        if got.skipped:
            log.error("%s: %d records before its end do not check out and were skipped (their segments "
                      "were empty here; the coordinator seals them again)", self.path, got.skipped)
        if got.valid_bytes < len(data):
            log.warning("%s: a torn last record (%d bytes) cut off", self.path, len(data) - got.valid_bytes)
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, got.valid_bytes)
                os.fdatasync(fd)
            finally:
                os.close(fd)
        with self._lock:
            for r in got.records:  # a segment's later record wins; another incarnation's are
                self._live.setdefault(r.queue, {})[r.seg] = r.incarnation  # sorted out by its reader
            self._dropped = len(got.records) - sum(len(v) for v in self._live.values())
        return [Record(q, s, i) for q, segs in self._live.items() for s, i in segs.items()]

    def append(self, records: Sequence[Record]) -> None:
        """Make ``records`` durable (module docstring); raises OSError when that failed (then
        none of them may be answered as sealed)."""
        if not records:
            return
        data = b"".join(encode(r) for r in records)
        with self._lock:
            fd = self._open()
            size = os.fstat(fd).st_size
            try:
                os.write(fd, data)
                os.fdatasync(fd)
            except OSError:
                # Never leave part of a line for later appends to follow: cut it off, and
                # reopen next time (after a failed sync the kernel may not report it again).
                self._close()
                try:
                    cut = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                    try:
                        os.ftruncate(cut, size)
                    finally:
                        os.close(cut)
                except OSError:
                    pass
                raise
            self.syncs += 1
            for r in records:
                segs = self._live.setdefault(r.queue, {})
                if r.seg in segs:
                    self._dropped += 1  # the same segment sealed again: one line too many
                segs[r.seg] = r.incarnation

    def _open(self) -> int:
        if self._fd is None:
            new = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if new:  # the file's name durable before any record in it counts
                sync_dir(self.path.parent)
                self.syncs += 1
        return self._fd

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def incarnation(self, queue: str) -> str | None:
        """The one incarnation the records of ``queue`` name; None when it holds none, or records
        of two (a deleted queue's and its successor's of the same name)."""
        with self._lock:
            found = set(self._live.get(queue, {}).values())
        return found.pop() if len(found) == 1 else None

    def has_other(self, queue: str, incarnation: str) -> bool:
        """Does it hold a record of ``queue`` of another incarnation (a deleted queue's)?"""
        with self._lock:
            return any(i != incarnation for i in self._live.get(queue, {}).values())

    def forget_other(self, queue: str, incarnation: str) -> None:
        """``forget`` every record of ``queue`` of another incarnation than ``incarnation``."""
        with self._lock:
            segs = self._live.get(queue, {})
            others = [(queue, seg) for seg, i in segs.items() if i != incarnation]
        self.forget(others)

    def forget(self, keys: Iterable[tuple[str, int]]) -> None:
        """These segments are gone (popped, or their queue deleted): their records no longer
        count (the file keeps them until ``compact``)."""
        with self._lock:
            for queue, seg in keys:
                segs = self._live.get(queue)
                if segs is not None and segs.pop(seg, None) is not None:
                    self._dropped += 1
                    if not segs:
                        del self._live[queue]

    def compact(self) -> bool:
        """Rewrite the file with only the live records once it holds more dropped ones than
        live (and over ``COMPACT_AFTER``): a synced copy renamed over it. True if it did."""
        with self._lock:
            live = sum(len(v) for v in self._live.values())
            if self._dropped <= max(COMPACT_AFTER, live):
                return False
            data = b"".join(encode(Record(q, s, i)) for q, segs in sorted(self._live.items())
                            for s, i in sorted(segs.items()))
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self._close()
            os.replace(tmp, self.path)
            sync_dir(self.path.parent)
            self.syncs += 2
            log.info("%s compacted: %d records kept, %d dropped", self.path, live, self._dropped)
            self._dropped = 0
            return True

    def close(self) -> None:
        with self._lock:
            self._close()
