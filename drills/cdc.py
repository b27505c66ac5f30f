"""The CDC drill: a MariaDB source, ``ordq cdc mysql``, the queue, ``ordq cdc apply``, a
PostgreSQL target — the shipper, a head master and the applier each killed (-9) at random
moments while an application commits inserts, updates and deletes.

Guarantee checked: at the end the target's tables equal the source's row for row, and the
Spark verifier finds every seq the shipper got acked delivered to a reading subscription
once, in order (its acks and this drill's deliveries are audited like any drill's).

How the end is known: after the application stops, one marker row is inserted into its own
table; it is the binlog's last change, so once the reader delivers it the queue holds the whole
stream (seqs 0..its seq) and the applier is done when both tables equal the source's.
The database servers are Debian's (``make test-deps``), started in temp folders for the run.
"""

from __future__ import annotations

import functools
import glob
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from ordq.common.errors import ConfigError, NotLeader, OrdqError
from ordq.common.proc import ManagedProcess
from ordq.drills.dbservers.mariadb import MARIADBD, MariaDbServer, ShopApp
from ordq.drills.dbservers.postgres import PostgresServer
from ordq.drills.runner import SUBSCRIPTION, DrillContext, DrillError

TABLES = {"items": "id INT PRIMARY KEY, name VARCHAR(20), qty INT NOT NULL",
          "drill_end": "id INT PRIMARY KEY, note VARCHAR(20)"}
VICTIMS = ("shipper", "applier", "master")
WORKERS = "4"
APPLIER_SUBSCRIPTION = "replica"


