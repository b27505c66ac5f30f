"""Pure tests of the coordinator state machine: examples, properties, and proof that each
invariant check fires when a transition is broken."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ordq.common.errors import IllegalTransition, InvariantViolation
from ordq.coordinator import state as sm
from ordq.coordinator.state import Cursor, Facts, QueueState, Segment, SegStatus

GROUPS = ("g1", "g2", "g3")
ALL_LIVE = Facts(live_groups=frozenset(GROUPS))


def started() -> QueueState:
    return sm.admit_all(sm.create("q", GROUPS), ALL_LIVE)


@attrs.define
class SegmentsModel:
    """One queue's state beside what its segments hold (seg -> seqs acked into it, on both
    replicas): the moves the property tests share, so each test adds only what it checks."""

    state: QueueState = attrs.field(factory=started)
    live: set[str] = attrs.field(factory=lambda: set(GROUPS))
    stored: dict[int, list[int]] = attrs.field(factory=dict)
    next_seq: int = 0

    def facts(self, cursors: dict[str, Cursor]) -> Facts:
        return Facts(live_groups=frozenset(self.live), cursors=dict(cursors))

    def write(self, n: int) -> None:
        assert self.state.open_segment is not None
        for _ in range(n):
            self.stored.setdefault(self.state.open_segment.seg, []).append(self.next_seq)
            self.next_seq += 1

    def seal_one(self, n: int) -> None:
        """Seals the nth sealing segment (modulo) at the end its replicas hold, if any seals."""
        sealing = [x for x in self.state.consume if x.status is SegStatus.SEALING]
        if sealing:
            t = sealing[n % len(sealing)]
            held = self.stored.get(t.seg, [])
            self.state = sm.seal(self.state, t.seg, len(held), held[0] if held else None, held[-1] if held else None)

    def shared_step(self, op: str, gid: str, n: int, facts: Facts) -> bool:
        """Applies the ops every model test has (write, blip, seal, live, admit_all); False if
        ``op`` is not one of them (the test applies its own)."""
        open_seg = self.state.open_segment
        if op == "write":
            if open_seg is not None:
                self.write(n)
        elif op == "blip":
            if open_seg is not None:
                self.state = sm.fail_over(self.state, open_seg.gid, open_seg.seg, facts)
        elif op == "seal":
            self.seal_one(n)
        elif op == "live":
            self.live ^= {gid}
        elif op == "admit_all":
            self.state = sm.admit_all(self.state, facts)
        else:
            return False
        return True

    def unread_from_earliest(self) -> list[int]:
        """What a reader from 'earliest' gets now, in list order."""
        reader = self.state.earliest_cursor()
        return [q for x in self.state.consume if x.seg >= reader.seg for q in self.stored.get(x.seg, [])
                if q > reader.last_seq]


def test_admit_opens_segment_on_first_head() -> None:
    s = sm.admit(sm.create("q", GROUPS), "g2", ALL_LIVE)
    assert s.send == ("g2",)
    assert s.consume == (Segment(seg=0, gid="g2", status=SegStatus.OPEN),)
    assert s.next_seg == 1
    s = sm.admit(s, "g1", ALL_LIVE)  # not head: no new segment
    assert s.send == ("g2", "g1") and len(s.consume) == 1


def test_admit_refuses_dead_member_backlog_and_duplicates() -> None:
    q = sm.create("q", GROUPS)
    with pytest.raises(IllegalTransition, match="not live"):
        sm.admit(q, "g1", Facts(live_groups=frozenset({"g2"})))
    with pytest.raises(IllegalTransition, match="does not serve"):
        sm.admit(q, "gX", ALL_LIVE)
    s = sm.admit(q, "g1", ALL_LIVE)
    with pytest.raises(IllegalTransition, match="already in the send list"):
        sm.admit(s, "g1", ALL_LIVE)
    s = sm.fail_over(sm.admit(s, "g2", ALL_LIVE), "g1", 0, ALL_LIVE)
    # issue 23: backlog (segment 0) no longer keeps a live group out; it joins at the tail
    assert sm.admit(s, "g1", ALL_LIVE).send == ("g2", "g1")


def test_fail_over_seals_and_opens_on_next_head() -> None:
    s = sm.fail_over(started(), "g1", 0, ALL_LIVE)
    assert s.send == ("g2", "g3")
    assert [(x.seg, x.gid, x.status) for x in s.consume] == [
        (0, "g1", SegStatus.SEALING),
        (1, "g2", SegStatus.OPEN),
    ]


def test_fail_over_is_conditional_on_the_head_and_segment() -> None:
    s = started()
    with pytest.raises(IllegalTransition):
        sm.fail_over(s, "g2", 0, ALL_LIVE)  # not the head
    with pytest.raises(IllegalTransition):
        sm.fail_over(s, "g1", 7, ALL_LIVE)  # not its open segment
    moved = sm.fail_over(s, "g1", 0, ALL_LIVE)
    with pytest.raises(IllegalTransition):
        sm.fail_over(moved, "g1", 0, ALL_LIVE)  # a second party racing: must follow instead


def test_fail_over_with_empty_send_list_admits_eligible_or_leaves_none_open() -> None:
    s = sm.admit(sm.create("q", GROUPS), "g1", ALL_LIVE)
    s = sm.fail_over(s, "g1", 0, Facts(live_groups=frozenset()))
    assert s.send == () and s.open_segment is None
    s2 = sm.admit(s, "g3", ALL_LIVE)
    assert s2.open_segment == Segment(seg=1, gid="g3")
    t = sm.admit(sm.create("q", GROUPS), "g1", ALL_LIVE)
    t = sm.fail_over(t, "g1", 0, ALL_LIVE)  # g1 just failed over: admitted, but last
    assert t.send == ("g2", "g3", "g1") and t.open_segment == Segment(seg=1, gid="g2")
    alone = sm.fail_over(sm.admit(sm.create("q", ("g1",)), "g1", ALL_LIVE), "g1", 0, ALL_LIVE)
    assert alone.send == ("g1",) and alone.open_segment == Segment(seg=1, gid="g1")  # the only one: writable


def test_a_group_holding_only_a_segment_sealed_empty_is_admitted_again() -> None:
    """Both heads lost in turn, the first failed over onto while its dead master still looked
    live: the queue's last segment is sealed empty on g1. No cursor can pass the last segment,
    so it is never popped; counted as backlog it kept g1 out for good (the producer waited
    forever: tests/test_failover.py::test_every_group_lost_in_turn_then_one_returns)."""
    s = sm.admit(sm.create("q", ("g1", "g2")), "g1", ALL_LIVE)
    s = sm.fail_over(sm.admit(s, "g2", ALL_LIVE), "g1", 0, ALL_LIVE)  # g1 -> g2 seg 1
    s = sm.pop(sm.seal(s, 0, 5, 0, 4), Facts(cursors={"a": Cursor(seg=1, offset=1, last_seq=5)}))
    s = sm.fail_over(s, "g2", 1, Facts(live_groups=frozenset({"g1"})))  # g1 looks live: seg 2 opened on it
    s = sm.fail_over(s, "g1", 2, Facts(live_groups=frozenset()))  # and lost before any write
    s = sm.seal(sm.seal(s, 1, 5, 5, 9), 2, 0, None, None)
    read = Facts(live_groups=frozenset({"g1"}), cursors={"a": Cursor(seg=2, offset=0, last_seq=9)})
    s = sm.pop(s, read)
    assert [(x.seg, x.gid, x.end) for x in s.consume] == [(2, "g1", 0)] and s.send == ()
    back = sm.admit(s, "g1", read)
    assert back.send == ("g1",) and back.open_segment == Segment(seg=3, gid="g1")
    # (issue 23) a segment with messages no longer keeps it out either
    assert sm.admit(sm.seal(sm.fail_over(back, "g1", 3, Facts()), 3, 1, 10, 10), "g1", read).send == ("g1",)


def test_roll_seals_the_open_segment_and_continues_on_the_same_head() -> None:
    s = started()
    rolled = sm.roll(s, "g1", 0)
    assert rolled.send == s.send and rolled.head == "g1"
    assert [(x.seg, x.gid, x.status) for x in rolled.consume] == [(0, "g1", SegStatus.SEALING),
                                                                  (1, "g1", SegStatus.OPEN)]
    with pytest.raises(IllegalTransition):
        sm.roll(rolled, "g1", 0)  # a second roller racing: the segment is no longer open
    with pytest.raises(IllegalTransition):
        sm.roll(rolled, "g2", 1)  # not the head
    sealed = sm.seal(rolled, 0, 5, 0, 4)
    read_on = Facts(live_groups=frozenset(GROUPS), cursors={"a": Cursor(seg=1, offset=1, last_seq=5)})
    popped = sm.pop(sealed, read_on)
    assert [x.seg for x in popped.consume] == [1]  # consumed: the disk can be freed


def test_roll_to_next_moves_writes_on_and_the_old_head_rejoins_once_drained() -> None:
    s = sm.admit(sm.admit(sm.create("q", GROUPS), "g1", ALL_LIVE), "g2", ALL_LIVE)
    assert s.send == ("g1", "g2")
    rolled = sm.roll(s, "g1", 0, ALL_LIVE, to_next=True)
    assert rolled.send == ("g2",)  # g1 holds segment 0 now: it waits outside the send list
    assert [(x.seg, x.gid, x.status) for x in rolled.consume] == [(0, "g1", SegStatus.SEALING),
                                                                  (1, "g2", SegStatus.OPEN)]
    assert rolled.eligible("g1", ALL_LIVE)  # issue 23: with backlog, it may rejoin at the tail
    with pytest.raises(IllegalTransition) as refused:  # a second roller racing, to next as well
        sm.roll(rolled, "g1", 0, ALL_LIVE, to_next=True)
    assert refused.value.transition == "roll"
    # Read and popped, g1 has no backlog and rejoins at the tail.
    popped = sm.pop(sm.seal(rolled, 0, 5, 0, 4),
                    Facts(live_groups=frozenset(GROUPS), cursors={"a": Cursor(seg=1, offset=1, last_seq=5)}))
    assert sm.admit(popped, "g1", ALL_LIVE).send == ("g2", "g1")
    # The only group that can take writes rolls on itself.
    only_g1 = sm.admit(sm.create("q", GROUPS), "g1", ALL_LIVE)
    alone = sm.roll(only_g1, "g1", 0, Facts(live_groups=frozenset({"g1"})), to_next=True)
    assert alone.send == ("g1",) and alone.open_segment == Segment(seg=1, gid="g1")
    # With nobody else in the send list, the eligible groups are admitted (as in fail_over).
    moved = sm.roll(only_g1, "g1", 0, ALL_LIVE, to_next=True)
    assert moved.send == ("g2", "g3", "g1") and moved.open_segment == Segment(seg=1, gid="g2")


def test_seal_and_pop_lifecycle() -> None:
    s = sm.fail_over(started(), "g1", 0, ALL_LIVE)
    with pytest.raises(IllegalTransition):
        sm.pop(s, Facts(cursors={"a": Cursor(seg=1)}))  # still sealing
    s = sm.seal(s, 0, end=10, first_seq=0, last_seq=9)
    with pytest.raises(IllegalTransition, match="sealed"):
        sm.seal(s, 0, end=10, first_seq=0, last_seq=9)  # SEALED -> SEALED is not a move
    with pytest.raises(IllegalTransition, match="have not passed"):
        sm.pop(s, Facts(cursors={"a": Cursor(seg=1), "b": Cursor(seg=0, offset=10)}))
    with pytest.raises(IllegalTransition, match="no subscription"):
        sm.pop(s, Facts())
    popped = sm.pop(s, Facts(cursors={"a": Cursor(seg=1, offset=1, last_seq=10), "b": Cursor(seg=1, last_seq=9)}))
    assert [x.seg for x in popped.consume] == [1] and popped.trimmed_seq == 9
    assert popped.earliest_cursor() == Cursor(seg=1, offset=0, last_seq=9)
    assert sm.admit(popped, "g1", ALL_LIVE).send == ("g2", "g3", "g1")
    assert sm.pop(sm.seal(sm.roll(s, "g2", 1), 1, 1, 10, 10), Facts(),
                  retention=True).consume[0].seg == 1


def test_the_segment_with_the_newest_message_stays_until_a_later_one_is_stored() -> None:
    """Issue 16: after a failover to a group that got nothing yet, popping the segment with
    the newest message left a new producer leader with only its seq (``last_committed()``
    message None) and a binlog shipper could not resume."""
    s = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, end=10, first_seq=0, last_seq=9)
    read_all = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=1, last_seq=9)})
    assert sm.holds_newest(s, read_all)
    for retention in (False, True):
        with pytest.raises(IllegalTransition, match="newest message"):
            sm.pop(s, read_all, retention=retention)
    assert sm.admit(s, "g1", read_all).send == ("g2", "g3", "g1")  # issue 23: kept, it may still take writes
    # A cursor past seq 9 proves a later message: the segment may go.
    read_on = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=1, offset=1, last_seq=10)})
    assert sm.pop(s, read_on).consume[0].seg == 1
    # So does a later segment sealed with messages (nobody has to have read them).
    rolled = sm.seal(sm.roll(s, "g2", 1), 1, end=1, first_seq=10, last_seq=10)
    assert sm.pop(rolled, Facts(), retention=True).consume[0].seg == 1
    # So does the caller's word that the open segment holds one (the daemon asks the head master).
    assert sm.pop(s, read_all, later_stored=True).consume[0].seg == 1
    # A later segment sealed empty proves nothing.
    empty = sm.seal(sm.fail_over(s, "g2", 1, ALL_LIVE), 1, end=0, first_seq=None, last_seq=None)
    with pytest.raises(IllegalTransition, match="newest message"):
        sm.pop(empty, read_all)
    # With no group left to write, liveness wins: the segment goes and its group may rejoin.
    g1_only = Facts(live_groups=frozenset({"g1"}), cursors={"a": Cursor(seg=2, last_seq=9)})
    stuck = sm.fail_over(empty, "g3", 2, Facts(cursors=g1_only.cursors))  # nobody live at that moment
    assert stuck.send == () and not sm.holds_newest(stuck, g1_only)
    assert sm.admit(sm.pop(stuck, g1_only), "g1", g1_only).send == ("g1",)


def test_a_segment_sealed_empty_goes_without_a_subscription() -> None:
    """Issue 43: every session blip of an idle queue's head group failed it over and left a
    segment sealed empty; with no subscription ``pop`` kept them all (8 blips, 8 segments).
    One that holds nothing goes; one that holds a message stays; a subscription at or before
    the empty one keeps it until it passes."""
    blip = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, end=0, first_seq=None, last_seq=None)
    popped = sm.pop(blip, Facts())
    assert [x.seg for x in popped.consume] == [1] and popped.trimmed_seq == -1
    assert popped.earliest_cursor() == Cursor(seg=1, offset=0, last_seq=-1)
    with pytest.raises(IllegalTransition, match="have not passed"):
        sm.pop(blip, Facts(cursors={"a": Cursor(seg=0)}))
    assert sm.pop(blip, Facts(cursors={"a": Cursor(seg=1)})).consume[0].seg == 1
    held = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, end=3, first_seq=0, last_seq=2)
    with pytest.raises(IllegalTransition, match="no subscription"):
        sm.pop(held, Facts())
    # an empty segment behind one that holds messages stays too: only the head goes (the
    # consumer moves by segment id)
    behind = sm.seal(sm.fail_over(held, "g2", 1, ALL_LIVE), 1, end=0, first_seq=None, last_seq=None)
    with pytest.raises(IllegalTransition, match="no subscription"):
        sm.pop(behind, Facts())
    # still sealing (its end not decided): never
    with pytest.raises(IllegalTransition, match="not sealed"):
        sm.pop(sm.fail_over(started(), "g1", 0, ALL_LIVE), Facts())


blip_ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "blip", "blip", "seal", "pop", "pop", "live", "admit_all", "subscribe", "read"]),
        st.sampled_from(GROUPS),
        st.integers(min_value=0, max_value=4),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(blip_ops)
@example([("blip", "g1", 0), ("seal", "g1", 0), ("pop", "g1", 0)])
# a head holding messages behind a later one holding the newest: no subscription read it, so it stays
@example([("write", "g1", 2), ("blip", "g1", 0), ("seal", "g1", 0), ("write", "g1", 1), ("blip", "g2", 0),
          ("seal", "g1", 0), ("pop", "g1", 0)])
@example([("write", "g1", 2), ("blip", "g1", 0), ("seal", "g1", 0), ("blip", "g2", 0), ("seal", "g1", 0),
          ("pop", "g1", 0), ("subscribe", "g1", 0), ("read", "g1", 0), ("pop", "g1", 0)])
def test_popping_empty_segments_drops_no_message_and_passes_no_subscription(seq: list[tuple[str, str, int]]) -> None:
    """Session blips (failovers of whichever group heads), writes, seals, pops, and a
    subscription that may come at any time, from 'earliest': a pop never drops a segment
    holding a message before every subscription passed it (none without a subscription),
    never one a subscription has not passed; with no subscription no empty sealed segment is
    left at the head after a pop; and a reader from 'earliest' at the end gets every message
    ever written, in order, exactly once (nothing was dropped before anyone could read it)."""
    m = SegmentsModel()
    cursors: dict[str, Cursor] = {}
    for op, gid, n in seq:
        facts = m.facts(cursors)
        before = m.state
        try:
            if m.shared_step(op, gid, n, facts):
                pass
            elif op == "pop":
                m.state = sm.pop(m.state, facts)
                gone = before.consume[0]
                assert all(c.seg > gone.seg for c in cursors.values())  # every subscription passed it
                if not cursors:
                    assert gone.holds_nothing and not m.stored.get(gone.seg)  # nothing anyone could read
            elif op == "subscribe" and "s" not in cursors:
                cursors["s"] = m.state.earliest_cursor()
            elif op == "read" and "s" in cursors:
                cur = cursors["s"]
                target = m.state.segment(cur.seg)
                if target is not None and target.status is SegStatus.SEALED:
                    later = [x.seg for x in m.state.consume if x.seg > target.seg]
                    last = max([cur.last_seq] + m.stored.get(target.seg, [])[:target.end])
                    cursors["s"] = Cursor(seg=later[0] if later else m.state.next_seg, last_seq=last)
        except IllegalTransition:
            assert m.state is before
            # with no subscription an empty sealed head segment always goes
            assert not (op == "pop" and not cursors and m.state.consume and m.state.consume[0].holds_nothing)
        sm.check_invariants(m.state, cursors)
    # a reader from 'earliest' now: everything written and not read by the subscription
    read_by_sub = cursors["s"].last_seq if "s" in cursors else -1
    assert m.unread_from_earliest() == list(range(m.state.trimmed_seq + 1, m.next_seq))
    assert m.state.trimmed_seq <= read_by_sub  # only what the subscription read was dropped


def test_seal_checks_its_arguments() -> None:
    s = sm.fail_over(started(), "g1", 0, ALL_LIVE)
    with pytest.raises(IllegalTransition):
        sm.seal(s, 0, end=3, first_seq=None, last_seq=None)
    with pytest.raises(IllegalTransition):
        sm.seal(s, 1, end=0, first_seq=None, last_seq=None)  # open, not sealing
    assert sm.seal(s, 0, end=0, first_seq=None, last_seq=None).consume[0].end == 0


def test_drain_non_head_and_head() -> None:
    s = started()
    assert sm.remove_from_send(s, "g3", ALL_LIVE).send == ("g1", "g2")
    d = sm.remove_from_send(s, "g1", ALL_LIVE)
    assert d.send == ("g2", "g3") and d.consume[0].status is SegStatus.SEALING


def test_round_trip_dict() -> None:
    s = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, 5, 0, 4)
    assert QueueState.from_dict(s.to_dict()) == s


# -- property: random sequences of transitions keep I1–I5 ---------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["admit", "admit_all", "fail_over", "fail_over_wrong", "roll", "roll_wrong", "roll_next", "seal", "pop",
             "retain",
             "bump", "drain", "live", "full", "move_cursor", "add_group", "remove_group"]
        ),
        st.sampled_from(GROUPS + ("gX",)),
        st.integers(min_value=0, max_value=20),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
@example([("admit", "g1", 0), ("fail_over", "g1", 0), ("seal", "g1", 3), ("retain", "g1", 0)])  # issue 16
# a head out of disk space rolled, then every group full: no new segment on a full disk
@example([("admit_all", "g1", 0), ("full", "g1", 0), ("roll", "g1", 0), ("full", "g2", 0), ("full", "g3", 0),
          ("roll_next", "g1", 0), ("full", "g2", 0), ("admit_all", "g1", 0)])
def test_random_transitions_keep_invariants(seq: list[tuple[str, str, int]]) -> None:
    state = sm.create("q", GROUPS)
    live = set(GROUPS)
    full: set[str] = set()  # groups whose disk is full
    cursors: dict[str, Cursor] = {"a": state.earliest_cursor(), "b": state.earliest_cursor()}
    next_seq = 0  # seqs increase along the queue (an out-of-order seal reuses none)
    for op, gid, n in seq:
        facts = Facts(live_groups=frozenset(live), cursors=dict(cursors), disk_full=frozenset(full))
        before = state
        try:
            if op == "admit":
                state = sm.admit(state, gid, facts)
            elif op == "admit_all":
                state = sm.admit_all(state, facts)
            elif op == "fail_over" and state.open_segment is not None:
                state = sm.fail_over(state, state.open_segment.gid, state.open_segment.seg, facts)
            elif op == "fail_over_wrong":
                state = sm.fail_over(state, gid, n, facts)
            elif op == "roll" and state.open_segment is not None:
                head = state.head
                state = sm.roll(state, state.open_segment.gid, state.open_segment.seg, facts)
                if head not in full:
                    assert state.head == head and state.open_segment is not None and state.open_segment.gid == head
            elif op == "roll_next" and state.open_segment is not None:
                head = state.head
                state = sm.roll(state, state.open_segment.gid, state.open_segment.seg, facts, to_next=True)
                assert state.open_segment is not None or head in full
                assert state.head != head or state.send == (head,)  # moved on, or the only one left
            elif op == "roll_wrong":
                state = sm.roll(state, gid, n)
            elif op == "seal":
                sealing = [x for x in state.consume if x.status is SegStatus.SEALING]
                if sealing:
                    target = sealing[n % len(sealing)]
                    state = sm.seal(state, target.seg, n, next_seq if n else None, next_seq + n - 1 if n else None)
                    next_seq += n
                else:
                    state = sm.seal(state, n, 0, None, None)
            elif op in ("pop", "retain"):
                state = sm.pop(state, facts, retention=(op == "retain"))
                gone = before.consume[0]
                if gone.end and before.send:  # issue 16: the newest message outlives its pop
                    # (seqs grow along the consume list: a later segment with messages has newer ones)
                    assert (any(x.end for x in state.consume)
                            or any(c.last_seq > (gone.last_seq or -1) for c in cursors.values()))
                low = state.consume[0].seg if state.consume else state.next_seg
                cursors = {k: c if c.seg >= low else Cursor(seg=low) for k, c in cursors.items()}
            elif op == "bump":
                state = sm.bump_epoch(state)
            elif op == "drain":
                state = sm.remove_from_send(state, gid, facts)
            elif op == "add_group":
                state = sm.add_group(state, gid)
            elif op == "remove_group":
                state = sm.remove_group(state, gid)
            elif op == "live":
                live ^= {gid}
            elif op == "full":
                full ^= {gid}
            elif op == "move_cursor":
                # past the segment it was in, having read everything in it (and, for odd n,
                # one message of the next one: a later message exists)
                sub = "a" if n % 2 else "b"
                nxt = min(cursors[sub].seg + 1, state.next_seg)
                done = [x.last_seq for x in state.consume if x.seg < nxt and x.last_seq is not None]
                read = max(done + [cursors[sub].last_seq, state.trimmed_seq])
                cursors[sub] = Cursor(seg=nxt, last_seq=read + n % 2)
        except IllegalTransition:
            assert state is before  # a refused transition changes nothing
        if not sm.may_pop(state):  # the coordinator answers such a Pop without reading the facts
            with pytest.raises(IllegalTransition):
                sm.pop(state, Facts(live_groups=frozenset(live), cursors=dict(cursors)), retention=True)
        sm.check_invariants(state, cursors)
        assert state.producer_epoch >= before.producer_epoch
        assert state.next_seg >= before.next_seg
        # no group out of disk space joins the send list, nor gets a new segment to write
        assert not (set(state.send) - set(before.send)) & facts.disk_full, (before, state, facts)
        opened = state.open_segment
        assert opened is None or opened == before.open_segment or opened.gid not in facts.disk_full, (state, facts)


# -- each invariant check fires when a transition is broken ------------------------------------


def _segment_on_wrong_group(state: QueueState) -> QueueState:
    head = state.send[-1]  # bug: the tail instead of the head
    seg = Segment(seg=state.next_seg, gid=head)
    return attrs.evolve(state, consume=state.consume + (seg,), next_seg=state.next_seg + 1)


def _no_segment(state: QueueState) -> QueueState:
    return state  # bug: forgets to open a segment


def _reused_id(state: QueueState) -> QueueState:
    seg = Segment(seg=0, gid=state.send[0])  # bug: restarts ids at 0
    return attrs.evolve(state, consume=state.consume + (seg,))


@pytest.mark.parametrize(
    ("broken", "invariant"),
    [(_segment_on_wrong_group, "I1"), (_no_segment, "I1"), (_reused_id, "I3")],
)
def test_broken_open_on_head_is_caught(monkeypatch: pytest.MonkeyPatch, broken, invariant) -> None:
    s = started()  # built with the real transition
    monkeypatch.setattr(sm, "_open_on_head", broken)
    with pytest.raises(InvariantViolation) as err:
        sm.fail_over(s, "g1", 0, ALL_LIVE)
    assert err.value.invariant == invariant


def test_broken_fail_over_that_keeps_segment_open_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # bug: moved_to ignores the status change, so the old segment stays open (I2 / I1)
    monkeypatch.setattr(Segment, "moved_to", lambda self, status, **kw: attrs.evolve(self, **kw))
    with pytest.raises(InvariantViolation) as err:
        sm.fail_over(started(), "g1", 0, ALL_LIVE)
    assert err.value.invariant in ("I1", "I2")


def test_sealed_without_end_is_caught() -> None:
    s = sm.fail_over(started(), "g1", 0, ALL_LIVE)
    bad = attrs.evolve(s, consume=(attrs.evolve(s.consume[0], status=SegStatus.SEALED),) + s.consume[1:])
    with pytest.raises(InvariantViolation) as err:
        sm.check_invariants(bad)
    assert err.value.invariant == "I2"


def test_broken_eligibility_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QueueState, "eligible", lambda self, gid, facts: True)
    s = sm.fail_over(started(), "g1", 0, ALL_LIVE)
    with pytest.raises(InvariantViolation) as err:
        sm.admit(s, "gX", ALL_LIVE)  # not a member
    assert err.value.invariant == "I4"
    with pytest.raises(InvariantViolation) as err:
        sm.admit(s, "g2", ALL_LIVE)  # already in the send list
    assert err.value.invariant == "I4"


def test_broken_pop_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    s = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, 1, 0, 0)
    # the real pop refuses; a pop that forgets the cursor check breaks I5
    facts = Facts(cursors={"slow": Cursor(seg=0)})
    with pytest.raises(IllegalTransition):
        sm.pop(s, facts)
    bad = attrs.evolve(s, consume=s.consume[1:])
    with pytest.raises(InvariantViolation) as err:
        sm.check_invariants(bad, facts.cursors)
    assert err.value.invariant == "I5"


# -- coordinator duties ------------------------------------------------------------------------


def test_duties_plan() -> None:
    from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, plan

    s = started()
    assert plan(s, ALL_LIVE) == []
    g1_down = Facts(live_groups=frozenset({"g2", "g3"}))
    assert plan(s, g1_down) == [Action(Kind.FAIL_OVER, gid="g1", seg=0)]
    s = sm.fail_over(s, "g1", 0, g1_down)
    assert plan(s, g1_down) == [Action(Kind.SEAL, gid="g1", seg=0)]
    s = sm.seal(s, 0, 2, 0, 1)
    behind = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=0)})
    # g1 is back, with backlog: while g2 and g3 take writes it waits until segment 0 is read
    assert plan(s, behind) == []
    # (an operator's admit may still take it: the order rests on segment ids, I3)
    s = sm.admit(s, "g1", behind)
    assert s.send == ("g2", "g3", "g1")
    assert plan(s, behind) == []
    assert plan(s, behind, Limits(retention_segments=1)) == []
    # (0 is below what a QueueConfig allows: here it only says "over the limit") Segment 0
    # holds the newest message until the consumer reads a later one (issue 16).
    assert plan(s, behind, Limits(retention_segments=0)) == []
    read_on = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=0, offset=1, last_seq=2)})
    assert plan(s, read_on, Limits(retention_segments=0)) == [Action(Kind.RETAIN, gid="g1", seg=0)]
    read_all = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=1, last_seq=1)})
    assert plan(s, read_all) == []
    written = OpenSegment(bytes=100, first_write_ms=5)  # the head master has a message in segment 1
    assert plan(s, read_all, open_info=written) == [Action(Kind.POP, gid="g1", seg=0, later_stored=True)]
    past = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=1, offset=1, last_seq=2)})
    assert plan(s, past) == [Action(Kind.POP, gid="g1", seg=0)]
    s = sm.pop(s, past)
    assert plan(s, past) == []


def test_duties_pop_an_empty_head_segment_without_a_subscription() -> None:
    """Issue 43: the daemon pops a head segment sealed empty when no subscription is at or
    before it, every such one in a row, and stops at one that holds a message."""
    from ordq.coordinator.duties import Action, Kind, plan

    g3_only = Facts(live_groups=frozenset({"g3"}))  # two blips: g1's, then g2's
    s = sm.seal(sm.fail_over(started(), "g1", 0, g3_only), 0, 0, None, None)
    s = sm.seal(sm.fail_over(s, "g2", 1, g3_only), 1, 0, None, None)
    assert s.head == "g3"
    assert plan(s, g3_only) == [Action(Kind.POP, gid="g1", seg=0), Action(Kind.POP, gid="g2", seg=1)]
    at_zero = Facts(live_groups=g3_only.live_groups, cursors={"a": Cursor(seg=0)})
    assert plan(s, at_zero) == []
    at_one = Facts(live_groups=g3_only.live_groups, cursors={"a": Cursor(seg=1)})
    assert plan(s, at_one) == [Action(Kind.POP, gid="g1", seg=0)]
    g1_down = Facts(live_groups=frozenset({"g2", "g3"}))
    held = sm.seal(sm.fail_over(started(), "g1", 0, g1_down), 0, 2, 0, 1)
    assert plan(held, g1_down) == []  # a message in it: kept until read (or retention)


def test_duties_roll_by_size_and_age_and_retention_by_time_and_bytes() -> None:
    from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, plan

    s = started()
    limits = Limits(segment_bytes=1000, segment_age_s=60)
    young = OpenSegment(bytes=999, first_write_ms=100_000)
    assert plan(s, ALL_LIVE, limits, now_ms=159_999, open_info=young) == []
    assert plan(s, ALL_LIVE, limits, now_ms=160_000, open_info=young) == [Action(Kind.ROLL, gid="g1", seg=0)]
    assert plan(s, ALL_LIVE, limits, now_ms=0, open_info=OpenSegment(bytes=1000, first_write_ms=0)) == [
        Action(Kind.ROLL, gid="g1", seg=0)]
    empty = OpenSegment(bytes=0, first_write_ms=None)  # an empty segment never rolls by age
    assert plan(s, ALL_LIVE, limits, now_ms=10**12, open_info=empty) == []
    assert plan(s, ALL_LIVE, Limits(), now_ms=10**12, open_info=OpenSegment(10**12, 0)) == []  # no limits

    # By size, a broker that says what is acked: the size acked, and no less acked than not
    # (issue 26: after a roll the producer resends its unacked window on the new segment;
    # counted by what the master wrote, that segment was over the size at once and rolled again
    # before any of it was acked, and so on: each segment a copy of the last, 32 MB on disk for
    # a 16 MB run).
    by_size = Limits(segment_bytes=1000)
    roll = [Action(Kind.ROLL, gid="g1", seg=0)]
    resent = OpenSegment(bytes=5000, first_write_ms=0, acked_bytes=0)
    assert plan(s, ALL_LIVE, by_size, open_info=resent) == []
    assert plan(s, ALL_LIVE, by_size, open_info=attrs.evolve(resent, acked_bytes=999)) == []
    assert plan(s, ALL_LIVE, by_size, open_info=attrs.evolve(resent, acked_bytes=2499)) == []  # more to resend
    assert plan(s, ALL_LIVE, by_size, open_info=attrs.evolve(resent, acked_bytes=2500)) == roll
    assert plan(s, ALL_LIVE, by_size, open_info=OpenSegment(bytes=1000, first_write_ms=0, acked_bytes=1000)) == roll

    # Two rolled segments, sealed at t=10 s and t=20 s, 600 and 500 bytes; a subscription is
    # still in the first one.
    s = sm.seal(sm.roll(s, "g1", 0), 0, 2, 0, 1, at_ms=10_000, size=600)
    s = sm.seal(sm.roll(s, "g1", 1), 1, 2, 2, 3, at_ms=20_000, size=500)
    behind = Facts(live_groups=ALL_LIVE.live_groups, cursors={"a": Cursor(seg=0)})
    retain = [Action(Kind.RETAIN, gid="g1", seg=0)]
    assert plan(s, behind, Limits(retention_time_s=5), now_ms=15_000) == []
    assert plan(s, behind, Limits(retention_time_s=5), now_ms=15_001) == retain
    assert plan(s, behind, Limits(retention_bytes=1100), now_ms=0) == []
    assert plan(s, behind, Limits(retention_bytes=1099), now_ms=0) == retain
    assert s.consume[0].to_dict()["sealed_ms"] == 10_000 and Segment.from_dict(s.consume[0].to_dict()) == s.consume[0]


# -- seal decision -----------------------------------------------------------------------------


def test_seal_decision() -> None:
    from ordq.common.errors import BrokerUnavailable
    from ordq.coordinator.seal import SealPlan, decide
    from ordq.wire.transport import ReplicaEnd

    m = ReplicaEnd(end=12, first_seq=100, last_seq=111)
    s = ReplicaEnd(end=10, first_seq=100, last_seq=109)
    assert decide({"master": m, "slave": s}) == SealPlan(12, 100, 111, copy_to="slave", copy_from="master")
    assert decide({"master": s, "slave": m}) == SealPlan(12, 100, 111, copy_to="master", copy_from="slave")
    assert decide({"master": None, "slave": s}) == SealPlan(10, 100, 109)
    assert decide({"master": m, "slave": m}) == SealPlan(12, 100, 111)
    empty = ReplicaEnd(end=0, first_seq=None, last_seq=None)
    assert decide({"master": empty, "slave": None}) == SealPlan(0, None, None)
    with pytest.raises(BrokerUnavailable):
        decide({"master": None, "slave": None})


def test_a_group_out_of_disk_space_is_not_admitted_and_its_head_fails_over() -> None:
    """A group whose process says its disk is full (``Facts.disk_full``): no admission, with
    the reason; as head, the daemon fails it over, even when its open segment is frozen (a
    roll would open the next segment on the same full disk); admitted again with room."""
    from ordq.coordinator.duties import Action, Kind, OpenSegment, plan

    g1_full = Facts(live_groups=ALL_LIVE.live_groups, disk_full=frozenset({"g1"}))
    with pytest.raises(IllegalTransition, match="disk is full"):
        sm.admit(sm.create("q", GROUPS), "g1", g1_full)
    assert sm.admit_all(sm.create("q", GROUPS), g1_full).send == ("g2", "g3")
    s = started()
    frozen = OpenSegment(bytes=4_000, first_write_ms=None, frozen=True)
    assert plan(s, g1_full, open_info=frozen) == [Action(Kind.FAIL_OVER, gid="g1", seg=0)]
    moved = sm.fail_over(s, "g1", 0, g1_full)
    assert moved.send == ("g2", "g3") and moved.open_segment == Segment(seg=1, gid="g2")
    alone = sm.fail_over(sm.admit(sm.create("q", ("g1",)), "g1", ALL_LIVE), "g1", 0, g1_full)
    assert alone.send == () and alone.open_segment is None  # producers wait: no write to fail
    assert sm.admit_all(alone, ALL_LIVE).open_segment == Segment(seg=1, gid="g1")  # room again
    rolled = sm.roll(s, "g1", 0, g1_full)  # an operator's or a producer's roll: no new segment on g1
    assert rolled.send == ("g2", "g3") and rolled.open_segment == Segment(seg=1, gid="g2")


def test_duties_roll_a_frozen_open_segment_without_any_producer() -> None:
    """Issue 23: a master restarted while the segment was open never writes it again; the
    daemon rolls it (whatever its size or age), so it gets sealed and writes resume."""
    from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, plan

    s = started()
    restarted = OpenSegment(bytes=4_000, first_write_ms=None, frozen=True)  # restored: no first-write time
    assert plan(s, ALL_LIVE, Limits(), open_info=restarted) == [Action(Kind.ROLL, gid="g1", seg=0)]
    assert plan(s, ALL_LIVE, Limits(), open_info=OpenSegment(bytes=0, first_write_ms=None, frozen=True)) == [
        Action(Kind.ROLL, gid="g1", seg=0)]
    rolled = sm.roll(s, "g1", 0)
    assert plan(rolled, ALL_LIVE) == [Action(Kind.SEAL, gid="g1", seg=0)]


# -- property: admitting groups with backlog keeps order (issue 23) -----------------------------

order_ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "write", "read", "read", "fail_over", "roll", "roll_next", "seal", "pop",
                         "admit", "admit_all", "live", "drain"]),
        st.sampled_from(GROUPS),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(order_ops)
def test_admitting_groups_with_backlog_keeps_order(seq: list[tuple[str, str, int]]) -> None:
    """A model of one producer and one consumer over random failovers, rolls, seals, pops and
    admissions of groups that still hold unread segments: segment ids increase along the
    consume list, the open segment is its tail on the head, the consumer reads segments in
    increasing id order and delivers every written seq exactly once, in order; a group that
    just failed over is head again only when no other group could be."""
    m = SegmentsModel()
    cursor = m.state.earliest_cursor()
    delivered: list[int] = []
    segs_read: list[int] = []
    for op, gid, n in seq:
        facts = m.facts({"s": cursor})
        before = m.state
        try:
            if op == "write":
                if m.state.open_segment is not None and m.state.head in m.live:
                    m.write(n + 1)
            elif op in ("seal", "live", "admit_all"):
                m.shared_step(op, gid, n, facts)
            elif op in ("fail_over", "roll", "roll_next") and (o := m.state.open_segment) is not None:
                state = m.state
                if op == "fail_over":
                    others = [g for g in state.admission_order(facts) if g != o.gid]
                    m.state = sm.fail_over(state, o.gid, o.seg, facts)
                    if len(before.send) == 1 and others:  # churn guard: another group heads
                        assert m.state.head != o.gid
                else:
                    m.state = sm.roll(state, o.gid, o.seg, facts, to_next=(op == "roll_next"))
            elif op == "pop":
                m.state = sm.pop(m.state, facts)
            elif op == "admit":
                m.state = sm.admit(m.state, gid, facts)
            elif op == "drain":
                m.state = sm.remove_from_send(m.state, gid, facts)
            elif op == "read":
                # the consumer reads its cursor's segment as far as it can, and moves on past a
                # sealed one it finished (to the next segment of the consume list)
                target = m.state.segment(cursor.seg)
                if target is not None:
                    held = m.stored.get(target.seg, [])
                    limit = target.end if target.status is SegStatus.SEALED else len(held)
                    assert limit is not None
                    for seq_no in held[cursor.offset:limit]:
                        if seq_no > cursor.last_seq:
                            delivered.append(seq_no)
                            cursor = attrs.evolve(cursor, last_seq=seq_no)
                    cursor = attrs.evolve(cursor, offset=limit)
                    if not segs_read or segs_read[-1] != target.seg:
                        segs_read.append(target.seg)
                    if target.status is SegStatus.SEALED:
                        later = [x.seg for x in m.state.consume if x.seg > target.seg]
                        cursor = Cursor(seg=later[0] if later else m.state.next_seg, offset=0,
                                        last_seq=cursor.last_seq)
        except IllegalTransition:
            assert m.state is before
        state = m.state
        sm.check_invariants(state, {"s": cursor})
        ids = [x.seg for x in state.consume]
        assert ids == sorted(set(ids))  # ids strictly increase along the consume list
        if state.open_segment is not None:
            assert state.consume[-1] is state.open_segment and state.open_segment.gid == state.head
        assert segs_read == sorted(set(segs_read))  # segments read in increasing id order
        assert delivered == list(range(len(delivered)))  # every seq once, in order, no gap


# -- state that does not parse is a typed error of that queue (issue 23) ----------------------


@pytest.mark.parametrize(("data", "why"), [
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"queue": "q"}', "is not a list"),
    (b'{"queue": "q", "groups": [], "send": [], "consume": []}', "'next_seg' missing"),
    (b'{"queue": "q", "groups": [], "send": [], "consume": [7], "next_seg": 1, "producer_epoch": 0}',
     "not an object"),
    (b'{"queue": "q", "groups": ["g1"], "send": [], "consume": [{"seg": 0, "gid": "g1", "status": "weird"}], '
     b'"next_seg": 1, "producer_epoch": 0}', "ValueError"),
    (b'{"queue": "q", "groups": ["g1"], "send": ["g1"], "consume": [], "next_seg": 0, "producer_epoch": 0}',
     "invariant I1"),
    (b'{"queue": "other", "groups": [], "send": [], "consume": [], "next_seg": 0, "producer_epoch": 0}',
     "names queue 'other'"),
])
def test_state_that_does_not_parse_is_corrupt_state_of_that_queue(data: bytes, why: str) -> None:
    from ordq.common.errors import CorruptState, OrdqError
    from ordq.coordinator.store_values import parse_state

    with pytest.raises(CorruptState) as err:
        parse_state("q", data)
    assert isinstance(err.value, OrdqError) and err.value.queue == "q" and why in err.value.detail
    assert "'q'" in str(err.value).splitlines()[0] and len(str(err.value).splitlines()) == 1


def test_a_valid_state_parses() -> None:
    import json

    from ordq.coordinator.store_values import parse_state

    s = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, 5, 0, 4)
    assert parse_state("q", json.dumps(s.to_dict()).encode()) == s


@given(groups=st.lists(st.sampled_from(("g1", "g2", "g3", "g4", "g5")), max_size=8), k=st.integers(0, 10**6))
def test_spread_heads_each_group_equally_and_splits_each_heads_successor(groups: list[str], k: int) -> None:
    """Queues created on every group get an order by how many queues exist: a permutation of
    the groups; n consecutive queues head each of n groups once, and n(n-1) consecutive ones
    give each head every other group as successor once (a dead head's queues do not herd)."""
    distinct = tuple(dict.fromkeys(groups))
    n = len(distinct)
    order = sm.spread(groups, k)
    assert sorted(order) == sorted(distinct)
    assert sm.spread(groups, 0) == distinct  # the first queue keeps the registered order
    if n >= 2:
        heads = [sm.spread(groups, k + i)[0] for i in range(n)]
        assert sorted(heads) == sorted(distinct)
        pairs = [sm.spread(groups, k + i)[:2] for i in range(n * (n - 1))]
        assert sorted(pairs) == sorted((a, b) for a in distinct for b in distinct if a != b)


def test_a_segment_sealed_empty_behind_a_head_that_stays_is_dropped() -> None:
    """Issue 43: a head that holds messages nobody read (or the newest message) stays, and each
    later failover of the idle head group left one more segment sealed empty behind it, for
    ever. ``drop_empty`` takes such a segment from the middle of the list: never the head or
    the tail, never one holding a message, never one a subscription is at or before."""
    held = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, end=3, first_seq=0, last_seq=2)
    behind = sm.seal(sm.fail_over(held, "g2", 1, ALL_LIVE), 1, end=0, first_seq=None, last_seq=None)
    behind = sm.seal(sm.fail_over(behind, "g3", 2, ALL_LIVE), 2, end=0, first_seq=None, last_seq=None)
    assert [x.seg for x in behind.consume] == [0, 1, 2, 3]
    assert sm.empty_behind(behind, Facts()) == (1, 2)
    dropped = sm.drop_empty(sm.drop_empty(behind, 1, Facts()), 2, Facts())
    assert [x.seg for x in dropped.consume] == [0, 3]
    assert dropped.trimmed_seq == behind.trimmed_seq == -1 and dropped.next_seg == behind.next_seg
    assert dropped.earliest_cursor() == behind.earliest_cursor()  # 'earliest' reads the same
    with pytest.raises(IllegalTransition, match="not sealed empty"):
        sm.drop_empty(behind, 0, Facts())  # holds messages (and is the head)
    empty_head = sm.seal(sm.fail_over(sm.fail_over(started(), "g1", 0, ALL_LIVE), "g2", 1, ALL_LIVE), 0, end=0,
                         first_seq=None, last_seq=None)
    with pytest.raises(IllegalTransition, match="head or tail"):
        sm.drop_empty(empty_head, 0, Facts())  # pop's
    with pytest.raises(IllegalTransition, match="not sealed empty"):
        sm.drop_empty(behind, 3, Facts())  # the open tail
    with pytest.raises(IllegalTransition, match="not in the consume list"):
        sm.drop_empty(dropped, 1, Facts())
    # a subscription at or before it keeps it; one past it does not
    for at in (0, 1):
        with pytest.raises(IllegalTransition, match="have not passed"):
            sm.drop_empty(behind, 1, Facts(cursors={"a": Cursor(seg=at, offset=3, last_seq=2)}))
    assert sm.empty_behind(behind, Facts(cursors={"a": Cursor(seg=2, last_seq=2)})) == (1,)
    assert [x.seg for x in sm.drop_empty(behind, 1, Facts(cursors={"a": Cursor(seg=2, last_seq=2)})).consume] == [
        0, 2, 3]
    # still sealing (its end not decided): never
    sealing = sm.fail_over(held, "g2", 1, ALL_LIVE)
    sealing = sm.seal(sm.fail_over(sealing, "g3", 2, ALL_LIVE), 2, end=0, first_seq=None, last_seq=None)
    assert sm.empty_behind(sealing, Facts()) == (2,)
    with pytest.raises(IllegalTransition, match="not sealed empty"):
        sm.drop_empty(sealing, 1, Facts())


