"""The admin CLI in-process (``ordq.cli.main``) against a real ZooKeeper and real broker
processes: queue describe, sub list|reset, peek, top, group drain|undrain|remove.

What is checked is what an operator relies on: the numbers shown are the stored ones (segments,
seq ranges, backlog, lag, holder); a reset really makes a consumer deliver from the target
again; peek reads the slave when the master is dead; a drained group leaves the send list and
stays out; every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.cli import main
from ordq.common.errors import ConflictError
from ordq.common.proc import ManagedProcess
from ordq.common.security import of_store, provision, register_coordinators
from ordq.coordinator import state as sm
from ordq.coordinator.store import ZkStore
from ordq.sdk import BatchingConfig, CommitConfig, Consumer, ConsumerConfig, Delivered, Producer, ProducerConfig
from ordq.wire.client import GrpcTransport
from ordq.zk_server import free_ports
from tests.cluster import start_coordinator
from tests.util import wait_until

pytestmark = pytest.mark.zk
Q = "q"


@attrs.define
class Cluster:
    zk: str
    root: str
    store: ZkStore
    groups: dict[str, BrokerGroupProcesses]
    capsys: pytest.CaptureFixture[str]

    def run(self, *argv: str) -> tuple[int, str, str]:
        code = main(["--zk", self.zk, "--root", self.root, *argv])
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self.run(*argv)
        assert code == 0, err
        return out

    def json(self, *argv: str) -> Any:
        return json.loads(self.ok(*argv, "--json"))

    def error(self, *argv: str) -> str:
        """Run a failing command: exit 1, nothing on stdout, one ``ordq: error:`` line."""
        code, out, err = self.run(*argv)
        lines = err.strip().splitlines()
        assert code == 1 and out == "" and len(lines) == 1 and lines[0].startswith("ordq: error: "), (code, out, err)
        return lines[0]

    def producer(self, **options: Any) -> Producer:
        return Producer(ProducerConfig(zk_hosts=self.zk, root=self.root, queue=Q, **options))

    def consumer(self, sub: str, consumer_id: str = "c") -> Consumer:
        # Commits only on close: a cursor in ZooKeeper is exactly what a closed consumer read.
        return Consumer(ConsumerConfig(zk_hosts=self.zk, root=self.root, queue=Q, subscription=sub,
                                       consumer_id=consumer_id, fetch_wait_ms=100,
                                       commit=CommitConfig(every_messages=1_000_000, every_ms=1e9)))


@pytest.fixture
def make_cluster(zk_server, zk_root, tmp_path: Path, capsys) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(*gids)``: register the groups, start a master and a slave for each (real
    processes), create queue ``q`` on them. Everything is killed at teardown."""
    store = ZkStore.connect(zk_server.connection_string, zk_root)
    started: list[BrokerGroupProcesses] = []
    coordinators: list[ManagedProcess] = []

    broker_tls, _ = provision(tmp_path / "tls", zk_server.connection_string, zk_root)

    def make(*gids: str) -> Cluster:
        groups = {}
        for gid in gids:
            store.add_group(gid)
            groups[gid] = BrokerGroupProcesses(gid, zk_hosts=zk_server.connection_string, root=zk_root,
                                               base_dir=tmp_path, tls=broker_tls)
            started.append(groups[gid])
        with concurrent.futures.ThreadPoolExecutor(len(gids)) as pool:
            list(pool.map(lambda g: g.start(), groups.values()))
        wait_until(lambda: store.live_groups(list(gids)) == set(gids), what="groups live")
        store.create_queue(Q, list(gids))
        if not coordinators:  # producers and consumers ask it (issue 23)
            # on a port registered for (zk, root): clients named by them find it (issue 37)
            address = f"127.0.0.1:{free_ports(1)[0]}"
            register_coordinators(zk_server.connection_string, zk_root, [address])
            coordinators.append(start_coordinator("coordinator-0", zk_server.connection_string, zk_root,
                                                  tmp_path / "run", listen=address))
        return Cluster(zk_server.connection_string, zk_root, store, groups, capsys)

    try:
        yield make
    finally:
        for g in started:
            for p in g.members:
                print(f"--- {p.gid} {p.role} log tail ---\n{p.log_tail(20)}")
            g.kill()
        for proc in coordinators:
            print(f"--- {proc.name} log tail ---\n{proc.log_tail(20)}")
            proc.kill()
        store.close()


def produce(c: Cluster, count: int, *, producer: Producer | None = None, **send: Any) -> list[Any]:
    """Send ``count`` messages (payload ``m<seq-ish>``) and wait until all are acked."""
    def go(p: Producer) -> list[Any]:
        futures = [p.send(b"m%d" % i, **send) for i in range(count)]
        p.flush(timeout_s=30)
        return [f.result() for f in futures]

    if producer is not None:
        return go(producer)
    with c.producer(batching=BatchingConfig(max_batch_messages=4)) as p:
        return go(p)


