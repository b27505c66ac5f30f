"""Pure tests of the producer and consumer bookkeeping (no I/O)."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError, CoordinationUnavailable, GapDetected, LeaseLost
from ordq.coordinator.client_values import Held
from ordq.coordinator.state import Cursor
from ordq.sdk._consumer_core import CommitConfig, CommitPolicy, DeliveryFilter, FinishedTracker
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk._producer_core import BatchingConfig, ProducerCore, message_bytes
from ordq.sdk._producer_io import FailoverPacing
from ordq.wire.batch import Message


def fake_encode(messages, *, epoch: int, first_seq: int) -> bytes:
    return b"".join(m.payload for m in messages) or b"-"


def core(**cfg) -> ProducerCore:
    return ProducerCore(BatchingConfig(**cfg), epoch=1, next_seq=0, encode=fake_encode)


def test_batches_cut_by_count_bytes_and_linger() -> None:
    c = core(max_batch_messages=3, linger_ms=5, max_batch_bytes=10_000, eager_batches=0)
    for i in range(7):
        assert c.add(Message(payload=b"x"), token=i, now_s=0.0) == i
    ready = c.take_ready(now_s=0.001)  # linger not expired: only the two full batches
    assert [(b.first_seq, b.count) for b in ready] == [(0, 3), (3, 3)]
    assert c.take_ready(now_s=0.004) == []
    assert c.next_deadline() == pytest.approx(0.005)
    ready = c.take_ready(now_s=0.006)
    assert [(b.first_seq, b.count) for b in ready] == [(6, 1)]
    big = core(max_batch_bytes=100, max_inflight_bytes=1000, eager_batches=0)
    big.add(Message(payload=b"a" * 60), 0, 0.0)
    big.add(Message(payload=b"b" * 60), 1, 0.0)
    big.flush()
    assert [b.count for b in big.take_ready(0.0)] == [1, 1]


def test_a_batch_goes_at_once_while_the_pipe_is_idle() -> None:
    """Fewer than eager_batches unacked: no linger (a lone synchronous send is not delayed);
    at eager_batches in flight, batches linger to fill until an ack frees the pipe."""
    c = core(max_batch_messages=100, linger_ms=5, eager_batches=2)
    c.add(Message(payload=b"a"), 0, 0.0)
    assert [b.count for b in c.take_ready(0.0)] == [1]
    c.add(Message(payload=b"b"), 1, 0.0)
    assert [b.count for b in c.take_ready(0.0)] == [1]
    for i in range(2, 5):  # two in flight: these linger together
        c.add(Message(payload=b"c"), i, 0.001)
    assert c.take_ready(0.002) == []
    assert c.next_deadline() == pytest.approx(0.006)
    c.on_ack(0, 0)  # the pipe has room again: the open batch is due now
    assert c.next_deadline() == pytest.approx(0.001)
    assert [(b.first_seq, b.count) for b in c.take_ready(0.002)] == [(2, 3)]
    c.rewind()  # nothing counts as sent after a failover: resends go (gated), the next batch too
    c.add(Message(payload=b"d"), 5, 0.003)
    assert [b.first_seq for b in c.take_ready(0.003)] == [1]  # the new stream acked nothing yet
    c.on_ack(1, 1)
    assert [b.first_seq for b in c.take_ready(0.003)] == [2, 5]


def test_resends_go_only_as_far_as_the_new_stream_acks() -> None:
    """Issue 39: after a rewind a head that stores but never acks gets one resent batch, not
    the window; on one that acks, resent batches in flight grow to RESEND_GROWTH of the bytes
    it acked; batches never sent before follow the resends in seq order."""
    c = core(max_batch_messages=1, linger_ms=0)
    for i in range(20):
        c.add(Message(payload=b"p" * 100), i, 0.0)
    c.flush()
    assert len(c.take_ready(0.0)) == 20
    c.on_ack(0, 0)
    c.rewind()
    c.add(Message(payload=b"new"), 20, 0.0)
    for _ in range(3):  # stalled heads in a row: each is handed the oldest unacked batch only
        assert [b.first_seq for b in c.take_ready(0.0)] == [1]
        assert c.take_ready(0.0) == []
        c.rewind()
    assert [b.first_seq for b in c.take_ready(0.0)] == [1]
    out = []
    while c.unacked:  # a head that acks: stop-and-wait at first, then 1.5x per round trip
        while c.unacked and c.unacked[0].sent:
            c.on_ack(c.unacked[0].first_seq, c.unacked[0].first_seq)
        ready = c.take_ready(0.0)
        if ready:
            out.append([b.first_seq for b in ready])
    assert out == [[2], [3], [4], [5, 6], [7, 8, 9], [10, 11, 12, 13], [14, 15, 16, 17, 18, 19, 20]]


def test_ack_pops_in_order_and_rejects_mismatch() -> None:
    c = core(max_batch_messages=2, linger_ms=0)
    for i in range(4):
        c.add(Message(payload=b"p"), i, 0.0)
    c.take_ready(1.0)
    with pytest.raises(ValueError):
        c.on_ack(2, 3)  # out of order
    assert [b.tokens for b in c.on_ack(0, 1)] == [[0, 1]]
    with pytest.raises(ValueError):
        c.on_ack(2, 2)  # not a batch boundary
    assert [b.tokens for b in c.on_ack(2, 3)] == [[2, 3]]
    assert c.inflight_bytes == 0


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        BatchingConfig(linger_ms=-1)
    with pytest.raises(ConfigError):
        BatchingConfig(max_batch_bytes=10, max_inflight_bytes=5)
    with pytest.raises(TypeError):
        BatchingConfig(2.0)  # keyword-only
    with pytest.raises(ConfigError):
        CommitConfig(every_messages=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["add", "add", "add", "take", "ack", "rewind", "tick"]), max_size=120),
       st.integers(0, 3))
def test_resend_after_rewind_is_exactly_the_unacked_suffix(ops: list[str], eager: int) -> None:
    c = core(max_batch_messages=3, linger_ms=1, eager_batches=eager)
    now = 0.0
    added: list[int] = []
    acked: list[int] = []
    wire: list[int] = []  # seqs as a broker sees them (with resends)
    for op in ops:
        if op == "add":
            added.append(c.add(Message(payload=b"m"), len(added), now))
        elif op == "tick":
            now += 0.002
        elif op == "take":
            for b in c.take_ready(now):
                wire.extend(range(b.first_seq, b.last_seq + 1))
        elif op == "ack" and c.unacked and c.unacked[0].sent:
            b = c.unacked[0]
            acked.extend(t for done in c.on_ack(b.first_seq, b.last_seq) for t in done.tokens)
        elif op == "rewind":
            c.rewind()
            # the new segment starts at the oldest unacked seq
            if c.unacked:
                wire.append(-1)  # marks a failover
        assert c.inflight_batches == sum(b.sent for b in c.unacked)
    assert added == list(range(len(added)))  # gap-free, in order
    assert acked == list(range(len(acked)))  # acks resolve in seq order
    # Between failovers, each wire run is contiguous; after one, it restarts at or before
    # where it stopped: never a gap, so a consumer dropping seq <= last sees every seq once.
    last = -1
    for s in wire:
        if s == -1:
            continue
        assert s <= last + 1
        last = max(last, s)


def test_delivery_filter_drops_duplicates_and_raises_on_gap() -> None:
    f = DeliveryFilter("q", last_seq=-1)
    assert [f.admit(s) for s in (0, 1, 1, 0, 2)] == [True, True, False, False, True]
    assert f.duplicates_dropped == 2
    with pytest.raises(GapDetected) as err:
        f.admit(4)
    assert (err.value.expected_seq, err.value.got_seq) == (3, 4)
    assert f.last_seq == 2  # the gap did not advance anything


def test_commit_policy_by_count_and_time() -> None:
    p = CommitPolicy(CommitConfig(every_messages=3, every_ms=100))
    assert not p.due(0.0)
    p.delivered(2)
    assert not p.due(0.05)
    assert p.due(0.2)
    p.committed(0.2)
    p.delivered(3)
    assert p.due(0.21)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 600), min_size=1, max_size=200), st.integers(1, 8), st.integers(64, 2048))
def test_starts_batch_predicts_exactly_where_add_starts_a_batch(sizes: list[int], per: int, limit: int) -> None:
    """The producer gives each batch one outcome by asking starts_batch before add: a wrong
    prediction would resolve a message with another batch's offsets."""
    c = ProducerCore(BatchingConfig(max_batch_messages=per, max_batch_bytes=limit, max_inflight_bytes=1 << 30),
                     epoch=1, next_seq=0)
    for i, n in enumerate(sizes):
        m = Message(payload=b"x" * n, key=b"k" * (i % 3) or None, headers=(("h", b"v" * (i % 5)),) if i % 2 else ())
        size = message_bytes(m.payload, m.key, m.headers)
        predicted = c.starts_batch(size)
        seq = c.add(m, token=i, now_s=0.0, size=size if i % 2 else None)  # given, or computed by add
        assert seq == i
        assert predicted == (c.open_count == 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), max_size=30))