def test_duties_drop_empty_segments_behind_a_head_that_stays() -> None:
    from ordq.coordinator.duties import Action, Kind, plan

    g3_only = Facts(live_groups=frozenset({"g3"}))
    s = sm.seal(sm.fail_over(started(), "g1", 0, g3_only), 0, 2, 0, 1)  # held: nobody read it
    s = sm.seal(sm.fail_over(s, "g2", 1, g3_only), 1, 0, None, None)
    assert s.head == "g3"
    assert plan(s, g3_only) == [Action(Kind.DROP_EMPTY, gid="g2", seg=1)]
    # a subscription at it keeps it (and the head holds the newest message: kept too)
    at_one = Facts(live_groups=g3_only.live_groups, cursors={"a": Cursor(seg=1, last_seq=1)})
    assert plan(s, at_one) == []
    at_zero = Facts(live_groups=g3_only.live_groups, cursors={"a": Cursor(seg=0)})
    assert plan(s, at_zero) == []


def _storm_state() -> QueueState:
    """The resend storm's state (tests/test_producer_resend.py, seen with a timing change): seg 0
    on g1 (seqs 0..2), segs 1 (g2) and 2 (g3) sealed empty by quick failovers and dropped from
    the middle of the list (``drop_empty``), seg 3 on g2 (seqs 3..7), seg 4 open on g2."""
    s = sm.seal(sm.fail_over(started(), "g1", 0, ALL_LIVE), 0, end=3, first_seq=0, last_seq=2)
    s = sm.seal(sm.fail_over(s, "g2", 1, ALL_LIVE), 1, end=0, first_seq=None, last_seq=None)
    s = sm.fail_over(s, "g3", 2, ALL_LIVE)  # the send list ran out: g2 (no backlog) heads again
    s = sm.seal(s, 2, end=0, first_seq=None, last_seq=None)
    s = sm.seal(sm.roll(s, "g2", 3), 3, end=5, first_seq=3, last_seq=7)
    s = sm.drop_empty(sm.drop_empty(s, 1, Facts()), 2, Facts())  # no subscription yet
    assert [(x.seg, x.gid, x.status) for x in s.consume] == [
        (0, "g1", SegStatus.SEALED), (3, "g2", SegStatus.SEALED), (4, "g2", SegStatus.OPEN)]
    return s


