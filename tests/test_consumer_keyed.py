"""Keyed parallel delivery (``Consumer.run_keyed``, DESIGN §5) on real brokers and ZooKeeper.

What must hold: every seq handled once per consumer instance; within one key, handled in seq
order (no order across keys); the committed cursor never passes a message not finished; after
a crash the next consumer resumes from the committed cursor, so together with what the first
one handled nothing is lost (redelivery of messages after the lowest unfinished is allowed).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from ordq.common.errors import HandlerError, NotLeader
from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Delivered, Producer, ProducerConfig
from ordq.sdk.aio import AsyncConsumer
from tests.cluster import (  # noqa: F401 - cluster_fixture
    CLIENT_SESSION_TIMEOUT_S,
    SEND_TIMEOUT_S,
    Cluster,
    cluster_fixture,
)
from tests.helpers.load import read_records
from tests.order_check import check_delivery, read_audit
from tests.util import wait_until

pytestmark = pytest.mark.zk
log = logging.getLogger("tests.consumer_keyed")

KEYS = 16
WORKERS = 4


def produce(cluster: Cluster, n: int, *, fail_over_at: int | None = None) -> list[bytes]:
    """Seqs 0..n-1, payload ``str(seq)``, keys drawn from KEYS; with ``fail_over_at`` the head
    master is killed there, so the stream spans two segments. Returns the key of each seq."""
    rnd = random.Random(7)
    keys = [b"k%02d" % rnd.randrange(KEYS) for _ in range(n)]
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, audit_dir=cluster.base / "audit")
    with Producer(cfg) as p:
        futures = []
        for i, key in enumerate(keys):
            if i == fail_over_at:
                p.flush(timeout_s=30)
                cluster.head().master.kill()
            futures.append(p.send(str(i).encode(), key=key))
        assert [f.result(timeout=60).seq for f in futures] == list(range(n))
    return keys


def consumer_config(cluster: Cluster, **options: object) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, leader_timeout_s=30,
                          commit=CommitConfig(every_messages=100, every_ms=20), **options)  # type: ignore[arg-type]


class Handled:
    """What a handler finished, per key in the order it finished them (thread-safe). Each
    consumer instance (``instance``) is judged alone for order and doubles; a later one may
    hand out again only what an earlier one finished after the cursor it starts from."""

    def __init__(self, keys: list[bytes], *, until: int, stop: threading.Event) -> None:
        self.keys, self.until, self.stop = keys, until, stop
        self.lock = threading.Lock()
        self.seqs: set[int] = set()
        self.orders: list[dict[bytes, list[int]]] = []
        self.twice: list[int] = []  # handed out twice by one instance, or again below its start
        self.redelivered: list[int] = []  # handed out again by a later instance, above its start
        self.starts: list[int] = []
        self.mine: set[int] = set()
        self.instance(-1)

    def instance(self, start: int) -> None:
        """A consumer instance starts after ``start`` (its committed cursor); it replaces the
        current one if that one handled nothing."""
        with self.lock:
            if self.starts and not self.mine:
                self.starts.pop()
                self.orders.pop()
            self.starts.append(start)
            self.orders.append(defaultdict(list))
            self.mine = set()

    def record(self, m: Delivered) -> None:
        assert m.payload == str(m.seq).encode() and m.key == self.keys[m.seq], m
        with self.lock:
            if m.seq in self.mine or (m.seq in self.seqs and m.seq <= self.starts[-1]):
                self.twice.append(m.seq)
            elif m.seq in self.seqs:
                self.redelivered.append(m.seq)
            self.mine.add(m.seq)
            self.seqs.add(m.seq)
            self.orders[-1][m.key or b""].append(m.seq)
            if len(self.seqs) == self.until:
                self.stop.set()

    def check_key_order(self) -> None:
        for by_key in self.orders:
            for key, seqs in by_key.items():
                assert seqs == sorted(seqs), f"key {key!r} handled out of order"


def run_keyed_rejoining(cluster: Cluster, handled: Handled, stop: threading.Event) -> None:
    """``run_keyed`` until ``stop``. A consumer whose lease went to another (a loaded box
    starved it past its lease: measured at load 24, this process went unscheduled for 2.4 s)
    rejoins by itself and resumes from the committed cursor (docs/SDK.md, "The lease"): what it
    handles after that counts as a new instance. (NotLeader: an SDK from before leases.)"""
    while not stop.is_set():
        try:
            c = Consumer(consumer_config(cluster))
            rejoin = c._rejoin

            def rejoined(reason: str, c: Consumer = c, rejoin: Callable[[str], None] = rejoin) -> None:
                rejoin(reason)
                handled.instance(c.statistics().last_seq)  # the committed cursor it reads on from

            c._rejoin = rejoined  # type: ignore[method-assign]
            with c:
                handled.instance(c.statistics().last_seq)
                c.run_keyed(handled.record, workers=WORKERS, stop=stop)
        except NotLeader as exc:
            log.warning("keyed consumer lost its lease (%s); a new one starts", exc)


def watchdog(stop: threading.Event, timeout_s: float) -> threading.Timer:
    t = threading.Timer(timeout_s, stop.set)
    t.daemon = True
    t.start()
    return t


def test_keyed_workers_keep_per_key_order_and_commit_only_the_finished_prefix(cluster: Cluster) -> None:
    """4 workers, 16 keys, random handler times, over a segment boundary (a failover): each
    seq handled once, per-key order kept; a cursor read from ZooKeeper at any time during
    the run covers only handled messages, and the last one covers them all."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 4000
    keys = produce(cluster, n, fail_over_at=n // 2)
    stop = threading.Event()
    handled = Handled(keys, until=n, stop=stop)
    rnd = random.Random(1)

    def handler(m: Delivered) -> None:
        time.sleep(rnd.random() * 0.002)
        handled.record(m)

    committed: list[int] = []
    violations: list[tuple[int, int]] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            cur = cluster.store.get_cursor("q", "s")[0]
            with handled.lock:  # read after the cursor: only more can be handled by now
                missing = next((s for s in range(cur.last_seq + 1) if s not in handled.seqs), None)
            if missing is not None:
                violations.append((cur.last_seq, missing))
            if not committed or committed[-1] != cur.last_seq:
                committed.append(cur.last_seq)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    timer = watchdog(stop, 60)
    t0 = time.monotonic()
    with Consumer(consumer_config(cluster, audit_dir=cluster.base / "audit")) as c:
        watcher.start()
        c.run_keyed(handler, workers=WORKERS, stop=stop)
        stats = c.statistics()
    took = time.monotonic() - t0
    timer.cancel()
    watching.set()
    watcher.join(5)

    assert len(handled.seqs) == n, f"handled {len(handled.seqs)} of {n} in {took:.1f}s"
    assert handled.twice == []
    handled.check_key_order()
    assert violations == [], f"committed cursor past an unfinished message (last_seq, missing): {violations[:5]}"
    assert len(committed) >= 3, committed  # commits happened while the workers ran
    assert cluster.store.get_cursor("q", "s")[0].last_seq == n - 1
    assert stats.segments_done >= 1  # the read moved to the next segment while workers ran
    # Deliveries are audited as they are handed to the workers: in seq order, each once.
    acked, instances = read_audit(cluster.base / "audit", "s")
    check_delivery(acked, instances)


def test_keyed_consumer_killed_while_a_key_is_stuck_resumes_from_the_finished_prefix(cluster: Cluster) -> None:
    """A keyed consumer process whose handler blocks forever on one key at seq B: its other
    workers go on, but the committed cursor stops at B-1. Killed -9 there, the next consumer
    resumes at B: with the first one's handled seqs nothing is lost, and what the first
    finished after B is redelivered."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 3000
    keys = produce(cluster, n)
    block = n // 3
    out = cluster.base / "keyed-c1.jsonl"
    proc = cluster.spawn("keyed-c1", [
        "-m", "tests.helpers.consume_keyed", "--zk", cluster.hosts, "--root", cluster.root, "--queue", "q",
        "--sub", "s", "--until", str(n - 1), "--out", str(out), "--workers", str(WORKERS),
        "--commit-every", "50", "--commit-ms", "20", "--block-key", keys[block].decode(),
        "--block-from", str(block)])

    def first_run() -> list[dict]:
        return read_records(out)

    wait_until(lambda: any(r.get("blocked") == block for r in first_run()), timeout_s=30, interval_s=0.02,
               what=f"the first consumer to block on seq {block} ({proc.log_path})")
    # Other keys go on past the stuck one; the cursor reaches B-1 and stays there.
    wait_until(lambda: sum(1 for r in first_run() if r.get("h", -1) > block) >= 200, timeout_s=30,
               interval_s=0.02, what="other keys handled past the stuck message")
    wait_until(lambda: cluster.store.get_cursor("q", "s")[0].last_seq == block - 1, timeout_s=10,
               interval_s=0.02, what=f"the cursor committed up to {block - 1}")
    time.sleep(0.1)  # a few more commit rounds (every 20 ms): none may pass B-1
    assert cluster.store.get_cursor("q", "s")[0].last_seq == block - 1
    proc.kill()

    first = [r for r in first_run() if "h" in r]
    first_seqs = [r["h"] for r in first]
    assert len(first_seqs) == len(set(first_seqs)), "the first consumer handled a seq twice"
    assert set(range(block)) <= set(first_seqs)  # everything the cursor covers was handled
    for key in set(keys):
        mine = [r["h"] for r in first if r["k"].encode() == key]
        assert mine == sorted(mine), f"first consumer: key {key!r} out of order"

    stop = threading.Event()
    handled = Handled(keys, until=n - block, stop=stop)
    timer = watchdog(stop, 60)
    run_keyed_rejoining(cluster, handled, stop)  # the first election waits for the killed one's session to expire
    timer.cancel()
    assert handled.starts[0] == block - 1
    assert handled.seqs == set(range(block, n)) and handled.twice == []
    handled.check_key_order()
    assert set(first_seqs) | handled.seqs == set(range(n))  # nothing lost
    redelivered = set(first_seqs) & handled.seqs
    assert redelivered and min(redelivered) > block  # finished after the stuck one: at-least-once
    assert cluster.store.get_cursor("q", "s")[0].last_seq == n - 1


def test_keyed_handler_error_stops_everything_and_commits_before_it(cluster: Cluster) -> None:
    """A handler raises on seq F: ``run_keyed`` raises HandlerError(seq=F) from it after the
    workers stopped; the cursor stays below F (leaving the ``with`` on that error commits the
    finished prefix); the next run starts at F."""
    cluster.add_groups("g1")
    cluster.create_queue()
    n = 1000
    keys = produce(cluster, n)
    fail = 600

    class AppFailed(Exception):
        pass

    stop = threading.Event()
    handled = Handled(keys, until=n, stop=stop)

    def handler(m: Delivered) -> None:
        if m.seq == fail:
            raise AppFailed
        time.sleep(0.0005)
        handled.record(m)

    timer = watchdog(stop, 60)
    with pytest.raises(HandlerError) as info, Consumer(consumer_config(cluster)) as c:
        c.run_keyed(handler, workers=WORKERS, stop=stop, max_pending=8)
    timer.cancel()
    assert info.value.seq == fail and info.value.key == keys[fail]
    assert isinstance(info.value.__cause__, AppFailed)
    assert not stop.is_set()  # the error ended it, not the stop event or the watchdog
    cur = cluster.store.get_cursor("q", "s")[0].last_seq
    assert cur < fail and set(range(cur + 1)) <= handled.seqs
    after = [s for s in handled.seqs if s > fail and keys[s] == keys[fail]]
    assert after == []  # the failed key's later messages never ran
    handled.check_key_order()

    stop2 = threading.Event()
    again = Handled(keys, until=n - cur - 1, stop=stop2)
    timer = watchdog(stop2, 60)
    with Consumer(consumer_config(cluster)) as c:
        c.run_keyed(again.record, workers=WORKERS, stop=stop2)
    timer.cancel()
    assert again.seqs == set(range(cur + 1, n)) and again.twice == []
    again.check_key_order()


def test_cli_consume_with_workers(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """``ordq consume --workers N``: prints handled messages (per-key order); ``--count`` stops
    after that many handled, commits only the finished prefix; the next run resumes there."""
    from ordq.cli import main

    cluster.add_groups("g1")
    cluster.create_queue()
    n = 500
    keys = produce(cluster, n)
    base = ["--zk", cluster.hosts, "--root", cluster.root, "consume", "q", "-s", "s", "--workers", "3"]

    def printed(out: str) -> list[int]:
        seqs = []
        for line in out.splitlines():
            seq, payload = line.split("\t")
            assert payload == seq
            seqs.append(int(seq))
        for key in set(keys):
            mine = [s for s in seqs if keys[s] == key]
            assert mine == sorted(mine), f"key {key!r} out of order"
        return seqs

    assert main([*base, "--count", "300"]) == 0
    first = printed(capsys.readouterr().out)
    assert len(first) == len(set(first)) == 300
    cur = cluster.store.get_cursor("q", "s")[0].last_seq
    assert set(range(cur + 1)) <= set(first)
    assert main([*base, "--idle-exit", "1"]) == 0
    second = printed(capsys.readouterr().out)
    assert second and min(second) == cur + 1 and len(second) == len(set(second))
    assert set(first) | set(second) == set(range(n))


def test_asyncio_keyed_delivery_with_a_coroutine_handler(cluster: Cluster) -> None:
    """``AsyncConsumer.run_keyed`` with a coroutine handler (run on the caller's loop, its
    worker waiting for it): each seq once, per-key order, across a segment boundary, and the
    final cursor covers everything; setting the asyncio stop event ends it."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 2000
    keys = produce(cluster, n, fail_over_at=n // 2)
    handled = Handled(keys, until=n, stop=threading.Event())
    rnd = random.Random(2)

    async def main() -> None:
        stop = asyncio.Event()

        async def handler(m: Delivered) -> None:
            await asyncio.sleep(rnd.random() * 0.002)
            handled.record(m)
            if handled.stop.is_set():
                stop.set()

        async with AsyncConsumer(consumer_config(cluster)) as c:
            await asyncio.wait_for(c.run_keyed(handler, workers=WORKERS, stop=stop), timeout=60)

    asyncio.run(main())
    assert len(handled.seqs) == n and handled.twice == []
    handled.check_key_order()
    assert cluster.store.get_cursor("q", "s")[0].last_seq == n - 1