def test_admit_run_admits_exactly_what_admit_would(runs: list[tuple[int, int]]) -> None:
    """The consumer's fast path (a whole batch at once) and the per-message path agree on
    what is delivered, what is dropped and where a gap stops delivery."""
    def per_message(f: DeliveryFilter, first: int, n: int) -> list[int]:
        return [s for s in range(first, first + n) if f.admit(s)]

    slow, fast = DeliveryFilter("q", last_seq=-1), DeliveryFilter("q", last_seq=-1)
    for first, n in runs:
        try:
            want = per_message(slow, first, n)
        except GapDetected:
            with pytest.raises(GapDetected):
                if not fast.admit_run(first, n):
                    per_message(fast, first, n)
            break
        got = list(range(first, first + n)) if fast.admit_run(first, n) else per_message(fast, first, n)
        assert got == want
        assert fast.last_seq == slow.last_seq


def test_finished_tracker_commits_only_the_contiguous_finished_prefix() -> None:
    t = FinishedTracker()
    for seq in range(5, 9):
        t.dispatched(seq, Cursor(seg=2, offset=seq + 1, last_seq=seq))
    t.finished(6)
    t.finished(8)
    assert t.position is None and t.unfinished == 2  # 5 is still running
    t.finished(5)
    assert t.position == Cursor(seg=2, offset=7, last_seq=6)  # not past 7
    t.moved(Cursor(seg=3, offset=0, last_seq=8))  # the read went on to the next segment
    assert t.position == Cursor(seg=2, offset=7, last_seq=6)
    t.finished(7)
    assert t.position == Cursor(seg=3, offset=0, last_seq=8) and t.pending == 0
    t.moved(Cursor(seg=4, offset=0, last_seq=8))  # nothing outstanding: at once
    assert t.position == Cursor(seg=4, offset=0, last_seq=8)
    with pytest.raises(ValueError):
        t.finished(7)  # twice
    with pytest.raises(ValueError):
        t.dispatched(8, Cursor(seg=4, offset=1, last_seq=8))  # not increasing