def test_a_cursor_committed_into_dropped_empty_segments_holds_the_pop_back_and_keeps_i5() -> None:
    """A consumer that read seg 0 to its end committed (1, 0): a segment dropped sealed empty,
    inside [head, next_seg], so the commit is taken (a consumer with an older copy of the list,
    which still holds seg 1, commits the same). Popping seg 0 then left that cursor before the
    new head 3: ``pop`` raised InvariantViolation I5, the coordinator refused the consumer's
    Pop with it, and the consumer died (a bug is final), while the daemon's pops failed the
    same way every round. Such a cursor has read seg 0 but not reached seg 3, the next segment
    the list holds: the pop waits for it (IllegalTransition, as for any subscription behind),
    and goes once it is there."""
    from ordq.coordinator.duties import Action, Kind, plan

    s = _storm_state()
    in_gap = Cursor(seg=1, offset=0, last_seq=2)
    sm.check_commit(s, "s", Cursor(seg=0), in_gap)  # taken: I5 holds for it in this state
    facts = Facts(live_groups=ALL_LIVE.live_groups, cursors={"s": in_gap})
    with pytest.raises(IllegalTransition, match="have not passed"):
        sm.pop(s, facts)
    assert Action(Kind.POP, gid="g1", seg=0) not in plan(s, facts)  # the daemon does not try it
    there = Facts(live_groups=ALL_LIVE.live_groups, cursors={"s": Cursor(seg=3, offset=0, last_seq=2)})
    popped = sm.pop(s, there)
    assert [x.seg for x in popped.consume] == [3, 4] and popped.trimmed_seq == 2
    assert plan(s, there) == [Action(Kind.POP, gid="g1", seg=0)]
    # the same with retention: it drops seg 0 anyway, and the cursor stays where it is (the
    # reader goes on from the head; the seq filter checks), as for any cursor behind
    assert [x.seg for x in sm.pop(s, facts, retention=True).consume] == [3, 4]