def require_servers() -> None:
    """ConfigError (one line) unless Debian's MariaDB and PostgreSQL servers are installed."""
    missing = [name for name, ok in (
        ("mariadb-server", MARIADBD.exists() and shutil.which("mariadb-install-db") is not None),
        ("postgresql", bool(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or shutil.which("initdb") is not None),
    ) if not ok]
    if missing:
        raise ConfigError(f"the cdc drill needs the database servers {' and '.join(missing)} installed "
                          f"(make test-deps, or: apt-get install {' '.join(missing)})")


class Reader(threading.Thread):
    """Reads the queue as the drill's audited subscription (what the verifier checks), and
    notes the seq of the end marker."""

    def __init__(self, ctx: DrillContext) -> None:
        super().__init__(name="cdc-drill-reader", daemon=True)
        from ordq.sdk import ConsumerConfig

        self.cfg = ConsumerConfig(zk_hosts=ctx.cluster.zk_hosts, root=ctx.cluster.root, queue=ctx.queue,
                                  subscription=SUBSCRIPTION, audit_dir=ctx.run_dir / "audit",
                                  consumer_id=f"c1-{ctx.queue}", lease_ttl_s=ctx.load.session_timeout_s)
        self.delivered = 0
        self.last_seq = -1
        self.end_seq: int | None = None
        self.rejoined = 0  # times it lost its lease and joined the election again
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from ordq.sdk import Consumer

        try:
            while not self.stop.is_set():
                try:
                    with Consumer(self.cfg) as c:
                        while not self.stop.is_set():
                            for m in c.poll(0.2):
                                self.delivered += 1
                                self.last_seq = m.seq
                                if (m.key or b"").startswith(b"shop.drill_end:"):
                                    self.end_seq = m.seq
                        c.commit()
                except NotLeader:
                    # Its session lapsed (this process starved on a busy box): it stopped
                    # delivering, as it must. Like a supervised consumer process, it joins the
                    # election again and resumes from the committed cursor (redeliveries are
                    # counted by the verdict, never lost).
                    self.rejoined += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the drill
            self.error = exc


class CdcRun:
    """The run's databases and processes; ``supervise()`` restarts a shipper or applier that
    exited (a producer finding no writable group for a while exits 1: a supervisor's job)."""

    def __init__(self, ctx: DrillContext, source: MariaDbServer, target_dsn: str) -> None:
        self.ctx, self.source, self.target_dsn = ctx, source, target_dsn
        self.procs: dict[str, ManagedProcess] = {}
        self.spawned = 0

    def spawn(self, what: str) -> None:
        c, ctx = self.ctx.cluster, self.ctx
        self.spawned += 1
        args = (["cdc", "mysql", self.source.source, ctx.queue, "--from-beginning", "--send-timeout",
                 str(ctx.load.send_timeout_s), "--audit-dir", str(ctx.run_dir / "audit")] if what == "shipper" else
                ["cdc", "apply", ctx.queue, "-s", APPLIER_SUBSCRIPTION, "--target", self.target_dsn,
                 "--workers", WORKERS])
        proc = ManagedProcess(f"{what}-{self.spawned}", [c.python, "-m", "ordq.cli", "--zk", c.zk_hosts, "--root",
                                                         c.root, *args], run_dir=ctx.run_dir)
        proc.start()
        self.procs[what] = proc

    def supervise(self) -> None:
        for what, proc in list(self.procs.items()):
            if not proc.alive():
                self.ctx.event(f"{proc.name} exited {proc.returncode}: started again")
                self.spawn(what)

    def kill(self, victim: str) -> None:
        ctx = self.ctx
        if victim == "master":
            gid, seg = ctx.head()
            ctx.cluster.broker(gid, "master").kill()
            ctx.fault(f"kill -9 master of {gid} (head, segment {seg})", kind="segment", seg=seg)
            ctx.restart_broker(gid, "master")
        else:
            proc = self.procs[victim]
            proc.kill()
            ctx.event(f"FAULT: kill -9 {proc.name}")
            self.spawn(victim)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.alive():
                code = proc.stop(timeout_s=30)
                self.ctx.event(f"{proc.name} stopped (exit {code})")


def _pg_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT * FROM shop.{table} ORDER BY id").fetchall()]


def _maria_rows(source: MariaDbServer, table: str) -> list[tuple[Any, ...]]:
    conn: Any = source.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM shop.{table} ORDER BY id")
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def _applied(dsn: str) -> int:
    """The highest seq the applier committed (-1: none yet, or its table is not made yet)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('public.ordq_apply')").fetchone() == (None,):
            return -1
        row = conn.execute("SELECT max(seq) FROM ordq_apply").fetchone()
    return -1 if row is None or row[0] is None else int(row[0])


def _differences(expected: dict[str, list[tuple[Any, ...]]], dsn: str) -> str:
    """What the target lacks, has extra or has changed, per table, and how far it applied."""
    parts = []
    for table, rows in expected.items():
        want, got = {r[0]: r for r in rows}, {r[0]: r for r in _pg_rows(dsn, table)}
        missing, extra = len(want.keys() - got.keys()), len(got.keys() - want.keys())
        changed = sum(1 for k in want.keys() & got.keys() if want[k] != got[k])
        parts.append(f"{table}: {len(rows)} rows" + (f", {missing} missing, {extra} extra, {changed} different"
                                                     if missing or extra or changed else ""))
    return "; ".join(parts) + f"; applied through seq {_applied(dsn)}"


def drive_faults(ctx: DrillContext, faults: list[tuple[int, str]], *, total: int, budget: float,
                 progress: Callable[[int], bool], moved: Callable[[], int], fault: Callable[[str], None],
                 what: str) -> None:
    """Each fault once ``progress(at)`` holds for its moment ``at`` (in order), then the wait
    for all ``total`` row changes; ``moved`` tells a slow run from a stuck one; ``what`` names
    what a row change must have been through (the cdc and cdc-mirror drills' loop)."""
    for at, victim in faults:
        ctx.wait(functools.partial(progress, at), timeout_s=budget, progress=moved, what=f"{at} {what}")
        fault(victim)
    ctx.wait(lambda: progress(total - 1), timeout_s=budget, progress=moved, what=f"{total} {what}")


def run_cdc(ctx: DrillContext) -> None:
    """The drill's whole run (it replaces the producer/consumer load of the other drills)."""
    import psycopg
    import pymysql

    require_servers()
    source = MariaDbServer.start()
    try:
        target = PostgresServer.start()
        try:
            _run(ctx, source, target)
        except (pymysql.Error, psycopg.Error) as exc:  # the drill's own statements: its error, one line
            raise DrillError(f"cdc drill: {type(exc).__name__}: {exc}") from exc
        finally:
            target.destroy()
    finally:
        source.destroy()


def _run(ctx: DrillContext, source: MariaDbServer, target: PostgresServer) -> None:
    import psycopg

    source.fresh_shop()
    conn: Any = source.connect(autocommit=True)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE shop.drill_end ({TABLES['drill_end']})")
    dsn = target.create_database("replica")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("CREATE SCHEMA shop")
        for table, columns in TABLES.items():
            pg.execute(f"CREATE TABLE shop.{table} ({columns})")
    with ctx.cluster.store() as store:  # both read from seq 0: nothing is popped before they exist
        for sub in (SUBSCRIPTION, APPLIER_SUBSCRIPTION):
            store.create_subscription(ctx.queue, sub)
    ctx.event(f"MariaDB source on port {source.port}, PostgreSQL target {dsn}")
    reader, run = Reader(ctx), CdcRun(ctx, source, dsn)
    reader.start()
    app = ShopApp(source, rate=max(ctx.load.rate / 2.5, 1.0), seed=ctx.rng.randrange(1 << 30))
    try:
        run.spawn("shipper")
        run.spawn("applier")
        app.start()
        began = time.monotonic()
        total = ctx.load.messages
        victims = list(VICTIMS) + [ctx.rng.choice(VICTIMS)]
        ctx.rng.shuffle(victims)
        moments = sorted(int(ctx.rng.uniform(0.15, 0.85) * total) for _ in victims)
        ctx.event(f"application running; kills at {moments} of {total} row changes: {', '.join(victims)}")
        budget = total / max(ctx.load.rate, 1.0) * 4 + 90

        def progress(at: int) -> bool:
            """Shipped, read and applied through seq ``at``?"""
            run.supervise()
            if reader.error is not None or app.error is not None:
                raise OrdqError(f"cdc drill: reader or application failed: {reader.error or app.error}")
            return reader.last_seq >= at and _applied(dsn) >= at

        def moved() -> int:
            """How far the slower of reader and applier got (a loaded box is slow, not stuck)."""
            return min(reader.last_seq, _applied(dsn))

        drive_faults(ctx, list(zip(moments, victims, strict=True)), total=total, budget=budget,
                     progress=progress, moved=moved, fault=run.kill, what="row changes read and applied")
        app.stop.set()
        app.join(timeout=30)
        cur.execute("INSERT INTO shop.drill_end VALUES (1, 'end')")  # the binlog's last change
        end = ctx.wait(lambda: progress(reader.last_seq) and reader.end_seq is not None and reader.end_seq + 1,
                       timeout_s=budget, what="the end marker read")
        ctx.event(f"the queue holds the whole stream: seqs 0..{end - 1}")
        shipped_s = time.monotonic() - began
        expected = {t: _maria_rows(source, t) for t in TABLES}
        try:
            ctx.wait(lambda: progress(0) and all(_pg_rows(dsn, t) == rows for t, rows in expected.items()),
                     timeout_s=budget, what="the target to equal the source")
        finally:
            ctx.expect(f"target tables equal the source row for row ({_differences(expected, dsn)})",
                       all(_pg_rows(dsn, t) == rows for t, rows in expected.items()))
        # the verdict's "stream completed" check: the stream is what the shipper shipped
        ctx.load = attrs.evolve(ctx.load, messages=end)
        ctx.notes.update(row_changes=end, rows=len(expected["items"]), rows_per_s=end / shipped_s,
                         reader_rejoined=reader.rejoined)
    finally:
        app.stop.set()
        run.stop()
        reader.stop.set()
        reader.join(timeout=30)
        conn.close()

