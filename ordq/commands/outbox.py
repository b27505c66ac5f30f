"""ordq outbox init|relay|status: the transactional outbox (ordq.sdk.outbox) and its relay."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import Any

import attrs

from ordq.bootstrap import cluster_options
from ordq.commands import add_command, int_in, seconds, wants_json
from ordq.common.proc import announce
from ordq.output import emit_json, table

DATABASE_HELP = "an SQLite file path, or a PostgreSQL URI (postgresql://user@host:port/dbname)"


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "outbox", help="ship a database's outbox table to a queue, in commit order",
                         description="The transactional outbox: applications add messages to an outbox table "
                         "in their own transactions (ordq.sdk.outbox.add); the relay ships each committed row to its "
                         "queue exactly once, in commit order (docs/INTEGRATIONS.md).")
    sub = parser.add_subparsers(dest="outbox_command", metavar="ACTION")
    sub.required = True
    init = add_command(sub, "init", func=cmd_init, help="create the outbox tables (an SQLite file is created too)")
    init.add_argument("database", metavar="DATABASE", help=DATABASE_HELP)
    init.add_argument("--table", default="ordq_outbox", help="outbox table name (default %(default)s)")

    relay = add_command(
        sub, "relay", func=cmd_relay,
        help="ship QUEUE's outbox rows to QUEUE until stopped (SIGTERM/Ctrl-C), as its producer",
        description="Ship the outbox rows of QUEUE, in commit order, each exactly once, as QUEUE's producer "
        "leader (start several for HA: one ships, the others wait). A row is deleted (or marked) only after "
        "its ack; a relay killed at any point resumes after the last row the queue stored, found from the "
        "x-ordq-outbox-id header of the queue's last message.")
    relay.add_argument("database", metavar="DATABASE", help=DATABASE_HELP)
    relay.add_argument("queue", metavar="QUEUE", help="the queue to ship to: the rows added for it")
    relay.add_argument("--table", default="ordq_outbox", help="outbox table name (default %(default)s)")
    relay.add_argument("--after-ack", choices=["delete", "mark"], default="delete",
                       help="what to do with a row once it is acked: delete it, or set its shipped_us "
                       "(default %(default)s)")
    relay.add_argument("--batch-rows", type=int_in(1, 100_000), default=1000, metavar="N",
                       help="rows per read of the table (default %(default)s)")
    relay.add_argument("--poll-interval", type=seconds(), default=0.05, metavar="SECONDS",
                       help="how often an idle relay looks for new rows; PostgreSQL also wakes it at each "
                       "commit (default %(default)s)")
    relay.add_argument("--send-timeout", type=seconds(), default=2.0, metavar="SECONDS",
                       help="ack deadline before the producer fails over (default %(default)s)")
    relay.add_argument("--until-empty", action="store_true",
                       help="stop once every row committed so far is shipped (scripts and tests)")

    status = add_command(sub, "status", func=cmd_status,
                         help="rows waiting in the outbox per queue, and where each queue's relay stands")
    status.add_argument("database", metavar="DATABASE", help=DATABASE_HELP)
    status.add_argument("--table", default="ordq_outbox", help="outbox table name (default %(default)s)")


def cmd_init(args: argparse.Namespace) -> int:
    from ordq.outbox.db import OutboxDb

    db = OutboxDb.open(args.database, table=args.table, create=True)
    db.close()
    print(f"outbox table {args.table} ready in {db.database}")
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    from ordq.outbox.relay import Relay

    return run_relay(args, relay_class=Relay)


def run_relay(args: argparse.Namespace, *, relay_class: Any) -> int:
    """``ordq outbox relay`` with the relay class given (tests pass one that crashes itself)."""
    from ordq.outbox.db import OutboxDb
    from ordq.outbox.relay import RelayConfig
    from ordq.sdk import Producer, ProducerConfig

    if not args.until_empty:  # a long-running process: its log is the operator's record
        logging.getLogger("ordq").setLevel(logging.INFO)
    config = RelayConfig(queue=args.queue, batch_rows=args.batch_rows, poll_interval_s=args.poll_interval,
                         after_ack=args.after_ack, until_empty=args.until_empty)
    stop = threading.Event()
    leading = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        if not leading.is_set():
            raise KeyboardInterrupt  # still waiting to be elected: nothing to finish

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    db = None
    try:
        db = OutboxDb.open(args.database, table=args.table)  # bad input fails before the election
        # (and before the coordinators are looked up: a wrong path is the first thing to say)
        producer_config = ProducerConfig(**cluster_options(args), queue=args.queue,
                                         send_timeout_s=args.send_timeout)
        _status(f"STARTED outbox relay for queue {args.queue} from {db.database}")
        with Producer(producer_config) as producer:
            leading.set()
            relay = relay_class(db, producer, config)
            position = relay.resume()
            tail = f"seq {position.seq}" if position is not None else "empty queue"
            _status(f"LEADER outbox relay {args.queue}: resuming after row {relay.statistics().resumed_after} "
                    f"({tail})")
            started = time.monotonic()
            stats = relay.run(stop)
        elapsed = time.monotonic() - started
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if db is not None:
            db.close()
    if wants_json(args):
        emit_json({"queue": args.queue, "database": db.database, "seconds": round(elapsed, 3),
                   **attrs.asdict(stats)})
    else:
        last = f"; last row {stats.position.id} at seq {stats.position.seq}" if stats.position else ""
        print(f"shipped {stats.shipped} rows to {args.queue}{last}", file=sys.stderr)
    return 0


def _status(line: str) -> None:
    """A status line a parent process waits for, in one write (ordq.common.proc.announce); printed
    plainly when stdout is no file (the CLI called in-process, e.g. by a test)."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError):  # io.UnsupportedOperation is an OSError
        print(line, flush=True)
        return
    announce(line)


def cmd_status(args: argparse.Namespace) -> int:
    from ordq.outbox.db import OutboxDb

    db = OutboxDb.open(args.database, table=args.table)
    try:
        backlog = db.backlog()
    finally:
        db.close()
    now_us = time.time_ns() // 1000
    rows = [{"queue": b.queue, "pending": b.pending,
             "oldest_s": round((now_us - b.oldest_pending_us) / 1e6, 1) if b.oldest_pending_us else None,
             "shipped_id": b.position.id if b.position else None,
             "shipped_seq": b.position.seq if b.position else None} for b in backlog]
    if wants_json(args):
        emit_json(rows)
    else:
        table(rows, ["queue", "pending", "oldest_s", "shipped_id", "shipped_seq"])
    return 0
