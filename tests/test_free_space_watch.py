"""What tells a broker to look at its queue folders again (broker_group/segments.py): a state
watch names its queue; a watch fired with no path (the connection dropped or the session was
lost, and every watch with it: kazoo sets none again) makes the next round look at every folder,
which otherwise happens only every ``FULL_SCAN_S`` (issue 43: once a minute it read every
folder's state, ~33,000 reads a broker at 10^5 queues)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from ordq.broker_group import log as seglog
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.segments import FULL_SCAN_S, INCARNATION_FILE, SegmentStore
from ordq.broker_group.shared import Segment, Shared
from ordq.coordinator import state as sm
from ordq.coordinator.store import ZkStore


def test_a_watch_fired_without_a_path_makes_the_next_round_scan_every_folder() -> None:
    shared: Any = None  # _on_state touches nothing of the broker's
    store = SegmentStore(shared)
    store._next_full_scan = 1e12  # scanned just now
    store._on_state(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/ordq/queues/q-7/state"))
    assert store._changed == {"q-7"} and store._next_full_scan == 1e12
    store._on_state(WatchedEvent(EventType.NONE, KazooState.CONNECTED, None))  # the connection dropped
    assert store._next_full_scan == 0.0
    assert FULL_SCAN_S >= 300  # otherwise the safety net alone costs every folder's read each few minutes


class CountingMap(dict):  # type: ignore[type-arg]
    """A broker's segment map that counts the passes over it."""

    passes = 0

    def __iter__(self) -> Any:
        self.passes += 1
        return super().__iter__()

    def items(self) -> Any:
        self.passes += 1
        return super().items()


@contextlib.contextmanager
def _in_process(zk_server: Any, zk_root: str, tmp_path: Path, role: Role) -> Iterator[tuple[ZkStore, Shared]]:
    """A broker's shared state in this process (no server, no threads) over a real ZooKeeper,
    with group g1 added."""
    zk = ZkStore.connect(zk_server.connection_string, zk_root)
    config = BrokerConfig(gid="g1", role=role, data_dir=tmp_path, zk_hosts=zk_server.connection_string,
                          root=zk_root)
    shared = Shared(config)
    try:
        zk.add_group("g1")
        yield zk, shared
    finally:
        shared.loop.loop.close()
        zk.close()


def test_a_free_space_pass_goes_over_the_segment_map_once_not_once_a_queue(
        zk_server: Any, zk_root: str, tmp_path: Path) -> None:
    """Issue 43: at start, ``free_space`` looks at every queue folder, and it went over the whole
    segment map for each one (``drop_segments``): at 10^5 queues ~33,000 x ~40,000 steps, about a
    minute of a restart before the broker served. Now one pass a round gives each queue the
    segments it holds. Failing first: 300 passes for 300 queues. Popped segments still go."""
    with _in_process(zk_server, zk_root, tmp_path, Role.MASTER) as (zk, shared):
        names = [f"q{i:03d}" for i in range(300)]
        created, _ = zk.create_queues(names, ["g1"])
        live = sm.Facts(live_groups=frozenset({"g1"}))

        def popped(st: sm.QueueState, _facts: Any) -> sm.QueueState:  # segment 0 sealed empty and popped
            st = sm.admit_all(st, live)
            st = sm.seal(sm.roll(st, "g1", 0, live), 0, 0, None, None, at_ms=1)
            return sm.pop(st, live)

        zk.apply(names[0], popped)
        segments = CountingMap()
        for st in created:
            folder = seglog.segment_dir(tmp_path, st.queue, 0)
            folder.mkdir(parents=True)
            (folder.parent / INCARNATION_FILE).write_text(json.dumps(st.incarnation))
            segments[(st.queue, 0)] = Segment(replica=SegmentReplica(st.queue, 0, Role.MASTER), directory=folder,
                                              log=None)
        shared.segments = segments
        shared.store = zk
        store = SegmentStore(shared)
        store.free_space()
        assert segments.passes <= 2, segments.passes
        assert (names[0], 0) not in segments and len(segments) == len(names) - 1
        assert store.set_aside_count() == 1 and not seglog.segment_dir(tmp_path, names[0], 0).exists()


