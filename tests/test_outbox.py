"""The transactional outbox (``ordq.sdk.outbox``) and its relay (``ordq outbox relay``).

- Without I/O: where a relay resumes (``resume_point``), argument checks.
- On a real SQLite file and a real PostgreSQL server (Debian's, started by
  ``drills/dbservers/postgres.py``): ids are commit order (on PostgreSQL, a second transaction
  adding to the queue waits for the first, seen in ``pg_locks``), rows are deleted or marked
  only as the relay records them, bad input gives one clear line.
- End to end on real processes (``tests/cluster.py``): writers commit (and roll back)
  transactions while relays ship them; a relay kills itself between an ack and its delete,
  another is killed from outside, the head master is killed; at the end a consumer finds
  every committed row once, in commit order, and no rolled-back one.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main
from ordq.common.errors import ConfigError, OutboxPositionError, OutboxTableMissing
from ordq.drills.dbservers.postgres import PostgresServer
from ordq.outbox.db import OutboxDb, Position
from ordq.outbox.relay import resume_point
from ordq.sdk import Consumer, ConsumerConfig, StoredMessage, outbox
from ordq.sdk.outbox import OUTBOX_ID_HEADER
from ordq.wire.batch import Message
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.helpers.servers import running
from tests.util import wait_until

# -- where a relay resumes (pure) -----------------------------------------------------------


def _tail(seq: int, row_id: int | None, *, readable: bool = True) -> StoredMessage:
    headers = ((OUTBOX_ID_HEADER, b"%d" % row_id),) if row_id is not None else (("other", b"x"),)
    message = Message(b"p", None, headers, 0) if readable else None
    return StoredMessage(seq=seq, seg=0, offset=seq, message=message,
                         message_error=None if readable else "no replica answers")


def test_resume_after_the_row_the_queue_stored_last_whatever_the_database_recorded() -> None:
    assert resume_point("q", None, None) == 0  # nothing ever shipped
    assert resume_point("q", _tail(9, 40), None) == 40
    # acked rows 31..40 were not yet deleted when the last relay died: resume after 40, not 30
    assert resume_point("q", _tail(9, 40), Position(30, 5)) == 40
    # the tail cannot be read now: the record settles it only if it is that very message
    assert resume_point("q", _tail(9, None, readable=False), Position(40, 9)) == 40
    assert resume_point("q", _tail(9, None, readable=False), Position(30, 5)) is None  # retry


@pytest.mark.parametrize(("tail", "recorded", "says"), [
    (None, Position(3, 2), "behind"),  # the queue was made again, empty
    (_tail(1, 2), Position(3, 2), "behind"),
    (_tail(5, 2), Position(3, 2), "behind"),  # row ids must not go back either
    (_tail(1, None, readable=False), Position(3, 2), "behind"),
    (_tail(4, None), None, "only producer"),  # someone else wrote the last message
])
def test_a_tail_that_does_not_fit_the_outbox_ships_nothing(tail: StoredMessage | None, recorded: Position,
                                                            says: str) -> None:
    with pytest.raises(OutboxPositionError, match=says):
        resume_point("q", tail, recorded)


def test_add_checks_its_arguments_and_the_table() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(OutboxTableMissing, match="ordq outbox init"):
        outbox.add(conn, "q", None, b"p")
    outbox.create_tables(conn)
    for bad in [dict(queue="no spaces"), dict(headers=[("h", b"\xff")]), dict(headers=[("h",)]),
                dict(headers=[(OUTBOX_ID_HEADER, b"1")]), dict(payload=5)]:
        args: dict[str, Any] = {"queue": "q", "payload": b"p", "headers": (), **bad}
        with pytest.raises(ConfigError):
            outbox.add(conn, args["queue"], None, args["payload"], args["headers"])
    with pytest.raises(ConfigError, match="invalid outbox table name"):
        outbox.add(conn, "q", None, b"p", table="x; drop table y")
    with pytest.raises(ConfigError, match="unsupported connection"):
        outbox.add(object(), "q", None, b"p")


# -- databases ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    with running(PostgresServer.start) as server:
        yield server


def _connect(database: str) -> Any:
    """An application's connection (transactions opened implicitly, committed by the caller)."""
    if database.startswith("postgresql://"):
        import psycopg

        return psycopg.connect(database)
    return sqlite3.connect(database, timeout=30)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind, with the outbox tables."""
    if request.param == "sqlite":
        db = str(tmp_path / "app.db")
    else:
        db = request.getfixturevalue("pg_server").create_database()
    OutboxDb.open(db, create=True).close()
    return db


def test_rows_are_read_in_commit_order_and_deleted_or_marked_only_as_recorded(database: str) -> None:
    app = _connect(database)
    ids = [outbox.add(app, "q", b"k", b"a", [("type", "t")]), outbox.add(app, "other", None, "b")]
    app.commit()
    outbox.add(app, "q", None, b"never")  # rolled back: never seen (SQLite may reuse its id, PostgreSQL not)
    app.rollback()
    ids.append(outbox.add(app, "q", None, b"c"))
    app.commit()
    assert ids == sorted(ids)
    db = OutboxDb.open(database)
    try:
        rows = db.fetch("q", 0, 10)
        assert [(r.id, r.key, r.payload, r.headers) for r in rows] == [
            (ids[0], b"k", b"a", (("type", b"t"),)), (ids[2], None, b"c", ())]
        assert db.fetch("q", ids[0], 10) == rows[1:] and db.fetch("q", 0, 1) == rows[:1]
        assert db.position("q") is None
        db.record_shipped("q", 0, Position(ids[0], 0), after_ack="mark")
        db.record_shipped("q", ids[0], Position(ids[2], 1), after_ack="delete")
        db.record_shipped("q", 0, Position(ids[0], 0), after_ack="delete")  # a deposed relay, late
        assert db.position("q") == Position(ids[2], 1)  # never moves back
        assert db.fetch("q", 0, 10) == []  # the marked row went with the later delete
        assert [(b.queue, b.pending, b.position) for b in db.backlog()] == [
            ("other", 1, None), ("q", 0, Position(ids[2], 1))]
    finally:
        db.close()
        app.close()


def test_sqlite_never_reuses_an_id_after_the_relay_deleted_its_row(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    OutboxDb.open(path, create=True).close()
    app = _connect(path)
    first = outbox.add(app, "q", None, b"a")
    app.commit()
    db = OutboxDb.open(path)
    db.record_shipped("q", 0, Position(first, 0), after_ack="delete")
    db.close()
    assert outbox.add(app, "q", None, b"b") > first  # a plain rowid would hand out `first` again
    app.close()


def test_postgres_a_second_transaction_waits_for_the_first_so_ids_are_commit_order(
        pg_server: PostgresServer) -> None:
    import psycopg

    dsn = pg_server.create_database()
    OutboxDb.open(dsn, create=True).close()
    first, second, watcher = psycopg.connect(dsn), psycopg.connect(dsn), psycopg.connect(dsn, autocommit=True)
    relay = OutboxDb.open(dsn)
    try:
        a = outbox.add(first, "q", None, b"a")  # open, holding the queue's order lock
        other_queue = outbox.add(second, "other", None, b"x")  # another queue is not held up
        got: list[int] = []
        adder = threading.Thread(target=lambda: got.append(outbox.add(second, "q", None, b"b")))
        adder.start()
        wait_until(lambda: watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                           "AND NOT granted").fetchone()[0] == 1,
                   timeout_s=10, what="the second transaction waiting for the order lock")
        assert not got and relay.fetch("q", 0, 10) == []
        first.commit()
        adder.join(timeout=10)
        second.commit()
        assert got and got[0] > a and other_queue < a + 3
        assert [r.id for r in relay.fetch("q", 0, 10)] == [a, got[0]]
        # a row inserted by hand (another language, psql) goes through the same trigger
        watcher.execute("INSERT INTO ordq_outbox (queue, payload) VALUES ('q', 'by hand')")
        assert [r.payload for r in relay.fetch("q", got[0], 10)] == [b"by hand"]
    finally:
        for conn in (first, second, watcher):
            conn.close()
        relay.close()


def test_postgres_a_commit_wakes_an_idle_relay(pg_server: PostgresServer) -> None:
    dsn = pg_server.create_database()
    db = OutboxDb.open(dsn, create=True)
    app = _connect(dsn)
    try:
        db.wait_for_rows(0.01)  # LISTEN from now on
        outbox.add(app, "q", None, b"a")
        app.commit()
        started = time.monotonic()
        db.wait_for_rows(30)
        assert time.monotonic() - started < 10  # woken by the commit, not the 30 s deadline
    finally:
        app.close()
        db.close()


def test_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     pg_server: PostgresServer) -> None:
    sqlite3.connect(tmp_path / "plain.db").execute("CREATE TABLE t (x)").connection.close()
    cases = [
        (["relay", str(tmp_path / "none.db"), "q"], "none.db: no such file (create it with: ordq outbox init"),
        (["relay", str(tmp_path / "plain.db"), "q"], "no outbox table 'ordq_outbox' in"),
        (["status", pg_server.dsn(), "--table", "absent"], "no outbox table 'absent' in postgresql://127.0.0.1:"),
        (["relay", "postgresql://nobody@127.0.0.1:1/app", "q"], "cannot open the outbox database "
                                                                  "postgresql://127.0.0.1:1/app: connection"),
        (["init", "host=127.0.0.1 port=x"], "cannot open the outbox database postgresql://127.0.0.1:x/"),
        (["relay", str(tmp_path / "plain.db"), "q", "--table", "a-b"], "invalid outbox table name 'a-b'"),
    ]
    for argv, says in cases:
        assert main(["outbox", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("ordq: error: ") and says in err and err.count("\n") == 1, err


def test_unknown_queue_is_one_clear_line(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")  # the test cluster starts its coordinator with its first queue
    db = str(tmp_path / "app.db")
    assert main(["outbox", "init", db]) == 0
    proc = cluster.ordq("outbox", "relay", db, "nope")
    assert proc.returncode == 1
    assert proc.stderr.decode() == "ordq: error: unknown queue 'nope' (create it with: ordq queue create nope)\n"


def test_a_row_over_the_queues_limit_stops_the_relay_before_it_never_skips_it(cluster: Cluster,
                                                                              tmp_path: Path) -> None:
    from ordq.coordinator.store_values import QueueConfig

    cluster.add_groups("g1")
    cluster.store.create_queue("q", ["g1"], QueueConfig(max_message_bytes=1000))
    db = str(tmp_path / "app.db")
    OutboxDb.open(db, create=True).close()
    app = _connect(db)
    ids = [outbox.add(app, "q", None, payload) for payload in (b"small", b"x" * 5000, b"after")]
    app.commit()
    proc = cluster.ordq("outbox", "relay", db, "q", "--until-empty")
    err = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and err[-1].startswith(f"ordq: error: row {ids[1]} of queue 'q' cannot be shipped: "
                                                       "message of 50"), err
    outbox_db = OutboxDb.open(db)
    try:
        assert outbox_db.position("q") == Position(ids[0], 0)
        assert [r.id for r in outbox_db.fetch("q", 0, 10)] == ids[1:]  # nothing after it went
    finally:
        outbox_db.close()


# -- end to end on real processes -------------------------------------------------------------------


class Writer(threading.Thread):
    """An application: commits transactions of 1-8 outbox rows (one in ten rolled back)."""

    def __init__(self, database: str, name: str, *, rows: int, rate: float, seed: int) -> None:
        super().__init__(name=f"writer-{name}", daemon=True)
        self.database, self.tag, self.rows, self.rate = database, name, rows, rate
        self.rng = random.Random(seed)
        self.committed: dict[int, bytes] = {}
        self.rolled_back: set[bytes] = set()  # payloads
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn = _connect(self.database)
            started, written = time.monotonic(), 0
            txn = 0
            while written < self.rows and not self.stop.is_set():
                txn += 1
                batch = {}
                for i in range(self.rng.randint(1, 8)):
                    payload = b"%s:%d:%d" % (self.tag.encode(), txn, i)
                    batch[outbox.add(conn, "q", b"k%d" % self.rng.randrange(7), payload, [("w", self.tag)])] = payload
                if self.rng.random() < 0.1:
                    conn.rollback()  # SQLite may give these ids to the next rows; PostgreSQL never
                    self.rolled_back.update(batch.values())
                    continue
                conn.commit()
                self.committed.update(batch)
                written += len(batch)
                self.stop.wait(max(0.0, started + written / self.rate - time.monotonic()))  # pace
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc


def _relay(cluster: Cluster, name: str, database: str, *, crash_at: str | None = None) -> Any:
    args = ["--zk", cluster.hosts, "--root", cluster.root, "outbox", "relay", database, "q",
            "--poll-interval", "0.02", "--send-timeout", "1"]
    if crash_at is None:
        return cluster.spawn(name, ["-m", "ordq.cli", *args])
    return cluster.spawn(name, ["-m", "tests.helpers.outbox_relay", "--crash-at", crash_at, *args])


def _consume_all(cluster: Cluster, last_seq: int, timeout_s: float = 60) -> list[tuple[int, int, bytes]]:
    """(seq, row id, payload) of every message through ``last_seq``, delivered in order."""
    got: list[tuple[int, int, bytes]] = []
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="check",
                         start="earliest")
    deadline = time.monotonic() + timeout_s
    with Consumer(cfg) as consumer:
        while (not got or got[-1][0] < last_seq) and time.monotonic() < deadline:
            for m in consumer.poll(0.5):
                got.append((m.seq, int(dict(m.headers)[OUTBOX_ID_HEADER]), m.payload))
    return got


def _shipped_through(database: str) -> Callable[[], Position | None]:
    def position() -> Position | None:
        db = OutboxDb.open(database)
        try:
            return db.position("q")
        finally:
            db.close()
    return position


def _check_every_committed_row_once_in_order(cluster: Cluster, database: str, writers: list[Writer]) -> None:
    """Stop the applications (each must end without an error), then check what they committed
    against what a consumer reads from the queue."""
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(timeout=60)
        assert w.error is None and not w.is_alive(), w.error
    committed = {k: v for w in writers for k, v in w.committed.items()}
    rolled_back = set().union(*(w.rolled_back for w in writers))
    position = wait_until(lambda: (p := _shipped_through(database)()) and p.id == max(committed) and p,
                          timeout_s=60, what="every committed row shipped")
    got = _consume_all(cluster, position.seq)
    seqs = [s for s, _, _ in got]
    assert seqs == list(range(position.seq + 1)), "seqs delivered once each, in order"
    ids = [i for _, i, _ in got]
    assert not {p for _, _, p in got} & rolled_back, "a rolled-back row was shipped"
    assert ids == sorted(committed), "every committed row once, in commit (id) order"
    assert all(committed[i] == p for _, i, p in got), "payloads as written"
    db = OutboxDb.open(database)
    try:
        assert db.fetch("q", 0, 10) == [], "shipped rows are deleted"
    finally:
        db.close()


def test_relay_ships_every_committed_row_once_in_order_through_kills(cluster: Cluster, database: str) -> None:
    """Relay A dies (kill -9 of itself) after acks came and before it deleted the rows; B,
    waiting as a standby, takes over and must neither resend nor skip them. The head master
    is killed under B; B is killed from outside; C finishes the job."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    position = _shipped_through(database)
    # two applications committing ~300 rows/s between them until the end, so every kill lands
    # while rows flow
    writers = [Writer(database, f"w{i}", rows=10**6, rate=150, seed=i) for i in range(2)]
    a = _relay(cluster, "relay-a", database, crash_at="acked:4")
    a.wait_for_line("LEADER", timeout_s=60)
    b = _relay(cluster, "relay-b", database)
    b.wait_for_line("STARTED", timeout_s=60)
    for w in writers:
        w.start()
    wait_until(lambda: not a.alive(), timeout_s=60, what="relay A to kill itself after its 4th ack")
    recorded_when_a_died = position()
    resumed = b.wait_for_line("LEADER", timeout_s=60)  # "q: resuming after row N (seq S)"
    resumed_after = int(resumed.split("resuming after row ")[1].split()[0])
    assert recorded_when_a_died is None or resumed_after > recorded_when_a_died.id, \
        "B resumed after the rows A got acked but had not recorded"

    before = position()
    wait_until(lambda: (p := position()) and p.seq > (before.seq if before else 0) + 100, timeout_s=30,
               what="B shipping")
    cluster.head().master.kill()
    mark = position()
    assert mark is not None
    wait_until(lambda: (p := position()) and p.seq > mark.seq + 100, timeout_s=60, what="B shipping after failover")
    b.kill()
    c = _relay(cluster, "relay-c", database)
    c.wait_for_line("LEADER", timeout_s=60)
    mark = position()
    assert mark is not None
    wait_until(lambda: (p := position()) and p.seq > mark.seq + 100, timeout_s=60, what="C shipping")
    _check_every_committed_row_once_in_order(cluster, database, writers)
    assert c.stop() == 0, c.log_tail()  # SIGTERM: finishes what it sent and exits cleanly
    assert a.returncode == -9


