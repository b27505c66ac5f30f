"""Producer and consumer processes for the drills, the demo and the failover bench.

    python -m ordq.drills.workload produce --zk H --root R --queue Q --total N --status FILE [...]
    python -m ordq.drills.workload consume --zk H --root R --queue Q --subscription S --total N --status FILE [...]

The producer waits to be elected (a standby blocks), then sends the queue's stream up to seq
``total - 1``: a standby that takes over continues where the stored stream ends, so however
many producers lead in turn, the queue ends up holding seqs 0..total-1 exactly once. Payloads
carry their seq and the writer (``%012d|writer|`` then padding). The consumer reads until it
delivered seq ``total - 1``. Both write the SDK's audit files (docs/AUDIT_FORMAT.md) for the
verifier and a small JSON status file, rewritten every ``--status-every`` seconds, that the
drills and the demo's live display read. Exit codes: 0 done, 3 fenced (another producer took
over: expected of a stale producer), 4 gap detected, 2 any other error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ordq.bootstrap import add_cluster_arguments, cluster_options
from ordq.common.proc import announce

EXIT_DONE = 0
EXIT_ERROR = 2
EXIT_FENCED = 3
EXIT_GAP = 4
EXIT_NOT_LEADER = 5  # a consumer that lost its lease and stopped (an SDK from before rejoins: issue 37)


def now_us() -> int:
    return time.time_ns() // 1000


def write_status(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` atomically (a reader never sees half a document)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    tmp.replace(path)


def read_status(path: Path) -> dict[str, Any]:
    """The last status a workload process wrote ({} before its first)."""
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return doc


def make_payload(seq: int, writer: str, size: int) -> bytes:
    head = b"%012d|%s|" % (seq, writer.encode())
    return head + b"x" * max(size - len(head), 0)


def payload_seq(payload: bytes) -> int | None:
    try:
        return int(payload[:12])
    except ValueError:
        return None


def closed(client: Any, error: str) -> str:
    """Close a role's Producer or Consumer (if it was made) in its ``finally``: a failure to
    close becomes the role's error unless it has one already (its exit code is kept)."""
    if client is not None:
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - reported in the status
            return error or f"close: {type(exc).__name__}: {exc}"
    return error


