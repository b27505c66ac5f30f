"""Load used by the failover tests: payloads that carry their seq, and the JSON-lines records
the producer/consumer programs (``tests.helpers.produce`` / ``consume``) write.

A payload is ``b"<seq:012d>:<writer>:" + filler`` where the filler is derived from the header,
so a reader can tell from the bytes alone which seq and which producer it belongs to and
whether any byte was changed (``parse_payload``).

Records (one JSON object per line, flushed as written so a ``kill -9`` loses at most the
line being written; readers drop a torn last line):
- ``{"a": seq, "crc": crc32}``: an acked message (producer);
- ``{"d": seq, "pseq": seq in payload, "w": writer, "ok": filler intact, "crc": crc32}``: a
  delivered message (consumer);
- ``{"event": ...}``: leadership, completion, errors (see the programs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import IO, Any

import attrs

from ordq.common.proc import ManagedProcess
from ordq.sdk import CommitConfig, ConsumerConfig
from tests.util import wait_until


def make_payload(seq: int, writer: str, size: int) -> bytes:
    """The payload of message ``seq`` written by ``writer`` (at least the header long)."""
    if ":" in writer:
        raise ValueError("writer must not contain ':'")
    head = f"{seq:012d}:{writer}:".encode()
    pad = max(size - len(head), 0)
    digest = hashlib.blake2b(head, digest_size=32).digest()
    return head + (digest * (pad // 32 + 1))[:pad]


@attrs.frozen
class PayloadInfo:
    seq: int  # the seq written in the payload (-1 when unreadable)
    writer: str
    intact: bool  # the payload is exactly what make_payload(seq, writer, len) gives


def parse_payload(payload: bytes) -> PayloadInfo:
    try:
        seq_s, writer_b, _ = payload.split(b":", 2)
        seq, writer = int(seq_s), writer_b.decode()
    except ValueError:
        return PayloadInfo(seq=-1, writer="?", intact=False)
    return PayloadInfo(seq=seq, writer=writer, intact=make_payload(seq, writer, len(payload)) == payload)


@attrs.frozen
class AckRec:
    seq: int
    crc: int
    writer: str = ""


@attrs.frozen
class DeliveryRec:
    seq: int  # the seq the SDK delivered it as
    payload_seq: int
    writer: str
    intact: bool
    crc: int


def delivery_of(seq: int, payload: bytes) -> DeliveryRec:
    info = parse_payload(payload)
    return DeliveryRec(seq=seq, payload_seq=info.seq, writer=info.writer, intact=info.intact,
                       crc=zlib.crc32(payload))


class RecordWriter:
    """Append JSON lines to a file, flushed to the OS after every ``write``; thread-safe."""

    def __init__(self, path: Path) -> None:
        self._f: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def write(self, *records: dict[str, Any]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        with self._lock:
            self._f.write(text)
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


EXIT_ERROR = 2


def record_failure(out: RecordWriter, exc: BaseException, program: str) -> int:
    """In a test program's last ``except``: tell the test what went wrong (the out file's
    ``error`` event), log the traceback, and return the program's exit code."""
    out.write({"event": "error", "type": type(exc).__name__, "error": str(exc)})
    logging.exception("%s failed", program)
    return EXIT_ERROR


class RecordsTail:
    """Reads a records file as it grows (complete lines only), keeping what it parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.records
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            if line:
                self.records.append(json.loads(line))
        self._offset += end
        return self.records


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a file (a torn last line, from a kill -9, is dropped)."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break  # torn last line: the writer was killed while writing it
            raise
    return out


def acks_in(records: list[dict[str, Any]], writer: str = "") -> list[AckRec]:
    return [AckRec(seq=r["a"], crc=r["crc"], writer=writer) for r in records if "a" in r]


def deliveries_in(records: list[dict[str, Any]]) -> list[DeliveryRec]:
    return [DeliveryRec(seq=r["d"], payload_seq=r["pseq"], writer=r["w"], intact=r["ok"], crc=r["crc"])
            for r in records if "d" in r]


def events_in(records: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    return [r for r in records if "event" in r and (name is None or r["event"] == name)]


# -- what the consumer programs share --------------------------------------------------------


def consumer_arguments(*, session_timeout_s: float) -> argparse.ArgumentParser:
    """The options every consumer program takes; each adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--sub", required=True)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit-every", type=int, default=1000)
    ap.add_argument("--commit-ms", type=float, default=200.0)
    ap.add_argument("--session-timeout", type=float, default=session_timeout_s)
    return ap


