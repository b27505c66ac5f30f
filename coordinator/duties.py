"""What the coordinator daemon should do for one queue, decided without I/O.

Rules:
- Pure: from a queue's state and the facts (liveness, cursors, config) to a list of actions.
  The daemon (``coordinator/daemon.py``) carries them out, each as a conditional transition
  or a Seal run, so a stale plan is harmless: its CAS fails and the next round re-plans.
- Correctness never depends on these duties (producers fail over and consumers seal on their
  own); they only make recovery faster and keep the lists tidy.
"""

from __future__ import annotations

import enum

import attrs

from ordq.coordinator.state import Facts, QueueState, SegStatus, empty_behind, holds_newest


class Kind(enum.Enum):
    FAIL_OVER = "fail_over"  # the head group lost a process or its disk space: move writes on at once
    SEAL = "seal"  # complete a sealing segment
    ADMIT = "admit"  # a recovered, drained group joins the send list
    POP = "pop"  # the head segment was read by every subscription
    RETAIN = "retain"  # an operator's retention limit drops the head segment
    ROLL = "roll"  # the open segment reached its size or age: seal it, continue on the next
    DROP_EMPTY = "drop_empty"  # a segment sealed empty behind a head that stays (state.drop_empty)


@attrs.frozen
class Limits:
    """A queue's settings that duties enforce (from its QueueConfig; None: no limit)."""

    retention_segments: int | None = None
    retention_time_s: float | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    segment_age_s: float | None = None


@attrs.frozen
class OpenSegment:
    """What the head master says of the open segment."""

    bytes: int
    first_write_ms: int | None  # wall clock of its first message; None while empty
    # The master will never write it again (it restarted while the segment was open, or its
    # disk or slave stream failed): roll it, so its acked messages become readable (sealed)
    # and writes resume on a new segment, with or without a producer.
    frozen: bool = False
    # Of ``bytes``, those of the messages both replicas hold (acked); None from a broker that
    # does not say (the roll then counts ``bytes``).
    acked_bytes: int | None = None


@attrs.frozen
class Action:
    kind: Kind
    gid: str | None = None
    seg: int | None = None
    later_stored: bool = False  # POP/RETAIN: the open segment holds a message (state.holds_newest)


def plan(state: QueueState, facts: Facts, limits: Limits = Limits(), *, now_ms: int = 0,
         open_info: OpenSegment | None = None) -> list[Action]:
    """Actions for one round, most urgent first."""
    actions: list[Action] = []
    open_seg = state.open_segment
    if open_seg is not None and (open_seg.gid not in facts.live_groups or open_seg.gid in facts.disk_full):
        # a dead head, or one out of disk space: a roll would open the next segment where
        # every write fails, so writes move on to a group with room
        actions.append(Action(Kind.FAIL_OVER, gid=open_seg.gid, seg=open_seg.seg))
    elif open_seg is not None and open_info is not None and (open_info.frozen
                                                             or _due_to_roll(open_info, limits, now_ms)):
        actions.append(Action(Kind.ROLL, gid=open_seg.gid, seg=open_seg.seg))
    actions.extend(
        Action(Kind.SEAL, gid=s.gid, seg=s.seg) for s in state.consume if s.status is SegStatus.SEALING
    )
    # groups without backlog first: a group that just failed over (it holds the segment it
    # failed) is not made head again ahead of the others (churn); it joins at the tail
    actions.extend(Action(Kind.ADMIT, gid=g) for g in state.admission_order(facts))
    # Every leading segment that can go, in order (one pop each): under heavy traffic many
    # segments may roll between two rounds, and popping one a round would fall behind.
    rest = state
    # the head master says the open segment holds a message: a later one than any sealed
    # (a master restarted since keeps no first-write time, but its bytes show a message)
    later = open_info is not None and (open_info.first_write_ms is not None or open_info.bytes > 0)
    while rest.consume and rest.consume[0].status is SegStatus.SEALED:
        head = rest.consume[0]
        if holds_newest(rest, facts, later_stored=later):
            break
        # read by every subscription; or sealed empty and no subscription is at or before it
        # (state.pop: nothing in it to read, issue 43's segment per session blip). Past it as
        # state.pop counts: at or past the next segment the list holds (state.QueueState.after).
        reached = rest.after(head.seg)
        if (facts.cursors or head.holds_nothing) and all(c.seg >= reached for c in facts.cursors.values()):
            actions.append(Action(Kind.POP, gid=head.gid, seg=head.seg, later_stored=later))
        elif past_retention(rest, limits, now_ms):
            actions.append(Action(Kind.RETAIN, gid=head.gid, seg=head.seg, later_stored=later))
        else:
            break
        rest = attrs.evolve(rest, consume=rest.consume[1:])
    # Segments sealed empty behind a head that stays (unread, or holding the newest message):
    # one failover of the idle head group each (issue 43); nothing in them to read.
    droppable = empty_behind(rest, facts)
    actions.extend(Action(Kind.DROP_EMPTY, gid=s.gid, seg=s.seg) for s in rest.consume if s.seg in droppable)
    return actions