@settings(max_examples=300)
@given(st.data())
def test_finished_tracker_matches_a_naive_model(data: st.DataObject) -> None:
    """Any interleaving of dispatches, finishes (in any order) and moves: the position is the
    naive one (after the longest finished prefix), never past an unfinished seq, and reaches
    the last message once all are finished."""
    t = FinishedTracker()
    entries: list[list] = []  # the model: [seq, cursor after it, finished]
    base: Cursor | None = None  # position before any entry (set by a move with nothing outstanding)
    seq, seg = -1, 0

    def model() -> Cursor | None:
        pos = base
        for _, after, done in entries:
            if not done:
                break
            pos = after
        return pos

    for op in data.draw(st.lists(st.sampled_from(["dispatch", "dispatch", "finish", "finish", "move"]),
                                 max_size=80)):
        unfinished = [e for e in entries if not e[2]]
        if op == "dispatch":
            seq += data.draw(st.integers(1, 3))  # increasing; the consumer's seqs are contiguous
            after = Cursor(seg=seg, offset=seq + 1, last_seq=seq)
            t.dispatched(seq, after)
            entries.append([seq, after, False])
        elif op == "finish" and unfinished:
            e = data.draw(st.sampled_from(unfinished))
            e[2] = True
            t.finished(e[0])
        elif op == "move":
            seg += 1
            cur = Cursor(seg=seg, offset=0, last_seq=seq)
            t.moved(cur)
            if entries:
                entries[-1][1] = cur
            else:
                base = cur
        assert t.position == model()
        low = min((e[0] for e in entries if not e[2]), default=None)
        if low is not None and t.position is not None:
            assert t.position.last_seq < low  # never past an unfinished seq
        assert t.unfinished == sum(1 for e in entries if not e[2])
    rest = [e for e in entries if not e[2]]
    for e in data.draw(st.permutations(rest)):
        e[2] = True
        t.finished(e[0])
        assert t.position == model()
    if entries:
        assert t.position == entries[-1][1] and t.pending == 0


