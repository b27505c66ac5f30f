"""ordq cdc mysql|apply: ship a MariaDB/MySQL binlog's row changes into a queue (ordq.cdc.mysql),
and replay such a queue into a PostgreSQL or MariaDB/MySQL target (ordq.cdc.apply)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from ordq.bootstrap import cluster_options
from ordq.commands import add_command, int_in, seconds, wants_json
from ordq.commands.outbox import _status
from ordq.common.errors import ConfigError
from ordq.output import emit_json


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "cdc", help="change data capture: a database's binlog into a queue")
    sub = parser.add_subparsers(dest="cdc_command", metavar="ACTION")
    sub.required = True
    mysql = add_command(
        sub, "mysql", func=cmd_mysql,
        help="ship a MariaDB/MySQL binlog's row changes to QUEUE, in binlog order, as its producer",
        description="Ship every insert, update and delete row event of a MariaDB/MySQL binlog (binlog_format=ROW, "
        "binlog_row_metadata=FULL) to QUEUE in binlog order, each once, keyed db.table:primary key, with the "
        "position in the x-ordq-binlog header and the GTID in x-ordq-gtid. A new queue starts at the binlog's "
        "current end (--from-beginning: its oldest file); a restarted shipper resumes after the last row the "
        "queue stored.")
    mysql.add_argument("source", metavar="SOURCE", help="mysql://user[:password]@host[:port]")
    mysql.add_argument("queue", metavar="QUEUE", help="the queue to ship to (its only producer)")
    mysql.add_argument("--server-id", type=int_in(1, 2**32 - 1), default=None,
                       help="replication server id, unique among the source's replicas (default: from the pid)")
    mysql.add_argument("--from-beginning", action="store_true", help="a new queue starts at the oldest binlog")
    mysql.add_argument("--until-end", action="store_true", help="stop at the binlog's current end (scripts, tests)")
    mysql.add_argument("--send-timeout", type=seconds(), default=2.0, metavar="SECONDS",
                       help="ack deadline before the producer fails over (default %(default)s)")
    mysql.add_argument("--audit-dir", type=Path, default=None,
                       help="write the producer's audit files here, for ordq verify (docs/AUDIT_FORMAT.md)")

    apply = add_command(
        sub, "apply", func=cmd_apply,
        help="replay a CDC queue into a PostgreSQL or MariaDB/MySQL database, idempotently, by primary key",
        description="Apply the row changes of QUEUE (as ordq cdc mysql ships them) to the same tables (db.table; "
        "on PostgreSQL schema.table) of the target, which the operator creates: upsert by primary key for inserts "
        "and updates, delete for deletes, columns matched by name. Changes of one row are applied in queue order; "
        "different rows in parallel on --workers connections. Each change commits in one target transaction "
        "with the row's position (table ordq_apply: per row, the seq of its last applied change), so a restart "
        "at any point resumes exactly: a change applied before is skipped. Runs until SIGTERM/Ctrl-C.")
    apply.add_argument("queue", metavar="QUEUE", help="the queue ordq cdc mysql ships to")
    apply.add_argument("--subscription", "-s", required=True, help="the applier's subscription (one per target)")
    apply.add_argument("--target", required=True, metavar="DSN",
                       help="postgresql://user[:password]@host[:port]/dbname or "
                       "mysql://user[:password]@host[:port]/dbname (the database that holds ordq_apply)")
    apply.add_argument("--workers", type=int_in(1, 256), default=4, metavar="N",
                       help="parallel connections; one row's changes always go to the same one (default %(default)s)")
    apply.add_argument("--start", default="earliest",
                       help="where a new subscription begins: earliest, latest, 'seq N' (default %(default)s)")


def parse_source(source: str) -> dict[str, Any]:
    url = urllib.parse.urlsplit(source)
    if url.scheme not in ("mysql", "mariadb") or not url.hostname:
        raise ConfigError(f"bad source {source!r}: expected mysql://user[:password]@host[:port]")
    try:
        port = url.port or 3306
    except ValueError:
        raise ConfigError(f"bad source {source!r}: the port is not a number") from None
    return {"host": url.hostname, "port": port, "user": urllib.parse.unquote(url.username or "root"),
            "password": urllib.parse.unquote(url.password or "")}


def cmd_mysql(args: argparse.Namespace) -> int:
    from ordq.cdc.mysql import BinlogShipper
    from ordq.sdk import Producer, ProducerConfig

    connection = parse_source(args.source)
    try:
        import pymysqlreplication  # noqa: F401
    except ImportError:
        raise ConfigError("ordq cdc mysql needs mysql-replication: pip install 'mysql-replication'") from None
    if not args.until_end:
        logging.getLogger("ordq").setLevel(logging.INFO)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _status(f"STARTED cdc mysql {connection['host']}:{connection['port']} -> {args.queue}")
        config = ProducerConfig(**cluster_options(args), queue=args.queue, send_timeout_s=args.send_timeout,
                                audit_dir=args.audit_dir)
        with Producer(config) as producer:
            shipper = BinlogShipper(connection, producer, queue=args.queue,
                                    server_id=args.server_id or 1_000_000 + os.getpid(),
                                    from_beginning=args.from_beginning, until_end=args.until_end)
            _status(f"LEADER cdc mysql {args.queue}")
            stats = shipper.run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    last = stats.last.encode().decode() if stats.last else None
    if wants_json(args):
        emit_json({"queue": args.queue, "shipped": stats.shipped, "last": last,
                   "resumed_after": stats.resumed_after.encode().decode() if stats.resumed_after else None})
    else:
        print(f"shipped {stats.shipped} row changes to {args.queue}" + (f"; last at {last}" if last else ""),
              file=sys.stderr)
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from ordq.cdc.apply import Applier, Target
    from ordq.common.errors import HandlerError, OrdqError
    from ordq.sdk import Consumer, ConsumerConfig, FailurePolicy

    target = Target.parse(args.target)
    config = ConsumerConfig(**cluster_options(args), queue=args.queue, subscription=args.subscription,
                            start=args.start, on_failure=FailurePolicy(on_failure="raise", attempts=1))
    applier = Applier(target, args.subscription)
    stop = threading.Event()
    running = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        if not running.is_set():  # still connecting or waiting to be elected
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _status(f"STARTED cdc apply {args.queue}/{args.subscription} -> {target.where}")
        applier.prepare()
        with Consumer(config) as consumer:
            _status(f"LEADER cdc apply {args.queue}/{args.subscription}")
            running.set()
            try:
                consumer.run_keyed(applier, workers=args.workers, stop=stop)
            except HandlerError as exc:
                if isinstance(exc.__cause__, OrdqError):
                    raise exc.__cause__ from None  # the target's own one line
                raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        applier.close()
    st = applier.stats
    if wants_json(args):
        emit_json({"queue": args.queue, "subscription": args.subscription, "applied": st.applied,
                   "skipped": st.skipped, "last_seq": st.last_seq})
    else:
        print(f"applied {st.applied} row changes from {args.queue}/{args.subscription} ({st.skipped} applied before)",
              file=sys.stderr)
    return 0