def test_a_reconcile_round_reads_the_states_pipelined_and_a_record_costs_no_write(
        zk_server: Any, zk_root: str, tmp_path: Path) -> None:
    """Issue 43: a start at 10^5 queues held ~33,000 segments to reconcile, and the repair
    thread read their queues' states one after another (~33,000 round trips). Now in one
    pipelined pass. Segments sealed empty as records (sealed_book.py) whose sealed end in
    ZooKeeper is 0 are reconciled without a file written. Failing first: 200 ``load_state``."""
    from ordq.broker_group.repair import Repairer
    from ordq.broker_group.sealed_book import Record

    with _in_process(zk_server, zk_root, tmp_path, Role.SLAVE) as (zk, shared):
        names = [f"r{i:03d}" for i in range(200)]
        created, _ = zk.create_queues(names, ["g1"])
        live = sm.Facts(live_groups=frozenset({"g1"}))

        def sealed_empty(st: sm.QueueState, _facts: Any) -> sm.QueueState:
            st = sm.admit_all(st, live)
            return sm.seal(sm.roll(st, "g1", 0, live), 0, 0, None, None, at_ms=1)

        writes = []
        for st in created:
            got, version, _ = zk.load_states([st.queue])[st.queue]  # type: ignore[misc]
            writes.append((st.queue, version, sealed_empty(got, None)))
        done, left = zk.apply_batch(writes, {})
        assert not left
        shared.store = zk
        segments = SegmentStore(shared)
        segments.book.append([Record(st.queue, 0, st.incarnation) for st in created])
        segments.recover()
        assert len(shared.segments) == len(names) and all(not s.reconciled for s in shared.segments.values())
        reads = []
        real = zk.load_state
        zk.load_state = lambda q, **kw: (reads.append(q), real(q, **kw))[1]  # type: ignore[method-assign]
        Repairer(shared, segments)._reconcile_round(zk)
        assert len(reads) <= 1, len(reads)
        assert all(s.reconciled and s.recorded is not None for s in shared.segments.values())
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sealed-empty.log"]  # no folder made
        segments.book.close()


def test_a_deleted_queue_s_record_never_drops_its_successor_s_segments(
        zk_server: Any, zk_root: str, tmp_path: Path) -> None:
    """A SealMany under way while its queue was deleted can append the old queue's record after
    the queue of the same name was created again (the book's reader tells them apart by
    incarnation, never by order). Such a record must drop only itself: not the new queue's
    segments (its folder's, written), when the new queue stores a segment or frees space.
    Failing first: the new queue's segment 0 and its folder went with the old record."""
    from ordq.broker_group.sealed_book import Record

    with _in_process(zk_server, zk_root, tmp_path, Role.MASTER) as (zk, shared):
        (st,), _ = zk.create_queues(["q"], ["g1"])
        shared.store = zk
        segments = SegmentStore(shared)
        segments.recover()
        first = segments.create("q", 0, 0, state=st)
        segments.book.append([Record("q", 5, "a-deleted-queue")])  # the late record of the old queue
        shared.segments[("q", 5)] = segments._recorded_segment(Record("q", 5, "a-deleted-queue"))
        segments.create("q", 1, 0, state=st)  # the new queue stores its next segment
        assert shared.segments.get(("q", 0)) is first and first.directory.exists()
        assert ("q", 5) not in shared.segments and not segments.book.has_other("q", st.incarnation)
        segments.book.append([Record("q", 6, "a-deleted-queue")])
        shared.segments[("q", 6)] = segments._recorded_segment(Record("q", 6, "a-deleted-queue"))
        segments.free_space()
        assert ("q", 6) not in shared.segments and ("q", 0) in shared.segments and ("q", 1) in shared.segments
        assert first.directory.exists()
        for s in list(shared.segments.values()):
            if s.log is not None:
                s.log.close()
        segments.book.close()


def test_a_share_takes_at_most_its_limit_in_name_order_and_leaves_the_rest() -> None:
    """``take_share``, free_space's bound per round (pure)."""
    from ordq.broker_group.segments import take_share

    pending = {f"q{i:02d}" for i in range(25)}
    shares = []
    while pending:
        shares.append(take_share(pending, 10))
    assert [len(s) for s in shares] == [10, 10, 5]
    assert [q for s in shares for q in s] == sorted(f"q{i:02d}" for i in range(25))
    everything = {"b", "a"}
    assert take_share(everything, None) == ["a", "b"] and not everything


