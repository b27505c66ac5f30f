"""The failing-handler drills (issue 13): a consumer whose handler fails on chosen seqs, under
load, with the head master killed meanwhile.

- ``failing-handler-block``: ``Consumer.run`` with ``block``. While the failing message blocks,
  nothing after it is handled (global order); the alarm shows in ZooKeeper; once the handler is
  fixed the stream goes on, every seq handled once, in order.
- ``failing-handler-park``: ``Consumer.run_keyed`` with ``park``. The failing messages are parked
  and every later message of their keys follows them; the other keys go on; an operator's
  ``replay --all`` hands them to the fixed handler; every seq is handled, one key's in seq order
  across parking and replay, and every parked seq has its ledger record, replayed.

The consumer process is ``python -m ordq.drills.failing`` (options of ``ordq.drills.workload consume``
plus the failure ones). It handles until every seq 0..total-1 was handled (directly or by a
replay), logging each handling to ``--handled-log`` (seq, key, replayed, µs).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from ordq.bootstrap import cluster_options
from ordq.common.proc import announce
from ordq.drills.workload import EXIT_DONE, EXIT_ERROR, StatusWriter, build_parser, closed, now_us, payload_seq

FIXED = "fixed"  # the file that tells the handler it works now
HANDLED = "handled.tsv"


class FailingConsumer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fail = {int(s) for s in args.fail_seqs.split(",")}
        self.lock = threading.Lock()
        self.handled: set[int] = set()
        self.read_to = -1
        self.state = "standby"
        self.error = ""
        self.first_failure_us: int | None = None
        self.consumer: Any = None
        self.stop = threading.Event()
        self.log = open(args.handled_log, "a", encoding="ascii", buffering=1)  # noqa: SIM115 - closed in run

    def snapshot(self) -> dict[str, Any]:
        c = self.consumer
        blocked = c.blocked if c is not None else None
        stats = c.statistics() if c is not None and self.state != "standby" else None
        with self.lock:
            return {"role": "consumer", "writer": self.args.writer, "state": self.state, "error": self.error,
                    "total": self.args.total, "handled": len(self.handled), "delivered": len(self.handled),
                    "last_seq": stats.last_seq if stats else -1, "first_failure_us": self.first_failure_us,
                    "blocked_seq": blocked.seq if blocked else None, "parked": stats.parked if stats else 0,
                    "replayed": stats.replayed if stats else 0}

    def handler(self, m: Any) -> None:
        if m.seq in self.fail and not (self.args.fixed_file.exists()):
            with self.lock:
                self.first_failure_us = self.first_failure_us or now_us()
            raise RuntimeError(f"drill: the handler cannot handle seq {m.seq} yet")
        if payload_seq(m.payload) != m.seq:
            raise AssertionError(f"payload of seq {m.seq} names another seq")
        replayed = dict(m.headers).get("x-ordq-replayed") == b"1"
        with self.lock:
            self.log.write(f"{m.seq}\t{(m.key or b'').hex()}\t{int(replayed)}\t{now_us()}\n")
            self.handled.add(m.seq)
            if len(self.handled) >= self.args.total:
                self.stop.set()

    def run(self) -> int:
        from ordq.common.errors import OrdqError
        from ordq.sdk import Consumer, ConsumerConfig, FailurePolicy

        a = self.args
        policy = FailurePolicy(on_failure=a.on_failure, attempts=2, backoff_s=(0.05,))
        cfg = ConsumerConfig(**cluster_options(a), queue=a.queue, subscription=a.subscription,
                             lease_ttl_s=a.session_timeout, audit_dir=a.audit_dir, consumer_id=a.writer,
                             on_failure=policy)
        status = StatusWriter(a.status, self.snapshot, a.status_every)
        status.start()
        announce("STARTED")
        code = EXIT_DONE
        try:
            self.consumer = consumer = Consumer(cfg)
            consumer.start()
            self.state = "leading"
            announce("LEADER")
            if a.workers:
                consumer.run_keyed(self.handler, workers=a.workers, stop=self.stop)
            else:
                consumer.run(self.handler, stop=self.stop)
            self.state = "done" if len(self.handled) >= a.total else "stopped"
        except (OrdqError, OSError) as exc:
            self.state, self.error, code = "error", f"{type(exc).__name__}: {exc}", EXIT_ERROR
        finally:
            self.error = closed(self.consumer, self.error)
            status.close()
            self.log.close()
        announce(f"EXIT {self.state} handled={len(self.handled)} {self.error}")
        return code


def read_handled(path: Path) -> list[tuple[int, str, bool]]:
    """(seq, key hex, replayed) per handling, in the order they were logged."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        seq, key, replayed, _t = line.split("\t")
        out.append((int(seq), key, replayed == "1"))
    return out


def order_faults(handled: list[tuple[int, str, bool]], *, keyed: bool) -> list[str]:
    """Where the first handlings of seqs break order: global seq order, or per key."""
    firsts: list[tuple[int, str]] = []
    seen: set[int] = set()
    for seq, key, _r in handled:
        if seq not in seen:
            seen.add(seq)
            firsts.append((seq, key))
    last: dict[str, int] = defaultdict(lambda: -1)
    faults = []
    for seq, key in firsts:
        k = key if keyed else ""
        if seq < last[k]:
            faults.append(f"seq {seq} after seq {last[k]}" + (f" of key {key}" if keyed else ""))
        last[k] = seq
    return faults


def main(argv: list[str] | None = None) -> int:
    import logging
    import signal

    args, rest = build_parser().parse_known_args(["consume", *(sys.argv[1:] if argv is None else argv)])
    extra = argparse.ArgumentParser(prog="python -m ordq.drills.failing")
    extra.add_argument("--fail-seqs", required=True, help="the handler fails on these seqs (comma separated)")
    extra.add_argument("--fixed-file", type=Path, required=True, help="until this file exists")
    extra.add_argument("--handled-log", type=Path, required=True)
    extra.add_argument("--on-failure", choices=["block", "park"], required=True)
    extra.add_argument("--workers", type=int, default=0, help="run_keyed with this many workers (0: run)")
    extra.parse_args(rest, namespace=args)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    run = FailingConsumer(args)
    signal.signal(signal.SIGTERM, lambda *_: run.stop.set())
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
