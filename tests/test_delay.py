"""Delayed delivery on real processes (issue 41): a subscription delay and a per-message
``deliver_at``, each through a kill -9 of the head master and a consumer restart (and, for
the delay, a cursor reset): every message delivered once, in order, never before its due time.

The producer and the consumers are threads here (the faults hit the brokers; the restart is a
consumer closed and a new one started); brokers and the coordinator are processes. Checked
twice: over what the threads saw, and over the SDK's audit files with the reference checker
(the rules of the Spark verifier: ``delivered_early``, ``out_of_order``, ``lost``, ...).
"""

from __future__ import annotations

import statistics
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import attrs
import pytest

from ordq.coordinator.client import CoordinatorClient
from ordq.sdk import BatchingConfig, CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk.delay import due_us
from ordq.spark_order_check import reference
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.helpers.load import make_payload
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 2_000
RATE = 1_000.0  # msgs/s: 2 s of load
DELAY_S = 1.0  # the subscription's delay
HOLD_EVERY, HOLD_S = 250, 0.8  # deliver_at: every 250th message is held 0.8 s after its send
LAST_HOLD_S = 8.0


@attrs.frozen
class Row:
    seq: int
    instance: int
    deliver_us: int
    due_us: int
    crc: int


class Sender(threading.Thread):
    """Sends seq first..first+n-1 at RATE; with ``hold``, every HOLD_EVERY-th message gets a
    ``deliver_at`` HOLD_S after its send. Records each ack's seq and CRC."""

    def __init__(self, cluster: Cluster, n: int, *, hold: bool, first: int = 0, last_hold_s: float = 0.0) -> None:
        super().__init__(name="load-delay-producer", daemon=True)
        self.config = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=1.0,
                                     lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, audit_dir=cluster.base / "audit",
                                     batching=BatchingConfig(linger_ms=2.0))
        # last_hold_s: the last message is held this long after its send (deliver_at), so the
        # consumer surely waits on time at the end, however late it runs on a loaded box
        self.n, self.hold, self.first, self.last_hold_s = n, hold, first, last_hold_s
        self.acked: dict[int, int] = {}
        self.failovers = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.config) as producer:
                futures = []
                t0 = time.monotonic()
                for i in range(self.n):
                    seq = self.first + i
                    pause = t0 + i / RATE - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    payload = make_payload(seq, "P", 100)
                    held = self.hold and seq % HOLD_EVERY == HOLD_EVERY // 2
                    hold_s = self.last_hold_s if (self.last_hold_s and i == self.n - 1) else HOLD_S if held else None
                    fut = producer.send(payload, deliver_at=None if hold_s is None else time.time() + hold_s)
                    futures.append((fut, zlib.crc32(payload)))
                producer.flush(timeout_s=120)
                for fut, crc in futures:
                    self.acked[fut.result(timeout=60).seq] = crc
                self.failovers = producer.statistics().failovers
        except BaseException as exc:  # noqa: BLE001 - raised in the test
            self.error = exc


class Receiver(threading.Thread):
    """Consumes subscription "s" until seq ``until``; after ``restart_at`` deliveries it
    commits, closes and starts a new consumer (a restart). Records every delivery with the
    wall time it was handed out and its due time (the subscription's delay or its deliver_at)."""

    def __init__(self, cluster: Cluster, *, until: int, delay_s: float, restart_at: int | None) -> None:
        super().__init__(name="load-delay-consumer", daemon=True)
        self.config = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                                     lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, audit_dir=cluster.base / "audit",
                                     commit=CommitConfig(every_messages=500, every_ms=200.0))
        self.until, self.delay_us, self.restart_at = until, int(delay_s * 1e6), restart_at
        self.rows: list[Row] = []
        self.saw_waiting = 0  # polls while the consumer said it waits on time
        self.time_waits = 0
        self.delay_s = -1.0  # the subscription delay the consumer applies, as it last said
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            instance = 0
            while not self.rows or self.rows[-1].seq < self.until:
                with Consumer(self.config) as consumer:
                    while not self.rows or self.rows[-1].seq < self.until:
                        batch = consumer.poll(0.2)
                        now_us = time.time_ns() // 1000
                        if consumer.waiting_on_time is not None:
                            self.saw_waiting += 1
                        self.delay_s = consumer.delay_s
                        for m in batch:
                            self.rows.append(Row(m.seq, instance, now_us, due_us(m.timestamp_us, m.headers,
                                                                                  self.delay_us),
                                                 zlib.crc32(m.payload)))
                        if self.restart_at is not None and len(self.rows) >= self.restart_at and instance == 0:
                            break
                    consumer.commit()  # all it handed out is finished: the next one starts after it
                    self.time_waits += consumer.statistics().time_waits
                instance += 1
        except BaseException as exc:  # noqa: BLE001 - raised in the test
            self.error = exc