class StatusWriter:
    """Rewrites a status file from ``snapshot()`` every ``every_s`` seconds until closed."""

    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]], every_s: float) -> None:
        self.path, self.snapshot, self.every_s = path, snapshot, every_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the status thread and the main thread both write
        self._thread = threading.Thread(target=self._loop, name="status", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def write(self) -> None:
        with self._lock:
            write_status(self.path, {**self.snapshot(), "pid": os.getpid(), "t_us": now_us()})

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.write()


# -- producer ----------------------------------------------------------------------------------



def _wait_for_file(path: Path) -> None:
    """Until the drill creates ``path`` (it kills this process if it never does)."""
    while not path.exists():
        time.sleep(0.01)

class ProducerRun:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = "standby"
        self.error = ""
        self.next_seq: int | None = None
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.last_acked_seq = -1
        self.first_ack_us: int | None = None
        self.seg_first_ack_us: dict[int, int] = {}  # segment -> first ack there (failover timing)
        self.first_failure: BaseException | None = None
        self.producer: Any = None

    def snapshot(self) -> dict[str, Any]:
        stats = self.producer.statistics() if self.producer is not None else None
        return {
            "role": "producer", "writer": self.args.writer, "state": self.state, "error": self.error,
            "total": self.args.total, "next_seq": self.next_seq, "sent": self.sent, "acked": self.acked,
            "failed": self.failed, "last_acked_seq": self.last_acked_seq, "first_ack_us": self.first_ack_us,
            "seg_first_ack_us": {str(k): v for k, v in self.seg_first_ack_us.items()},
            "seg": stats.seg if stats else None, "head": stats.head if stats else None,
            "epoch": stats.epoch if stats else None, "failovers": stats.failovers if stats else 0,
        }

    def on_done(self, fut: Any) -> None:
        # Runs on the SDK's ack thread, in seq order: keep it cheap.
        exc = fut.exception()
        if exc is not None:
            self.failed += 1
            if self.first_failure is None:
                self.first_failure = exc
            return
        res = fut.result()
        t = now_us()
        self.acked += 1
        self.last_acked_seq = res.seq
        if self.first_ack_us is None:
            self.first_ack_us = t
        if res.seg not in self.seg_first_ack_us:
            self.seg_first_ack_us[res.seg] = t

    def run(self) -> int:
        from ordq.common.errors import FencedError, GapDetected, OrdqError
        from ordq.sdk import Producer, ProducerConfig
        from ordq.sdk._producer_core import BatchingConfig

        a = self.args
        cfg = ProducerConfig(**cluster_options(a), queue=a.queue, send_timeout_s=a.send_timeout,
                             lease_ttl_s=a.session_timeout, audit_dir=a.audit_dir, producer_id=a.writer,
                             batching=BatchingConfig(linger_ms=a.linger_ms))
        status = StatusWriter(a.status, self.snapshot, a.status_every)
        status.start()
        announce("STARTED")
        code = EXIT_DONE
        try:
            self.producer = producer = Producer(cfg)
            producer.start()  # a standby blocks here until it leads
            self.next_seq = _next_seq(producer)
            self.state = "leading"
            status.write()
            announce(f"LEADER next_seq={self.next_seq}")
            if a.go_file is not None:
                _wait_for_file(a.go_file)  # held until every process is up
            keys = [b"k%d" % i for i in range(a.keys)] if a.keys else None
            start = time.monotonic()
            for i, seq in enumerate(range(self.next_seq, a.total)):
                if a.stop_file is not None and i % 50 == 0 and a.stop_file.exists():
                    break  # the stream ends here (a run of many faults on one stream is over)
                if seq == a.hold_at and a.hold_file is not None:
                    _wait_for_file(a.hold_file)  # the rest of the stream waits for the fault
                if a.rate:
                    pause = start + i / a.rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    elif pause < -0.1:  # after a stall, resume the steady rate (no burst)
                        start -= pause
                # Steady load means acks keep pace: at most --max-inflight messages unacked.
                while self.sent - self.acked - self.failed >= a.max_inflight and self.first_failure is None:
                    time.sleep(0.001)
                fut = producer.send(make_payload(seq, a.writer, a.size), key=keys[seq % len(keys)] if keys else None)
                fut.add_done_callback(self.on_done)
                self.sent += 1
            producer.flush(timeout_s=a.flush_timeout)
            if self.first_failure is not None:  # every send must be acked, or this run failed
                raise self.first_failure
            self.state = "done"
        except FencedError as exc:
            self.state, self.error, code = "fenced", str(exc), EXIT_FENCED
        except GapDetected as exc:  # pragma: no cover - a producer never raises it
            self.state, self.error, code = "gap", str(exc), EXIT_GAP
        except (OrdqError, OSError) as exc:
            self.state, self.error, code = "error", f"{type(exc).__name__}: {exc}", EXIT_ERROR
        finally:
            self.error = closed(self.producer, self.error)
            status.close()
        announce(f"EXIT {self.state} acked={self.acked} {self.error}")
        return code


def _next_seq(producer: Any) -> int:
    """Where the stored stream continues (the takeover found it)."""
    last = producer.last_committed()
    return 0 if last is None else int(last.seq) + 1


# -- consumer ----------------------------------------------------------------------------------


class ConsumerRun:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = "standby"
        self.error = ""
        self.delivered = 0
        self.last_seq = -1
        self.first_delivery_us: int | None = None
        self.payload_mismatches = 0
        self.consumer: Any = None
        self.stop = threading.Event()

    def snapshot(self) -> dict[str, Any]:
        stats = self.consumer.statistics() if self.consumer is not None and self.state != "standby" else None
        return {
            "role": "consumer", "writer": self.args.writer, "state": self.state, "error": self.error,
            "total": self.args.total, "delivered": self.delivered, "last_seq": self.last_seq,
            "first_delivery_us": self.first_delivery_us, "payload_mismatches": self.payload_mismatches,
            "seg": stats.seg if stats else None, "offset": stats.offset if stats else None,
            "duplicates_dropped": stats.duplicates_dropped if stats else 0,
            "rejoins": stats.rejoins if stats else 0,
            "rejoining": self.consumer.rejoining if self.consumer is not None else False,
        }

    def run(self) -> int:
        from ordq.common.errors import GapDetected, NotLeader, OrdqError
        from ordq.sdk import Consumer, ConsumerConfig

        a = self.args
        cfg = ConsumerConfig(**cluster_options(a), queue=a.queue, subscription=a.subscription,
                             lease_ttl_s=a.session_timeout, audit_dir=a.audit_dir, consumer_id=a.writer)
        status = StatusWriter(a.status, self.snapshot, a.status_every)
        status.start()
        announce("STARTED")
        code = EXIT_DONE
        try:
            self.consumer = consumer = Consumer(cfg)
            consumer.start()
            self.state = "leading"
            status.write()
            announce("LEADER")
            rejoins = 0
            while self.last_seq < a.total - 1 and not self.stop.is_set():
                batch = consumer.poll(0.2)
                if consumer.statistics().rejoins != rejoins:
                    # Its lease went to another (frozen past it) and came back: it reads on from
                    # the committed cursor (the successor may have finished the stream).
                    rejoins = consumer.statistics().rejoins
                    self.last_seq = consumer.statistics().last_seq
                for m in batch:
                    if self.first_delivery_us is None:
                        self.first_delivery_us = now_us()
                    if payload_seq(m.payload) != m.seq:
                        self.payload_mismatches += 1
                    self.delivered += 1
                    self.last_seq = m.seq
            self.state = "done" if self.last_seq >= a.total - 1 else "stopped"
            consumer.commit()  # every message handed out is counted: finished
        except NotLeader as exc:
            self.state, self.error, code = "deposed", str(exc), EXIT_NOT_LEADER
        except GapDetected as exc:
            self.state, self.error, code = "gap", str(exc), EXIT_GAP
        except (OrdqError, OSError) as exc:
            self.state, self.error, code = "error", f"{type(exc).__name__}: {exc}", EXIT_ERROR
        finally:
            self.error = closed(self.consumer, self.error)
            status.close()
        announce(f"EXIT {self.state} delivered={self.delivered} last_seq={self.last_seq} {self.error}")
        return code


# -- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ordq.drills.workload", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    for role in ("produce", "consume"):
        p = sub.add_parser(role)
        add_cluster_arguments(p)
        p.add_argument("--queue", required=True)
        p.add_argument("--total", type=int, required=True, help="the stream is seqs 0..total-1")
        p.add_argument("--status", type=Path, required=True, help="JSON status file, rewritten as it runs")
        p.add_argument("--status-every", type=float, default=0.1, metavar="SECONDS")
        p.add_argument("--writer", required=True, help="writer id (audit files, payloads)")
        p.add_argument("--audit-dir", type=Path, default=None)
        p.add_argument("--session-timeout", type=float, default=1.0, metavar="SECONDS")
        if role == "produce":
            p.add_argument("--rate", type=float, default=None, help="messages per second (default: unpaced)")
            p.add_argument("--size", type=int, default=100, help="payload bytes")
            p.add_argument("--keys", type=int, default=8, help="distinct keys, round robin (0: no key)")
            p.add_argument("--send-timeout", type=float, default=1.0, metavar="SECONDS")
            p.add_argument("--linger-ms", type=float, default=2.0)
            p.add_argument("--max-inflight", type=int, default=2000, help="messages sent but not acked at most")
            p.add_argument("--go-file", type=Path, default=None, help="once leading, wait for this file to exist")
            p.add_argument("--hold-at", type=int, default=None, metavar="SEQ",
                           help="before sending this seq, wait for --hold-file to exist (the drill's fault)")
            p.add_argument("--hold-file", type=Path, default=None)
            p.add_argument("--stop-file", type=Path, default=None,
                           help="stop sending once this file exists (the stream then ends before --total)")
            p.add_argument("--flush-timeout", type=float, default=120.0, metavar="SECONDS")
        else:
            p.add_argument("--subscription", required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    if args.role == "produce":
        return ProducerRun(args).run()
    run = ConsumerRun(args)
    # SIGTERM: stop reading, commit the cursor, close the audit files, exit.
    signal.signal(signal.SIGTERM, lambda *_: run.stop.set())
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
