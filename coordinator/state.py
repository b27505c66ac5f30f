"""The per-queue state machine: send list, consume list, segments, producer epoch.

Rules:
- Pure: no ZooKeeper, gRPC, clocks, threads or randomness here. Facts from the outside world
  (which groups are live, where subscription cursors are) come in as arguments.
- Every transition is a function ``state -> new state`` that first checks its precondition
  (raising ``IllegalTransition``) and then checks invariants I1–I5 on the result (raising
  ``InvariantViolation``: a bug, never a user error). The ZooKeeper store only loads, applies
  and conditionally writes; see ``coordinator/store.py``.
- Segment statuses move only along ``SEGMENT_TRANSITIONS``.

Invariants (DESIGN §3), as checked by ``check_invariants``:
- I1 If the send list is non-empty, the consume-list tail is the one ``open`` segment and it
  lives on ``send[0]``; if it is empty, no segment is open.
- I2 Every consume-list segment but the tail is ``sealing`` or ``sealed``; ``sealed`` ones
  have ``end`` (and ``last_seq`` when ``end > 0``).
- I3 Segment ids strictly increase along the consume list and are below ``next_seg``.
- I4 No group is in the send list twice; every group in it belongs to the queue. Liveness
  (master and slave) at admission is a fact checked by ``admit`` itself.
  Unlike JMQ (and DESIGN before issue 23) a group is admitted *with* backlog: JMQ's consume
  list holds groups, so a group readmitted before its old data is read would interleave old
  and new data; ordq's holds numbered segments, and a new segment always gets ``next_seg`` at
  the tail, so readers still see segment ids in increasing order whichever groups hold them
  (I3; property-tested in tests/test_state.py). Requiring no backlog left a queue whose only
  group restarted unwritable until read, for ever with no subscription (issues 23, 26).
- I5 A subscription cursor never points before the consume-list head or past ``next_seg``
  (the position after the tail: where a consumer waits once it drained a sealed tail).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ordq.common.errors import IllegalTransition, InvariantViolation


class SegStatus(enum.Enum):
    OPEN = "open"  # the producer writes here (only the tail, only on send[0])
    SEALING = "sealing"  # failed over: no more writes; its end is being decided
    SEALED = "sealed"  # end (and last_seq) fixed; readable to the end


# Allowed status moves; anything else raises IllegalTransition.
SEGMENT_TRANSITIONS: Mapping[SegStatus, frozenset[SegStatus]] = {
    SegStatus.OPEN: frozenset({SegStatus.SEALING}),
    SegStatus.SEALING: frozenset({SegStatus.SEALED}),
    SegStatus.SEALED: frozenset(),
}


@attrs.frozen
class Segment:
    """One segment of a queue's history, stored on broker group ``gid``."""

    seg: int
    gid: str
    status: SegStatus = SegStatus.OPEN
    end: int | None = None  # message count, known once sealed
    first_seq: int | None = None  # seq range stored, known once sealed (None: empty)
    last_seq: int | None = None
    sealed_ms: int | None = None  # wall clock when sealed (retention by time counts from it)
    bytes: int | None = None  # on each replica's disk, known once sealed (retention by bytes)

    @property
    def holds_nothing(self) -> bool:
        """Sealed with no message: nothing in it to consume (I4 does not count it as backlog)."""
        return self.status is SegStatus.SEALED and self.end == 0

    def moved_to(self, status: SegStatus, **changes: Any) -> Segment:
        if status not in SEGMENT_TRANSITIONS[self.status]:
            raise IllegalTransition(
                "segment", f"segment {self.seg} cannot go from {self.status.value} to {status.value}"
            )
        return attrs.evolve(self, status=status, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seg": self.seg,
            "gid": self.gid,
            "status": self.status.value,
            "end": self.end,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "sealed_ms": self.sealed_ms,
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        return cls(
            seg=int(d["seg"]),
            gid=str(d["gid"]),
            status=SegStatus(d["status"]),
            end=d.get("end"),
            first_seq=d.get("first_seq"),
            last_seq=d.get("last_seq"),
            sealed_ms=d.get("sealed_ms"),
            bytes=d.get("bytes"),
        )


@attrs.frozen
class Cursor:
    """Where a subscription resumes: read (seg, offset) next; seqs <= last_seq are delivered."""

    seg: int
    offset: int = 0
    last_seq: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {"seg": self.seg, "offset": self.offset, "last_seq": self.last_seq}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cursor:
        return cls(seg=int(d["seg"]), offset=int(d["offset"]), last_seq=int(d["last_seq"]))


@attrs.frozen
class Facts:
    """What the outside world says at the time of a transition (read by the store)."""

    live_groups: frozenset[str] = frozenset()  # groups whose master AND slave are registered live
    cursors: Mapping[str, Cursor] = attrs.field(factory=dict)  # subscription -> cursor
    # groups an operator drained for maintenance (``ordq group drain``): never admitted until
    # undrained, even when live with no backlog
    drained: frozenset[str] = frozenset()
    # groups one of whose processes says its disk is full (its liveness node, until it has room
    # again): not admitted, and a head among them fails over (duties.plan), since every write
    # there would fail; only a group with room takes writes
    disk_full: frozenset[str] = frozenset()


@attrs.frozen
class QueueState:
    """All list state of one queue: what lives in its one ``state`` znode."""

    queue: str
    groups: tuple[str, ...] = ()  # groups this queue may use
    send: tuple[str, ...] = ()
    consume: tuple[Segment, ...] = ()
    next_seg: int = 0
    producer_epoch: int = 0
    trimmed_seq: int = -1  # highest last_seq of popped segments: where 'earliest' starts
    # Tells this queue apart from an earlier, deleted one of the same name: a broker drops the
    # files it holds of another incarnation before it stores a segment of this one.
    incarnation: str = ""
    # SHA-256 hex of the key the last Claim issued with ``producer_epoch`` (coordinator/service.py):
    # brokers refuse that epoch without the key. None in state written before keys existed:
    # any key passes until the next claim binds one.
    producer_key: str | None = None

    # -- queries -----------------------------------------------------------------------------

    @property
    def head(self) -> str | None:
        """The send head: the group producers write to, or None."""
        return self.send[0] if self.send else None

    @property
    def open_segment(self) -> Segment | None:
        tail = self.consume[-1] if self.consume else None
        return tail if tail is not None and tail.status is SegStatus.OPEN else None

    def segment(self, seg: int) -> Segment | None:
        for s in self.consume:
            if s.seg == seg:
                return s
        return None

    def after(self, seg: int) -> int:
        """The first segment the consume list holds after ``seg``, or ``next_seg`` (where the next
        one opens) when none: where a reader goes at ``seg``'s sealed end. Not ``seg + 1``: ids
        between two listed segments (between the head and the tail) were sealed empty and dropped
        (``drop_empty``), and a cursor committed there reads as behind the head once ``pop``
        takes the segment before them (I5)."""
        return next((s.seg for s in self.consume if s.seg > seg), self.next_seg)

    def has_backlog(self, gid: str) -> bool:
        """True when ``gid`` still stores a segment of this queue with something left to read
        (a segment sealed empty holds nothing). Orders admission (``admission_order``) and
        keeps a group holding data from being removed from the queue."""
        return any(s.gid == gid and not s.holds_nothing for s in self.consume)

    def eligible(self, gid: str, facts: Facts) -> bool:
        """I4: both processes live, a member, not already sending (and not drained by an
        operator, nor out of disk space). Backlog does not matter (see the module doc, I4)."""
        return (
            gid in self.groups
            and gid in facts.live_groups
            and gid not in facts.drained
            and gid not in facts.disk_full
            and gid not in self.send
        )

    def admission_order(self, facts: Facts, *, last: str | None = None) -> list[str]:
        """The groups to admit now, in order: those without backlog first (in the queue's
        group order), then those with backlog, and ``last`` (the group that just failed over)
        at the very end. While some group takes writes, a group with backlog waits until its
        segments are read (JMQ's rule, kept as a preference): a head that just failed holds
        the segment it failed, and its killed master's liveness node lingers for a session, so
        it would otherwise rejoin at once and be tried again. Only when no group takes writes
        is a group with backlog admitted (order rests on segment ids, I3), so a queue whose
        groups all restarted is writable again at once."""
        ok = [g for g in self.groups if self.eligible(g, facts)]
        if self.send:
            ok = [g for g in ok if not self.has_backlog(g)]
        return sorted(ok, key=lambda g: (g == last, self.has_backlog(g)))

    def earliest_cursor(self) -> Cursor:
        seg = self.consume[0].seg if self.consume else self.next_seg
        return Cursor(seg=seg, offset=0, last_seq=self.trimmed_seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "groups": list(self.groups),
            "send": list(self.send),
            "consume": [s.to_dict() for s in self.consume],
            "next_seg": self.next_seg,
            "producer_epoch": self.producer_epoch,
            "trimmed_seq": self.trimmed_seq,
            "incarnation": self.incarnation,
            **({"producer_key": self.producer_key} if self.producer_key is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QueueState:
        return cls(
            queue=str(d["queue"]),
            groups=tuple(d["groups"]),
            send=tuple(d["send"]),
            consume=tuple(Segment.from_dict(s) for s in d["consume"]),
            next_seg=int(d["next_seg"]),
            producer_epoch=int(d["producer_epoch"]),
            trimmed_seq=int(d.get("trimmed_seq", -1)),
            incarnation=str(d.get("incarnation", "")),
            producer_key=None if d.get("producer_key") is None else str(d["producer_key"]),
        )


# -- invariants ------------------------------------------------------------------------------


def check_invariants(state: QueueState, cursors: Mapping[str, Cursor] | None = None) -> None:
    """Raise InvariantViolation naming the first broken invariant (I1–I5)."""
    consume = state.consume
    open_segs = [s for s in consume if s.status is SegStatus.OPEN]
    # I1
    if state.send:
        tail = consume[-1] if consume else None
        if tail is None or tail.status is not SegStatus.OPEN:
            raise InvariantViolation("I1", f"send list {state.send} but the tail is not open")
        if tail.gid != state.send[0]:
            raise InvariantViolation("I1", f"open tail on {tail.gid}, send head is {state.send[0]}")
        if len(open_segs) != 1:
            raise InvariantViolation("I1", f"{len(open_segs)} open segments")
    elif open_segs:
        raise InvariantViolation("I1", "an open segment with an empty send list")
    # I2
    for s in consume[:-1]:
        if s.status is SegStatus.OPEN:
            raise InvariantViolation("I2", f"segment {s.seg} before the tail is open")
    for s in consume:
        if s.status is SegStatus.SEALED:
            if s.end is None or s.end < 0:
                raise InvariantViolation("I2", f"sealed segment {s.seg} has no end")
            if s.end > 0 and (s.last_seq is None or s.first_seq is None):
                raise InvariantViolation("I2", f"sealed segment {s.seg} has no seq range")
    # I3
    ids = [s.seg for s in consume]
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise InvariantViolation("I3", f"segment ids not increasing: {ids}")
    if ids and ids[-1] >= state.next_seg:
        raise InvariantViolation("I3", f"segment {ids[-1]} not below next_seg {state.next_seg}")
    # I4
    if len(set(state.send)) != len(state.send):
        raise InvariantViolation("I4", f"a group twice in the send list {state.send}")
    for i, gid in enumerate(state.send):
        if gid not in state.groups:
            raise InvariantViolation("I4", f"group {gid} in the send list is not a member")
        # (backlog is allowed: order rests on I3, segment ids, not on which group holds them)
        if i > 0 and any(s.gid == gid and s.status is SegStatus.OPEN for s in consume):
            raise InvariantViolation("I4", f"send-list group {gid} is not the head but holds the open segment")
    # I5
    if cursors:
        low = consume[0].seg if consume else state.next_seg
        for sub, c in cursors.items():
            if not low <= c.seg <= state.next_seg:
                raise InvariantViolation(
                    "I5", f"cursor of {sub!r} at segment {c.seg}, outside [{low}, {state.next_seg}]"
                )


def _checked(state: QueueState, cursors: Mapping[str, Cursor] | None = None) -> QueueState:
    check_invariants(state, cursors)
    return state


# -- transitions -------------------------------------------------------------------------------


def _open_on_head(state: QueueState) -> QueueState:
    """Open a new segment on send[0] at the consume-list tail (JMQ rule: the consume list
    learns of a new send group before any producer writes to it)."""
    head = state.send[0]
    seg = Segment(seg=state.next_seg, gid=head, status=SegStatus.OPEN)
    return attrs.evolve(state, consume=state.consume + (seg,), next_seg=state.next_seg + 1)


def create(queue: str, groups: Iterable[str], incarnation: str = "") -> QueueState:
    """A new queue using ``groups``; nothing admitted yet (see ``admit``). ``incarnation``:
    unique per creation (the store draws it), so brokers can tell a re-created queue's
    segments from the deleted one's."""
    gs = tuple(dict.fromkeys(groups))
    return _checked(QueueState(queue=queue, groups=gs, incarnation=incarnation))


def spread(groups: Iterable[str], k: int) -> tuple[str, ...]:
    """The order of ``groups`` (deduplicated) that the ``k``-th queue created on "every
    registered group" gets (the store passes how many queues exist): the head (``send[0]``:
    where the first segment opens, and what fails over when its master dies) is group
    ``k mod n``, and the groups after it are rotated by ``k div n``, so n consecutive queues
    head each group once and n(n-1) consecutive ones also split each head's successor evenly
    (issue 29: with 10,000 idle queues headed by one group, one master's death meant 10,000
    failovers, seals and re-admissions at once; with one successor per head, a failover would
    herd a dead head's queues onto one group). The first queue keeps the registered order."""
    gs = tuple(dict.fromkeys(groups))
    n = len(gs)
    if n < 2:
        return gs
    h = k % n
    rest = gs[h + 1:] + gs[:h]
    r = (k // n) % (n - 1)
    return (gs[h],) + rest[r:] + rest[:r]


def add_group(state: QueueState, gid: str) -> QueueState:
    if gid in state.groups:
        raise IllegalTransition("add_group", f"group {gid} already serves queue {state.queue}")
    return _checked(attrs.evolve(state, groups=state.groups + (gid,)))


def admit(state: QueueState, gid: str, facts: Facts) -> QueueState:
    """Append an eligible group to the send list; if it becomes the head, open a segment."""
    if not state.eligible(gid, facts):
        raise IllegalTransition("admit", _why_not_eligible(state, gid, facts))
    new = attrs.evolve(state, send=state.send + (gid,))
    if len(new.send) == 1:
        new = _open_on_head(new)
    return _checked(new)


def _why_not_eligible(state: QueueState, gid: str, facts: Facts) -> str:
    if gid not in state.groups:
        return f"group {gid} does not serve queue {state.queue}"
    if gid in state.send:
        return f"group {gid} is already in the send list"
    if gid in facts.drained:
        return f"group {gid} is drained for maintenance (undrain it: ordq group undrain {gid})"
    if gid in facts.disk_full and gid in facts.live_groups:
        return f"group {gid} has a process whose disk is full (admitted again once it has room)"
    return f"group {gid} is not live (master and slave must both be registered)"


def admit_all(state: QueueState, facts: Facts, *, last: str | None = None) -> QueueState:
    """Admit every eligible group in ``admission_order`` (no-op when none is); ``last``: the
    group that just failed over, admitted after every other."""
    for gid in state.admission_order(facts, last=last):
        state = admit(state, gid, facts)
    return state


def fail_over(state: QueueState, gid: str, seg: int, facts: Facts) -> QueueState:
    """The head ``gid`` failed while ``seg`` was its open segment: mark it sealing, drop the
    head, open a new segment on the next head (admitting eligible groups if none is left)."""
    return _move_writes_on(_head_segment_sealing(state, gid, seg, "fail_over"), facts)


def _move_writes_on(sealing: QueueState, facts: Facts) -> QueueState:
    """The head (whose open segment is now sealing) leaves the send list; the next head gets a
    new segment, or, with none left, every eligible group is admitted, the old head (if it
    still looks live) last: it becomes head again only when no other group can be. Groups out
    of disk space leave the send list here (admitted again once they have room)."""
    old_head = sealing.send[0]
    new = attrs.evolve(sealing, send=tuple(g for g in sealing.send[1:] if g not in facts.disk_full))
    if new.send:
        return _checked(_open_on_head(new))
    return _checked(admit_all(new, facts, last=old_head))


def roll(state: QueueState, gid: str, seg: int, facts: Facts | None = None, *,
         to_next: bool = False) -> QueueState:
    """Seal-and-continue on a healthy head: ``seg``, the open segment of head ``gid``, becomes
    ``sealing`` and the next segment opens in the same write. Producers continue on the new
    segment with the next seq exactly as after ``fail_over`` (their unacked batches are
    resent; consumers drop duplicates by seq); the old segment, once sealed and read by every
    subscription, can be popped: this is how a healthy queue frees disk.

    By default the next segment opens on the same head, which stays in the send list. With
    ``to_next`` (the queue's ``roll_to: next`` backlog policy) the head leaves the send list as
    in ``fail_over`` and writes move to the next group (admitting the eligible ones if none is
    left), so backlog spreads over the groups instead of piling up on one; the old head rejoins
    at the tail of the send list when next admitted (the daemon does it while it is live).
    When no other group can take writes, it rolls on the same head. A head out of disk space
    (``facts.disk_full``) gets no new segment: writes move on as in ``fail_over``."""
    sealing = _head_segment_sealing(state, gid, seg, "roll")
    if facts is not None and gid in facts.disk_full:
        return _move_writes_on(sealing, facts)
    if to_next and facts is not None:
        moved = _move_writes_on(sealing, facts)
        if moved.send:
            return moved
    return _checked(_open_on_head(sealing))


def _head_segment_sealing(state: QueueState, gid: str, seg: int, transition: str) -> QueueState:
    """``state`` with ``seg``, the open segment of the head ``gid``, marked ``sealing``;
    IllegalTransition when it is not (another party failed it over or rolled it first: the
    caller must follow the state instead)."""
    open_seg = state.open_segment
    if state.head != gid or open_seg is None or open_seg.seg != seg or open_seg.gid != gid:
        raise IllegalTransition(
            transition,
            f"group {gid} segment {seg} is not the open head "
            f"(head {state.head}, open segment {open_seg.seg if open_seg else None})",
        )
    return attrs.evolve(state, consume=state.consume[:-1] + (open_seg.moved_to(SegStatus.SEALING),))


def remove_from_send(state: QueueState, gid: str, facts: Facts) -> QueueState:
    """Take ``gid`` out of the send list (maintenance drain); the head is failed over."""
    if gid not in state.send:
        raise IllegalTransition("drain", f"group {gid} is not in the send list")
    if state.head == gid:
        open_seg = state.open_segment
        assert open_seg is not None  # I1
        return fail_over(state, gid, open_seg.seg, facts)
    return _checked(attrs.evolve(state, send=tuple(g for g in state.send if g != gid)))


def seal(state: QueueState, seg: int, end: int, first_seq: int | None, last_seq: int | None, *,
         at_ms: int | None = None, size: int | None = None) -> QueueState:
    """A ``sealing`` segment's end is decided: it becomes ``sealed`` (at wall-clock ``at_ms``,
    taking ``size`` bytes on disk, as the sealing party saw them)."""
    target = state.segment(seg)
    if target is None:
        raise IllegalTransition("seal", f"segment {seg} is not in the consume list")
    if end < 0 or (end > 0) != (last_seq is not None):
        raise IllegalTransition("seal", f"segment {seg}: end {end} and last_seq {last_seq} disagree")
    if first_seq is not None and last_seq is not None and last_seq < first_seq:
        raise IllegalTransition("seal", f"segment {seg}: last_seq {last_seq} < first_seq {first_seq}")
    sealed = target.moved_to(SegStatus.SEALED, end=end, first_seq=first_seq, last_seq=last_seq,
                             sealed_ms=at_ms, bytes=size)
    return _checked(
        attrs.evolve(state, consume=tuple(sealed if s.seg == seg else s for s in state.consume))
    )


def holds_newest(state: QueueState, facts: Facts, *, later_stored: bool = False) -> bool:
    """Whether the (sealed) head segment must stay because it holds the queue's newest
    message: it stored messages, nothing shows a message after them (every later segment is
    sealed empty, or not yet sealed and no cursor has read past the head's ``last_seq``), and
    some group can take writes.

    Why: a new producer leader resumes its source from ``last_committed()``, the newest
    message *itself* (e.g. its binlog position header); ``trimmed_seq`` only keeps its seq.
    After a failover to a group that got nothing yet, popping this segment would leave that
    message nowhere. With an empty send list the rule yields (a double fault: no group
    takes writes, so no later message can come to prove one).

    ``later_stored``: the caller knows of a later message the state cannot show (the daemon
    asked the head master whether the open segment holds one)."""
    head = state.consume[0] if state.consume else None
    if later_stored or head is None or not head.end or head.last_seq is None or not state.send:
        return False
    if any(s.status is SegStatus.SEALED and s.end for s in state.consume[1:]):
        return False
    return not any(c.last_seq > head.last_seq for c in facts.cursors.values())


def may_pop(state: QueueState) -> bool:
    """Whether ``pop`` could drop anything, on the state alone: its head segment is sealed. When
    not, ``pop`` refuses whatever the facts (cursors, retention), so a caller need not read them."""
    return bool(state.consume) and state.consume[0].status is SegStatus.SEALED


def pop(state: QueueState, facts: Facts, *, retention: bool = False, later_stored: bool = False) -> QueueState:
    """Drop the head segment once it is sealed and every subscription is past it, unless it
    holds the queue's newest message (``holds_newest``; retention keeps it too).

    With no subscription the segment stays (nothing is dropped before anyone could read it)
    unless ``retention`` is set by an operator's retention limit, or it was sealed empty
    (``Segment.holds_nothing``: ``end`` 0, no seq).

    Why an empty segment goes without a subscription (issue 43): each time a head group's
    brokers lose their ZooKeeper session, an idle queue is failed over and gains a segment
    sealed empty; kept "until read" by a subscription that never comes, they piled up, one per
    session blip. Dropping one drops no message: its sealed ``end`` is 0, and a seal's end is
    the longer of the replicas that answered, and every acked batch is on both replicas (DESIGN
    §5, Seal), so none was acked into it. ``trimmed_seq`` is unchanged (no seq), so 'earliest'
    and every seq check read the same. A subscription whose cursor is at or before it still
    keeps it until it passes (the consumer moves on in id order), so only the consume-list head
    goes, and only when every subscription (if any) is past it.

    Past it means at or past the next segment the list holds (``after``), not only beyond its
    id: a cursor committed into the ids between them (segments dropped sealed empty; a consumer
    whose copy of the list still held one commits there) has read the head, but once the head
    went it would point before the new one (I5: the Pop refused with InvariantViolation, and
    the consumer died of it). It holds the pop back until it commits on, as any subscription
    behind does; it loses nothing, as the reader goes on to the next segment held.
    """
    if not state.consume:
        raise IllegalTransition("pop", "the consume list is empty")
    head = state.consume[0]
    if head.status is not SegStatus.SEALED:
        raise IllegalTransition("pop", f"head segment {head.seg} is {head.status.value}, not sealed")
    if not facts.cursors and not retention and not head.holds_nothing:
        raise IllegalTransition("pop", "no subscription has read it (and no retention applies)")
    reached = state.after(head.seg)  # where the list goes on: a cursor below it is not past the head
    behind = sorted(sub for sub, c in facts.cursors.items() if c.seg < reached)
    if behind and not retention:
        raise IllegalTransition("pop", f"subscriptions {behind} have not passed segment {head.seg} "
                                       f"(reached segment {reached}, the next one held)")
    if holds_newest(state, facts, later_stored=later_stored):
        raise IllegalTransition("pop", f"segment {head.seg} holds the queue's newest message "
                                       f"(seq {head.last_seq}): kept until a later one is stored")
    trimmed = max(state.trimmed_seq, head.last_seq if head.last_seq is not None else -1)
    new = attrs.evolve(state, consume=state.consume[1:], trimmed_seq=trimmed)
    # Retention may drop a segment a slow subscription still points at; the store moves such
    # cursors to the new head in the same write, so only check cursors when not retaining.
    return _checked(new, None if retention else facts.cursors)


def empty_behind(state: QueueState, facts: Facts) -> tuple[int, ...]:
    """The segments ``drop_empty`` may drop now: sealed empty, neither the consume-list head
    (``pop``'s) nor its tail, and every subscription (if any) past them."""
    return tuple(s.seg for s in state.consume[1:-1]
                 if s.holds_nothing and all(c.seg > s.seg for c in facts.cursors.values()))


def drop_empty(state: QueueState, seg: int, facts: Facts) -> QueueState:
    """Drop segment ``seg`` from the middle of the consume list: it was sealed empty, it is
    neither the head (``pop`` takes that one) nor the tail, and every subscription is past it.

    Why (issue 43): ``pop`` takes only the head. A queue whose head holds messages nobody has
    read yet (no subscription, or one behind), or the queue's newest message (``holds_newest``),
    keeps that head; every later failover of its idle head group (a session blip, a kill, a
    spread-back move) appended one more segment sealed empty behind it, kept for ever.

    Why it is safe (DESIGN §3, §5): the segment holds no message, acked or not (``end`` 0 is
    the longer replica's end, and every acked batch is on both replicas); nothing in it can be
    read, so dropping it drops nothing, and ``trimmed_seq`` (the seqs popped) stays as it is.
    No subscription's cursor is at or before it, so no committed position points into the gap;
    a reader arriving later (a new subscription at 'earliest', a reset) goes from the end of
    the segment before it to the next segment the list holds (``sdk/_consumer_read.py``), and
    its seq filter still proves nothing was skipped. The order of what remains is unchanged
    (I3: ids still increase), the head and tail are untouched (I1, I5)."""
    target = state.segment(seg)
    if target is None:
        raise IllegalTransition("drop_empty", f"segment {seg} is not in the consume list")
    if not target.holds_nothing:
        raise IllegalTransition("drop_empty", f"segment {seg} is {target.status.value} with end {target.end}, "
                                              "not sealed empty")
    if seg == state.consume[0].seg or seg == state.consume[-1].seg:
        raise IllegalTransition("drop_empty", f"segment {seg} is the consume list's head or tail")
    behind = sorted(sub for sub, c in facts.cursors.items() if c.seg <= seg)
    if behind:
        raise IllegalTransition("drop_empty", f"subscriptions {behind} have not passed segment {seg}")
    new = attrs.evolve(state, consume=tuple(s for s in state.consume if s.seg != seg))
    return _checked(new, facts.cursors)


def bump_epoch(state: QueueState, key_hash: str | None = None) -> QueueState:
    """A new producer leader takes over: every lower epoch is fenced from now on. ``key_hash``
    (SHA-256 hex of the key only the claimer learns) binds the new epoch to it, in the same
    write: another holder of a produce token who reads the epoch cannot use it."""
    return _checked(attrs.evolve(state, producer_epoch=state.producer_epoch + 1, producer_key=key_hash))


def remove_group(state: QueueState, gid: str) -> QueueState:
    if gid not in state.groups:
        raise IllegalTransition("remove_group", f"group {gid} does not serve queue {state.queue}")
    if gid in state.send or state.has_backlog(gid):
        raise IllegalTransition(
            "remove_group", f"group {gid} is in the send list or still holds segments"
        )
    return _checked(attrs.evolve(state, groups=tuple(g for g in state.groups if g != gid)))


def hand_over(state: QueueState, gid: str, seg: int, to: str) -> QueueState:
    """Move the head of a healthy queue to ``to``, another group of its send list (issue 43:
    heads spread back after a group returns): ``seg``, the open segment of head ``gid``,
    becomes ``sealing``, ``to`` goes first in the send list (``gid`` stays in it, behind), and
    the next segment opens on ``to`` in the same write. For producers and consumers this is a
    ``roll`` to another group: the producer continues on the new segment with the next seq,
    consumers read ``seg`` to its sealed end first. Only for a queue nobody is writing (the
    caller's rule): a producer mid-stream would resend its unacked window."""
    if to not in state.send or to == gid:
        raise IllegalTransition("hand_over", f"group {to} is not another group of {state.queue}'s send list")
    sealing = _head_segment_sealing(state, gid, seg, "hand_over")
    moved = attrs.evolve(sealing, send=(to,) + tuple(g for g in sealing.send if g != to))
    return _checked(_open_on_head(moved))


def check_commit(state: QueueState, sub: str, current: Cursor, cursor: Cursor) -> None:
    """Whether the holder of ``sub``'s consumer lease may move its cursor from ``current`` to
    ``cursor``: forward only (only an admin reset moves it back), and within the consume list
    (I5) -- or behind it, in segments retention already dropped, as long as its ``last_seq``
    claims no seq that was not in them (``trimmed_seq``). Such a cursor skips nothing stored:
    the next read from it goes on, or reports what retention took (RetentionOvertook). A
    consumer's commit held up past a retention pop is one (issue 39's commit thread on a loaded
    box); refusing it killed a consumer that had missed nothing."""
    if (cursor.seg, cursor.offset) < (current.seg, current.offset) or cursor.last_seq < current.last_seq:
        raise IllegalTransition("commit", f"cursor of {state.queue}/{sub} would move back from {current} to "
                                          f"{cursor} (only an admin reset moves it back)")
    low = state.consume[0].seg if state.consume else state.next_seg
    if cursor.seg < low and cursor.last_seq <= state.trimmed_seq:
        return
    try:
        check_invariants(state, {sub: cursor})
    except InvariantViolation as exc:
        raise IllegalTransition("commit", f"cursor {cursor} is outside the consume list: {exc.detail}") from exc