def test_failover_pacing_backs_off_after_failovers_and_forgets_them_after_the_window() -> None:
    pacing = FailoverPacing(1.0)  # send timeout 1 s, window 10 timeouts, at most 8x
    assert pacing.ack_timeout(0.0) == 1.0  # a quiet period: a single fault is judged as before
    pacing.failed_over(0.0)
    assert pacing.ack_timeout(0.5) == 2.0
    pacing.failed_over(1.0)
    pacing.failed_over(2.0)
    assert pacing.ack_timeout(2.0) == 8.0
    pacing.failed_over(3.0)
    assert pacing.ack_timeout(3.0) == 8.0  # capped
    assert pacing.recent(10.5) == 3 and pacing.ack_timeout(13.5) == 1.0  # all older than 10 s


class FakeLease:
    """What ``LeaseChecks`` reads of a ``CoordinatorLease``; the test sets whether it holds."""

    def __init__(self) -> None:
        self.holds = True
        self.lost_reason: str | None = None
        self.valid_until = 100.0

    def valid(self) -> bool:
        return self.holds

    def wait_valid(self, timeout_s: float) -> bool:
        return self.holds


def lease_checks(lease: FakeLease, **cfg: object) -> object:
    from ordq.sdk import ConsumerConfig
    from ordq.sdk._consumer_lease import LeaseChecks

    config = ConsumerConfig(zk_hosts="127.0.0.1:2181", queue="q", subscription="s", fetch_wait_ms=0, **cfg)
    return LeaseChecks(lease, config)  # type: ignore[arg-type]


def test_lease_checked_after_the_periodic_commit_starts() -> None:
    """The promise of issue 26: a check made before anything that may block proves nothing
    after it. The lease is confirmed last, after the periodic commit starts (issue 39: it is
    written on its own thread); losing the lease meanwhile hands out nothing (LeaseGone: the
    consumer rejoins, the application sees no error), being unsure of it hands out nothing
    now (False)."""
    from ordq.common.errors import OrdqError
    from ordq.sdk._consumer_lease import LeaseGone

    lease = FakeLease()
    checks = lease_checks(lease)

    def commit_then_deposed(now: float) -> None:
        lease.holds, lease.lost_reason = False, "generation 1 was superseded by 2 (c2)"

    with pytest.raises(LeaseGone, match="superseded") as caught:
        checks.before_hand_out(0.0, commit_then_deposed)
    assert not isinstance(caught.value, OrdqError)  # a signal inside the consumer, not an application error

    lease = FakeLease()
    checks = lease_checks(lease, coordinator_outage_s=60.0)

    def commit_then_unsure(now: float) -> None:
        lease.holds = False

    assert checks.before_hand_out(0.0, commit_then_unsure) is False

    lease = FakeLease()
    checks = lease_checks(lease, commit=CommitConfig(every_ms=5000.0))
    assert checks.before_hand_out(0.0, lambda now: None) is True
    assert checks.next_check == 5.0  # the next timed commit, before the lease runs out
    lease.valid_until = 1.0
    assert checks.before_hand_out(0.0, lambda now: None) is True
    assert checks.next_check == 1.0  # the lease runs out first


def test_handout_finishes_only_what_was_handed_out() -> None:
    from collections import deque

    from ordq.sdk import ConsumerConfig, Delivered
    from ordq.sdk._consumer_commit import Handout
    from ordq.sdk._consumer_types import ConsumerStats

    read_at = Cursor(seg=0, offset=5, last_seq=4)
    h = Handout(ConsumerConfig(zk_hosts="127.0.0.1:2181", queue="q", subscription="s"),
                CommitPolicy(CommitConfig()), ConsumerStats(), audit=None, read_position=lambda: read_at)
    h.finished_base = Cursor(seg=0)
    h.buffer = deque(Delivered(i, 0, i, b"", None, (), 0) for i in range(5))
    first = h.take(2)
    assert [m.seq for m in first] == [0, 1] and h.finished_pos() == Cursor(seg=0)  # in hand: not finished
    h.mark_finished(first[0])
    assert h.finished_pos() == Cursor(seg=0, offset=1, last_seq=0)
    with pytest.raises(ConfigError):
        h.mark_finished(Delivered(3, 0, 3, b"", None, (), 0))  # not handed out yet
    h.finish_handed()
    assert h.finished_pos() == Cursor(seg=0, offset=2, last_seq=1)
    h.take(None)
    h.finish_handed()  # nothing left in the buffer: the read position itself
    assert h.finished_pos() == read_at


