"""``ordq cdc apply`` on real servers: Debian's MariaDB as the source (shipped by ``ordq cdc
mysql``), Debian's PostgreSQL or a second MariaDB as the target, real broker processes. While an application
commits inserts, updates and deletes, appliers are killed (-9) mid-stream and the head master
is killed; at the end the target table equals the source table row for row, and every
row's position in ``ordq_apply`` is its last change's seq."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from ordq.cli import main
from sdk import Consumer, ConsumerConfig, Delivered, Producer, ProducerConfig
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.helpers.mariadb import MariaDbServer, ShopApp
from tests.helpers.postgres import PostgresServer
from tests.util import wait_until

# mysql-replication 1.0 passes pymysql the old "db" argument (pymysql 1.2 warns about it)
pytestmark = pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDbServer]:
    server = MariaDbServer.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def maria_target() -> Iterator[MariaDbServer]:
    server = MariaDbServer.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.destroy()


def _rows(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []
    finally:
        conn.close()


@attrs.frozen
class TargetDb:
    """The target database of one test: its DSN and a way to run one statement on it."""

    dsn: str
    connect: Callable[[], Any]
    positions_table: str = "ordq_apply"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return _rows(self.connect(), sql)

    def items(self) -> list[tuple[Any, ...]]:
        return self.query("SELECT id, name, qty FROM shop.items ORDER BY id")

    def positions(self) -> dict[str, int]:
        """key -> seq of the last change applied to that row (empty before the table exists)."""
        try:
            return {str(k): int(seq) for k, seq in self.query(f"SELECT k, seq FROM {self.positions_table}")}
        except Exception:  # noqa: BLE001 - the applier has not created it yet
            return {}


def _target(kind: str, request: pytest.FixtureRequest) -> TargetDb:
    """An empty target of that kind with the operator's table shop.items."""
    if kind == "postgresql":
        import psycopg

        dsn = request.getfixturevalue("pg").create_database("apply")
        db = TargetDb(dsn, lambda: psycopg.connect(dsn, autocommit=True))
        db.query("CREATE SCHEMA shop")
    else:
        server: MariaDbServer = request.getfixturevalue("maria_target")
        db = TargetDb(f"mysql://ordq@127.0.0.1:{server.port}/ordq", lambda: server.connect(autocommit=True),
                      "ordq.ordq_apply")
        for sql in ("DROP DATABASE IF EXISTS shop", "DROP DATABASE IF EXISTS ordq", "CREATE DATABASE shop",
                    "CREATE DATABASE ordq"):
            db.query(sql)
    db.query("CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(20), qty INT NOT NULL)")
    return db


def _fresh_source(maria: MariaDbServer) -> None:
    """shop.items, empty, and a binlog that starts after it was made (each test ships it --from-beginning)."""
    conn: Any = maria.connect(autocommit=True)
    with conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS shop")
        cur.execute("RESET MASTER")
        cur.execute("CREATE DATABASE shop")
        cur.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(20), qty INT NOT NULL)")
    conn.close()


def _last_seq_per_key(cluster: Cluster, until: int) -> dict[str, int]:
    """Read the queue from its start to ``until`` rows: each key's last seq."""
    last: dict[str, int] = {}
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="check", start="earliest")
    with Consumer(cfg) as c:
        for m in c:
            last[(m.key or b"").decode()] = m.seq
            if m.seq + 1 >= until:
                c.commit()
                break
    return last


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_target_equals_source_through_applier_and_master_kills(kind: str, cluster: Cluster, maria: MariaDbServer,
                                                               request: pytest.FixtureRequest) -> None:
    _fresh_source(maria)
    target = _target(kind, request)
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    app = ShopApp(maria, rate=60)
    app.start()
    shipper = cluster.spawn_ordq("cdc", "cdc", "mysql", maria.source, "q", "--from-beginning", "--send-timeout", "1")

    def applier(name: str) -> Any:
        return cluster.spawn_ordq(name, "cdc", "apply", "q", "-s", "replica", "--target", target.dsn, "--workers", "4")

    def applied() -> int:
        return len(target.positions())

    a = applier("apply-a")
    wait_until(lambda: applied() > 100, timeout_s=60, what="A applying")
    a.kill()
    b = applier("apply-b")
    mark = applied()
    wait_until(lambda: applied() > mark + 60, timeout_s=60, what="B applying")
    cluster.head().master.kill()
    b.kill()  # mid-stream, while the shipper fails over
    c = applier("apply-c")
    mark = applied()
    wait_until(lambda: applied() > mark + 60, timeout_s=60, what="C applying after the failover")
    app.stop.set()
    app.join(timeout=30)
    assert app.error is None, app.error
    expected = [(i, name, qty) for i, name, qty in _rows(maria.connect(), "SELECT id, name, qty FROM shop.items "
                                                                          "ORDER BY id")]
    wait_until(lambda: target.items() == expected, timeout_s=60, what="the target to equal the source")
    assert len(expected) > 100
    assert c.stop(timeout_s=30) == 0, c.log_tail()  # SIGTERM: finishes what it holds, exits 0
    assert "applied" in c.log_tail(), c.log_tail()
    shipper.kill()
    # each row's stored position is exactly the seq of its last change in the queue
    positions = target.positions()
    assert _last_seq_per_key(cluster, until=max(positions.values()) + 1) == positions