def _join(*threads: Sender | Receiver, timeout_s: float = 120.0) -> None:
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), f"{t.name} still running after {timeout_s}s"
        assert t.error is None, f"{t.name} failed: {t.error!r}"


def _check(rows: list[Row], acked: dict[int, int], first: int, n: int) -> list[int]:
    """Every seq first..first+n-1 once, in order, as acked, never before its due time;
    returns the delivery-time errors (µs after due) of the messages that had a due time."""
    seqs = [r.seq for r in rows]
    assert seqs == list(range(first, first + n)), f"not each seq once in order: {seqs[:5]}..{seqs[-5:]}"
    assert {r.seq: r.crc for r in rows} == {s: acked[s] for s in seqs}
    early = [r for r in rows if r.deliver_us < r.due_us]
    assert not early, f"{len(early)} delivered before their due time, first {early[0]}"
    return [r.deliver_us - r.due_us for r in rows if r.due_us]


def _audit_counts(cluster: Cluster) -> dict[str, int]:
    audit = cluster.base / "audit"
    return reference.check(audit / "acks", audit / "deliveries").counts


def _sub_list(cluster: Cluster) -> dict[str, Any]:
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials) as coord:
        rows = coord.admin("sub list", queue="q")["subscriptions"]
    return {r["subscription"]: r for r in rows}


def _kill_head_master_at(cluster: Cluster, sender: Sender, share: int) -> None:
    wait_until(lambda: len(sender.acked) >= share or sender.error is not None or _acked_by(cluster) >= share,
               timeout_s=60, interval_s=0.01, what=f"{share} acks")
    cluster.head().master.kill()


def _acked_by(cluster: Cluster) -> int:
    """Acks the producer wrote to its audit files so far (its futures are read at the end)."""
    total = 0
    for f in Path(cluster.base / "audit" / "acks").glob("*.tsv*"):
        total += max(f.read_text().count("\n") - 1, 0)
    return total