def _due_to_roll(info: OpenSegment, limits: Limits, now_ms: int) -> bool:
    """By size: once the segment holds the size *acked*, and at least as much acked as not.
    After a roll the producer resends what was not acked on the new segment. Rolled by what its
    master wrote, that segment was over the size at once and rolled again before any of it was
    acked, each one holding more than the last (issue 26, a loaded run with 256 KiB segments:
    segments of 4180, 5567 and 7174 messages, the last two both seqs 8826..15999, 32 MB on the
    replicas' disks for a 16 MB run). Counted this way each roll moves at least the size out
    acked, and what is sent again is never more than what the segment keeps."""
    if limits.segment_bytes is not None:
        acked = info.bytes if info.acked_bytes is None else info.acked_bytes
        if acked >= limits.segment_bytes and 2 * acked >= info.bytes:
            return True
    return (limits.segment_age_s is not None and info.first_write_ms is not None
            and now_ms - info.first_write_ms >= limits.segment_age_s * 1000)


def past_retention(state: QueueState, limits: Limits, now_ms: int) -> bool:
    """Whether a retention limit drops the (sealed) head segment, read or not: too many
    sealed segments, sealed too long ago, or the sealed ones taking too many bytes."""
    head = state.consume[0]
    sealed = [s for s in state.consume if s.status is SegStatus.SEALED]
    if limits.retention_segments is not None and len(sealed) > limits.retention_segments:
        return True
    if (limits.retention_time_s is not None and head.sealed_ms is not None
            and now_ms - head.sealed_ms > limits.retention_time_s * 1000):
        return True
    return limits.retention_bytes is not None and sum(s.bytes or 0 for s in sealed) > limits.retention_bytes


def next_due_ms(state: QueueState, limits: Limits, *, open_info: OpenSegment | None = None) -> int | None:
    """When a duty of this queue falls due by the clock alone (wall clock, ms), or None: the
    open segment's age limit (counted from its first message) and the sealed head segment's
    retention time. Other duties follow a change the daemon is told of (a watch, a probe), so a
    daemon that plans a queue again at this time misses none (``coordinator/daemon_view.py``)."""
    due: list[int] = []
    open_seg = state.open_segment
    if (open_seg is not None and open_info is not None and open_info.first_write_ms is not None
            and limits.segment_age_s is not None):
        due.append(open_info.first_write_ms + int(limits.segment_age_s * 1000))
    head = state.consume[0] if state.consume else None
    if (head is not None and head.status is SegStatus.SEALED and head.sealed_ms is not None
            and limits.retention_time_s is not None):
        due.append(head.sealed_ms + int(limits.retention_time_s * 1000) + 1)  # past_retention: strictly after
    return min(due) if due else None