def consumer_config(args: argparse.Namespace, **more: Any) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=args.zk, root=args.root, queue=args.queue, subscription=args.sub,
                          commit=CommitConfig(every_messages=args.commit_every, every_ms=args.commit_ms),
                          lease_ttl_s=args.session_timeout, **more)


def wait_for_file(path: Path) -> None:
    """A test program's hold: until the test creates ``path`` (its go file, a producer's gate)."""
    while not path.exists():
        time.sleep(0.01)


def program_logging() -> None:
    """A test program logs to stdout (its log tail goes into a failing test's report)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)


class _Program:
    def __init__(self, name: str, proc: ManagedProcess, out: Path, go_file: Path) -> None:
        self.name, self.proc, self.out, self.go_file = name, proc, out, go_file
        self._tail = RecordsTail(out)

    def go(self) -> None:
        """Let a held program connect (and contend for leadership)."""
        self.proc.wait_for_line("STARTED", timeout_s=60)
        self.go_file.touch()

    def records(self) -> list[dict[str, Any]]:
        """Complete records so far (a torn last line of a killed program is left out)."""
        return self._tail.read()

    def event(self, name: str) -> dict[str, Any] | None:
        found = events_in(self.records(), name)
        return found[-1] if found else None

    def count(self, key: str) -> int:
        return sum(1 for r in self.records() if key in r)

    def wait_leader(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The program's leader event, once it leads."""
        return wait_until(lambda: self.event("leader"), timeout_s=timeout_s, interval_s=0.02,
                          what=f"{self.proc.name} to lead ({self.proc.log_path})")

    def wait_exit(self, timeout_s: float) -> int | None:
        """Its exit code once it exited (negative: killed by that signal)."""
        wait_until(lambda: not self.proc.alive(), timeout_s=timeout_s, interval_s=0.05,
                   what=f"{self.proc.name} to finish ({self.proc.log_path})")
        return self.proc.returncode


class ProducerProgram(_Program):
    """A ``tests.helpers.produce`` process and what it wrote; ``gate_file``: its ``--gate``."""

    def __init__(self, writer: str, proc: ManagedProcess, out: Path, go_file: Path,
                 gate_file: Path | None = None) -> None:
        super().__init__(writer, proc, out, go_file)
        self.writer = writer
        self.gate_file = gate_file

    def open_gate(self) -> None:
        """Let it send past its ``--gate-at`` seq (a stopped program sees it once resumed)."""
        assert self.gate_file is not None, f"{self.writer} was started without a gate"
        self.gate_file.touch()

    def wait_acked(self, count: int, timeout_s: float = 60.0) -> None:
        """Until ``count`` of its messages were acked; it exiting first fails the test."""
        def progressed() -> bool:
            if not self.proc.alive():
                raise AssertionError(f"{self.writer} exited: {self.records()[-2:]}")
            return self.acked_count() >= count

        wait_until(progressed, timeout_s=timeout_s, interval_s=0.01, what=f"{count} acks of {self.writer}")

    def acks(self) -> list[AckRec]:
        return acks_in(self.records(), self.writer)

    def acked_count(self) -> int:
        return self.count("a")


class ConsumerProgram(_Program):
    """A ``tests.helpers.consume`` process and what it wrote."""

    def deliveries(self) -> list[DeliveryRec]:
        return deliveries_in(self.records())

    def delivered_count(self) -> int:
        return self.count("d")