@pytest.mark.slow
def test_relay_survives_many_kills_at_random_moments(cluster: Cluster, database: str) -> None:
    """Longer: relays killed from outside at random moments (a standby always waiting), one
    killing itself right after handing a read's rows to the producer, and head masters
    killed and restarted, while two applications commit."""
    cluster.add_groups("g1", "g2", "g3")
    cluster.create_queue("q")
    position = _shipped_through(database)
    rng = random.Random(16)
    writers = [Writer(database, f"w{i}", rows=10**6, rate=150, seed=10 + i) for i in range(2)]
    for w in writers:
        w.start()
    relays = [_relay(cluster, "relay-0", database, crash_at="sent:7")]
    relays[0].wait_for_line("LEADER", timeout_s=60)
    for n in range(1, 9):
        standby = _relay(cluster, f"relay-{n}", database)
        standby.wait_for_line("STARTED", timeout_s=60)
        mark = position()
        goal = (mark.seq if mark else 0) + rng.randint(20, 400)
        wait_until(lambda goal=goal: (p := position()) and p.seq > goal, timeout_s=60, what=f"shipping past {goal}")
        if n % 3 == 0:
            master = cluster.head().master
            master.kill()
            cluster.restart(master)
        leader = next(r for r in relays if r.alive()) if any(r.alive() for r in relays) else None
        if leader is not None:
            leader.kill()
        relays.append(standby)
        standby.wait_for_line("LEADER", timeout_s=60)
    _check_every_committed_row_once_in_order(cluster, database, writers)
    assert relays[0].returncode == -9
