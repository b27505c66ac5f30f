"""The coordinator daemon's cost follows changes, not the number of queues (issue 29): after
its first round an idle cluster costs it no ZooKeeper read, a change to one queue among 300 is
read and planned alone, and a group losing a process is acted on for the queues that use it.

In process, against a real ZooKeeper; liveness nodes are this test's own session's (no broker
needed: the daemon's rounds are called directly, with no prober)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from ordq.coordinator.daemon import CoordinatorDaemon
from ordq.coordinator.daemon_round import MOVES_IN_FLIGHT
from ordq.coordinator.store import ZkStore
from tests.helpers.collector import note_collector
from tests.helpers.groups import add_live_groups
from tests.util import wait_until

pytestmark = pytest.mark.zk
N = 300
DEADLINE_S = 60.0  # generous: the box may be busy; nothing here is timed


@pytest.fixture(scope="module")
def setup(zk_server, tmp_path_factory) -> Iterator[tuple[ZkStore, CoordinatorDaemon]]:
    import uuid

    root = f"/t-{uuid.uuid4().hex[:10]}"
    with ZkStore.connect(zk_server.connection_string, root) as store:
        add_live_groups(store, ("g1", "g2", "g3"))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: store.create_queue(f"q-{i:04d}", ["g1", "g2"]), range(N)))
        store.create_queue("solo", ["g3"])
        # away_grace_s=0: a group whose liveness node is deleted here is dead at once, as one whose
        # process refused the probe is (no broker here to probe: coordinator/away.py)
        # sweep_interval_s a day: the default sweep reads 301 queues per 300 s, a queue a second, so
        # on a loaded box (5 idle rounds in ~8 s) it read 8 queues (16 reads) in "idle" rounds;
        # what these tests count is the cost of changes (the sweep's share has its own test below)
        # rebalance_moves_per_s=0: no spread pass; on a loaded box (rounds seconds apart) it moved
        # the idle heads back to g1 in the round that popped the last of them, so "every segment
        # popped and g1 admitted" was never seen at once (the spread has tests of its own:
        # test_rebalance, test_heads_spread)
        daemon = CoordinatorDaemon(store, identifier="t", away_grace_s=0, sweep_interval_s=86_400.0,
                                   rebalance_moves_per_s=0)
        yield store, daemon
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()
        # The root is left (a fresh uuid in the session's throwaway ZooKeeper): deleting its
        # 2,100 nodes costs as many ZooKeeper writes as creating them did.


def _round_until(daemon: CoordinatorDaemon, done, what: str) -> None:  # type: ignore[no-untyped-def]
    def step() -> bool:
        daemon.round()
        return bool(done())

    wait_until(step, timeout_s=DEADLINE_S, interval_s=0.05, what=what)


def test_idle_rounds_read_nothing_and_one_change_reads_one_queue(setup) -> None:
    store, daemon = setup
    daemon.round()  # the first round of a term reads (and watches) everything once
    assert daemon.view is not None
    first = daemon.view.reads
    assert first >= 2 * (N + 1)  # state and settings of every queue
    assert daemon.stats.planned >= N + 1
    for _ in range(5):
        daemon.round()
    assert daemon.view.reads == first, "an idle round read ZooKeeper"
    planned = daemon.stats.planned
    assert planned == N + 1, "an idle round planned queues"

    store.update_queue_config("q-0123", retention_segments=7)
    _round_until(daemon, lambda: daemon.stats.planned > planned, "the changed queue planned")
    assert daemon.stats.planned == planned + 1
    assert daemon.view.reads - first <= 2  # its settings (and nothing of the 300 others)
    assert daemon.view.entries["q-0123"].config.retention_segments == 7


def test_a_long_round_says_where_its_time_went(setup, monkeypatch, caplog) -> None:
    """Issue 43: at 10^5 queues the leader was silent for 71 s after a group's return (scale43l,
    run 2), and nothing told a long re-read from a long plan. A round past ``LONG_ROUND_S`` logs
    its reads and its planning, each timed (here every round is long). Failing first: no line."""
    import logging
    import re

    from ordq.coordinator import daemon_round

    _store, daemon = setup
    daemon.round()
    assert daemon.view is not None
    monkeypatch.setattr(daemon_round, "LONG_ROUND_S", 0.0)
    caplog.set_level(logging.INFO, logger="ordq.coordinator")
    daemon.view.mark_all()
    daemon.round()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("a round of ")]
    assert len(lines) == 1, lines
    found = re.fullmatch(r"a round of \d+\.\d s: (\d+) reads in \d+\.\d s \(and what came between their "
                         r"slices\), (\d+) queues planned in \d+\.\d s; idle work held 0\.0 s for urgent requests "
                         r"meanwhile \(every thread\)", lines[0])
    assert found is not None, lines
    assert int(found[1]) >= 2 * (N + 1) and int(found[2]) >= N + 1  # every queue's state and settings, planned


def test_a_group_losing_a_process_is_acted_on_for_its_queues_only(setup) -> None:
    store, daemon = setup
    daemon.round()
    planned = daemon.stats.planned
    assert store.load_state("solo")[0].head == "g3"
    store.client.delete(store.paths.live("g3", "master"))
    # the daemon fails the head over (here: g3 was its only group, so no group takes writes)
    _round_until(daemon, lambda: store.load_state("solo")[0].head != "g3", "solo failed over")
    # only the queue that uses g3 was planned (again after its own write), not the 300 others
    assert daemon.stats.planned - planned <= 3
    assert daemon.stats.actions.get("fail_over", 0) >= 1


def test_a_group_whose_live_folder_comes_after_the_daemon_read_it_is_seen_live(setup) -> None:
    """``group add`` writes the group, then its ``live`` folder. A daemon that read the group
    in between got NoNode for ``live``, and ZooKeeper sets no child watch on a missing node:
    the group's processes registering later went unseen (until the 5-minute sweep), so its
    queues were failed over from a live group again and again (the lab's churn, stop 27)."""
    store, daemon = setup
    daemon.round()
    store.client.create(store.paths.group("late"), b"{}")
    try:
        daemon.round()  # reads the new group: no live folder yet
        assert daemon.view is not None and "late" not in daemon.view.live
        for role in ("master", "slave"):
            store.register_live("late", role, address=f"127.0.0.1:0/late/{role}", incarnation="t")
        _round_until(daemon, lambda: "late" in daemon.view.live,  # type: ignore[union-attr]
                     "the late group seen live")
    finally:  # the module's other tests count the registered groups
        store.client.delete(store.paths.group("late"), recursive=True)


def test_default_groups_spread_queue_heads_over_the_groups(setup) -> None:
    """A queue created on every registered group (no groups named) gets them rotated by the
    number of queues that exist, so consecutive queues head different groups (issue 29)."""
    store, _ = setup
    for i in range(6):
        store.create_queue(f"spread-{i}")
    orders = [store.load_state(f"spread-{i}")[0].groups for i in range(6)]
    # 301 queues existed: k = 301..306; (g3's master may be gone: the head is then the next group)
    assert sorted(o[0] for o in orders) == ["g1", "g1", "g2", "g2", "g3", "g3"]
    assert sorted(o[:2] for o in orders) == sorted((a, b) for a in ("g1", "g2", "g3") for b in ("g1", "g2", "g3")
                                                   if a != b)


def test_written_queues_come_first_in_rounds_and_seals() -> None:
    """After a head master dies, the failover and the seal of a queue a probe saw written come
    before those of the idle queues it also headed (pure order; then the seal pool's order)."""
    import threading
    import time

    from ordq.coordinator.daemon import SEAL_WORKERS, WRITTEN_S, is_written, urgent_first
    from ordq.coordinator.duties import Action, Kind

    now = 1000.0
    written = {"q-busy": now - 1, "q-old": now - WRITTEN_S - 1}
    assert is_written("q-busy", written, now) and not is_written("q-old", written, now)
    assert not is_written("q-never", written, now)
    assert urgent_first(["a", "q-busy", "q-old", "z"], written, now) == ["q-busy", "a", "q-old", "z"]
    assert urgent_first(["b", "a"], {}, now) == ["b", "a"]  # nothing written: the order given

    sealed: list[str] = []
    # one gate per blocker: the first is opened alone, so one worker runs the queued seals one at
    # a time in the order it pops them (two free workers may finish them in either order: CI saw
    # q-busy popped first, then its worker descheduled while the other ran the three idle ones)
    gates = {f"block-{i}": threading.Event() for i in range(SEAL_WORKERS)}

    def sealer(queue: str, seg: int, **_known: object) -> None:
        if queue in gates:
            gates[queue].wait(DEADLINE_S)  # hold every seal worker while the rest queue up
        sealed.append(queue)

    daemon = CoordinatorDaemon(None, sealer=sealer, identifier="order")  # type: ignore[arg-type]
    daemon._written = {"q-busy": time.monotonic()}
    try:
        for blocker in gates:
            daemon._seal_later(blocker, Action(Kind.SEAL, gid="g1", seg=1))
        wait_until(lambda: not daemon._seals, timeout_s=DEADLINE_S, what="the workers took the blockers")
        for q in ("q-idle-1", "q-idle-2", "q-busy", "q-idle-3"):
            daemon._seal_later(q, Action(Kind.SEAL, gid="g1", seg=1))
        gates["block-0"].set()
        wait_until(lambda: len(sealed) == 1 + 4, timeout_s=DEADLINE_S, what="one worker ran the queued seals")
        assert sealed == ["block-0", "q-busy", "q-idle-1", "q-idle-2", "q-idle-3"]
    finally:
        for gate in gates.values():
            gate.set()
        daemon.stop()


def test_two_sealing_segments_of_one_queue_on_one_group_are_both_sealed_in_batches() -> None:
    """A queue can have two segments sealing on one group (a roll, then its failover). The
    batches' waiting seals were keyed by queue, so the later replaced the earlier, which was
    never asked and stayed in the pool's "sealing now" set, so no later round could seal it
    (failing first). Now both are asked, in two batches (one write of a queue's state a batch)."""
    import threading
    import types

    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon import SEAL_WORKERS
    from ordq.coordinator.duties import Action, Kind

    asked: list[list[tuple[str, int]]] = []
    gates = {f"block-{i}": threading.Event() for i in range(SEAL_WORKERS)}

    def sealer(queue: str, seg: int, **_known: object) -> None:
        gates[queue].wait(DEADLINE_S)  # hold every seal worker while the seals queue up

    def batch_sealer(gid, items, members):  # type: ignore[no-untyped-def]
        asked.append([(q, seg) for q, seg, _st, _v in items])
        return []

    daemon = CoordinatorDaemon(None, sealer=sealer, batch_sealer=batch_sealer,  # type: ignore[arg-type]
                               identifier="two-sealing")
    daemon.view = types.SimpleNamespace(members={"g1": {}}, schedule=lambda *a: None)  # type: ignore[assignment]
    st = sm.create("q", ["g1"])
    try:
        for blocker in gates:
            daemon._seal_later(blocker, Action(Kind.SEAL, gid="g1", seg=1))
        wait_until(lambda: not daemon._seals, timeout_s=DEADLINE_S, what="the workers took the blockers")
        daemon._seal_later("q", Action(Kind.SEAL, gid="g1", seg=3), known=(st, 7))
        daemon._seal_later("q", Action(Kind.SEAL, gid="g1", seg=4), known=(st, 8))
        daemon._seal_later("r", Action(Kind.SEAL, gid="g1", seg=2), known=(st, 1))
        for gate in gates.values():
            gate.set()
        wait_until(lambda: sum(len(a) for a in asked) == 3, timeout_s=DEADLINE_S, what="every seal asked")
        assert sorted(k for a in asked for k in a) == [("q", 3), ("q", 4), ("r", 2)]
        assert all(len({q for q, _seg in a}) == len(a) for a in asked), asked  # a queue once a batch
        wait_until(lambda: not daemon._sealing_now, timeout_s=DEADLINE_S, what="none left sealing for good")
    finally:
        for gate in gates.values():
            gate.set()
        daemon.stop()


def test_a_deferred_seal_batch_is_tried_again_by_the_pool_waiting_longer_each_time(monkeypatch) -> None:
    """A batch no replica answered is kept and asked again by the seal pool itself (scale43n: at
    10^5 queues its queues' timers waited for a 2 min round), after RETRY_S, the wait doubled at
    each failure of the group in a row up to SEAL_RETRY_MAX_S, and again RETRY_S once the group
    answered. Once this process no longer leads, a deferred batch is let go (the next term
    plans every queue). Failing first: on 430dd84 the batch was asked once (its queues went to
    their timers)."""
    import time
    import types

    from ordq.common.errors import BrokerUnavailable
    from ordq.coordinator import daemon_seals
    from ordq.coordinator import state as sm
    from ordq.coordinator.duties import Action, Kind

    monkeypatch.setattr(daemon_seals, "RETRY_S", 0.05)
    monkeypatch.setattr(daemon_seals, "SEAL_RETRY_MAX_S", 0.2)
    calls: list[tuple[float, float | None, list[str]]] = []  # (when, the group's wait then, queues)
    failures = {"left": 4}

    def batch_sealer(gid, items, members):  # type: ignore[no-untyped-def]
        calls.append((time.monotonic(), getattr(daemon, "_seal_retry_s", {}).get(gid), sorted(q for q, *_ in items)))
        if failures["left"] > 0:
            failures["left"] -= 1
            raise BrokerUnavailable(f"group {gid}", "no replica answered SealMany (test)")
        return []

    daemon = CoordinatorDaemon(None, sealer=lambda *a, **k: None, batch_sealer=batch_sealer,  # type: ignore[arg-type]
                               identifier="deferred")
    daemon.view = types.SimpleNamespace(members={"g1": {}}, schedule=lambda *a: None)  # type: ignore[assignment]
    st = sm.create("q", ["g1"])
    try:
        daemon._seal_later("a", Action(Kind.SEAL, gid="g1", seg=0), known=(st, 1))
        wait_until(lambda: len(calls) == 5 and not daemon._sealing_now, timeout_s=DEADLINE_S,
                   what="the batch sealed after four deferrals")
        assert [wait for _t, wait, _q in calls] == [None, 0.05, 0.1, 0.2, 0.2]  # doubled, bounded
        for before, (at, wait, queues) in zip(calls, calls[1:], strict=False):
            assert queues == ["a"] and at - before[0] >= wait * 0.9, calls  # type: ignore[operator]
        assert daemon._seal_retry_s == {} and daemon._seal_deferred == {}

        # deferred, and the term ends before the retry: let go, nothing asked
        failures["left"] = 1
        asked = len(calls)
        daemon._seal_later("c", Action(Kind.SEAL, gid="g1", seg=0), known=(st, 1))
        wait_until(lambda: daemon._seal_deferred, timeout_s=DEADLINE_S, what="c deferred")
        daemon.view = None
        wait_until(lambda: not daemon._sealing_now and not daemon._seal_retry_timers, timeout_s=DEADLINE_S,
                   what="c let go")
        assert len(calls) == asked + 1 and not daemon._seal_batches.get("g1")
    finally:
        daemon.stop()


def test_idle_work_waits_while_a_producer_s_failover_is_served() -> None:
    """One process, one GIL (coordinator/pacing.py): while the service serves a FailOver, an
    idle queue's round and seal start only once it is answered; a written queue's at once, and
    a request that never ends holds idle work no longer than ``max_hold_s``. Pure (no cluster)."""
    import threading
    import time

    from ordq.coordinator.duties import Action, Kind
    from ordq.coordinator.pacing import URGENT_RPCS, RequestsFirst

    assert {"FailOver", "Claim"} <= URGENT_RPCS and "Commit" not in URGENT_RPCS
    first = RequestsFirst(max_hold_s=DEADLINE_S)
    sealed: list[str] = []
    daemon = CoordinatorDaemon(None, sealer=lambda queue, seg, **_k: sealed.append(queue),  # type: ignore[arg-type]
                               identifier="pacing", requests_first=first)
    daemon._written = {"q-busy": time.monotonic()}
    rounds: list[str] = []
    daemon._queue_round = rounds.append  # type: ignore[method-assign]
    try:
        with first.serving():
            idle = threading.Thread(target=daemon._guarded_round, args=("q-idle",))
            idle.start()
            daemon._seal_later("q-idle", Action(Kind.SEAL, gid="g1", seg=1))
            daemon._guarded_round("q-busy")
            daemon._seal_later("q-busy", Action(Kind.SEAL, gid="g1", seg=1))
            wait_until(lambda: sealed == ["q-busy"], timeout_s=DEADLINE_S, what="the written queue's seal")
            assert rounds == ["q-busy"]
            idle.join(0.2)  # it waits for the request: still there (nothing is timed but the bound below)
            assert idle.is_alive() and sealed == ["q-busy"]
        idle.join(DEADLINE_S)
        wait_until(lambda: sorted(sealed) == ["q-busy", "q-idle"], timeout_s=DEADLINE_S, what="the idle seal")
        assert rounds == ["q-busy", "q-idle"] and first.held == 2
    finally:
        daemon.stop()
    bounded = RequestsFirst(max_hold_s=0.05)
    with bounded.serving():
        assert bounded.wait_turn() >= 0.04  # a request that never ends holds idle work only so long
    assert bounded.wait_turn() == 0.0


def test_a_long_refresh_reads_in_slices_and_pauses_between_them(setup, monkeypatch) -> None:
    """A first load (or a failover storm's re-reads) of many queues is sent ``READ_SLICE``
    queues at a time, and the daemon's pause (wait while a FailOver is served) runs between
    two slices, not after all of them (coordinator/pacing.py)."""
    import time

    from ordq.coordinator import daemon_view
    from ordq.coordinator.daemon_view import DaemonView

    store, _ = setup
    monkeypatch.setattr(daemon_view, "READ_SLICE", 100)
    view = DaemonView(store, lambda: None)
    at_pause: list[int] = []
    try:
        queues = view.refresh(time.monotonic(), pause=lambda: at_pause.append(view.reads))
    finally:
        view.close()
    assert len(queues) >= N + 1 and view.reads >= 2 * len(queues)  # N and the other tests' few
    assert len(at_pause) == (len(queues) - 1) // 100  # 301-399 queues: 4 slices, 3 pauses
    assert at_pause == sorted(at_pause) and at_pause[0] > 0 and at_pause[-1] < view.reads


def test_a_round_of_many_queues_hands_them_to_the_pool_in_slices(setup, monkeypatch) -> None:
    """After a group's liveness changes every queue using it is planned: they go to the pool
    ``ROUND_SLICE`` at a time, and the round waits its turn (a FailOver served) between two
    slices, not only after all of them (coordinator/pacing.py)."""
    import threading

    from ordq.coordinator import daemon_round as daemon_mod  # the round's module (coordinator/daemon_parts.py)
    from ordq.coordinator.pacing import RequestsFirst

    store, daemon = setup
    monkeypatch.setattr(daemon_mod, "ROUND_SLICE", 100)
    if daemon.view is None:
        daemon.round()
    assert daemon.view is not None
    planned: list[str] = []
    inner = daemon._queue_round

    def counted(queue: str) -> None:
        planned.append(queue)
        inner(queue)

    at_pause: list[int] = []

    class Counting(RequestsFirst):
        def wait_turn(self) -> float:
            if threading.current_thread() is threading.main_thread():  # the round's own, not a worker's
                at_pause.append(len(planned))
            return super().wait_turn()

    monkeypatch.setattr(daemon, "_queue_round", counted)
    monkeypatch.setattr(daemon, "requests_first", Counting())
    daemon.view.mark_all()
    daemon.round()
    assert len(planned) >= N + 1
    between = [n for n in at_pause if 0 < n < len(planned)]
    assert len(between) >= 3 and between == sorted(between)  # 301+ queues: 4 slices of 100


def test_a_seal_on_the_daemon_s_copies_reads_nothing_first_and_survives_a_stale_copy(setup) -> None:
    """The daemon's seal runs on the state it planned on and the members its view knows (no
    reads first, issue 29); a copy that went stale meanwhile costs a retry, never a wrong write."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.seal import run_seal
    from ordq.coordinator.state import SegStatus
    from ordq.coordinator.store_values import LiveInfo
    from ordq.wire.transport import ReplicaEnd

    store, _ = setup
    asked: list[str] = []

    class Replicas:
        def seal(self, address: str, queue: str, seg: int) -> ReplicaEnd:
            asked.append(address)
            return ReplicaEnd(end=3, first_seq=0, last_seq=2, bytes=300)

        def copy_from_peer(self, address: str, queue: str, seg: int, peer: str, end: int) -> ReplicaEnd:
            raise AssertionError("one replica answered: nothing to copy")

    for queue, stale in (("seal-fresh", False), ("seal-stale", True)):
        store.create_queue(queue, ["g1", "g2"])
        st = store.load_state(queue)[0]
        seg = st.open_segment.seg
        failed = store.apply(queue, lambda s, f, seg=seg: sm.fail_over(s, "g1", seg, f))
        known = store.load_state_to_write(queue)
        assert known[0] == failed
        if stale:  # another write lands after the daemon's copy was taken
            store.update_queue_config(queue, retention_segments=3)  # not the state: same version
            store.apply(queue, lambda s, _f: sm.bump_epoch(s))
        members = {"slave": LiveInfo(address="known-slave:1", incarnation="t", pid=1)}
        done = run_seal(store, Replicas(), queue, seg, known=known, members=members)
        sealed = done.segment(seg)
        assert sealed is not None and sealed.status is SegStatus.SEALED and sealed.end == 3
        assert store.load_state(queue)[0] == done
        if stale:
            assert done.producer_epoch == known[0].producer_epoch + 1  # the later write kept
    assert asked == ["known-slave:1", "known-slave:1"]  # the view's members, no liveness read


def test_per_queue_series_are_rendered_again_only_when_a_queue_changed() -> None:
    """At 10,000 queues the per-queue gauges are 50,000 series: the /metrics page renders them
    once per change of the daemon's per-queue stats, not at every scrape (issue 29)."""
    from ordq.coordinator.metrics import CoordinatorMetrics, DaemonStats

    stats = DaemonStats(is_leader=True)
    stats.queues = {f"q{i}": {"send": ["g1", "g2"], "segments": 1, "epoch": 0, "sealing": 0, "not_live": 0}
                    for i in range(3)}
    metrics = CoordinatorMetrics(stats)
    _, first = metrics.page()
    assert b'ordq_queue_send_groups{queue="q1"} 2.0' in first
    assert b"ordq_coordinator_leader 1.0" in first
    assert metrics.per_queue_text() is metrics.per_queue_text()  # nothing changed: not rendered again
    stats.set_queue("q1", {**stats.queues["q1"], "sealing": 1})
    _, second = metrics.page()
    assert b'ordq_queue_sealing_segments{queue="q1"} 1.0' in second
    stats.is_leader = False  # a standby's view is stale: no per-queue series
    assert b'queue="q1"' not in metrics.page()[1]


def test_a_dead_group_s_heads_move_in_batched_transactions_written_ones_first(setup, caplog, monkeypatch) -> None:
    """Issue 43: the ~150 queues g1 heads move off it in a few transactions, not one write each,
    a queue a probe saw written in the first (``coordinator/group_moves.py``); the log says where
    the moves' time went (``MovePhases``: every head moved 7.9-10.9 s after the verdict at 10^5
    queues, scale43n, and nothing told the planning from the writes); no garbage collection
    while they are written (coordinator/daemon_gc.py: at 10^5 a full one walks ~700,000 copies)."""
    import gc
    import logging
    import re
    import time

    store, daemon = setup
    collector_on = note_collector(monkeypatch, daemon, "_write_moves")
    daemon.round()
    headed = [f"q-{i:04d}" for i in range(N) if store.load_state(f"q-{i:04d}")[0].head == "g1"]
    assert len(headed) > 100
    busy = headed[-1]
    daemon._written = {busy: time.monotonic()}
    batches_before, moves_before = daemon.stats.move_batches, daemon.stats.batched_moves
    store.client.delete(store.paths.live("g1", "master"))
    try:
        with caplog.at_level(logging.INFO, logger="ordq.coordinator"):
            _round_until(daemon, lambda: all(store.load_state(q)[0].head == "g2" for q in headed),
                         "every queue g1 headed moved to g2")
        moved = daemon.stats.batched_moves - moves_before
        batches = daemon.stats.move_batches - batches_before
        # (other tests' queues headed by g1 move too): one busy batch, then 200 a batch
        assert moved >= len(headed) and batches <= 2 + moved // 200
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("moved ")]
        said = re.search(r"moved (\d+) heads .* \(1 busy\) in [\d.]+ s: rows [\d.]+ s, plan [\d.]+ s \(cpu [\d.]+\), "
                         r"(\d+) transactions \((\d+) in flight at most\)", line)
        assert said is not None, line
        assert int(said[1]) == moved and int(said[2]) == batches and int(said[3]) == MOVES_IN_FLIGHT, line
        assert collector_on and not any(collector_on) and gc.isenabled(), collector_on
        # the busy queue's transaction came first: its state's znode was written before any other's
        mzxid = {q: store.client.exists(store.paths.state(q)).mzxid for q in headed}
        assert mzxid[busy] == min(mzxid.values()) and mzxid[busy] < sorted(mzxid.values())[1]
        for q in headed[:3]:
            st = store.load_state(q)[0]
            assert st.consume[0].status.value == "sealing" and st.open_segment.gid == "g2"
    finally:
        store.register_live("g1", "master", address="127.0.0.1:0/g1/master", incarnation="t")


