"""Audit hook: append every acked send and every delivery to rolling TSV files.

Format (the contract with ``spark_order_check``): docs/AUDIT_FORMAT.md. Each ``write_rows``
call (one per ack, one per delivered batch) reaches the OS before it returns, and the SDK calls
it before the application sees those acks or messages: a process killed with -9 loses no row
of what its application saw (a machine crash can: the files are not fsynced). A file is
renamed from ``.tsv.part`` to ``.tsv`` when it is complete.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import attrs

ACK_COLUMNS = (
    "queue", "producer", "epoch", "seq", "seg", "offset", "key", "crc32", "send_us", "ack_us",
)
DELIVERY_COLUMNS = (
    "queue", "subscription", "consumer", "seq", "seg", "offset", "key", "crc32", "msg_us",
    "deliver_us",
)
# A message a consumer's failure policy moved aside (``parked``) or later handed to the
# application from the parking queue (``replayed``): docs/AUDIT_FORMAT.md, "skips".
SKIP_COLUMNS = (
    "queue", "subscription", "consumer", "seq", "key", "action", "parking_queue", "parked_seq", "at_us",
)
KIND_COLUMNS = {"acks": ACK_COLUMNS, "deliveries": DELIVERY_COLUMNS, "skips": SKIP_COLUMNS}


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
    _file: TextIO | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        if self.kind not in KIND_COLUMNS:
            raise ValueError(f"audit kind must be one of {sorted(KIND_COLUMNS)}, not {self.kind!r}")
        (self.directory / self.kind).mkdir(parents=True, exist_ok=True)

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
        if self._file is None:
            self._file = open(self._path(final=False), "w", encoding="ascii")  # noqa: SIM115
            self._file.write("\t".join(KIND_COLUMNS[self.kind]) + "\n")
        self._file.write("\n".join(self._pending) + "\n")
        self._file.flush()
        self._pending.clear()

    def _roll(self) -> None:
        self._flush()
        if self._file is not None:
            self._file.close()
            os.replace(self._path(final=False), self._path(final=True))
            self._file = None
        self._n += 1
        self._rows_in_file = 0

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def close(self) -> None:
        with self._lock:
            self._roll()
