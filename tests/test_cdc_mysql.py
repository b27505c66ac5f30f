"""``ordq cdc mysql`` on a real MariaDB (Debian's, drills/dbservers/mariadb.py) and real broker
processes: while an application commits inserts, updates and deletes, shippers are killed
(-9) and the head master is killed; at the end the queue holds every row change of the
binlog once, in binlog order, as an independent read of the binlog lists them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ordq.cdc.mysql import change_messages
from ordq.cli import main
from ordq.drills.dbservers.mariadb import MariaDbServer, ShopApp
from ordq.sdk import Consumer, ConsumerConfig
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.helpers.servers import running
from tests.util import wait_until


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDbServer]:
    with running(MariaDbServer.start) as server:
        yield server


def _binlog_changes(maria: MariaDbServer) -> list[dict[str, Any]]:
    """Every row change of shop.items in the binlog, read independently of the queue. The
    dump blocks and stops at the end SHOW MASTER STATUS gave first: MariaDB 10.11 resets a
    non-blocking dump part-way, and pymysqlreplication then spun on a garbled table map
    (8.5 GB and 12 CPU minutes in one run, until killed)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    conn: Any = maria.connect()
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        first = cur.fetchall()[0][0]
        cur.execute("SHOW MASTER STATUS")
        status = cur.fetchone()
    conn.close()
    until = (str(status[0]), int(status[1]))
    stream = BinLogStreamReader(connection_settings={"host": "127.0.0.1", "port": maria.port, "user": "ordq",
                                                     "password": ""}, server_id=77, blocking=True, is_mariadb=True,
                                only_events=[MariadbGtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                                             HeartbeatLogEvent],
                                log_file=first, log_pos=4, resume_stream=True, slave_heartbeat=1.0,
                                enable_logging=False)
    out, gtid = [], None
    try:
        for event in stream:
            if isinstance(event, HeartbeatLogEvent):
                break  # nothing more for a second: at the end
            if isinstance(event, MariadbGtidEvent):
                gtid = str(event.gtid)
            else:
                out += [json.loads(payload) for row in event.rows if event.table == "items"
                        for _key, payload in change_messages(event, row, gtid)]
            if (stream.log_file, event.packet.log_pos) >= until:
                break
    finally:
        stream.close()
    return out


@contextlib.contextmanager
def _reading(cluster: Cluster, take: Callable[[bytes], object]) -> Iterator[None]:
    """While inside: a consumer thread (subscription "check", from the start of queue "q")
    hands every payload to ``take``, in order."""
    done = threading.Event()

    def consume() -> None:
        cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="check",
                             start="earliest")
        with Consumer(cfg) as c:
            while not done.is_set():
                for m in c.poll(0.2):
                    take(m.payload)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        yield
    finally:
        done.set()
        reader.join(timeout=30)


# mysql-replication 1.0 passes pymysql the old "db" argument (pymysql 1.2 warns about it)
@pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")
def test_binlog_rows_reach_the_queue_once_in_order_through_kills(cluster: Cluster, maria: MariaDbServer) -> None:
    maria.fresh_shop()
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    got: list[dict[str, Any]] = []
    with _reading(cluster, lambda payload: got.append(json.loads(payload))):
        _ship_through_kills(cluster, maria, got)


def _ship_through_kills(cluster: Cluster, maria: MariaDbServer, got: list[dict[str, Any]]) -> None:
    app = ShopApp(maria, rate=60)
    app.start()

    def shipper(name: str, *extra: str) -> Any:
        return cluster.spawn_ordq(name, "cdc", "mysql", maria.source, "q", "--from-beginning", "--send-timeout", "1",
                                  *extra)

    a = shipper("cdc-a")
    a.wait_for_line("LEADER", timeout_s=60)
    wait_until(lambda: len(got) > 150, timeout_s=60, what="A shipping")
    a.kill()
    b = shipper("cdc-b")
    b.wait_for_line("LEADER", timeout_s=60)
    mark = len(got)
    wait_until(lambda: len(got) > mark + 150, timeout_s=60, what="B shipping")
    cluster.head().master.kill()
    mark = len(got)
    wait_until(lambda: len(got) > mark + 150, timeout_s=60, what="B shipping after the failover")
    b.kill()
    app.stop.set()
    app.join(timeout=30)
    assert app.error is None, app.error
    c = shipper("cdc-c", "--until-end")
    wait_until(lambda: not c.alive(), timeout_s=60, what="C to catch up and exit")
    assert c.returncode == 0, c.log_tail()
    expected = _binlog_changes(maria)
    wait_until(lambda: len(got) >= len(expected), timeout_s=60, what=f"{len(expected)} changes delivered")
    assert len(expected) > 450 and got == expected  # each once, in binlog order, with its transaction's GTID


@pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")
def test_a_restarted_shipper_resumes_after_a_failover_to_an_empty_segment(cluster: Cluster,
                                                                         maria: MariaDbServer) -> None:
    """Issue 16: every subscription had read the queue's last message and a head failover
    opened a new, empty segment; the segment holding that message was popped, and every
    shipper started after that exited 1 ("cannot read the queue's last message"). The
    segment now stays until a later message is stored, and the shipper resumes."""
    from ordq.common.errors import IllegalTransition
    from ordq.coordinator import state as sm

    maria.fresh_shop()
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    conn: Any = maria.connect(autocommit=True)
    cur = conn.cursor()
    cur.executemany("INSERT INTO shop.items VALUES (%s, 'a', 0)", [(i,) for i in range(10)])

    def ship() -> None:
        proc = cluster.ordq("cdc", "mysql", maria.source, "q", "--from-beginning", "--until-end")
        assert proc.returncode == 0, proc.stderr.decode()

    got: list[int] = []
    ship()
    with contextlib.closing(conn), _reading(cluster, lambda payload: got.append(json.loads(payload)["pk"]["id"])):
        wait_until(lambda: len(got) == 10, timeout_s=30, what="the first 10 rows read")
        cluster.groups["g1"].master.kill()
        cluster.start_daemon("coordinator")  # fails g1 over to g2 (empty segment 1), seals segment 0
        # the reader finished segment 0 and moved on: the moment retention used to pop it
        wait_until(lambda: cluster.store.get_cursor("q", "check")[0].seg == 1, timeout_s=30,
                   what="the reader past segment 0")
        with contextlib.suppress(IllegalTransition):  # retention's turn (refused: "newest message")
            cluster.store.apply("q", sm.pop)
        cur.executemany("INSERT INTO shop.items VALUES (%s, 'b', 0)", [(i,) for i in range(10, 15)])
        ship()  # resumes after row 9; it exited 1 before the fix: "cannot read the queue's last message"
        wait_until(lambda: len(got) >= 15, timeout_s=30, what="rows 10-14 read")
        assert got == list(range(15))
        # a later message stored and read: segment 0 may go now (and g1 rejoin once back)
        cluster.wait_state(lambda st: st.consume[0].seg == 1, what="segment 0 popped")


def test_bad_source_is_one_clear_line(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cdc", "mysql", "postgres://x@h", "q"]) == 1
    assert capsys.readouterr().err == ("ordq: error: bad source 'postgres://x@h': expected "
                                       "mysql://user[:password]@host[:port]\n")
    cluster.add_groups("g1")
    cluster.create_queue("q")
    proc = cluster.ordq("cdc", "mysql", "mysql://ordq@127.0.0.1:1", "q", "--until-end")
    err = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and err[-1].startswith("ordq: error: cannot read the binlog of "
                                                       "mysql://ordq@127.0.0.1:1: (2003"), err


def test_the_position_header_round_trips() -> None:
    from ordq.cdc.mysql import BinlogPos

    pos = BinlogPos("binlog.000002", 1024, 2048, 3)
    assert BinlogPos.decode(pos.encode()) == pos and pos.encode() == b"binlog.000002:1024:2048:3"
    second = BinlogPos("binlog.000002", 1024, 2048, 3, part=1)  # an insert half of a key change
    assert second.encode() == b"binlog.000002:1024:2048:3.1" and BinlogPos.decode(second.encode()) == second
    assert pos < second < BinlogPos("binlog.000002", 1024, 2048, 4)


@pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")
def test_an_update_of_the_primary_key_ships_as_delete_then_insert(cluster: Cluster, maria: MariaDbServer) -> None:
    """Each key's changes stay under that key: the old row's delete under the old key, the new
    row's insert under the new one; a second run ships nothing again (positions with parts)."""
    maria.fresh_shop()
    cluster.add_groups("g1")
    cluster.create_queue("q")
    conn: Any = maria.connect(autocommit=True)
    cur = conn.cursor()
    cur.execute("INSERT INTO shop.items VALUES (1, 'a', 0), (2, 'b', 0)")
    cur.execute("UPDATE shop.items SET id = id + 10")  # one event, two rows, both keys move
    cur.execute("INSERT INTO shop.items VALUES (1, 'c', 0)")  # the old key again
    conn.close()
    for _ in range(2):
        proc = cluster.ordq("cdc", "mysql", maria.source, "q", "--from-beginning", "--until-end")
        assert proc.returncode == 0, proc.stderr.decode()
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s")
    got: list[tuple[str, str, int]] = []
    with Consumer(cfg) as c:
        while len(got) < 7:
            got += [(m.key.decode() if m.key else "", json.loads(m.payload)["op"], m.seq) for m in c.poll(0.5)]
        assert c.poll(0.5) == []  # the second run shipped nothing again
    assert [(k, op) for k, op, _ in got] == [
        ("shop.items:1", "insert"), ("shop.items:2", "insert"),
        ("shop.items:1", "delete"), ("shop.items:11", "insert"), ("shop.items:2", "delete"),
        ("shop.items:12", "insert"), ("shop.items:1", "insert")]