def test_a_segment_sealed_empty_is_popped_with_one_write_and_a_new_subscription_keeps_it(
        setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: after a group's failure thousands of idle queues each hold a segment sealed
    empty, popped when no subscription exists (state.pop). The daemon writes each pop against
    its own copies (one write: no read of the state, the subscriptions and the groups first),
    safe because the view read the subscriptions after that state copy and a subscription
    created since writes the state (create_subscription): a queue that got one keeps its
    segment until the subscription passes it."""
    from ordq.coordinator import state as sm

    store, daemon = setup
    for queue in ("blip-alone", "blip-read"):
        head = store.create_queue(queue, ["g1", "g2"]).head
        assert head is not None
        store.apply(queue, lambda s, f, head=head: sm.fail_over(s, head, 0, f))
        store.apply(queue, lambda s, f: sm.seal(s, 0, 0, None, None))
        # its old head back in the send list (it is live here), as the daemon would have done:
        # the plan is the pop alone (an admit first would take the round's copies)
        store.apply(queue, lambda s, f, head=head: sm.admit(s, head, f))
    store.create_subscription("blip-read", "s")  # at segment 0
    reads: list[str] = []
    real_load, real_subs = store.load_state, store.list_subscriptions
    monkeypatch.setattr(store, "load_state", lambda q, *a, **k: (reads.append(q), real_load(q, *a, **k))[1])
    monkeypatch.setattr(store, "list_subscriptions", lambda q: (reads.append(q), real_subs(q))[1])
    _round_until(daemon, lambda: real_load("blip-alone")[0].segment(0) is None, "the empty segment popped")
    assert "blip-alone" not in reads  # written on the daemon's copies
    st = real_load("blip-alone")[0]
    assert [s.seg for s in st.consume] == [1] and st.trimmed_seq == -1
    for _ in range(3):
        daemon.round()
    assert real_load("blip-read")[0].segment(0) is not None  # the subscription has not passed it


def test_a_group_judged_dead_during_a_round_moves_between_two_slices(setup, monkeypatch) -> None:
    """Issue 43: a kill makes every queue of the group dirty, and the group is judged dead only
    once its probe is refused, after that round began. Its heads move between two slices of
    that round, in batches, and leave the rest of it (they waited for the whole round's
    planning of every queue before: 10^4 queues, 3,333-4,000 heads all moved in 6-12 s)."""
    import threading

    from ordq.coordinator import daemon_round as daemon_mod
    from ordq.coordinator.group_probe import make_pinger

    store, _shared = setup
    monkeypatch.setattr(daemon_mod, "ROUND_SLICE", 50)
    gid = _busiest_master_at_a_closed_port(store)
    pinger = make_pinger(timeout_s=2.0)
    assert pinger is not None
    planning = threading.Event()

    def probe_once_planning(address: str, group: str, role: str):  # type: ignore[no-untyped-def]
        # the refused probe answers only once the round plans: under load it answered during the
        # round's re-read, and the heads moved between two slices of the re-read (right too, but
        # not what this test shows; test_a_group_dying_during_a_re_read... shows that)
        if group == gid:
            planning.wait(DEADLINE_S)
        return pinger(address, group, role)

    daemon = CoordinatorDaemon(store, identifier="t2", away_grace_s=60.0, pinger=probe_once_planning)
    try:
        daemon.round()  # reads everything, sees g1's master at that address
        assert daemon.view is not None
        headed = {q for q, e in daemon.view.entries.items()
                  if e.state is not None and e.state.open_segment is not None and e.state.open_segment.gid == gid}
        assert len(headed) > 100
        planned: list[str] = []
        moved_at: list[int] = []
        inner = daemon._queue_round

        def counted(queue: str) -> None:
            planned.append(queue)
            inner(queue)

        real_wait = daemon._wait_turn

        def wait_for_the_probe() -> None:
            # the round's own pause between two slices (not a worker's, not the re-reads'):
            # wait for the probe's answer, so the verdict flips there, as a refused probe does
            if threading.current_thread() is threading.main_thread() and planned and not moved_at:
                planning.set()
                wait_until(lambda: daemon.stats.away_probes.get("gone", 0) > 0, timeout_s=DEADLINE_S,
                           what=f"{gid}'s master probed and refused")
                moved_at.append(len(planned))
            real_wait()

        monkeypatch.setattr(daemon, "_queue_round", counted)
        monkeypatch.setattr(daemon, "_wait_turn", wait_for_the_probe)
        moves_before = daemon.stats.batched_moves
        store.client.delete(store.paths.live(gid, "master"))
        wait_until(lambda: daemon.view is not None and daemon.view._groups_stale, timeout_s=DEADLINE_S,
                   what="the daemon's groups watch fired")
        daemon.round()  # the group away: every queue using it planned; judged dead during it
        # after the first slice, before the round had planned the group's queues
        assert moved_at and 0 < moved_at[0] < len(headed)
        assert daemon.stats.batched_moves - moves_before >= len(headed)
        assert all(store.load_state(q)[0].head != gid for q in headed)
        # the moved ones were not planned again in the rest of that round
        assert not headed & set(planned[moved_at[0]:])
    finally:
        planning.set()  # a failed run leaves no probe waiting
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()
        if store.client.exists(store.paths.live(gid, "master")) is not None:
            store.client.delete(store.paths.live(gid, "master"))
        store.register_live(gid, "master", address=f"127.0.0.1:0/{gid}/master", incarnation="t")


def test_a_group_dying_during_a_re_read_of_every_queue_moves_before_it_ends(setup, monkeypatch) -> None:
    """Issue 43: at 10^5 queues a re-read of every queue (the sweep, a new term) takes minutes;
    a kill during one waited for all of it (346 s to move 33,333 heads, docs/BENCHMARKS.md).
    Between two slices of the re-read the daemon reads the groups again when their watch fired,
    and moves the heads of a group judged dead, before the re-read ends."""
    import threading

    from ordq.coordinator import daemon_view
    from ordq.coordinator.group_probe import make_pinger

    store, _shared = setup
    monkeypatch.setattr(daemon_view, "READ_SLICE", 25)
    gid = _busiest_master_at_a_closed_port(store)
    daemon = CoordinatorDaemon(store, identifier="t3", away_grace_s=60.0, pinger=make_pinger(timeout_s=2.0))
    try:
        daemon.round()
        assert daemon.view is not None
        view = daemon.view
        headed = {q for q, e in view.entries.items()
                  if e.state is not None and e.state.open_segment is not None and e.state.open_segment.gid == gid}
        assert len(headed) > 100
        steps: list[int] = []  # the view's reads when the group went, and when its probe was refused
        real_wait = daemon._wait_turn

        def kill_then_wait_for_the_probe() -> None:
            if threading.current_thread() is threading.main_thread() and len(steps) < 2:
                if not steps:  # the first pause of the re-read: the group's master goes
                    store.client.delete(store.paths.live(gid, "master"))
                    wait_until(lambda: view._groups_stale, timeout_s=DEADLINE_S, what="the groups watch fired")
                else:  # the next: its probe was refused
                    wait_until(lambda: daemon.stats.away_probes.get("gone", 0) > 0, timeout_s=DEADLINE_S,
                               what=f"{gid}'s master probed and refused")
                steps.append(view.reads)
            real_wait()

        monkeypatch.setattr(daemon, "_wait_turn", kill_then_wait_for_the_probe)
        moves_before = daemon.stats.batched_moves
        view.mark_all()  # the sweep: every queue read again
        daemon.round()
        assert len(steps) == 2
        assert daemon.stats.batched_moves - moves_before >= len(headed)
        assert all(store.load_state(q)[0].head != gid for q in headed)
        assert steps[1] < view.reads - 100  # moved with more than 100 reads of the sweep still to go
    finally:
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()
        if store.client.exists(store.paths.live(gid, "master")) is not None:
            store.client.delete(store.paths.live(gid, "master"))
        store.register_live(gid, "master", address=f"127.0.0.1:0/{gid}/master", incarnation="t")


@pytest.mark.parametrize("created_here", [False, True], ids=["created-elsewhere", "created-by-the-leader"])
def test_queues_created_during_a_round_move_with_their_dead_group_right_after_its_verdict(
        setup, monkeypatch, created_here: bool) -> None:
    """Issue 43: a queue created while a round runs was listed only at the next round's start.
    At 10^5 queues a round lasts ~1 min: a kill 5 s after mass creation left 1,600-2,533 of the
    dead group's queues out of the moves after its verdict, and they moved 77-106 s later
    (scale43j). Now a verdict first reads the queue list and every queue the copy lacks, and
    the moves between the very slices where it came take them too.

    ``created_here``: the leading process created them itself (its admin API does): their
    first states are kept from the creation and none is read before the moves (scale43k: 7,600
    to 12,800 such reads took 14-18 s at 10^5 queues). Failing first: all 20 were read. And
    they move in the verdict's first pass, with the heads the copy knew, the queue list not
    read again before (scale43l: a second pass 0.2-3.0 s later). Failing first: a second one."""
    import threading

    from ordq.coordinator import daemon_view
    from ordq.coordinator.group_probe import make_pinger

    store, _shared = setup
    monkeypatch.setattr(daemon_view, "READ_SLICE", 25)
    store.written.leading(created_here)  # as the daemon's election makes it (round() alone does not)
    gid = _busiest_master_at_a_closed_port(store)
    other = "g2" if gid == "g1" else "g1"
    new = [f"new-{i:02d}" for i in range(20)]
    doomed = "zz-doomed"  # read in the round's last slice, deleted before it: the list read meanwhile drops it
    store.create_queue(doomed, [other])
    store.create_queue("zz-gone", [gid])
    store.delete_queue("zz-gone")
    assert store.written.get("zz-gone") is None  # no creation kept of a deleted queue: a verdict takes none
    daemon = CoordinatorDaemon(store, identifier="t5", away_grace_s=60.0, pinger=make_pinger(timeout_s=2.0))
    try:
        daemon.round()
        assert daemon.view is not None
        view = daemon.view
        steps: list[str] = []
        still_on_gid: list[list[str]] = []  # the new queues still headed by gid right after the verdict
        read_first: set[str] = set()  # the new queues whose states the view read before that
        real_wait = daemon._wait_turn
        real_between = daemon._between_slices
        real_read = view._read_queues
        real_move = daemon._move_dead_heads
        passes: list[tuple[set[str], int]] = []  # each pass that moved heads: those moved, list reads before it

        def move_dead_heads(queues, v, now):  # type: ignore[no-untyped-def]
            lists = v.list_changes
            left = real_move(queues, v, now)
            if len(left) < len(queues):
                passes.append((set(queues) - set(left), lists))
            return left

        def read_queues(queues, only=frozenset({daemon_view.STATE, daemon_view.CONFIG, daemon_view.SUBS})):  # type: ignore[no-untyped-def]
            if not still_on_gid and daemon_view.STATE in only:
                read_first.update(q for q in queues if q in new and daemon_view.STATE in view.entries[q].stale)
            real_read(queues, only)

        def create_kill_then_wait_for_the_probe() -> None:
            if threading.current_thread() is threading.main_thread() and len(steps) < 2:
                if not steps:  # the round's first pause: queues created on gid, then its master goes
                    store.delete_queue(doomed)
                    store.create_queues(new, [gid, other])
                    assert all(store.load_state(q)[0].head == gid for q in new)
                    # a non-leader keeps none of its creations
                    assert all((store.written.get(q) is not None) is created_here for q in new)
                    wait_until(lambda: view._queues_stale, timeout_s=DEADLINE_S, what="the queue list's watch fired")
                    store.client.delete(store.paths.live(gid, "master"))
                    wait_until(lambda: view._groups_stale, timeout_s=DEADLINE_S, what="the groups watch fired")
                    steps.append("created and killed")
                else:  # the next: its probe was refused (judged dead in this pause)
                    wait_until(lambda: daemon.stats.away_probes.get("gone", 0) > 0, timeout_s=DEADLINE_S,
                               what=f"{gid}'s master probed and refused")
                    steps.append("refused")
            real_wait()

        def between(v: daemon_view.DaemonView, moved: set[str]) -> None:
            real_between(v, moved)
            if len(steps) == 2 and not still_on_gid:
                still_on_gid.append([q for q in new if store.load_state(q)[0].head == gid])

        monkeypatch.setattr(daemon, "_wait_turn", create_kill_then_wait_for_the_probe)
        monkeypatch.setattr(daemon, "_between_slices", between)
        monkeypatch.setattr(view, "_read_queues", read_queues)
        monkeypatch.setattr(daemon, "_move_dead_heads", move_dead_heads)
        view.mark_all()  # a long round: every queue read again, READ_SLICE at a time
        daemon.round()
        assert steps == ["created and killed", "refused"]
        assert still_on_gid == [[]]
        assert doomed not in view.entries
        assert read_first == (set() if created_here else set(new))
        first_moved, lists_before = passes[0]
        if created_here:
            assert set(new) <= first_moved and len(passes) == 1, [sorted(set(new) - p) for p, _ in passes]
            assert lists_before == view.list_changes - 1  # the list read by the round's refresh alone so far
        else:
            assert not set(new) & first_moved and set(new) <= set().union(*(p for p, _ in passes[1:]))
        daemon.round()  # read for the move by their states alone (or none): the rest of them next round
        assert all(view.entries[q].config is not None for q in new)
        store.written.leading(False)  # the term's end: no creation is kept
        assert not any((got := store.written.get(q)) is not None and got[1] == 0 for q in new)
    finally:
        store.written.leading(False)
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()
        for q in [*new, doomed]:
            if store.client.exists(store.paths.queue(q)) is not None:
                store.delete_queue(q)
        if store.client.exists(store.paths.live(gid, "master")) is not None:
            store.client.delete(store.paths.live(gid, "master"))
        store.register_live(gid, "master", address=f"127.0.0.1:0/{gid}/master", incarnation="t")


def test_the_leader_s_session_holds_no_watch_of_a_queue(setup, zk_server) -> None:
    """Issue 43: the view sets a data watch on each queue's settings and state (~200,000 at 10^5
    queues); when a connection drops, kazoo hands each watch an event, one by one, in the
    connection's thread, before it reconnects (307 ms for 33,334, scale43k), so on the session
    that holds the leadership a blip could cost it. They live on ``watch_store``'s session, and
    a change is seen through it. Failing first: every one was on the leader's session."""
    import time

    store, _ = setup
    hosts, root = zk_server.connection_string, store.paths.root
    with ZkStore.connect(hosts, root) as leading, ZkStore.connect(hosts, root) as watches:
        daemon = CoordinatorDaemon(leading, identifier="watch-session", away_grace_s=0, sweep_interval_s=86_400.0,
                                   rebalance_moves_per_s=0, watch_store=watches)
        try:
            daemon.round()
            view = daemon.view
            assert view is not None and len(view.entries) > N

            def of_queues(s: ZkStore) -> set[str]:  # kazoo's own book of watches, of paths under a queue
                book = {**s.client._data_watchers, **s.client._child_watchers}
                return {p for p, fns in book.items() if fns and p.startswith(s.paths.queues + "/")}

            assert of_queues(leading) == set()
            watched = of_queues(watches)
            assert {leading.paths.state(q) for q in view.entries} <= watched
            assert {leading.paths.queue(q) for q in view.entries} <= watched
            store.update_queue_config("q-0042", retention_segments=9)
            wait_until(lambda: "q-0042" in view.refresh(time.monotonic()), timeout_s=DEADLINE_S,
                       what="the change seen through the watch session")
            assert view.entries["q-0042"].config is not None
            assert view.entries["q-0042"].config.retention_segments == 9
        finally:
            daemon.stop()
            if daemon.view is not None:
                daemon.view.close()