drop_ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "blip", "blip", "seal", "pop", "drop", "drop", "live", "admit_all", "subscribe",
                         "read"]),
        st.sampled_from(GROUPS),
        st.integers(min_value=0, max_value=4),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(drop_ops)
@example([("write", "g1", 2), ("seal", "g1", 0), ("blip", "g1", 0), ("seal", "g1", 0), ("blip", "g2", 0),
          ("seal", "g2", 0), ("drop", "g1", 0), ("subscribe", "g1", 0), ("read", "g1", 0), ("read", "g1", 0)])
# the resend storm's: segs 1 and 2 dropped empty, the reader at the end of seg 0 moves to 1, seg 0 popped
@example([("write", "g1", 2), ("blip", "g1", 0), ("seal", "g1", 0), ("blip", "g2", 0), ("seal", "g1", 0),
          ("blip", "g3", 0), ("seal", "g1", 0), ("write", "g1", 1), ("blip", "g2", 0), ("seal", "g1", 0),
          ("drop", "g1", 1), ("drop", "g1", 1), ("subscribe", "g1", 0), ("read", "g1", 0), ("pop", "g1", 0),
          ("read", "g1", 0), ("read", "g1", 0), ("pop", "g1", 0)])
def test_dropping_empty_segments_drops_no_message_and_strands_no_reader(seq: list[tuple[str, str, int]]) -> None:
    """Writes, session blips, seals, pops, drops of segments sealed empty from the middle, and a
    subscription that may come at any time, from 'earliest', reading on to the next segment the
    list holds (or, with an older copy of the list, the next id): a drop never takes a segment
    holding a message, the head, the tail, or one a subscription is at or before; a pop never
    breaks I5 for a cursor committed into dropped ids (the resend storm's InvariantViolation);
    the invariants hold; and a reader from 'earliest' at the end gets every message not yet
    popped, in order, exactly once."""
    m = SegmentsModel()
    cursors: dict[str, Cursor] = {}
    for op, gid, n in seq:
        facts = m.facts(cursors)
        before = m.state
        try:
            if m.shared_step(op, gid, n, facts):
                pass
            elif op == "pop":
                m.state = sm.pop(m.state, facts)
            elif op == "drop" and m.state.consume:
                target = m.state.consume[n % len(m.state.consume)]
                m.state = sm.drop_empty(m.state, target.seg, facts)
                assert target.seg in sm.empty_behind(before, facts)
                assert target.holds_nothing and not m.stored.get(target.seg)
                assert target.seg not in (before.consume[0].seg, before.consume[-1].seg)
                assert all(c.seg > target.seg for c in cursors.values())
                assert m.state.trimmed_seq == before.trimmed_seq
            elif op == "subscribe" and "s" not in cursors:
                cursors["s"] = m.state.earliest_cursor()
            elif op == "read" and "s" in cursors:
                cur = cursors["s"]
                target = m.state.segment(cur.seg)
                if target is None:  # dropped empty before we came: on to the next one held
                    later = [x.seg for x in m.state.consume if x.seg > cur.seg]
                    if later:
                        cursors["s"] = Cursor(seg=later[0], last_seq=cur.last_seq)
                elif target.status is SegStatus.SEALED:
                    got = m.stored.get(target.seg, [])[:target.end]
                    assert all(q == cur.last_seq + 1 + i for i, q in enumerate(x for x in got if x > cur.last_seq))
                    last = max([cur.last_seq] + got)
                    # The SDK moves to the next segment its copy of the list holds; an older copy
                    # may still hold those dropped since (odd n): then it is as if by id.
                    cursors["s"] = Cursor(seg=m.state.after(target.seg) if n % 2 == 0 else target.seg + 1,
                                          last_seq=last)
        except IllegalTransition:
            assert m.state is before
            if op == "drop" and m.state.consume:
                assert m.state.consume[n % len(m.state.consume)].seg not in sm.empty_behind(m.state, facts)
        sm.check_invariants(m.state, cursors)
    assert m.unread_from_earliest() == list(range(m.state.trimmed_seq + 1, m.next_seq))
    if "s" in cursors:
        assert m.state.trimmed_seq <= cursors["s"].last_seq