def take(consumer: Consumer, n: int, timeout_s: float = 20.0) -> list[Delivered]:
    """The next ``n`` messages, handled: committed when the consumer closes."""
    out: list[Delivered] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} messages: {[m.seq for m in out]}"
        out.extend(consumer.poll(timeout_s=0.1, max_messages=n - len(out)))
    consumer.commit()
    return out


def first_delivered(c: Cluster, sub: str) -> Delivered:
    with c.consumer(sub) as consumer:
        return take(consumer, 1)[0]


def test_describe_sub_list_and_top_show_segments_backlog_lag_and_holder(make_cluster) -> None:
    c = make_cluster("g1", "g2")
    produce(c, 20)
    with c.consumer("s1") as consumer:
        assert [m.seq for m in take(consumer, 20)] == list(range(20))
    produce(c, 30)

    doc = c.json("queue", "describe", Q)
    assert doc["send"] == ["g1", "g2"] and doc["last_seq"] == 49 and doc["stored"] == 50
    [seg0] = doc["consume"]
    seg0_bytes = seg0.pop("bytes")
    assert seg0_bytes > 50 * 10  # payloads and batch headers, as synced on disk
    assert seg0 == {"seg": 0, "gid": "g1", "status": "open", "messages": 50, "first_seq": 0,
                    "last_seq": 49, "read_from": "master"}
    backlog = {g["group"]: (g["backlog"], g["bytes"]) for g in doc["groups"]}
    assert backlog == {"g1": (50, seg0_bytes), "g2": (0, 0)}
    [s1] = doc["subscriptions"]
    assert (s1["subscription"], s1["last_seq"], s1["lag"], s1["held_by"]) == ("s1", 19, 30, None)
    human = c.ok("queue", "describe", Q)
    assert "send list: g1 -> g2" in human and "consume list:" in human and "subscriptions:" in human
    assert any(line.split()[:4] == ["0", "g1", "open", "50"] for line in human.splitlines())

    with c.consumer("s1", consumer_id="holder-7"):
        listed = c.json("sub", "list", Q)
        assert listed["subscriptions"][0]["held_by"] == "holder-7"
        assert listed["subscriptions"][0]["lag"] == 30
        assert "holder-7" in c.ok("sub", "list", Q)

    frame = c.json("top", "--interval", "0.2")
    [row] = frame["queues"]
    assert (row["queue"], row["head"], row["last_seq"], row["segments"], row["max_lag"]) == (Q, "g1", 49, 1, 30)
    assert row["produce_rate"] == 0.0
    [sub] = frame["subscriptions"]
    assert (sub["subscription"], sub["lag"], sub["held_by"]) == ("s1", 30, None)
    once = c.ok("top", "--once", "--interval", "0.2")
    assert "PRODUCE_RATE" in once and "s1" in once and "\x1b[" not in once
    live_top_redraws_until_interrupted(c)

    assert "unknown queue 'nope'" in c.error("queue", "describe", "nope")
    assert "has no subscription" in c.error("sub", "reset", Q, "nope", "--to", "earliest")


@pytest.mark.heavy  # ~30 s on a busy box; the default run sees mirrors on the status page (test_status_page.py)
def test_top_shows_how_far_each_mirror_of_a_queue_is_behind(make_cluster) -> None:
    """A mirror's subscription (mirror.<target>) on the source: ``ordq top`` lists it as a
    mirror, with the last source seq its copy holds and its lag in messages and seconds
    (the age of the oldest message not copied yet), whether or not a mirror runs."""
    c = make_cluster("g1")
    produced_at = time.time()
    produce(c, 50)
    with c.consumer("mirror.dc2") as consumer:  # as a mirror that copied seqs 0..19 would have committed
        assert [m.seq for m in take(consumer, 20)] == list(range(20))
    c.ok("sub", "create", Q, "s1")
    frame = c.json("top", "--interval", "0.1")
    [mirror] = frame["mirrors"]  # s1 is no mirror
    assert {k: mirror[k] for k in ("queue", "subscription", "target", "source_last_seq", "copied_seq",
                                   "lag_messages", "held_by")} == {
        "queue": Q, "subscription": "mirror.dc2", "target": "dc2", "source_last_seq": 49, "copied_seq": 19,
        "lag_messages": 30, "held_by": None}
    assert 0 < mirror["lag_seconds"] <= time.time() - produced_at + 1
    once = c.ok("top", "--once", "--interval", "0.1")
    table = once.split("\nmirrors\n", 1)[1].splitlines()
    assert table[0].split() == ["QUEUE", "TARGET", "COPIED_SEQ", "LAG_MESSAGES", "LAG_SECONDS", "HELD_BY"]
    assert table[1].split()[:4] == [Q, "dc2", "19", "30"]

    with c.consumer("mirror.dc2") as consumer:  # caught up: no lag in either unit
        take(consumer, 30)
    [mirror] = c.json("top", "--interval", "0.1")["mirrors"]
    assert (mirror["copied_seq"], mirror["lag_messages"], mirror["lag_seconds"]) == (49, 0, 0.0)