class _FailOverStub:
    """The parts of ``ProducerIO._fail_over`` meets: a coordinator that answers FailOver with
    ``CoordinationUnavailable`` (its ZooKeeper silent) ``outage`` times, then with a new head,
    and Describe with the live processes of the queue's groups (one call per failover)."""

    def __init__(self, outage: int, *, no_group_timeout_s: float = 30.0) -> None:
        from ordq.coordinator.client import Described
        from ordq.coordinator.state import QueueState, Segment
        from ordq.coordinator.store_values import LiveInfo
        from ordq.sdk import ProducerConfig
        from ordq.sdk._producer_io import ProducerIO

        class Coordinator:
            calls = 0
            describes = 0
            state = QueueState("q", groups=("g1", "g2"), send=("g2",), consume=(Segment(1, "g2"),), producer_epoch=1)

            def fail_over(self, queue: str, gid: str, seg: int, epoch: int, key: str, *, wait_s: float) -> object:
                Coordinator.calls += 1
                if Coordinator.calls <= outage:
                    raise CoordinationUnavailable("ZooKeeper unreachable: no answer in time")
                return self.state

            def describe(self, queue: str, *, with_live: bool = False, timeout_s: float | None = None) -> Described:
                Coordinator.describes += 1
                live = {g: {"master": LiveInfo(address=f"{g}:1", incarnation="i", pid=0)} for g in ("g1", "g2")}
                return Described(state=self.state, version=1, live=live if with_live else None)

        class Core:
            epoch = 1

        self.coordinator = Coordinator()
        io = ProducerIO.__new__(ProducerIO)
        io.config = ProducerConfig(zk_hosts="127.0.0.1:2181", queue="q", no_group_timeout_s=no_group_timeout_s)
        io._gid, io._seg, io._core, io._epoch_key, io._closed = "g1", 0, Core(), "key", False  # type: ignore[assignment]
        io._pacing = FailoverPacing(io.config.send_timeout_s)
        io._mutex, io._fo = threading.RLock(), None  # no failover timing recorded here
        io._links = {}  # the masters' lean produce links, as looked up (none here)
        io._require_coordinator = lambda: self.coordinator  # type: ignore[method-assign]
        self.io = io


def test_failover_waits_out_a_coordinator_whose_zookeeper_is_silent_within_its_bound() -> None:
    """A coordinator that cannot reach ZooKeeper answers FailOver CoordinationUnavailable (after
    its store's request timeout): transient, like a ZooKeeper outage anywhere else. The producer
    asks again until ``no_group_timeout_s`` from the failure, not only once (issue 26: a quorum
    lost for 7.5 s under load made the producer give up for good at the first answer)."""
    stub = _FailOverStub(outage=3)
    assert stub.io._fail_over() == ("g2", 1, "g2:1")
    assert stub.coordinator.calls == 4
    assert stub.coordinator.describes == 1  # the new head's master: one Describe after the answer


def test_failover_gives_up_when_its_bound_runs_out_with_the_coordinator_s_answer() -> None:
    stub = _FailOverStub(outage=1 << 30, no_group_timeout_s=0.3)
    with pytest.raises(CoordinationUnavailable, match="no answer in time"):
        stub.io._fail_over()
    assert stub.coordinator.calls >= 2


# -- the queue view: an idle reader's Describes back off (issue 39) -------------------------------


class _ViewClock:
    def __init__(self) -> None:
        self.t = 128.0

    def __call__(self) -> float:
        return self.t


def _view(every_s: float, stamp: list[int] | None = None) -> tuple[object, _ViewClock, list[float]]:
    """A QueueView on a stub coordinator that records when it was asked (no I/O); ``stamp``:
    the state's stamp its Describes answer (``stamp[0]``, changed by the caller; none: 0, not
    told, as a coordinator before stamps)."""
    from ordq.coordinator.client import Described
    from ordq.coordinator.state import QueueState
    from ordq.sdk._queue_view import QueueView

    clock = _ViewClock()
    asked: list[float] = []

    class Coordinator:
        def describe(self, queue: str, **_kw: object) -> Described:
            asked.append(clock.t)
            return Described(state=QueueState(queue), version=1, live={}, zxid=stamp[0] if stamp else 0)

    view = QueueView(Coordinator(), "q", "s", every_s=every_s, clock=clock)  # type: ignore[arg-type]
    view.state()
    asked.clear()
    return view, clock, asked


