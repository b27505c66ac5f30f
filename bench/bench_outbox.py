"""The outbox relay against the bare Producer on the same box: how many rows/s the relay ships
from a backlog (read in commit order, send, ack on both replicas, delete after the ack), and
how many messages/s a bare ``Producer`` sends with the same payloads, key and headers. Not a
test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_outbox [--rows 50000] [--size 200] [--batch-rows 1000] [--no-postgres]
        [--no-mariadb] [--no-outbox] [--apply-workers 1,4] [--apply-mariadb]

One broker group of real processes (both replicas fsynced before each ack), one queue per
phase. The backlog is written first (transactions of 100 rows through ``ordq.sdk.outbox.add``; its
rate is printed too), then one relay in this process ships it until the table is empty
(``--until-empty``); rows/s counts from the relay's first read to its last delete. PostgreSQL
is Debian's, started in a temp folder (drills/dbservers/postgres.py), fsync on. Last, ``ordq cdc
mysql``'s shipper reads the same number of inserted rows from a MariaDB binlog (Debian's,
drills/dbservers/mariadb.py) into its own queue, and ``ordq cdc apply``'s applier replays that
queue into PostgreSQL (with ``--apply-mariadb`` into a second MariaDB server too): a fresh
database and subscription per ``--apply-workers`` value; rows/s from the consumer's start to
the last row's commit.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._cluster import ROOT, BenchCluster, bench_cluster
from ordq.outbox.db import OutboxDb
from ordq.outbox.relay import Relay, RelayConfig
from ordq.sdk import Producer, ProducerConfig, outbox


def _payload(i: int, size: int) -> bytes:
    return (b"%012d" % i).ljust(size, b"x")


def bare_producer(cluster: BenchCluster, queue: str, rows: int, size: int) -> float:
    """msgs/s of one Producer sending ``rows`` messages like the relay's, through the last ack."""
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=queue)
    with Producer(cfg) as p:
        started = time.perf_counter()
        for i in range(rows):
            p.send(_payload(i, size), key=b"k%d" % (i % 16), headers=(("type", b"t"), ("x-ordq-outbox-id", b"%d" % i)))
        p.flush()
        return rows / (time.perf_counter() - started)


def fill(connect: Callable[[], Any], queue: str, rows: int, size: int) -> float:
    """Commit ``rows`` outbox rows in transactions of 100; the rows/s of that."""
    conn = connect()
    started = time.perf_counter()
    for i in range(rows):
        outbox.add(conn, queue, b"k%d" % (i % 16), _payload(i, size), [("type", "t")])
        if i % 100 == 99:
            conn.commit()
    conn.commit()
    conn.close()
    return rows / (time.perf_counter() - started)


def relay(cluster: BenchCluster, database: str, queue: str, rows: int, batch_rows: int) -> float:
    """rows/s of one relay shipping the backlog of ``queue`` until the table is empty."""
    db = OutboxDb.open(database)
    try:
        with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=queue)) as p:
            r = Relay(db, p, RelayConfig(queue=queue, batch_rows=batch_rows, until_empty=True))
            r.resume()
            started = time.perf_counter()
            stats = r.run(threading.Event())
            elapsed = time.perf_counter() - started
        if stats.shipped != rows or db.fetch(queue, 0, 1):
            raise SystemExit(f"relay shipped {stats.shipped} of {rows} rows")
    finally:
        db.close()
    return rows / elapsed


def phase(cluster: BenchCluster, name: str, database: str, connect: Callable[[], Any], args: argparse.Namespace
          ) -> None:
    queue = f"outbox-{name}"
    cluster.store.create_queue(queue, [g.gid for g in cluster.groups])
    OutboxDb.open(database, create=True).close()
    added = fill(connect, queue, args.rows, args.size)
    shipped = relay(cluster, database, queue, args.rows, args.batch_rows)
    print(f"{name}: add() {added:,.0f} rows/s (transactions of 100); relay {shipped:,.0f} rows/s", flush=True)


def _target_db(kind: str, server: Any) -> tuple[str, Callable[[str], Any]]:
    """A fresh target on ``server`` (PostgresServer or MariaDbServer) with an empty shop.items:
    its DSN and a function that runs one statement (returning its first row)."""
    if kind == "postgresql":
        import psycopg

        dsn = server.create_database("apply")

        def sql(query: str) -> Any:
            with psycopg.connect(dsn, autocommit=True) as conn:
                cur = conn.execute(query)  # type: ignore[call-overload]
                return cur.fetchone() if cur.description else None

        sql("CREATE SCHEMA shop")
    else:
        dsn = f"mysql://ordq@127.0.0.1:{server.port}/ordq"

        def sql(query: str) -> Any:
            conn: Any = server.connect(autocommit=True)
            try:
                with conn.cursor() as cur:
                    cur.execute(query)
                    return cur.fetchone() if cur.description else None
            finally:
                conn.close()

        for query in ("DROP DATABASE IF EXISTS shop", "DROP DATABASE IF EXISTS ordq", "CREATE DATABASE shop",
                      "CREATE DATABASE ordq"):
            sql(query)
    sql("CREATE TABLE shop.items (id INT PRIMARY KEY, payload TEXT)")
    return dsn, sql