def test_the_sweep_reads_a_share_of_the_queues_each_round_every_one_once_per_period(setup) -> None:
    """Issue 43: the safety net read every queue at once every 5 min, ~3 min of the leader at
    10^5 queues. Now a share each round: every queue once per period, in name order, and no
    more than ``max_per_s`` queues a second."""
    import time

    from ordq.coordinator.daemon_view import STATE, DaemonView, known_state

    store, _ = setup
    view = DaemonView(store, lambda: None)
    try:
        view.refresh(time.monotonic())
        n = len(view.entries)
        assert n >= N and not any(e.stale for e in view.entries.values())
        assert view.sweep_share(1000.0, 300.0, 1e9) == 0  # starts the clock
        assert view.sweep_share(1100.0, 300.0, 1e9) == n // 3  # a third of the period: a third
        marked = sorted(q for q, e in view.entries.items() if STATE in e.recheck)
        assert marked == sorted(view.entries)[:n // 3]
        # marked to be read again, not stale: its copy is still what is known of it
        assert all(known_state(view.entries[q], None) is not None for q in marked)
        assert view.sweep_share(1200.0, 300.0, 0.5) == 50  # capped: half a queue a second, not a third
        view.sweep_share(1500.0, 300.0, 1e9)  # the rest of the pass, and on into the next
        assert all(STATE in e.recheck for e in view.entries.values()) and view.sweep_passes == 1
        queues = view.refresh(time.monotonic())
        assert len(queues) == n and not any(e.stale or e.recheck for e in view.entries.values())
        assert view.sweep_share(1500.5, 300.0, 1e9) <= n * 0.5 / 300 + 1  # a round: next to nothing
    finally:
        view.close()


def _busiest_master_at_a_closed_port(store: ZkStore) -> str:
    """The group heading most of the queues now (earlier tests here move heads about), its
    master registered at a port nobody serves, so the coordinator's probe is refused (GONE)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    heads = [store.load_state(f"q-{i:04d}")[0].head for i in range(N)]
    gid = max(("g1", "g2"), key=heads.count)
    store.client.delete(store.paths.live(gid, "master"))
    store.register_live(gid, "master", address=f"127.0.0.1:{closed}", incarnation="t")
    return str(gid)


def test_idle_queues_pops_and_admits_after_a_failover_are_written_in_batches(
        setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: after a group's failure each idle queue it headed pops its segment sealed empty,
    then admits the group again once it is back (I4: no backlog there first). At 10^5 queues
    that was ~33,000 of each, one write each at 50-115/s (the coordinator's log, scale43f), and
    the heads could not spread back to a group not admitted yet. Now a round keeps the idle
    queues' pops and admits planned on its copies and writes them in batched transactions,
    each against the version it was planned on. Failing first: one ``apply`` per queue."""
    from ordq.coordinator import state as sm

    store, daemon = setup
    names = [f"tidy-{i:03d}" for i in range(40)]
    heads = {}
    for queue in names:
        head = store.create_queue(queue, ["g1", "g2"]).head
        assert head is not None
        heads[queue] = head
        store.apply(queue, lambda s, f, head=head: sm.fail_over(s, head, 0, f))
        store.apply(queue, lambda s, f: sm.seal(s, 0, 0, None, None))  # sealed empty, as after a kill
    applied: list[str] = []
    real_apply, real_batches = store.apply, store.apply_batches
    monkeypatch.setattr(store, "apply", lambda q, *a, **k: (applied.append(q), real_apply(q, *a, **k))[1])
    raced: list[str] = []

    def racing_batches(parts, group_versions):  # type: ignore[no-untyped-def]
        # another writer moves one planned queue's state first: the batch leaves it out, and
        # it is read again and planned again
        if not raced:
            raced.append(parts[0][0][0])
            real_apply(raced[0], lambda s, f: sm.bump_epoch(s))
        return real_batches(parts, group_versions)

    monkeypatch.setattr(store, "apply_batches", racing_batches)
    pops_before = daemon.stats.actions.get("pop", 0)

    def tidied() -> bool:
        states = {q: store.load_state(q)[0] for q in names}
        return all([s.seg for s in st.consume] == [1] and heads[q] in st.send for q, st in states.items())

    _round_until(daemon, tidied, "every empty segment popped and its group admitted again")
    assert not set(applied) & set(names), sorted(set(applied) & set(names))  # none written alone
    assert raced and raced[0] in names
    assert daemon.stats.actions.get("pop", 0) - pops_before >= len(names)


def _queues_on_groups_of_their_own(store: ZkStore, prefix: str, groups: tuple[str, str]) -> list[str]:
    """60 queues ``<prefix>-NNN`` on two groups added (both processes live) for one test: earlier
    tests of the module leave theirs as they like."""
    add_live_groups(store, groups)
    names = [f"{prefix}-{i:03d}" for i in range(60)]
    for q in names:
        store.create_queue(q, list(groups))
    return names


def test_a_dead_group_s_moved_heads_are_sealed_from_the_move_not_a_later_round(setup) -> None:
    """Issue 43: the seal of each old segment a batched move left sealing is queued with the
    move, on the state it wrote (version checked by the seal's own write), not once the moved
    queues' watches fired, their states were read again and a later round planned them: at
    10^5 queues the first seal batch came 61 s after the moves (bench_queues, scale43g).
    Failing first: no seal asked after the round that moved them."""
    store, _shared = setup
    asked: list[tuple[str, str, int, int]] = []

    def batch_sealer(gid, items, members):  # type: ignore[no-untyped-def]
        asked.extend((gid, q, seg, version) for q, seg, _st, version in items)
        return []

    daemon = CoordinatorDaemon(store, identifier="seal-moved", away_grace_s=0, sealer=lambda *a, **k: None,
                               batch_sealer=batch_sealer)
    names = _queues_on_groups_of_their_own(store, "sm", ("s1", "s2"))
    try:
        daemon.round()
        heads = {q: store.load_state(q)[0].head for q in names}
        dead, other = "s1", "s2"
        headed = [q for q in names if heads[q] == dead]
        assert len(headed) >= 10
        store.client.delete(store.paths.live(dead, "master"))
        try:
            _round_until(daemon, lambda: all(store.load_state(q)[0].head == other for q in headed),
                         f"{dead}'s heads moved to {other}")
            # no round after the one that moved them: the seals were queued by the move
            wait_until(lambda: {q for _g, q, _s, _v in asked} >= set(headed), timeout_s=DEADLINE_S,
                       what="the moved queues' seals asked")
            for gid, q, seg, version in asked:
                if q in headed:
                    st, now = store.load_state_to_write(q)
                    assert (gid, seg, version) == (dead, 0, now) and st.segment(0).status.value == "sealing", q
        finally:
            store.register_live(dead, "master", address=f"127.0.0.1:0/{dead}/master", incarnation="t")
    finally:
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()


def test_a_listing_takes_the_states_this_process_wrote_not_a_read_of_each(setup) -> None:
    """Issue 43: 15 s after a group's failure at 10^5 queues, ``queue list`` spent ~15 s of its
    coordinator's 23 s re-reading from ZooKeeper the states the daemon had just written itself
    (its moves and seals fire the watches that mark its copies stale; py-spy, scale43h). The
    states a coordinator writes are kept, with the version each write made, until its view
    reads that version back: the listing takes them as they are (the elected coordinator is the
    one writer of states). Failing first: the written queues were missing (stale) or older."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_view import STATE

    store, _ = setup
    names = [f"lw-{i:03d}" for i in range(20)]
    for q in names:
        store.create_queue(q, ["g1", "g2"])
    daemon = CoordinatorDaemon(store, identifier="listing", away_grace_s=0, sweep_interval_s=86_400.0,
                               rebalance_moves_per_s=0)
    try:
        daemon.round()
        daemon.stats.is_leader = True  # as its election makes it (round() alone does not)
        before = daemon.known_queues(names)
        assert set(before) == set(names)
        live = sm.Facts(live_groups=frozenset({"g1", "g2"}))
        writes = []
        for q in names[:10]:
            st, version, _ = before[q]
            head = st.open_segment
            assert head is not None
            writes.append((q, version, sm.roll(st, head.gid, head.seg, live)))
        done, left = store.apply_batch(writes, {})
        assert sorted(done) == names[:10] and not left
        # the watches fire (or not yet): either way, no read, and the state as written
        wait_until(lambda: all(STATE in daemon.view.entries[q].stale for q in names[:10]),  # type: ignore[union-attr]
                   timeout_s=DEADLINE_S, what="the writes' watches fired")
        after = daemon.known_queues(names)
        assert set(after) == set(names)
        for q, version, new in writes:
            assert after[q][:2] == (new, version.next()), q
        for q in names[10:]:
            assert after[q][:2] == before[q][:2], q
        daemon.round()  # the view reads them back: nothing kept
        assert all(store.written.get(q) is None for q in names[:10])
    finally:
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()


def test_one_seal_batch_call_of_a_dead_group_runs_while_its_heads_move(setup, monkeypatch) -> None:
    """Issue 43: the moves queue their seals window by window; started at once, two seal batch
    calls a group ran beside the rest of the moves (same process, same ZooKeeper connection) and
    a dead group's 33,333 heads at 10^5 queues moved in 17.3 / 29.7 s, not 10.1-10.5 s
    (scale43h); with none until the last window, its seals ended 63 s after it was judged dead
    (scale43i; the goal is 60 s). Now one batch call of the group runs during the moves, the
    second once they end. Failing first (scale43i's rule): no seal asked before the last window
    (this test waits for one at each later window, and gave up)."""
    from ordq.coordinator import daemon_round, group_moves

    store, _shared = setup
    asked: list[str] = []
    queued_while_moving: list[tuple[int, set[str]]] = []  # (w1's batch jobs, w1's queues sealed) a window

    def batch_sealer(gid, items, members):  # type: ignore[no-untyped-def]
        asked.extend(q for q, _seg, _st, _v in items)
        return []

    daemon = CoordinatorDaemon(store, identifier="seal-after-moves", away_grace_s=0, sealer=lambda *a, **k: None,
                               batch_sealer=batch_sealer)
    real_stream = store.stream_batches
    windows: list[int] = []  # (the transactions answered)

    def watched_stream(parts, group_versions, **kwargs):  # type: ignore[no-untyped-def]
        mine = {q for part in parts for q, _v, _st in part} <= set(headed)  # w1's moves
        for part, answer in zip(parts, real_stream(parts, group_versions, **kwargs), strict=False):
            if mine and windows:  # a later one: the earlier ones' seals are being asked, one call at a time
                wait_until(lambda: set(asked) & set(headed), timeout_s=10, interval_s=0.02,
                           what="a seal batch of w1 during its moves")
                queued_while_moving.append((daemon._seal_batch_jobs.get("w1", 0), set(asked) & set(headed)))
            if mine:
                windows.append(len(part))
            yield answer

    # small transactions, one in flight: the ~30 heads move in several transactions
    monkeypatch.setattr(daemon_round, "batches", lambda moves: group_moves.batches(moves, max_count=5))
    monkeypatch.setattr(daemon_round, "MOVES_IN_FLIGHT", 1)
    names = _queues_on_groups_of_their_own(store, "sw", ("w1", "w2"))
    try:
        daemon.round()
        headed = [q for q in names if store.load_state(q)[0].head == "w1"]
        assert len(headed) >= 10
        monkeypatch.setattr(store, "stream_batches", watched_stream)
        store.client.delete(store.paths.live("w1", "master"))
        try:
            _round_until(daemon, lambda: all(store.load_state(q)[0].head == "w2" for q in headed),
                         "w1's heads moved to w2")
            assert len(windows) >= 2, windows
            assert queued_while_moving and all(jobs <= 1 and sealed for jobs, sealed in queued_while_moving), \
                queued_while_moving
            # started once the moves ended, with no later round: every moved queue's seal asked
            wait_until(lambda: set(asked) >= set(headed), timeout_s=DEADLINE_S, what="the moved queues' seals asked")
            wait_until(lambda: not daemon._seal_batch_jobs, timeout_s=DEADLINE_S, what="the batch jobs ended")
        finally:
            store.register_live("w1", "master", address="127.0.0.1:0/w1/master", incarnation="t")
    finally:
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()


def test_the_cursors_of_many_queues_with_a_sealed_head_are_read_pipelined(setup, monkeypatch) -> None:
    """Issue 43: once a dead group's 33,333 segments are sealed (10^5 queues), each of those
    queues has a sealed head and the view reads its cursors (a pop candidate). One queue after
    another, a round trip each, none of their pops was written within ~170 s (scale43h). The
    subscriptions' names of a slice's queues are now all asked before the first answer is
    awaited, then their cursors. Failing first: one children read in flight at a time."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_view import DaemonView

    store, _shared = setup
    names = [f"cur-{i:03d}" for i in range(20)]
    for queue in names:
        head = store.create_queue(queue, ["g1", "g2"]).head
        assert head is not None
        store.apply(queue, lambda s, f, head=head: sm.fail_over(s, head, 0, f))
        store.apply(queue, lambda s, f: sm.seal(s, 0, 0, None, None))  # sealed empty, as after a kill
    store.create_subscription(names[3], "s")
    asked: set[int] = set()
    in_flight: list[int] = [0, 0]  # now, most
    real_children = store.client.get_children_async
    real_get = DaemonView._get

    def children(path, *a, **k):  # type: ignore[no-untyped-def]
        request = real_children(path, *a, **k)
        if "/cur-" in path:
            asked.add(id(request))
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        return request

    def get(view, request):  # type: ignore[no-untyped-def]
        if id(request) in asked:
            asked.discard(id(request))
            in_flight[0] -= 1
        return real_get(view, request)

    monkeypatch.setattr(store.client, "get_children_async", children)
    monkeypatch.setattr(DaemonView, "_get", get)
    view = DaemonView(store, lambda: None)
    try:
        view.refresh(0.0)  # a first read: every queue
        entries = view.entries
        assert entries[names[3]].cursors is not None and set(entries[names[3]].cursors) == {"s"}
        assert all(entries[q].cursors == {} for q in names if q != names[3])
        # (READ_SLICE queues a slice: the 20 may fall in two slices, one of them >= 10)
        assert in_flight[1] >= 10, in_flight
    finally:
        view.close()


def test_a_returning_group_gets_heads_back_in_the_round_that_admits_it(zk_server, monkeypatch) -> None:
    """Issue 43: at 10^5 queues no head went back to a group returning after a kill (0 in 60 s,
    three runs, scale43i). The round that admitted it again (~33,333 admits, ~21 s) ended with
    a spread pass that left out every queue whose state was stale, and the admits, written by
    the daemon itself, had just made exactly the queues that may move to the returning group
    stale (it is in no other queue's send list); the next pass came only after the next long
    round. The pass now takes the states this process wrote (``known_state``). Failing first:
    none of the 20 heads moved in the admitting round."""
    import uuid

    from ordq.coordinator import daemon, daemon_spread

    for module in (daemon, daemon_spread):  # the first pass at once, g1 settled at once
        monkeypatch.setattr(module, "REBALANCE_GRACE_S", 0.0)
    with ZkStore.connect(zk_server.connection_string, f"/t-{uuid.uuid4().hex[:10]}") as store:
        add_live_groups(store, ("g2",))
        store.add_group("g1")  # not live yet: the queues are created without it in their send lists
        names = [f"back-{i:03d}" for i in range(40)]
        store.create_queues(names, ["g1", "g2"])
        assert {store.load_state(q)[0].send for q in names} == {("g2",)}
        for role in ("master", "slave"):  # g1 returns
            store.register_live("g1", role, address=f"127.0.0.1:0/g1/{role}", incarnation="t")
        daemon = CoordinatorDaemon(store, identifier="spread", away_grace_s=0, sweep_interval_s=86_400.0,
                                   rebalance_moves_per_s=50)
        try:
            daemon.round()  # reads every queue, admits g1 to each, then its spread pass
            states = [store.load_state(q)[0] for q in names]
            assert all("g1" in st.send for st in states)
            heads = [st.head for st in states]
            assert heads.count("g1") == 20, heads
        finally:
            daemon.stop()
            if daemon.view is not None:
                daemon.view.close()


def test_a_creation_is_kept_only_while_leading_and_until_its_view_reads_it() -> None:
    """Issue 43: the leader keeps the first state of each queue it creates, so a verdict plans
    its move without a read (10^5 creations: a non-leader, whose view never reads them back,
    must keep none); read back, or the term over, it is dropped."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.store_base import WrittenStates
    from ordq.coordinator.store_values import StateVersion as V

    first, again = sm.create("q", ("g1",), incarnation="a" * 12), sm.create("q", ("g2",), incarnation="b" * 12)
    written = WrittenStates()
    written.created("q", first, 9)
    assert written.get("q") is None  # not leading
    written.leading(True)
    written.created("q", first, 9)
    assert written.get("q") == (first, V(0, 9))  # with the deletion count read before the creation
    written.seen("q", V(0, 9))
    assert written.get("q") is None  # read back
    written.note("q", first, V(5, 9))  # a write of an earlier incarnation of q
    written.created("q", again, 10)
    assert written.get("q") == (again, V(0, 10))  # a creation replaces it
    written.note("r", first, V(3, 10))
    assert written.creations() == {"q": (again, V(0, 10))}  # a write is no creation
    written.created("gone", first, 10)
    written.forget("gone")  # deleted: no state of any queue
    assert written.get("gone") is None and "gone" not in written.creations()
    written.leading(False)
    assert written.get("q") is None and written.get("r") == (first, V(3, 10))  # writes stay until read back


def test_a_spread_pass_plans_on_every_queue_s_state_or_not_at_all() -> None:
    """The rows of a spread pass (``spread_rows``): a copy read and unchanged, or this process's
    later write; None while any queue's state is unknown (counts without it look uneven);
    an unusable state (``problem``) is left out. Pure: no ZooKeeper."""
    from ordq.common.errors import CorruptState
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_spread import spread_rows
    from ordq.coordinator.daemon_view import STATE, QueueEntry
    from ordq.coordinator.store_values import StateVersion as V

    st = sm.create("a", ("g1", "g2"))
    later = sm.create("b", ("g2", "g1"))
    read = QueueEntry(state=st, version=3, deletions=1, stale=set())
    written_since = QueueEntry(state=st, version=3, stale={STATE})
    unusable = QueueEntry(state=st, version=3, stale=set(), problem=CorruptState("c", "x"))
    mine = {"b": (later, V(4, 1))}.get
    rows = spread_rows({"a": read, "b": written_since, "c": unusable}, mine)
    assert rows == [("a", st, V(3, 1)), ("b", later, V(4, 1))]
    assert spread_rows({"a": read, "b": QueueEntry(state=st, version=3, stale={STATE})}, {}.get) is None
    assert spread_rows({"a": read, "n": QueueEntry()}, {}.get) is None  # not read yet
    old = {"b": (later, V(2, 1))}.get  # written in an earlier term, overtaken since
    assert spread_rows({"b": QueueEntry(state=st, version=3, stale=set())}, old) == [("b", st, V(3, 0))]


def test_a_listing_takes_a_creation_of_this_term_taken_unread_not_an_older_write() -> None:
    """Issue 43 (scale43o, run 1 at 10^5): a verdict took 17,621 creations of the leader unread
    (``take_written``: version 0, STATE stale), and a listing 15 s later read 10,247 of them from
    ZooKeeper, 15.0 s of its 25.1 s: ``known_state`` took this process's writes only when newer
    than a copy read in this term. A creation (version 0, kept only while leading: of this term)
    is taken while the copy read nothing newer; a write of an earlier term still is not.
    Failing first: None for the taken creation."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_view import STATE, QueueEntry, known_state
    from ordq.coordinator.store_values import StateVersion as V

    st = sm.create("q", ("g1",), incarnation="a" * 12)
    moved = sm.admit(st, "g1", sm.Facts(live_groups=frozenset({"g1"})))
    taken = QueueEntry(state=st, version=0, deletions=2, stale={STATE})  # as take_written leaves it
    assert known_state(taken, (st, V(0, 2))) == (st, V(0, 2))
    assert known_state(QueueEntry(), (st, V(0, 2))) == (st, V(0, 2))  # listed, not read nor taken yet
    assert known_state(QueueEntry(), (moved, V(3, 2))) is None  # a write of an earlier term: read first
    read = QueueEntry(state=moved, version=4, stale={STATE})
    assert known_state(read, (st, V(0, 2))) is None  # the copy read something newer, changed since
    assert known_state(read, (moved, V(5, 2))) == (moved, V(5, 2))  # a later write of this term, as before


def test_why_the_copy_lacks_a_listing_s_queues_is_counted_by_reason() -> None:
    """Issue 43: a listing 15 s after a group's failure at 10^5 queues read 2.4 s of states the
    leader's copy lacked, and nothing said why. ``why_lacked`` (logged by ``known_queues``) counts
    each reason ``known_state`` has for taking no state."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon import why_lacked
    from ordq.coordinator.daemon_view import STATE, QueueEntry
    from ordq.coordinator.store_base import WrittenStates
    from ordq.coordinator.store_values import StateVersion as V

    st = sm.create("q", ("g1",), incarnation="a" * 12)
    written = WrittenStates()
    written.note("written-older", st, V(2, 0))
    written.note("kept", st, V(1, 0))
    entries = {"never": QueueEntry(), "kept": QueueEntry(),
               "changed": QueueEntry(state=st, version=3, stale={STATE}),
               "written-older": QueueEntry(state=st, version=2, stale={STATE}),
               "bad": QueueEntry(state=None, problem=ValueError("x"))}
    lacked = ["unlisted", "never", "kept", "changed", "written-older", "bad", "changed"]
    assert why_lacked(entries, written, lacked) == (
        "2 changed, not read again, no write of this process kept, 1 not listed in the copy, 1 never read, "
        "1 never read (created here, kept unread), 1 changed, not read again, this process's write not newer than "
        "the copy, 1 unusable")


def test_a_listing_takes_this_process_s_writes_with_one_lock_not_one_a_queue() -> None:
    """Issue 43: ``known_queues`` of 100,001 queues took 0.9-2.6 s under load (scale43n), a lock
    of ``WrittenStates`` taken for each queue while the view's reads take it too. It takes them
    all at once (``snapshot``), and gives what the lock-a-queue reading gave: a later write of
    this process over an older copy. Failing first: 1,000 lock acquisitions for 1,000 queues."""
    import threading
    import types

    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_view import STATE, QueueEntry
    from ordq.coordinator.store_base import WrittenStates
    from ordq.coordinator.store_values import StateVersion as V

    class CountingLock:
        def __init__(self) -> None:
            self.taken = 0
            self._lock = threading.Lock()

        def __enter__(self) -> None:
            self.taken += 1
            self._lock.acquire()

        def __exit__(self, *_exc: object) -> None:
            self._lock.release()

    old = sm.create("q", ("g1", "g2"), incarnation="a" * 12)
    new = sm.admit(old, "g1", sm.Facts(live_groups=frozenset({"g1", "g2"})))
    names = [f"q{i:04d}" for i in range(1000)]
    written = WrittenStates()
    for q in names[:10]:
        written.note(q, new, V(5, 0))
    lock = CountingLock()
    written._lock = lock  # type: ignore[assignment]
    daemon = CoordinatorDaemon(types.SimpleNamespace(written=written), identifier="one-lock")  # type: ignore[arg-type]
    daemon.view = types.SimpleNamespace(entries={q: QueueEntry(state=old, version=4, stale={STATE} if q == names[0]
                                                               else set()) for q in names})  # type: ignore[assignment]
    daemon.stats.is_leader = True
    got = daemon.known_queues(names)
    assert lock.taken == 1
    assert {q: got[q][:2] for q in names[:10]} == {q: (new, V(5, 0)) for q in names[:10]}
    assert all(got[q][:2] == (old, V(4, 0)) for q in names[10:])