def _round(view: object, clock: _ViewClock, wait_s: float, got_batches: bool) -> None:
    """One read round as SegmentReader makes it at an open segment: a fetch that waited
    ``wait_s`` (or answered batches at once), then the view told of it."""
    clock.t += 2**-10 if got_batches else wait_s
    if got_batches:
        view.reading()  # type: ignore[attr-defined]
    else:
        view.idle()  # type: ignore[attr-defined]
    view.state()  # type: ignore[attr-defined]


def test_an_idle_reader_describes_the_queue_less_and_less_often_up_to_once_a_second() -> None:
    """At the end of an open segment with a fetch wait of 62.5 ms (a binary fraction: exact
    sums) for 10 s: 160 Describes before (one per fetch wait); now one at the first empty
    answer, then after 125 ms, 250, 500 ms, then one a second (IDLE_MAX_S). After it read
    again, the next wait starts at one fetch wait again (a failover right after the traffic
    stops is learnt as soon as before)."""
    from ordq.sdk._queue_view import IDLE_MAX_S

    wait = 0.0625
    view, clock, asked = _view(wait)
    for _ in range(160):
        _round(view, clock, wait, got_batches=False)
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[:3] == [0.125, 0.25, 0.5] and set(gaps[3:]) == {IDLE_MAX_S}, gaps
    assert len(asked) <= 4 + 10 / IDLE_MAX_S, len(asked)
    _round(view, clock, wait, got_batches=True)
    asked.clear()
    _round(view, clock, wait, got_batches=False)
    assert len(asked) == 1  # the last Describe is old: at the first empty answer, as before
    _round(view, clock, wait, got_batches=False)
    _round(view, clock, wait, got_batches=False)
    assert len(asked) == 2  # then after two fetch waits


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=300), st.sampled_from([0.05, 0.2, 1.0, 3.0]))
def test_an_idle_reader_is_never_left_without_a_describe_past_the_cap(rounds: list[bool], every_s: float) -> None:
    """Whatever the pattern of reads and waits: no idle reader goes longer than its cap
    (``max(every_s, IDLE_MAX_S)`` and one fetch wait) without a Describe, and none is made
    sooner than ``every_s`` after the last."""
    from ordq.sdk._queue_view import IDLE_MAX_S

    view, clock, asked = _view(every_s)
    last = clock.t
    for got in rounds:
        before = len(asked)
        _round(view, clock, every_s, got_batches=got)
        if len(asked) > before:
            assert asked[-1] - last >= every_s - 1e-9 or got
            last = asked[-1]
        elif not got:
            assert clock.t - last <= max(every_s, IDLE_MAX_S) + every_s + 1e-9


def _idle_rounds_with_renewals(view: object, clock: _ViewClock, seconds: float, stamp: list[int],
                               renew_every_s: float = 0.75, wait_s: float = 0.0625) -> None:
    """Idle read rounds for ``seconds``, with a lease renewal every ``renew_every_s`` that reads
    the stamp ``stamp[0]`` (``QueueView.heard``, sent at its round's time)."""
    next_renewal = clock.t
    end = clock.t + seconds
    while clock.t < end:
        if clock.t >= next_renewal and view.idling:  # type: ignore[attr-defined]
            view.heard(stamp[0], clock.t)  # type: ignore[attr-defined]
            next_renewal = clock.t + renew_every_s
        _round(view, clock, wait_s, got_batches=False)


def test_an_idle_reader_whose_renewals_find_its_states_stamp_makes_no_describe() -> None:
    """Guard: ``QueueView.idle`` counts a lease renewal that read the cached state's own stamp
    as a fresh read (stop 100: 40 idle consumers took 20-23 % of a core of the coordinator
    with a Describe a second each). Before: 23 Describes in 20 s, one a second after the first
    ones; now only the first ones (at 62.5, 125, 250, 500 ms), until the idle wait outgrows
    the renewals' period (0.75 s at a ttl of 3 s) and they vouch for the state."""
    stamp = [7]
    view, clock, asked = _view(0.0625, stamp)
    _idle_rounds_with_renewals(view, clock, 20.0, stamp)
    assert len(asked) <= 4 and all(t < 129.5 for t in asked), asked


