"""A dead group's heads moved as one event (issue 43), the pure part: which queues move, busy
ones first, and the batches bounded by count and bytes (``coordinator/group_moves.py``); then
``ZkStore.apply_batch`` against a real ZooKeeper: all or nothing per transaction, a queue whose
state moved meanwhile left out (its CAS lost) and the rest written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.coordinator import state as sm
from ordq.coordinator.group_moves import Move, MovePhases, batches, dead_head, plan_moves
from ordq.coordinator.state import Facts, QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from tests.helpers.groups import add_live_groups

GROUPS = ("g1", "g2", "g3")
ALL_LIVE = Facts(live_groups=frozenset(GROUPS))
G1_DEAD = Facts(live_groups=frozenset({"g2", "g3"}))


def queue(name: str, head: str) -> QueueState:
    order = (head, *[g for g in GROUPS if g != head])
    return sm.admit_all(sm.create(name, order), Facts(live_groups=frozenset(order)))


def test_the_moves_phases_are_said_in_one_line() -> None:
    """What the moves' log line says (issue 43: where a dead group's 7.9-10.9 s at 10^5 went)."""
    phases = MovePhases(rows_s=0.31, plan_s=2.456, plan_cpu_s=2.2, turns_s=0.01, writes_s=6.5, writes_cpu_s=3.25,
                        seals_s=0.4, total_s=9.7, process_cpu_s=9.1, in_flight=8, transactions=167, redone=1,
                        revalidations=0, queue_events=33334)
    assert phases.line() == (
        "in 9.70 s: rows 0.31 s, plan 2.46 s (cpu 2.20), 167 transactions (8 in flight at most) 6.50 s (cpu 3.25), "
        "turns waited 0.01 s, seals queued 0.40 s; the process's cpu 9.10 s; 1 transactions redone, "
        "0 revalidations, 33334 queue watches fired")


def test_only_queues_headed_by_a_dead_group_move_busy_first_each_by_fail_over() -> None:
    rows = [(f"q{i}", queue(f"q{i}", GROUPS[i % 3]), 7, G1_DEAD) for i in range(9)]
    moves = plan_moves(rows, busy={"q6", "q1"})
    assert [m.queue for m in moves] == ["q6", "q0", "q3"]  # q1 is busy but headed by g2: not moved
    assert [m.busy for m in moves] == [True, False, False]
    for m in moves:
        assert m.version == 7 and m.after == sm.fail_over(m.before, "g1", 0, G1_DEAD)
        assert m.after.head == "g2" and m.after.consume[0].status is SegStatus.SEALING
    assert [m.queue for m in plan_moves(rows, busy=set())] == ["q0", "q3", "q6"]  # the order given
    assert dead_head(rows[0][1], ALL_LIVE) is None and dead_head(rows[0][1], G1_DEAD) == ("g1", 0)


def test_a_queue_the_state_machine_refuses_is_left_to_its_own_round() -> None:
    moved = sm.fail_over(queue("a", "g1"), "g1", 0, G1_DEAD)  # already moved: head g2, alive
    nothing_live = Facts(live_groups=frozenset())
    only = sm.create("b", ("g1",))
    alone = sm.admit_all(sm.create("c", ("g1",)), ALL_LIVE)
    rows = [("a", moved, 1, G1_DEAD), ("b", only, 1, nothing_live), ("c", alone, 1, nothing_live)]
    moves = plan_moves(rows, busy=set())
    # "a" moved already, "b" has no open segment; "c" fails over and, no group of it live,
    # is left without one (producers wait: DESIGN fail_over)
    assert [m.queue for m in moves] == ["c"] and moves[0].after.open_segment is None


def _move(name: str, busy: bool, size: int) -> Move:
    st_ = sm.create(name, GROUPS)
    return Move(queue=name, version=0, before=st_, after=st_, busy=busy, size=size)


@settings(deadline=None)  # timing is not what it checks (a loaded box ran one example over 200 ms)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=120),
       st.integers(1, 20), st.integers(1, 8), st.integers(1, 20_000))
def test_batches_keep_order_bounds_and_never_mix_busy_with_idle(
        spec: list[tuple[bool, int]], max_count: int, busy_count: int, max_bytes: int) -> None:
    # busy ones first, as plan_moves gives them
    spec = sorted(spec, key=lambda s: not s[0])
    moves = [_move(f"q{i}", busy, size) for i, (busy, size) in enumerate(spec)]
    out = batches(moves, max_count=max_count, max_bytes=max_bytes, busy_count=busy_count)
    assert [m for part in out for m in part] == moves  # every move once, in order
    for part in out:
        assert part and len({m.busy for m in part}) == 1
        assert len(part) <= (busy_count if part[0].busy else max_count)
        assert len(part) == 1 or sum(m.size for m in part) <= max_bytes
    # as few batches as the bounds allow: two neighbours could not have been one
    for a, b in zip(out, out[1:], strict=False):
        limit = busy_count if a[0].busy else max_count
        assert (a[0].busy != b[0].busy or len(a) == limit
                or sum(m.size for m in a) + b[0].size > max_bytes)


def test_batch_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        batches([], max_count=0)


@pytest.fixture
def store(zk_server, zk_root) -> Iterator[ZkStore]:
    with ZkStore.connect(zk_server.connection_string, zk_root) as s:
        yield s


@pytest.mark.zk
def test_apply_batch_writes_all_and_leaves_out_a_queue_that_moved(store: ZkStore, caplog) -> None:
    add_live_groups(store, GROUPS)
    names = [f"q{i}" for i in range(6)]
    for q in names:
        store.create_queue(q, ["g1", "g2", "g3"])
    _, group_versions = store._drained_with_versions(GROUPS)
    rows = []
    for q in names:
        st_, version = store.load_state_to_write(q)
        rows.append((q, st_, version, G1_DEAD))
    moves = plan_moves(rows, busy={"q4"})
    assert [m.queue for m in moves][0] == "q4" and len(moves) == 6
    # q2 moves meanwhile (its producer asked for a failover): its version no longer matches
    store.apply("q2", lambda s, f: sm.fail_over(s, "g1", 0, G1_DEAD))
    after_q2 = store.load_state("q2")
    done, left = store.apply_batch([(m.queue, m.version, m.after) for m in moves], group_versions)
    assert left == ["q2"] and sorted(done) == sorted(set(names) - {"q2"})
    for m in moves:
        if m.queue != "q2":
            assert store.load_state(m.queue)[0] == m.after
    assert store.load_state("q2") == after_q2  # not written over

    # a drain mark changed since it was read: nothing is written, every queue left
    rows = [(q, *store.load_state_to_write(q), Facts(live_groups=frozenset({"g3"}))) for q in names]
    again = plan_moves(rows, busy=set())
    assert again, "g2 heads them now and is not live in these facts"
    store.set_group_drained("g3", True)
    caplog.set_level("WARNING", logger="ordq.coordinator")
    done, left = store.apply_batch([(m.queue, m.version, m.after) for m in again], group_versions)
    assert done == [] and sorted(left) == sorted(m.queue for m in again)
    # said, with why (a lost version check is not: scale43r's 200 queues left whole, cause unknown);
    # the store's lines only: the collector's log (daemon_gc) shares the logger, once installed
    assert [r.getMessage() for r in caplog.records if r.module == "store"] == [
        f"a batch of {len(again)} states: 0 written, 0 moved since, {len(again)} more not written (a group's drain "
        "mark changed since it was read)"]


@pytest.mark.zk
def test_apply_batch_leaves_out_every_moved_queue_however_many_and_writes_the_rest(store: ZkStore) -> None:
    """More queues moved meanwhile than ``apply_batch`` makes attempts: ZooKeeper names one
    failing write per transaction, so the moved ones are found by one round of reads, and the
    others are still written (before: after 8 attempts the whole transaction was left, and its
    queues failed over one by one much later: scale43r's 200 queues at 10^5)."""
    add_live_groups(store, GROUPS)
    names = [f"m{i:02d}" for i in range(20)]
    for q in names:
        store.create_queue(q, ["g1", "g2", "g3"])
    _, group_versions = store._drained_with_versions(GROUPS)
    moves = plan_moves([(q, *store.load_state_to_write(q), G1_DEAD) for q in names], busy=set())
    moved = names[::2] + names[1:5:2]  # 12 of 20, more than the 8 attempts
    for q in moved:
        store.apply(q, lambda s, f: sm.fail_over(s, "g1", 0, G1_DEAD))
    done, left = store.apply_batch([(m.queue, m.version, m.after) for m in moves], group_versions)
    assert sorted(left) == sorted(moved)
    assert sorted(done) == sorted(set(names) - set(moved))
    for m in moves:
        if m.queue in done:
            assert store.load_state(m.queue)[0] == m.after


def test_the_moves_are_planned_on_this_processs_later_writes_not_an_older_copy(monkeypatch) -> None:
    """Issue 43: the moves planned on the view's copies, and a copy older than what this process
    wrote since failed its version check: at 10^5 a spread pass moved the first names' heads
    14-44 s before a verdict, and a move transaction of 200 was left whole (scale43r runs 1-2).
    Now a queue this process wrote after the view's copy is planned on its written version
    (or not at all, when that write moved its head off the dead group); a copy a watch says
    changed, with no write of this process since, is still used (a lost CAS at worst). Pure:
    the daemon's planning over a view of stubs, its writes caught. Failing first: q0 and q1
    were planned on the copy's version 1."""
    import types

    from ordq.coordinator.daemon import CoordinatorDaemon
    from ordq.coordinator.daemon_view import STATE, DaemonView, QueueEntry
    from ordq.coordinator.store_base import WrittenStates
    from ordq.coordinator.store_values import StateVersion

    written = WrittenStates()
    store = types.SimpleNamespace(written=written, paths=types.SimpleNamespace(queues="/ordq/queues"),
                                  batches_redone=0, revalidations=0)
    daemon = CoordinatorDaemon(store, identifier="moves-mine")  # type: ignore[arg-type]
    view = DaemonView(store, lambda: None)  # type: ignore[arg-type]
    names = [f"q{i}" for i in range(4)]
    copies = {q: queue(q, "g1") for q in names}
    view.entries = {q: QueueEntry(state=s, version=1, stale=set()) for q, s in copies.items()}
    view.live = frozenset({"g2", "g3"})
    # q0: this process handed its head to g3 since (a spread pass); q1: it wrote q1 (still g1's)
    handed = sm.hand_over(copies["q0"], "g1", 0, "g3")
    assert handed.head == "g3"
    written.note("q0", handed, StateVersion(2, 0))
    bumped = sm.bump_epoch(copies["q1"])
    written.note("q1", bumped, StateVersion(2, 0))
    view.entries["q2"].stale.add(STATE)  # q2: its watch fired, not read again yet
    planned: list[Move] = []

    def caught(parts, _view, _phases):  # type: ignore[no-untyped-def]
        # (the transactions; on the old code windows of them: lists of lists)
        planned.extend(m for p in parts for m in (p if isinstance(p[0], Move) else [m for t in p for m in t]))
        return set()

    monkeypatch.setattr(daemon, "_write_moves", caught)
    daemon._move_dead_heads_now(names, view, 0.0)
    rows = {m.queue: (m.version, m.before) for m in planned}
    assert sorted(rows) == ["q1", "q2", "q3"]  # q0's head is g3's now: nothing to move
    assert rows["q1"] == (StateVersion(2, 0), bumped)
    assert rows["q2"] == (StateVersion(1, 0), copies["q2"]) and rows["q3"] == (StateVersion(1, 0), copies["q3"])


@pytest.mark.zk
def test_the_move_transactions_go_as_a_sliding_window(store: ZkStore, monkeypatch) -> None:
    """Issue 43: a dead group's move transactions went a window at a time (4 sent, then all 4
    awaited, then the next 4): ZooKeeper idled while this process handled the answers and built
    the next window. Now at most ``MOVES_IN_FLIGHT`` are unanswered and the next is sent as
    each answer comes, busy queues' first. Against a real ZooKeeper: the daemon's moves of 24
    queues in 13 transactions, 3 in flight; each send and each wait for an answer noted (1 busy transaction, 12 idle).
    Failing first (495524d): the 4th transaction was sent after the 3rd answer, not the 1st."""
    import time

    from ordq.coordinator import daemon_round, group_moves
    from ordq.coordinator.daemon import CoordinatorDaemon
    from ordq.coordinator.daemon_view import DaemonView, QueueEntry

    add_live_groups(store, GROUPS)
    names = [f"w{i:02d}" for i in range(24)]
    for q in names:
        store.create_queue(q, ["g1", "g2", "g3"])
    _, group_versions = store._drained_with_versions(GROUPS)
    view = DaemonView(store, lambda: None)
    for q in names:
        st_, version = store.load_state_to_write(q)
        assert st_.head == "g1"
        view.entries[q] = QueueEntry(state=st_, version=version.znode, deletions=version.deletions, stale=set())
    view.live, view.group_versions = frozenset({"g2", "g3"}), dict(group_versions)
    daemon = CoordinatorDaemon(store, identifier="sliding")
    daemon._written = {"w23": time.monotonic()}  # written lately: its transaction goes first
    monkeypatch.setattr(daemon_round, "batches", lambda moves: group_moves.batches(moves, max_count=2,
                                                                                   busy_count=2))
    monkeypatch.setattr(daemon_round, "MOVES_IN_FLIGHT", 3)
    events: list[tuple[str, int]] = []
    first_of: dict[int, str] = {}
    real_transaction = store._state_transaction

    class Answer:
        def __init__(self, request, n: int) -> None:  # type: ignore[no-untyped-def]
            self.request, self.n = request, n

        def wait(self, timeout=None):  # type: ignore[no-untyped-def]  # (coordinator/zk_answer.py)
            events.append(("answer", self.n))
            return self.request.wait(timeout)

        def __getattr__(self, name):  # type: ignore[no-untyped-def]  # its value or exception
            return getattr(self.request, name)

    def noted_transaction(writes, versions):  # type: ignore[no-untyped-def]
        tx, checks = real_transaction(writes, versions)
        real_commit = tx.commit_async

        def commit_async():  # type: ignore[no-untyped-def]
            n = sum(1 for kind, _n in events if kind == "send")
            first_of[n] = writes[0][0]
            events.append(("send", n))
            return Answer(real_commit(), n)

        tx.commit_async = commit_async
        return tx, checks

    monkeypatch.setattr(store, "_state_transaction", noted_transaction)
    left = daemon._move_dead_heads_now(names, view, time.monotonic())
    assert left == []
    assert all(store.load_state(q)[0].head != "g1" for q in names)
    sends = [n for kind, n in events if kind == "send"]
    assert sends == list(range(13)) and first_of[0] == "w23"  # the busy queue's transaction first, alone
    unanswered = 0
    for i, (kind, n) in enumerate(events):
        unanswered += 1 if kind == "send" else -1
        assert unanswered <= 3, events
        if kind == "send" and n >= 3:  # the next goes as soon as the one 3 before it is answered
            assert events[i - 1] == ("answer", n - 3), events
