"""Which lone requests a broker commits on its event loop (broker_group/loop_sync.py, issue 39):
the rule alone (pure), and the write path following it: a slow group commit sends the next lone
request to the slave's replica thread, so a congested disk does not hold the loop (the fast
path itself, on real processes: test_broker.py's lone-small-request test)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.broker_group import log as seglog
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.epochs import EpochGate
from ordq.broker_group.loop_sync import LoopSyncRule
from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.shared import Segment, Shared
from ordq.broker_group.write_path import ProduceStreamState, WritePath
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import Message, encode_batch, stamp_offset


def test_a_lone_request_goes_on_the_loop_while_syncs_are_quick_and_it_is_small() -> None:
    rule = LoopSyncRule(max_bytes=1000, slow_s=0.005, backoff_s=1.0)
    assert rule.on_loop(999, 0.0) and not rule.on_loop(1000, 0.0)
    assert not rule.synced(0.004, 10.0)  # quick: nothing changes
    assert rule.on_loop(10, 10.0)
    assert rule.synced(0.005, 20.0)  # slow: the thread for a second
    assert not rule.on_loop(10, 20.0) and not rule.on_loop(10, 20.999)
    rule.synced(0.0001, 20.5)  # a quick one meanwhile does not end it
    assert not rule.on_loop(10, 20.9)
    rule.synced(0.2, 20.9)  # a slow one meanwhile extends it
    assert not rule.on_loop(10, 21.5) and rule.on_loop(10, 21.9)


@given(st.lists(st.tuples(st.floats(0, 0.02), st.floats(0, 5)), max_size=30), st.floats(0, 7),
       st.integers(0, 2000))
def test_the_loop_is_refused_exactly_within_a_backoff_after_a_slow_sync(
        syncs: list[tuple[float, float]], now: float, nbytes: int) -> None:
    rule = LoopSyncRule(max_bytes=1000, slow_s=0.005, backoff_s=1.0)
    for took, at in sorted(syncs, key=lambda x: x[1]):
        rule.synced(took, at)
    held = any(took >= 0.005 and now < at + 1.0 for took, at in syncs)  # a slow one less than a second before
    assert rule.on_loop(nbytes, now) == (nbytes < 1000 and not held)


class _Histogram:
    def observe(self, _seconds: float) -> None:
        pass


@pytest.fixture
def slave(tmp_path: Path) -> Iterator[tuple[WritePath, Segment]]:
    """A slave's write path in this process, with one segment's log on disk (no loop started,
    no ZooKeeper: ``commit_replica`` needs neither)."""
    shared = Shared(BrokerConfig(gid="g1", role=Role.SLAVE, data_dir=tmp_path, zk_hosts="zk:1"))
    write = WritePath(shared, None, _Histogram())  # type: ignore[arg-type] # no segment is created here
    log = seglog.SegmentLog.open(tmp_path, "q", 0, create=True)
    s = Segment(replica=SegmentReplica("q", 0, Role.SLAVE), directory=tmp_path, log=log)
    try:
        yield write, s
    finally:
        log.close()
        shared.loop.stop()


def _place(write: WritePath, s: Segment, first: int) -> list[bytes]:
    raw = stamp_offset(encode_batch([Message(payload=b"x" * 100, timestamp_us=first)], epoch=1, first_seq=first),
                       first)
    with write.shared.cv:
        s.replica.accept_replica(1, first, first, 1)
        s.syncing += 1
    return [raw]


def test_after_a_slow_sync_the_next_lone_request_goes_to_the_thread(
        slave: tuple[WritePath, Segment], monkeypatch: pytest.MonkeyPatch) -> None:
    write, s = slave
    # The disk's speed is what this is about: fdatasync takes no time, or 30 ms (a congested
    # disk: ext4's journal commit waiting for other files' data), whatever this machine's does.
    def quick(_fd: Any) -> None:
        pass

    def slow(_fd: Any) -> None:
        time.sleep(0.03)

    monkeypatch.setattr(os, "fdatasync", quick)
    assert write.commit_replica(s, _place(write, s, 0), alone=True) is None  # quick disk: on the loop
    monkeypatch.setattr(os, "fdatasync", slow)
    assert write.commit_replica(s, _place(write, s, 1), alone=True) is None  # not known slow yet: on the loop
    monkeypatch.setattr(os, "fdatasync", quick)
    on_thread = write.commit_replica(s, _place(write, s, 2), alone=True)
    assert on_thread is not None  # the replica thread's commit
    on_thread.result(10)
    stats = write.shared.stats
    assert (stats.loop_commits, stats.slow_syncs, stats.syncs) == (2, 1, 3)
    assert s.replica.local_synced == 3 and s.syncing == 0


class _LeanLink:
    """What the master's write path asks of its replication link (replication.py), recording
    when the batches go to the slave; the slave owes ``owed`` bytes of an earlier request."""

    connected = True
    forwards_at_once = True

    def __init__(self, events: list[str], owed: int) -> None:
        self.events, self.owed = events, owed

    def lag(self, _now: float) -> tuple[int, float]:
        return self.owed, 0.0

    def forward(self, _s: Segment, _stamped: bytes) -> None:
        pass

    def flush(self) -> None:
        self.events.append("to the slave")


@attrs.define
class _Master:
    """A master's write path on one segment of ``q`` (no ZooKeeper, no slave: a recording
    link) and what happened on it."""

    shared: Shared
    write: WritePath
    segment: Segment
    events: list[str]

    def produce(self) -> None:
        """One request of one small batch, run to its end (it waits for nothing here)."""
        req = pb.ProduceRequest(queue="q", seg=0, epoch=1, batches=[
            encode_batch([Message(payload=b"x" * 100, timestamp_us=0)], epoch=1, first_seq=0)])
        coro = self.write.accept_produce(ProduceStreamState(), req)
        with pytest.raises(StopIteration):
            coro.send(None)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[_Master]:
    shared = Shared(BrokerConfig(gid="g1", role=Role.MASTER, data_dir=tmp_path, zk_hosts="zk:1"))
    write = WritePath(shared, None, _Histogram())  # type: ignore[arg-type] # no segment is created here
    events: list[str] = []

    class _Recorded(threading.Condition):
        def notify(self, n: int = 1) -> None:
            events.append("sync thread woken")
            super().notify(n)

    write._dirty_cv = _Recorded(shared.lock)
    write.epochs = EpochGate(lambda _queue: 1)
    write.epochs.check("q", 1)  # the issued epoch, known
    write._message_limits["q"] = 1 << 20
    log = seglog.SegmentLog.open(tmp_path, "q", 0, create=True)
    s = Segment(replica=SegmentReplica("q", 0, Role.MASTER), directory=tmp_path, log=log)
    shared.segments[("q", 0)] = s
    write.replication = _LeanLink(events, owed=1000)  # an earlier request unanswered by the slave
    try:
        yield _Master(shared, write, s, events)
    finally:
        log.close()
        shared.loop.stop()


def test_the_masters_sync_thread_is_woken_after_the_batches_went_to_the_slave(master: _Master) -> None:
    """A request that comes while an earlier one is not synced on the master yet is committed by
    the sync thread, woken only once the batches were written to the slave (issue 39, fast39p):
    woken first, it took the GIL from the loop in the middle of that write."""
    master.write._inflight_bytes = 1000  # the earlier request is not synced here yet: not alone
    master.produce()
    assert master.events == ["to the slave", "sync thread woken"]
    assert master.write._dirty == [master.segment] and master.segment.pending  # not committed on the loop
    assert master.shared.stats.loop_commits == 0


def test_a_request_behind_one_only_the_slave_has_yet_to_answer_is_committed_on_the_loop(master: _Master) -> None:
    """Synced on the master, unanswered by the slave: the earlier request holds no ack of this
    master's, so the next one is committed on the loop (stop 93), after it went to the slave;
    the sync thread is not woken."""
    master.produce()
    assert master.events == ["to the slave"]
    assert master.shared.stats.loop_commits == 1
    assert not master.write._dirty and not master.segment.pending
    log = master.segment.log
    assert log is not None and log.synced_end == 1  # appended and synced by the loop itself