def test_a_renewal_that_finds_a_later_stamp_or_the_queue_gone_brings_a_describe_at_once() -> None:
    """A later stamp (the state changed after the cached read) or -1 (the queue or the
    subscription is gone): Describe at the next round, not after the idle wait. An earlier
    stamp (a renewal that read before the cached Describe), or a -1 sent before that Describe
    answered, is not news."""
    stamp = [7]
    view, clock, asked = _view(0.0625, stamp)
    _idle_rounds_with_renewals(view, clock, 5.0, stamp)
    asked.clear()
    stamp[0] = 9
    view.heard(9, clock.t)  # type: ignore[attr-defined]
    _round(view, clock, 0.0625, got_batches=False)
    assert len(asked) == 1  # at once
    view.heard(8, clock.t)  # type: ignore[attr-defined]  # read before that Describe: older
    _round(view, clock, 0.0625, got_batches=False)
    assert len(asked) == 1
    view.heard(-1, clock.t - 1.0)  # type: ignore[attr-defined]  # sent before the Describe answered
    _round(view, clock, 0.0625, got_batches=False)
    assert len(asked) == 1
    view.heard(-1, clock.t)  # type: ignore[attr-defined]
    _round(view, clock, 0.0625, got_batches=False)
    assert len(asked) == 2


def test_a_state_learnt_without_its_stamp_is_not_vouched_for_by_renewals() -> None:
    """``learnt`` (a seal's or a pop's answer): the state's stamp is not known, so a renewal's
    stamp (of the state before, or after) proves nothing: the idle Describes come back, one a
    second, until a Describe tells the stamp again."""
    from ordq.coordinator.state import QueueState
    from ordq.sdk._queue_view import IDLE_MAX_S

    stamp = [7]
    view, clock, asked = _view(0.0625, stamp)
    _idle_rounds_with_renewals(view, clock, 5.0, stamp)
    view.learnt(QueueState("q"))  # type: ignore[attr-defined]
    asked.clear()
    started = clock.t
    _idle_rounds_with_renewals(view, clock, 0.9 * IDLE_MAX_S, stamp)
    assert asked and asked[0] <= started + IDLE_MAX_S, asked  # Described again: the stamp known again


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.3, 0.75, 1.5]), st.sampled_from([0, 1, 2])),
                min_size=1, max_size=300))
def test_an_idle_reader_is_never_unsure_of_its_state_past_the_cap(rounds: list[tuple[bool, float, int]]) -> None:
    """Whatever the reads, renewals (late or not, with the same stamp, a later one, or a
    stale one): at every idle round the cached state was read by a Describe, or vouched for by
    a renewal that read its stamp, at most ``IDLE_MAX_S`` and one fetch wait before, and a
    later stamp heard is Described at the next round."""
    from ordq.sdk._queue_view import IDLE_MAX_S

    wait = 0.0625
    stamp = [7]
    view, clock, asked = _view(wait, stamp)
    sure_at = clock.t
    for got, renew_after, change in rounds:
        if not got and renew_after and view.idling:  # type: ignore[attr-defined]
            clock.t += renew_after
            stamp[0] += change  # a change between the Describe and this renewal: a later stamp
            heard = stamp[0]
            view.heard(heard, clock.t)  # type: ignore[attr-defined]
            described = len(asked)
            _round(view, clock, wait, got_batches=False)
            if change:
                assert len(asked) == described + 1  # at once
            else:
                sure_at = max(sure_at, clock.t - wait)
        else:
            _round(view, clock, wait, got_batches=got)
        if asked and asked[-1] > sure_at:
            sure_at = asked[-1]
        if not got:
            assert clock.t - sure_at <= IDLE_MAX_S + wait + max(renew_after, 0.0) + 1e-9, (clock.t, sure_at)


class _ReleasingCoordinator:
    """What ``CoordinatorLease`` calls of a coordinator: grants at once; a renewal in flight
    when the holder releases is answered LeaseLost("it was released"), as the leader answers
    a Heartbeat that arrives after the Release."""

    def __init__(self) -> None:
        self.renewing = threading.Event()
        self.released = threading.Event()

    def acquire(self, kind: str, queue: str, sub: str, holder: str, **_: object) -> Held:
        return Held(kind=kind, queue=queue, sub=sub, holder=holder, generation=1, key="k", ttl_ms=200)

    def heartbeat(self, lease: Held, **_: object) -> Held:
        self.renewing.set()
        self.released.wait(10)
        raise LeaseLost(lease.kind, lease.queue, lease.sub, "it was released")

    def release(self, lease: Held, **_: object) -> None:
        self.released.set()