def test_a_round_looks_at_a_bounded_share_of_the_changed_queues(
        zk_server: Any, zk_root: str, tmp_path: Path) -> None:
    """Issue 43: after its master's return at 10^5 queues, a slave re-read the states of its
    ~33,334 queues in one round (the coordinator's admits fired their watches; a blip asks for
    a full scan), about half a core for a minute, and a ZooKeeper stall meeting that lost it
    its session. A round now reads at most ``limit`` states; the rest wait for the next rounds,
    and every queue is looked at in the end (the popped segment goes). Failing first: one
    round read all 300 (``free_space`` took no limit)."""
    with _in_process(zk_server, zk_root, tmp_path, Role.SLAVE) as (zk, shared):
        names = [f"p{i:03d}" for i in range(300)]
        created, _ = zk.create_queues(names, ["g1"])
        live = sm.Facts(live_groups=frozenset({"g1"}))
        for st in created:
            folder = seglog.segment_dir(tmp_path, st.queue, 0)
            folder.mkdir(parents=True)
            (folder.parent / INCARNATION_FILE).write_text(json.dumps(st.incarnation))
            shared.segments[(st.queue, 0)] = Segment(replica=SegmentReplica(st.queue, 0, Role.SLAVE),
                                                     directory=folder, log=None)
        shared.store = zk
        store = SegmentStore(shared)
        store.free_space()  # the start: every folder, and a watch on each state
        assert len(shared.segments) == len(names)

        def popped(st: sm.QueueState, _facts: Any) -> sm.QueueState:
            st = sm.admit_all(st, live)
            st = sm.seal(sm.roll(st, "g1", 0, live), 0, 0, None, None, at_ms=1)
            return sm.pop(st, live)

        zk.apply(names[-1], popped)  # the last in name order: looked at in the last share
        store._on_state(WatchedEvent(EventType.NONE, KazooState.CONNECTED, None))  # a blip: a full scan
        reads: list[int] = []
        real = zk.load_states
        zk.load_states = lambda qs, **kw: (reads.append(len(qs)), real(qs, **kw))[1]  # type: ignore[method-assign]
        rounds = 0
        while (names[-1], 0) in shared.segments:
            store.free_space(limit=120)
            rounds += 1
            assert rounds <= 3
        assert max(reads) <= 120 and sum(reads) == len(names), reads
        assert rounds == 3 and len(shared.segments) == len(names) - 1


def test_the_state_watches_live_on_a_session_of_their_own(zk_server: Any, zk_root: str, tmp_path: Path) -> None:
    """Issue 43 (scale43k): when a connection drops, kazoo hands every watch of it an event, one
    by one, in the connection's thread before it reconnects: 307 ms for a slave's ~33,334 state
    watches at 10^5 queues, and a blip became a lost 1 s session of the session that holds the
    broker's liveness. The watches now live on ``watch_session``; the broker's session holds
    none. Failing first: every state watch was on the broker's session."""
    with _in_process(zk_server, zk_root, tmp_path, Role.SLAVE) as (zk, shared):
        names = [f"w{i:02d}" for i in range(20)]
        zk.create_queues(names, ["g1"])
        for name in names:
            folder = seglog.segment_dir(tmp_path, name, 0)
            folder.mkdir(parents=True)
            shared.segments[(name, 0)] = Segment(replica=SegmentReplica(name, 0, Role.SLAVE),
                                                 directory=folder, log=None)
        shared.store = zk
        with ZkStore.connect(zk_server.connection_string, zk_root) as watches:
            shared.watch_session = watches
            SegmentStore(shared).free_space()

            def state_watches(store: ZkStore) -> set[str]:  # kazoo's own book of data watches
                return {p for p, fns in store.client._data_watchers.items() if fns and p.endswith("/state")}

            assert state_watches(watches) == {zk.paths.state(n) for n in names}
            assert state_watches(zk) == set()