def _retained_past_segment_0() -> QueueState:
    """Segment 0 (seqs 0..99) sealed and dropped by retention; segment 1 open, written on."""
    s = sm.roll(started(), "g1", 0)
    s = sm.seal(s, 0, 100, 0, 99)
    return sm.pop(s, Facts(live_groups=frozenset(GROUPS)), retention=True, later_stored=True)


@given(last_seq=st.integers(min_value=-1, max_value=300), seg=st.integers(min_value=0, max_value=4))
def test_a_commit_behind_the_list_is_taken_only_if_it_claims_no_seq_still_kept(last_seq: int, seg: int) -> None:
    """Retention dropped segment 0 (seqs 0..99): a consumer's commit held up past that pop
    lands in it and is taken (the loaded tier's consumer died of its refusal); a cursor there
    claiming a seq past 99 would skip messages still stored, and is refused."""
    s = _retained_past_segment_0()
    assert (s.consume[0].seg, s.trimmed_seq, s.next_seg) == (1, 99, 2)
    cursor = Cursor(seg=seg, offset=0, last_seq=last_seq)
    ok = (seg == 0 and last_seq <= 99) or 1 <= seg <= 2
    if ok:
        sm.check_commit(s, "s", Cursor(seg=0), cursor)
    else:
        with pytest.raises(IllegalTransition, match="outside the consume list"):
            sm.check_commit(s, "s", Cursor(seg=0), cursor)


def test_a_commit_never_moves_a_cursor_back() -> None:
    s = _retained_past_segment_0()
    with pytest.raises(IllegalTransition, match="would move back"):
        sm.check_commit(s, "s", Cursor(seg=1, offset=5, last_seq=104), Cursor(seg=1, offset=4, last_seq=103))
    with pytest.raises(IllegalTransition, match="would move back"):
        sm.check_commit(s, "s", Cursor(seg=0, offset=100, last_seq=99), Cursor(seg=0, offset=100, last_seq=98))