def test_subscription_delay_through_head_master_kill_and_restart(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    made = cluster.ordq("sub", "create", "q", "s", "--delay", f"{DELAY_S:g}s")
    assert made.returncode == 0, made.stderr.decode()
    assert b"delivered 1s after its timestamp" in made.stdout
    assert _sub_list(cluster)["s"]["delay_ms"] == 1000

    sender = Sender(cluster, N, hold=False, last_hold_s=LAST_HOLD_S)
    receiver = Receiver(cluster, until=N - 1, delay_s=DELAY_S, restart_at=N // 2)
    sender.start()
    receiver.start()
    _kill_head_master_at(cluster, sender, N // 4)
    # sub list says the subscription waits on time, not that it is stuck (at the latest while
    # the last message is held)
    wait_until(lambda: _sub_list(cluster)["s"]["state"] == "waiting on time", timeout_s=60, interval_s=0.2,
               what="sub list: waiting on time")
    _join(sender, receiver)
    assert sender.failovers >= 1
    assert receiver.saw_waiting > 0 and receiver.time_waits > 0
    assert max(r.instance for r in receiver.rows) == 1  # the restart happened
    errors = _check(receiver.rows, sender.acked, 0, N)
    assert len(errors) == N
    assert _sub_list(cluster)["s"]["state"] == "caught up"
    counts = _audit_counts(cluster)
    for cls in ("delivered_early", "out_of_order", "lost", "duplicate", "gap", "crc_mismatch_delivery"):
        assert counts.get(cls, 0) == 0, (cls, counts)
    print(f"subscription delay {DELAY_S}s: delivery after due p50 {statistics.median(errors) / 1000:.1f} ms, "
          f"max {max(errors) / 1000:.1f} ms")


@pytest.mark.slow
def test_delay_through_a_cursor_reset(cluster: Cluster) -> None:
    """A cursor reset back into what was delivered: those messages are due already (delivered
    at once, in order), the new ones after them wait for their time again."""
    cluster.add_groups("g1")
    cluster.create_queue()
    assert cluster.ordq("sub", "create", "q", "s", "--delay", f"{DELAY_S:g}s").returncode == 0
    sender = Sender(cluster, 500, hold=True)
    receiver = Receiver(cluster, until=499, delay_s=DELAY_S, restart_at=None)
    sender.start()
    receiver.start()
    _join(sender, receiver)
    _check(receiver.rows, sender.acked, 0, 500)
    back = 200
    reset = cluster.ordq("sub", "reset", "q", "s", "--to", "seq", str(back))
    assert reset.returncode == 0, reset.stderr.decode()
    more = Sender(cluster, 300, hold=True, first=500)
    again = Receiver(cluster, until=799, delay_s=DELAY_S, restart_at=None)
    more.start()
    again.start()
    _join(more, again)
    _check(again.rows, {**sender.acked, **more.acked}, back, 600)
    counts = _audit_counts(cluster)
    assert counts.get("delivered_early", 0) == 0 and counts.get("out_of_order", 0) == 0, counts


def test_deliver_at_through_head_master_kill_and_restart(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    made = cluster.ordq("sub", "create", "q", "s")
    assert made.returncode == 0, made.stderr.decode()

    sender = Sender(cluster, N, hold=True, last_hold_s=3.0)
    receiver = Receiver(cluster, until=N - 1, delay_s=0, restart_at=N // 2)
    sender.start()
    receiver.start()
    _kill_head_master_at(cluster, sender, N // 4)
    _join(sender, receiver)
    assert sender.failovers >= 1
    assert max(r.instance for r in receiver.rows) == 1
    errors = _check(receiver.rows, sender.acked, 0, N)
    assert len(errors) == N // HOLD_EVERY + 1  # the held ones and the last
    assert receiver.saw_waiting > 0
    # later messages waited behind a held one: none handed out before it
    for r in receiver.rows:
        if r.due_us:
            assert all(x.deliver_us >= r.deliver_us for x in receiver.rows if x.seq > r.seq)

    counts = _audit_counts(cluster)
    for cls in ("delivered_early", "out_of_order", "lost", "duplicate", "gap", "crc_mismatch_delivery"):
        assert counts.get(cls, 0) == 0, (cls, counts)


@pytest.mark.slow
def test_sub_alter_reaches_a_running_consumer(cluster: Cluster) -> None:
    """``ordq sub alter --delay`` on a subscription a consumer holds: it applies the new delay
    within SETTINGS_REFRESH_S and never hands a message out before the delay it knows."""
    cluster.add_groups("g1")
    cluster.create_queue()
    assert cluster.ordq("sub", "create", "q", "s").returncode == 0
    receiver = Receiver(cluster, until=399, delay_s=0, restart_at=None)
    receiver.start()
    first = Sender(cluster, 200, hold=False)
    first.start()
    _join(first)
    wait_until(lambda: len(receiver.rows) >= 200, timeout_s=30, what="first 200 delivered at once")
    altered = cluster.ordq("sub", "alter", "q", "s", "--delay", "1500ms")
    assert altered.returncode == 0, altered.stderr.decode()
    assert b"delay none -> 1.5s" in altered.stdout
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials) as coord:
        wait_until(lambda: coord.admin("sub list", queue="q")["subscriptions"][0]["delay_ms"] == 1500,
                   timeout_s=10, what="delay stored")
    wait_until(lambda: receiver.delay_s == 1.5, timeout_s=15, interval_s=0.1, what="the consumer knows the new delay")
    second = Sender(cluster, 200, hold=False, first=200)
    second.start()
    _join(second, receiver)
    late = [r for r in receiver.rows if r.seq >= 200]
    # Due under the new delay: timestamp + 1.5 s
    errors = [r.deliver_us - (r.due_us + 1_500_000) for r in late]
    assert min(errors) >= 0, f"handed out {-min(errors)} µs before timestamp + 1.5 s"
