"""Segment log: append-only, CRC-checked record batches for one (queue, seg) on one replica.

Guarantee: a batch is served (``read``) only after ``sync()`` made it durable, and only whole,
CRC-valid batches are ever stored, served or recovered. On open, a torn tail is truncated and
counted; a bad batch with a valid batch after it raises ``CorruptLog`` — never skipped.

Rules:
- This module owns the file ``segment.log`` of one segment. It
  does not own any metadata (fenced epoch, sealed state, LAC): the broker keeps those in its
  own file beside ``segment.log``. It never talks to the network, ZooKeeper or a clock.
- The bytes of a batch, their layout and checks are ``ordq/wire/batch.py``'s (the same on the
  wire and on disk).
- Nothing is durable until ``sync()`` returned; ``synced_end`` is the durable message count.
- The file runs ahead of its batches with zeros (``FILL_AHEAD_MAX``), written and synced with
  the batches that needed them, so most syncs overwrite blocks the file already has: an
  ``fdatasync`` then writes the data alone, not the inode's new size too (issue 39: two brokers
  syncing on one disk, p50 196 -> 126 µs a sync on this lab's ext4). A zero tail is where the
  batches end, as a torn tail is (never a batch: its length field is 0). A tail of zeros alone
  is kept on open and not counted as torn (one with any other byte is cut off whole and
  counted); the zeros are cut off when the log is parked or closed.
- A power cut can tear an overwrite out of order: a later sector of the one unsynced group
  commit on disk, an earlier one not. A sector the write did not reach reads as the zeros it
  replaced, so the scan tells that from corruption by its zeros (segment_scan.py,
  ``lost_sector``) and cuts it off as a torn tail: synced batches are never rewritten with
  other bytes, so nothing before the first lost sector was unsynced, and nothing after it was
  synced (the group commits are written one at a time). Both replicas torn by one power cut
  each keep what they synced.
- Not thread-safe: the broker serialises access to one ``SegmentLog``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import zlib
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NoReturn

import attrs

from ordq.broker_group.segment_scan import TEAR_WINDOW, scan_batches
from ordq.common.errors import ClosedError, CorruptLog, DiskFull, SegmentNotFound
from ordq.coordinator.paths import check_name
from ordq.wire.batch import (
    PREFIX,
    PREFIX_BYTES,
    BatchHeader,
    BytesLike,
    Message,
    check_messages,
    decode_batch,
    parse_header,
)

SEGMENT_FILE = "segment.log"
FILL_AHEAD_MAX = 128 << 10  # zeros written past the batches at most: as much as the file holds, up to this
FILL_PAGE = 4096



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
    batches: int  # the buffered batches it holds, from the first


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
        self._filled = 0  # the file's length: the batches, then zeros (``_fill``)
        self._fd: int | None = fd
        # Closed to spare a file descriptor while nothing uses it (``park``), reopened on the next use
        self._parked = False
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
    def open(cls, directory: Path, queue: str, seg: int, *, create: bool = False,
             sync_dirs: bool = True) -> SegmentLog:
        """Open the log of (queue, seg) under the data directory ``directory``.

        Scans the whole file: every batch's CRC and first_offset are checked. A torn tail is
        truncated (durably) and counted in ``recovery.truncated_bytes``. With ``create`` a
        missing segment is created empty (folders fsynced; with ``sync_dirs`` False the
        caller does it, ``sync_new_names``, before anything is acked from it); without it,
        SegmentNotFound.

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
            made = private_dir(folder)
            # Messages are the users' data: readable by the broker's user only (the umask can
            # only take bits away from 0600).
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if sync_dirs:
                sync_new_names(folder, made)
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
    def absent(cls, directory: Path, queue: str, seg: int) -> SegmentLog:
        """The log of a segment sealed empty without a file (broker_group/sealed_book.py): it
        reads as empty and, like a parked log, opens its file only when something needs it,
        which the broker makes first (``SegmentStore.materialize``)."""
        lg = cls(segment_dir(Path(directory), queue, seg) / SEGMENT_FILE, -1,
                 RecoveryReport(batches=0, messages=0, truncated_bytes=0))
        lg._fd, lg._parked = None, True
        return lg

    @classmethod
    def _recover(cls, path: Path, fd: int) -> SegmentLog:
        size = os.fstat(fd).st_size
        log = cls(path, fd, RecoveryReport(batches=0, messages=0, truncated_bytes=0))
        scan = scan_batches(fd, size, str(path))
        while True:
            try:
                pos, header, _ = next(scan)
            except StopIteration as stop:
                valid_end: int = stop.value
                break
            log._index(pos, header)
        torn = size - valid_end if _any_nonzero(fd, valid_end, size) else 0
        if torn:
            os.ftruncate(fd, valid_end)
            os.fdatasync(fd)
        log._synced_bytes = valid_end
        log._filled = valid_end if torn else size  # a tail of zeros alone is the fill, kept
        log.synced_end = log.end
        log.recovery = RecoveryReport(batches=len(log._offsets), messages=log.end, truncated_bytes=torn)
        return log

    @property
    def synced_bytes(self) -> int:
        """Bytes of the file that are synced: what this segment takes on disk."""
        return self._synced_bytes

    def bytes_before(self, offset: int) -> int:
        """Bytes of the file before message ``offset`` (a batch boundary, such as the LAC): where
        the first batch at or past it starts, or the file's synced length if none does."""
        i = bisect_left(self._offsets, offset)
        return self._positions[i] if i < len(self._offsets) else self._synced_bytes

    def _index(self, pos: int, header: BatchHeader) -> None:
        self._offsets.append(header.first_offset)
        self._positions.append(pos)
        self._seqs.append(header.first_seq)
        if self.first_seq is None:
            self.first_seq = header.first_seq
        self.end = header.first_offset + header.count
        self.last_seq = header.first_seq + header.count - 1

    def _require_fd(self) -> int:
        if self._fd is None and self._parked:
            self._fd, self._parked = os.open(self.path, os.O_RDWR | os.O_CLOEXEC), False
        if self._fd is None:
            raise ClosedError(f"segment log {self.path} is closed")
        return self._fd

    def park(self) -> None:
        """Close the file until the next call that needs it, which reopens it (a sealed
        segment nobody reads: an idle queue's must not hold a file descriptor, issue 29; a
        broker holding 10,000 of them would run out). Only with nothing buffered. Its zero
        tail is cut off (``_trim``)."""
        if self._fd is not None and not self._buffer:
            self._trim(self._fd)
            fd, self._fd, self._parked = self._fd, None, True
            os.close(fd)

    def _trim(self, fd: int) -> None:
        """Cut the zeros past the batches off the file, best effort (not synced: after a crash
        they are a zero tail again, kept as the fill)."""
        if self._filled > self._synced_bytes:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._synced_bytes)
                self._filled = self._synced_bytes

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
        """Write every buffered batch with one write and ``fdatasync`` (more than one when
        they span more than ``TEAR_WINDOW``: ``begin_sync``); return the new ``synced_end``.
        A no-op (no syscall) when nothing is buffered.

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
        while (written := self.begin_sync()) is not None:
            try:
                os.fdatasync(written.fd)
            except OSError as exc:
                return self.end_sync(written, exc)
            self.end_sync(written)
        return self.synced_end

    def begin_sync(self) -> Written | None:
        """The first half of ``sync()``: write the buffered batches (one ``pwrite``), not yet
        durable and not yet readable; None when nothing is buffered. Every batch of one write
        starts within ``TEAR_WINDOW`` of its start (the scan's bound on a torn write); the
        rest stay buffered for the next call. The caller then runs ``os.fdatasync(written.fd)``
        — without holding its lock, so reads of the synced prefix go on meanwhile — and
        ``end_sync(written, error)``, and calls again until it returns None. Nothing may be
        appended or truncated in between. Raises as ``sync()`` does."""
        fd = self._require_writable()
        if not self._buffer:
            return None
        count, size = 0, 0
        for b in self._buffer:
            if size >= TEAR_WINDOW:
                break
            count, size = count + 1, size + len(b)
        data = self._buffer[0] if count == 1 else b"".join(self._buffer[:count])
        written = Written(fd=fd, size=len(data), batches=count)
        try:
            _pwrite_all(fd, data, self._synced_bytes)
        except OSError as exc:
            self._sync_failed(written, exc)
        self._fill(fd, self._synced_bytes + len(data))
        return written

    def _fill(self, fd: int, end: int) -> None:
        """Zeros past ``end`` (where the batches will end) when it passes the fill: as many
        as the file holds, at most ``FILL_AHEAD_MAX``, to a page boundary (a small file takes
        the one block it took before); made durable by the same sync as the batches. Best
        effort: a file that cannot grow (no space) keeps what it has, and the batches are
        written all the same."""
        if end <= self._filled:
            return
        target = -(-(end + min(end, FILL_AHEAD_MAX)) // FILL_PAGE) * FILL_PAGE
        try:
            _pwrite_all(fd, bytes(target - end), end)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            self._filled = end
            return
        self._filled = target

    def end_sync(self, written: Written, error: OSError | None = None) -> int:
        """The second half of ``sync()``, after the caller's fdatasync (``error``: how it
        failed): count the batches synced and return the new ``synced_end``."""
        self._require_fd()
        if error is not None:
            self._sync_failed(written, error)
        self._synced_bytes += written.size
        self._synced_batches += written.batches
        self._syncs += 1
        del self._buffer[: written.batches]
        self._buffered_bytes -= written.size
        unsynced = len(self._buffer)
        self.synced_end = self._offsets[-unsynced] if unsynced else self.end
        return self.synced_end

    def _sync_failed(self, written: Written, exc: OSError) -> NoReturn:
        dropped = len(self._buffer)
        self._drop_unsynced()
        self._filled = self._synced_bytes
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
        self._synced_bytes = self._filled = pos
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
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        limit = min(upto, self.synced_end)
        if offset >= limit:
            if self.closed:
                raise ClosedError(f"segment log {self.path} is closed")
            return []  # no file needed (a parked log stays closed; an absent one has none)
        fd = self._require_fd()
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
                length, crc, first_offset = PREFIX.unpack_from(raw)
                with memoryview(raw) as view:
                    bad = length != len(raw) or first_offset != offsets[k] or zlib.crc32(view[PREFIX_BYTES:]) != crc
                if bad:
                    raise CorruptLog(str(self.path), positions[k], "CRC mismatch on read (or a changed prefix)")
        return out

    def last_message(self) -> tuple[int, Message] | None:
        """(offset, message) of the last appended message (buffered ones included; call
        sync() first for the last durable one), or None when empty."""
        if not self._offsets:
            return None
        fd = self._require_fd()
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
        return self._fd is None and not self._parked

    def close(self) -> None:
        """Close the file. Unsynced batches are dropped (they were never acked). Idempotent."""
        self._parked = False
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._buffer.clear()
            self._buffered_bytes = 0
            self._trim(fd)
            os.close(fd)

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SegmentLog {self.path} end={self.end} synced_end={self.synced_end}>"


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    done = 0
    with memoryview(data) as view:
        while done < len(data):
            done += os.pwrite(fd, view[done:], at + done)


def _any_nonzero(fd: int, start: int, size: int) -> bool:
    """Whether any byte of the file from ``start`` to ``size`` is not zero: a tail of zeros
    alone is the fill (or a torn write of zeros: no batch either way), kept as it is."""
    while start < size:
        chunk = os.pread(fd, min(1 << 20, size - start), start)
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return True
        start += len(chunk)
    return False


def private_dir(path: Path) -> list[Path]:
    """Make ``path`` (and its missing parents) folders only their owner may list or enter: 0700,
    set with chmod as well because mkdir's mode passes through the umask and leaves a
    folder made by an older version as it was. Returns the folders it made, outermost first."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    os.chmod(missing[0] if missing else path, 0o700)
    return list(reversed(missing))


def sync_new_names(folder: Path, made: list[Path]) -> None:
    """Make durable the names just created in a segment's ``folder`` (its files) and the
    folder's own name in its queue's folder; and, for each folder in ``made`` (created just
    now, by ``private_dir``), its name in its parent. A synced batch in a file whose directory
    entry was lost would be lost with it. (A queue's folder that existed already was made
    durable when it was created: ``SegmentStore`` syncs the data folder then, and at start.)"""
    for d in dict.fromkeys([folder, folder.parent, *(m.parent for m in made)]):
        _fsync_dir(d)


def sync_dir(path: Path) -> None:
    """fsync a folder: the names created or removed in it are durable after this."""
    _fsync_dir(path)


def segment_dir(data_dir: Path, queue: str, seg: int) -> Path:
    """Where a replica keeps (queue, seg): <data>/<queue>/<seg:012d>/."""
    return data_dir / queue / f"{seg:012d}"