def live_top_redraws_until_interrupted(c: Cluster) -> None:
    """``ordq top`` as a user runs it: a frame per interval until Ctrl-C, then exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "ordq.cli", "--zk", c.zk, "--root", c.root, "top",
                             "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout, proc.stderr
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum(line.startswith("ordq top") for line in lines) >= 2, timeout_s=20, what="two frames")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        out.close()
        err.close()


def test_reset_is_refused_while_held_unless_forced_and_redelivers_from_the_target(make_cluster) -> None:
    c = make_cluster("g1")
    produce(c, 30)
    with c.consumer("s1") as consumer:
        seen = take(consumer, 30)
    assert [m.seq for m in seen] == list(range(30))

    holder = c.consumer("s1", consumer_id="holder-b")
    holder.start()
    try:
        assert "held by consumer 'holder-b'" in c.error("sub", "reset", Q, "s1", "--to", "seq", "10")
        forced = c.json("sub", "reset", Q, "s1", "--to", "seq", "10", "--force")
        assert forced["forced"] and forced["held_by"] == "holder-b"
        assert forced["before"]["last_seq"] == 29
        assert forced["after"] == {"seg": 0, "offset": 10, "last_seq": 9} and forced["next_seq"] == 10
        with pytest.raises(ConflictError):
            holder.commit()  # the running consumer learns its cursor was moved under it
    finally:
        holder.close()  # it finished nothing since it began: it writes nothing, and the reset stands

    # Back to an earlier seq: delivered again from exactly there, in order.
    with c.consumer("s1") as consumer:
        assert [m.seq for m in take(consumer, 20)] == list(range(10, 30))
    # Forward, earliest, by time, latest.
    c.ok("sub", "reset", Q, "s1", "--to", "seq", "25")
    assert first_delivered(c, "s1").seq == 25
    c.ok("sub", "reset", Q, "s1", "--to", "earliest")
    assert first_delivered(c, "s1").seq == 0
    t_us = seen[15].timestamp_us
    expected = min(m.seq for m in seen if m.timestamp_us >= t_us)
    at = c.json("peek", Q, "--seq", "15")["timestamp"]
    reset = c.json("sub", "reset", Q, "s1", "--to", "time", at)
    assert reset["next_seq"] == expected
    assert first_delivered(c, "s1").seq == expected
    c.ok("sub", "reset", Q, "s1", "--to", "latest")
    with c.consumer("s1") as consumer:
        assert consumer.poll(timeout_s=0.2) == []
        produce(c, 1)
        assert [m.seq for m in take(consumer, 1)] == [30]

    assert "is not stored (yet): the last readable seq is 30" in c.error("sub", "reset", Q, "s1", "--to", "seq", "99")
    assert c.json("sub", "reset", Q, "s1", "--to", "seq", "31")["after"]["last_seq"] == 30  # next to come
    assert "bad reset target" in c.error("sub", "reset", Q, "s1", "--to", "tomorrow")
    assert "bad time" in c.error("sub", "reset", Q, "s1", "--to", "time", "yesterday")
    assert c.json("sub", "reset", Q, "s1", "--to", "time", "2000-01-01T00:00:00")["next_seq"] == 0


def test_peek_reads_the_slave_when_the_master_is_killed(make_cluster) -> None:
    c = make_cluster("g1")
    with c.producer() as p:
        produce(c, 5, producer=p, key=b"k3", headers=[("trace", b"t-1")])
        p.send(bytes(range(256)) * 4).result(timeout=30)  # seq 5: 1 KiB binary

    out = c.ok("peek", Q, "--seq", "3")
    assert "seg 0 offset 3 on group g1 (read from master)" in out and "k3" in out and "trace: t-1" in out
    assert out.rstrip().endswith("m3")
    binary = c.json("peek", Q, "--seq", "5")
    assert binary["payload"]["encoding"] == "hex" and binary["payload"]["truncated"]
    assert binary["payload_bytes"] == 1024 and len(binary["payload"]["value"]) == 2 * 256
    full = c.json("peek", Q, "--seq", "5", "--full")["payload"]
    assert not full["truncated"] and bytes.fromhex(full["value"]) == bytes(range(256)) * 4

    # The slave serves up to the LAC the master pushed it: wait until that covers seq 5.
    slave = c.store.live_members("g1")["slave"].address
    transport = GrpcTransport(credentials=of_store(c.store))
    try:
        wait_until(lambda: transport.fetch(slave, Q, 0, 6, max_bytes=1, max_wait_ms=0).readable_end == 6,
                   what="slave LAC at 6")
    finally:
        transport.close()
    c.groups["g1"].master.kill()
    peeked = c.json("peek", Q, "--seq", "3")
    assert (peeked["read_from"], peeked["payload"]["value"], peeked["key"]["value"]) == ("slave", "m3", "k3")
    assert c.json("queue", "describe", Q)["consume"][0]["read_from"] == "slave"

    assert "is not stored (yet): the last readable seq is 5" in c.error("peek", Q, "--seq", "6")
    c.groups["g1"].slave.kill()
    assert "no replica answered" in c.error("peek", Q, "--seq", "3")
    doc = c.json("queue", "describe", Q)
    if doc["consume"][0]["messages"] is None:  # no replica answers and ZooKeeper records no end
        assert doc["last_seq"] is None and doc["groups"][0]["backlog"] is None
        assert "(no replica answered)" in c.ok("queue", "describe", Q)
    else:  # the coordinator sealed the segment through the slave before it was killed: ZooKeeper knows
        assert c.store.load_state(Q)[0].consume[0].end == 6
        assert (doc["consume"][0]["messages"], doc["last_seq"]) == (6, 5), doc


def test_drain_moves_the_head_keeps_the_group_out_and_remove_is_consistent(make_cluster) -> None:
    c = make_cluster("g1", "g2")
    with c.producer(send_timeout_s=2.0) as p:
        before = produce(c, 20, producer=p)
        assert {r.seg for r in before} == {0}
        drained = c.json("group", "drain", "g1")
        assert drained["queues"] == [{"queue": Q, "was_head": True, "new_head": "g2", "sealing_seg": 0,
                                      "sealed": True}]
        after = produce(c, 20, producer=p)  # the producer follows the new head
    assert [r.seq for r in after] == list(range(20, 40)) and {r.seg for r in after} == {1}

    doc = c.json("queue", "describe", Q)
    assert doc["send"] == ["g2"]
    assert [(s["seg"], s["gid"], s["status"], s["messages"], s["first_seq"], s["last_seq"]) for s in doc["consume"]] \
        == [(0, "g1", "sealed", 20, 0, 19), (1, "g2", "open", 20, 20, 39)]
    assert {g["group"]: (g["drained"], g["backlog"]) for g in doc["groups"]} == {"g1": (True, 20), "g2": (False, 20)}
    # Nothing re-admits a drained group (the coordinator daemon admits through the same check).
    assert c.store.apply(Q, sm.admit_all).send == ("g2",)
    assert [g["drained"] for g in c.json("group", "list")] == [True, False]
    assert "processes are live" in c.error("group", "remove", "g1")

    # Seqs are found in either segment; once a segment is popped its seqs are gone.
    assert (c.json("peek", Q, "--seq", "5")["seg"], c.json("peek", Q, "--seq", "25")["offset"]) == (0, 5)
    undrained = c.json("group", "undrain", "g1")["queues"]
    # g2 takes writes: g1, holding unread segment 0, waits until it is read (JMQ's rule)
    assert [(q["queue"], q["admitted"]) for q in undrained] == [(Q, False)]
    assert "still holds unconsumed segments" in undrained[0]["why_not"]
    with c.consumer("s1") as consumer:
        assert [m.seq for m in take(consumer, 40)] == list(range(40))
        wait_until(lambda: c.store.load_state(Q)[0].trimmed_seq == 19, what="segment 0 popped")
    assert "was already popped" in c.error("peek", Q, "--seq", "5")
    assert "was already popped" in c.error("sub", "reset", Q, "s1", "--to", "seq", "5")
    assert c.json("group", "undrain", "g1")["queues"] == [{"queue": Q, "admitted": True, "why_not": None}]
    assert c.store.load_state(Q)[0].send == ("g2", "g1")

    # Remove: refused while in a send list, then drained and stopped, it goes cleanly.
    assert "drain it first" in c.error("group", "remove", "g1")
    assert c.json("group", "drain", "g1")["queues"][0]["was_head"] is False
    c.groups["g1"].kill()
    wait_until(lambda: not c.store.live_members("g1"), what="g1 processes gone from ZooKeeper")
    assert c.json("group", "remove", "g1") == {"removed": "g1", "queues": [Q]}
    assert c.store.load_state(Q)[0].groups == ("g2",) and c.store.list_groups() == ["g2"]
    # Draining the last group that takes writes needs --force: producers would wait.
    assert "last group that can take writes for q" in c.error("group", "drain", "g2")
    assert c.json("group", "drain", "g2", "--force")["queues"][0]["new_head"] is None