def test_missing_table_and_bad_target_are_one_clear_line(cluster: Cluster, pg: PostgresServer,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cdc", "apply", "q", "-s", "r", "--target", "sqlite:///x.db"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("ordq: error: bad target 'sqlite:///x.db'")
    cluster.add_groups("g1")
    cluster.create_queue("q")
    proc = cluster.ordq("cdc", "apply", "q", "-s", "r", "--target", "postgresql://postgres@127.0.0.1:1/x")
    err = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and err[-1].startswith("ordq: error: cannot open the target database "
                                                       "postgresql://127.0.0.1:1/x: "), err
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q")) as p:
        change = {"op": "insert", "db": "shop", "table": "gone", "pk": {"id": 1}, "before": None, "after": {"id": 1},
                  "gtid": None}
        p.send(json.dumps(change).encode(), key=b"shop.gone:1").result()
    proc = cluster.ordq("cdc", "apply", "q", "-s", "r", "--target", pg.create_database("empty"))
    err = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and err[-1].startswith('ordq: error: cannot apply seq 0 to table shop.gone: '
                                                       'relation "shop.gone" does not exist'), err
    proc = cluster.ordq("cdc", "apply", "nosuchqueue", "-s", "r", "--target", pg.create_database("empty"))
    assert proc.returncode == 1 and "nosuchqueue" in proc.stderr.decode().splitlines()[-1], proc.stderr


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_a_replayed_change_is_a_no_op(kind: str, request: pytest.FixtureRequest) -> None:
    """Changes applied directly (no queue): an older or repeated seq of a row changes nothing,
    a newer one applies; an update that moves the primary key removes the old row."""
    from ordq.cdc.apply import Applier, Target

    target = _target(kind, request)

    def change(seq: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> Delivered:
        image = after if after is not None else before
        assert image is not None
        payload = {"op": op, "db": "shop", "table": "items", "pk": {"id": image["id"]}, "before": before,
                   "after": after, "gtid": None}
        return Delivered(seq=seq, seg=0, offset=seq, payload=json.dumps(payload).encode(),
                         key=b"shop.items:%d" % image["id"], headers=(), timestamp_us=0)

    one = {"id": 1, "name": "a", "qty": 1}
    applier = Applier(Target.parse(target.dsn), "s")
    applier.prepare()
    try:
        for m in [change(0, "insert", None, one), change(2, "update", one, {**one, "qty": 3}),
                  change(1, "update", one, {**one, "qty": 2}),  # older than the stored seq 2: a replay
                  change(2, "update", one, {**one, "qty": 3}),  # the same seq again
                  change(0, "insert", None, one)]:
            applier(m)
        assert target.items() == [(1, "a", 3)]
        assert (applier.stats.applied, applier.stats.skipped) == (2, 3)
        applier(change(3, "delete", {**one, "qty": 3}, None))
        applier(change(2, "update", one, {**one, "qty": 3}))  # a replay after the delete: stays deleted
        assert target.items() == []
        applier(change(4, "insert", None, {"id": 5, "name": "b", "qty": 0}))
        moved = change(5, "update", {"id": 5, "name": "b", "qty": 0}, {"id": 6, "name": "b", "qty": 0})
        applier(moved)
        assert target.items() == [(6, "b", 0)]
    finally:
        applier.close()