def apply(cluster: BenchCluster, kind: str, server: Any, queue: str, rows: int, workers: int) -> float:
    """rows/s of ``ordq cdc apply``'s applier replaying ``rows`` changes of ``queue`` into a
    fresh target database with ``workers`` keyed workers."""
    from ordq.cdc.apply import Applier, Target
    from ordq.sdk import Consumer, ConsumerConfig

    dsn, sql = _target_db(kind, server)
    applier = Applier(Target.parse(dsn), f"bench-{kind}-{workers}")
    applier.prepare()
    stop = threading.Event()

    def handle(m: Any) -> None:
        applier(m)
        if m.seq == rows - 1:  # the last one; keys are distinct, so every other one is done by
            stop.set()         # the time the consumer's prefix commit covers it (drain=True)

    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=queue, subscription=f"apply-{kind}-{workers}",
                         start="earliest")
    try:
        started = time.perf_counter()
        with Consumer(cfg) as c:
            c.run_keyed(handle, workers=workers, stop=stop)
        elapsed = time.perf_counter() - started
    finally:
        applier.close()
    count = sql("SELECT count(*) FROM shop.items")
    if applier.stats.applied != rows or count is None or count[0] != rows:
        raise SystemExit(f"apply: {applier.stats.applied} changes applied, {count} rows in the target, not {rows}")
    return rows / elapsed


def binlog(cluster: BenchCluster, rows: int, size: int, targets: dict[str, Any], apply_workers: list[int]) -> None:
    """``ordq cdc mysql``'s shipper on Debian's MariaDB: rows inserted (transactions of 100)
    first, then shipped from the binlog until its end; rows/s of each."""
    import warnings

    from ordq.cdc.mysql import BinlogShipper
    from ordq.drills.dbservers.mariadb import MariaDbServer

    warnings.filterwarnings("ignore", "'db' is deprecated", DeprecationWarning)  # mysql-replication 1.0
    server = MariaDbServer.start()
    try:
        conn: Any = server.connect(autocommit=False)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, payload VARBINARY(4096))")
            started = time.perf_counter()
            for i in range(rows):
                cur.execute("INSERT INTO shop.items VALUES (%s, %s)", (i, _payload(i, size)))
                if i % 100 == 99:
                    conn.commit()
            conn.commit()
            added = rows / (time.perf_counter() - started)
        conn.close()
        cluster.store.create_queue("binlog", [g.gid for g in cluster.groups])
        with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue="binlog")) as p:
            shipper = BinlogShipper({"host": "127.0.0.1", "port": server.port, "user": "ordq", "password": ""}, p,
                                    queue="binlog", server_id=4242, from_beginning=True, until_end=True)
            started = time.perf_counter()
            stats = shipper.run(threading.Event())
            shipped = stats.shipped / (time.perf_counter() - started)
        if stats.shipped != rows:
            raise SystemExit(f"binlog: shipped {stats.shipped} of {rows} rows")
        print(f"mariadb binlog: inserts {added:,.0f} rows/s (transactions of 100); cdc mysql {shipped:,.0f} rows/s",
              flush=True)
        for kind, target in targets.items():
            for workers in apply_workers:
                rate = apply(cluster, kind, target, "binlog", rows, workers)
                print(f"cdc apply into {kind}, {workers} workers: {rate:,.0f} rows/s", flush=True)
    finally:
        server.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=200, help="payload bytes")
    ap.add_argument("--batch-rows", type=int, default=1000)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-mariadb", action="store_true")
    ap.add_argument("--no-outbox", action="store_true", help="skip the bare producer and the outbox phases")
    ap.add_argument("--apply-workers", default="1,4", help="cdc apply runs, by worker count (default 1,4)")
    ap.add_argument("--apply-mariadb", action="store_true", help="cdc apply into a second MariaDB server too")
    args = ap.parse_args()
    pg = None
    if not args.no_postgres:
        from ordq.drills.dbservers.postgres import PostgresServer

        pg = PostgresServer.start()
    try:
        with bench_cluster(groups=1) as cluster, tempfile.TemporaryDirectory(prefix="ordq-bench-outbox-") as tmp:
            if not args.no_outbox:
                outbox_phases(cluster, Path(tmp), pg, args)
            if not args.no_mariadb:
                targets: dict[str, Any] = {"postgresql": pg} if pg is not None else {}
                if args.apply_mariadb:
                    from ordq.drills.dbservers.mariadb import MariaDbServer

                    targets["mariadb"] = maria_target = MariaDbServer.start()
                try:
                    binlog(cluster, args.rows, args.size, targets, [int(w) for w in args.apply_workers.split(",") if w])
                finally:
                    if "mariadb" in targets:
                        maria_target.destroy()
    finally:
        if pg is not None:
            pg.destroy()


def outbox_phases(cluster: BenchCluster, tmp: Path, pg: Any, args: argparse.Namespace) -> None:
    cluster.store.create_queue("bare", [g.gid for g in cluster.groups])
    rate = bare_producer(cluster, "bare", args.rows, args.size)
    print(f"bare Producer: {rate:,.0f} msgs/s ({args.rows} messages of {args.size} B)", flush=True)
    path = str(tmp / "app.db")
    phase(cluster, "sqlite", path, lambda: sqlite3.connect(path, timeout=30), args)
    if pg is not None:
        import psycopg

        dsn = pg.create_database("bench")
        phase(cluster, "postgres", dsn, lambda: psycopg.connect(dsn), args)


if __name__ == "__main__":
    main()
