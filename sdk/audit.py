"""Audit hook: append every acked send and every delivery to rolling TSV files.

Format (the contract with ``spark_order_check``): docs/AUDIT_FORMAT.md. Each ``write_rows``
call (one per ack, one per delivered batch) reaches the OS before it returns, and the SDK calls
it before the application sees those acks or messages: a process killed with -9 loses no row
of what its application saw (a machine crash can: the files are not fsynced). A file is
renamed from ``.tsv.part`` to ``.tsv`` when it is complete.

A file only ever grows by whole rows: a write that fails half-way (an interrupted or refused
write) is cut back to the last complete row before the error goes on, so half a row never glues
onto the next write into one unreadable line (a reader drops such a line: a row in the middle
would read as lost).

Written back as it grows (``WRITEBACK_BYTES``): left to the kernel, a file written at a steady
rate and never synced is written back whole once its oldest dirty page is 30 s old
(``vm.dirty_expire_centisecs``), ~18 MB at once for the drills' 600 KB/s of audit rows, and a
broker's fdatasync on the same disk waited behind it (stop 73: a window of the control-plane
drill every ~30 s, its acks at 70-110 ms for ~0.5 s). So each ``WRITEBACK_BYTES`` written are
handed to the kernel's writeback at once (``posix_fadvise(DONTNEED)`` starts it and does not wait
for it, as PostgreSQL's ``pg_flush_data`` does where ``sync_file_range`` is missing). Not a sync:
a machine crash still loses what the disk did not get.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

import attrs

ACK_COLUMNS = (
    "queue", "producer", "epoch", "seq", "seg", "offset", "key", "crc32", "send_us", "ack_us",
)
DELIVERY_COLUMNS = (
    "queue", "subscription", "consumer", "seq", "seg", "offset", "key", "crc32", "msg_us",
    "deliver_us", "due_us",
)
# Columns added at the end of a kind after its first version: readers take rows without them
# (files written before) as well as with them.
OPTIONAL_COLUMNS = {"deliveries": ("due_us",)}
# A message a consumer's failure policy moved aside (``parked``) or later handed to the
# application from the parking queue (``replayed``): docs/AUDIT_FORMAT.md, "skips".
SKIP_COLUMNS = (
    "queue", "subscription", "consumer", "seq", "key", "action", "parking_queue", "parked_seq", "at_us",
)
# Where a consumer instance began reading: after ``after_seq`` (its cursor when it took the
# subscription). The verifier judges a subscription from its lowest start in the run: a
# subscription made after segments were removed never could read what was before them
# (docs/AUDIT_FORMAT.md, "starts").
START_COLUMNS = ("queue", "subscription", "consumer", "after_seq", "seg", "offset", "at_us")
KIND_COLUMNS = {"acks": ACK_COLUMNS, "deliveries": DELIVERY_COLUMNS, "skips": SKIP_COLUMNS, "starts": START_COLUMNS}
WRITEBACK_BYTES = 256 << 10  # a written stretch this long goes to the disk at once (a few ms of it)
_PAGE = os.sysconf("SC_PAGE_SIZE")


def start_writeback(fd: int, start: int, length: int) -> None:
    """Start the kernel's writeback of ``length`` bytes at ``start`` of ``fd`` without waiting
    for it (on Linux, DONTNEED writes dirty pages back asynchronously and drops only clean ones)."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no posix_fadvise here
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def new_writer_id() -> str:
    """A process-unique id: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@attrs.define
class AuditWriter:
    """Rolling TSV writer for one kind (``acks`` or ``deliveries``); thread-safe.

    ``write_rows`` takes rows already in column order and writes them to the OS at once (one
    write per call); call ``close()`` to publish the last file.
    """

    directory: Path
    kind: str
    writer_id: str = attrs.field(factory=new_writer_id)
    rows_per_file: int = 1_000_000
    _n: int = 0
    _rows_in_file: int = 0
    _pending: list[str] = attrs.field(factory=list)
    _fd: int | None = None
    _size: int = 0  # bytes of whole rows (and the header) in the open file
    _written_back: int = 0  # bytes of the open file handed to writeback (``start_writeback``)
    writeback_bytes: int = WRITEBACK_BYTES
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        if self.kind not in KIND_COLUMNS:
            raise ValueError(f"audit kind must be one of {sorted(KIND_COLUMNS)}, not {self.kind!r}")
        folder = self.directory / self.kind
        folder.mkdir(parents=True, exist_ok=True)
        # A writer restarted with the same id (a fixed consumer or member id) numbers its files
        # after those already there: they are the evidence of what the one before it saw.
        mine = re.compile(re.escape(self.writer_id) + r"-(\d+)\.tsv(?:\.part)?")
        taken = [int(m[1]) for m in map(mine.fullmatch, os.listdir(folder)) if m]
        self._n = max(taken) + 1 if taken else 0

    def _path(self, final: bool) -> Path:
        name = f"{self.writer_id}-{self._n}.tsv" + ("" if final else ".part")
        return self.directory / self.kind / name

    def write_rows(self, rows: Iterable[tuple[object, ...]]) -> None:
        with self._lock:
            for row in rows:
                self._pending.append("\t".join(map(str, row)))
                self._rows_in_file += 1
                if self._rows_in_file >= self.rows_per_file:
                    self._roll()
            # At once, not in blocks: a killed producer's buffered rows were acks its
            # application had seen, lost to the verifier (found in the kill-producer drill).
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        data = ("\n".join(self._pending) + "\n").encode("ascii")
        if self._fd is None:
            self._fd = self._create()
            self._size = self._written_back = 0
        if self._size == 0:
            data = ("\t".join(KIND_COLUMNS[self.kind]) + "\n").encode("ascii") + data
        try:
            view = memoryview(data)
            while view:  # os.write may take less than asked
                view = view[os.write(self._fd, view):]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            raise
        self._size += len(data)
        self._pending.clear()
        if self._size - self._written_back >= self.writeback_bytes:
            # Whole pages only: a page handed over part-written was written to again while under
            # writeback, the next hand-over skipped it (the kernel does not wait for a page in
            # flight) and it stayed dirty until the kernel's own 30 s (default tier, stop 83).
            end = self._size // _PAGE * _PAGE
            start_writeback(self._fd, self._written_back, end - self._written_back)
            self._written_back = end

    def _create(self) -> int:
        """This writer's next file, never one that exists (another process with the same id)."""
        while True:
            if not self._path(final=True).exists():
                try:
                    return os.open(self._path(final=False), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    pass
            self._n += 1

    def _roll(self) -> None:
        self._flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            os.replace(self._path(final=False), self._path(final=True))
        self._n += 1
        self._rows_in_file = 0

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def close(self) -> None:
        with self._lock:
            self._roll()