def test_a_renewal_overtaken_by_the_holders_own_release_is_not_a_lost_lease(caplog: pytest.LogCaptureFixture
                                                                           ) -> None:
    """A consumer closing while its renewal was in flight logged "consumer lease of
    ledger/payments lost: it was released" (docs/SDK.md's run, heavy tier, stop 64): its own
    release, not a loss; nothing is said and nothing counted."""
    coord = _ReleasingCoordinator()
    lease = CoordinatorLease(coord, "consumer", "ledger", "payments", "c1", ttl_s=0.2)  # type: ignore[arg-type]
    assert lease.acquire(5)
    assert coord.renewing.wait(10)
    with caplog.at_level(logging.WARNING, logger="ordq.lease"):
        lease.stop()
        thread = lease._thread
        assert thread is not None
        thread.join(10)
    assert not [r for r in caplog.records if "lost" in r.getMessage()], caplog.text
    assert lease.stats.lost == 0


def _reader_at(state: object, start: Cursor) -> tuple[object, list[Cursor], list[int | None]]:
    """A SegmentReader on a stub view of ``state`` (no coordinator, no broker: a round at a
    sealed segment's end reads nothing), with what it reports as moved and as done."""
    from ordq.sdk._consumer_read import SegmentReader
    from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats

    class View:
        def state(self) -> object:
            return state

        def cached(self) -> object:
            return state

        def mark_changed(self) -> None:
            pass

    moved: list[Cursor] = []
    done: list[int | None] = []
    reader = SegmentReader(ConsumerConfig(queue="q", subscription="s", bootstrap="127.0.0.1:1"), View(), None, None,  # type: ignore[arg-type]
                           ConsumerStats(), start=start, moved=moved.append, segment_done=done.append,
                           lease_confirmed=lambda: True)
    return reader, moved, done


def test_at_a_sealed_segment_s_end_the_reader_moves_to_the_next_segment_the_list_holds() -> None:
    """The resend storm (tests/test_producer_resend.py with a timing change): segs 1 and 2 were
    sealed empty and dropped from the middle of the list (state.drop_empty), leaving 0, 3, 4.
    At seg 0's end the reader moved to seg 0 + 1, a segment the list no longer holds; the
    consumer committed that cursor, and the pop of seg 0 it then asked for left the cursor before
    the new head (I5): the consumer died. It moves to seg 3, the next one the list holds; with an
    older copy of the list that still holds seg 1 (empty), to seg 1, and from its end on."""
    from ordq.coordinator.state import QueueState, Segment, SegStatus

    sealed = SegStatus.SEALED
    now = QueueState("q", groups=("g1", "g2", "g3"), send=("g2", "g3"), next_seg=5, consume=(
        Segment(0, "g1", sealed, end=3, first_seq=0, last_seq=2),
        Segment(3, "g2", sealed, end=5, first_seq=3, last_seq=7),
        Segment(4, "g2")))
    reader, moved, done = _reader_at(now, Cursor(seg=0, offset=3, last_seq=2))
    assert reader.read_round(0) == []  # type: ignore[attr-defined]
    assert moved == [Cursor(seg=3, offset=0, last_seq=2)] and done == [2]
    assert reader.cursor == Cursor(seg=3, offset=0, last_seq=2)  # type: ignore[attr-defined]
    # an older copy: seg 1 still in it (sealed empty)
    older = QueueState("q", groups=now.groups, send=now.send, next_seg=5, consume=(
        now.consume[0], Segment(1, "g2", sealed, end=0), *now.consume[1:]))
    reader, moved, done = _reader_at(older, Cursor(seg=0, offset=3, last_seq=2))
    reader.read_round(0)  # type: ignore[attr-defined]
    reader.read_round(0)  # type: ignore[attr-defined]
    assert moved == [Cursor(seg=1, offset=0, last_seq=2), Cursor(seg=3, offset=0, last_seq=2)]
    assert done == [2, None]
    # at a sealed tail's end (nothing after it yet): next_seg, where the next segment opens
    tail = QueueState("q", groups=now.groups, next_seg=4, consume=now.consume[:2])
    reader, moved, _ = _reader_at(tail, Cursor(seg=3, offset=5, last_seq=7))
    reader.read_round(0)  # type: ignore[attr-defined]
    assert moved == [Cursor(seg=4, offset=0, last_seq=7)]
