"""ordq cdc mysql: ship a MariaDB/MySQL binlog's row changes into a queue (ordq.cdc.mysql)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import urllib.parse
from typing import Any

from ordq.commands import add_command, int_in, seconds, wants_json
from ordq.commands.outbox import _status
from ordq.errors import ConfigError
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
    from sdk import Producer, ProducerConfig

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
        config = ProducerConfig(zk_hosts=args.zk, root=args.root, queue=args.queue, send_timeout_s=args.send_timeout)
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
