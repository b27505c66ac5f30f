"""Taking broker groups out of service: drain (out of every send list, kept out), undrain,
remove (unregister once nothing needs it); and rolling a queue's open segment.

Guarantee: every list change is a conditional transition of ``ordq.coordinator.state`` applied by
the store; a drain mark is checked in the same write as any admit (``ZkStore.apply``), so a
drained group is never re-admitted behind the operator's back.
"""

from __future__ import annotations

from typing import Any

import attrs

from ordq.common.errors import IllegalTransition, OrdqError
from ordq.coordinator import state as sm
from ordq.coordinator.paths import check_name
from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import roll_transition
from ordq.sdk.replicas import ReplicaReader

# -- draining and removing groups --------------------------------------------------------------


@attrs.frozen
class DrainedQueue:
    queue: str
    was_head: bool
    new_head: str | None
    sealing_seg: int | None  # the segment failed over from the drained head
    sealed: bool | None  # whether this command could seal it (None: nothing to seal)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def drain_group(store: ZkStore, reader: ReplicaReader, gid: str, *, force: bool = False) -> list[DrainedQueue]:
    """Mark ``gid`` drained (never admitted again until undrained) and take it out of every
    send list. Where it was the head this is a fail_over; its old segment is then sealed (best
    effort) so its master refuses further writes and producers follow the new head at once.

    Refused (IllegalTransition) when it would leave a queue with no writable group, unless
    ``force``: its producers would wait until a group is admitted."""
    store.get_group(gid)  # GroupNotFound
    if not force:
        stranded = stranded_queues(store, gid)
        if stranded:
            raise IllegalTransition(
                "drain", f"group {gid} is the last group that can take writes for {', '.join(stranded)}: "
                "its producers would wait until another group is admitted (pass --force to drain anyway)")
    store.set_group_drained(gid, True)
    out = []
    for queue in store.list_queues():
        st, _ = store.load_state(queue)
        if gid not in st.send:
            continue
        was_head = st.head == gid
        open_seg = st.open_segment.seg if was_head and st.open_segment else None
        try:
            st = store.apply(queue, lambda s, f: sm.remove_from_send(s, gid, f) if gid in s.send else s)
        except IllegalTransition:
            st, _ = store.load_state(queue)  # moved by someone else meanwhile
        sealed: bool | None = None
        if open_seg is not None:
            st, sealed = seal_now(store, reader, st, open_seg)
        out.append(DrainedQueue(queue, was_head, st.head, open_seg, sealed))
    return out


# How long an admin verb waits for the coordinator to seal (it completes the seal later anyway).
SEAL_TIMEOUT_S = 10.0


def seal_now(store: ZkStore, reader: ReplicaReader, st: sm.QueueState, seg: int) -> tuple[sm.QueueState, bool]:
    """Seal ``seg`` (a segment just failed over or rolled) so its master refuses further
    writes and producers follow the new segment at once. The coordinator runs the Seal
    protocol (brokers take Seal only from coordinators and brokers): asked here, best effort.
    False when it could not seal now (no coordinator or no replica answered; the elected
    coordinator completes it later, or the consumer that reaches its end asks again)."""
    from ordq.common.security import of_store
    from ordq.coordinator.client import CoordinatorClient

    target = st.segment(seg)
    if target is None or target.status is not SegStatus.SEALING:
        return st, True
    try:
        with CoordinatorClient(store, credentials=of_store(store), timeout_s=SEAL_TIMEOUT_S) as coord:
            st = coord.seal(st.queue, seg)
    except OrdqError:
        return st, False
    done = st.segment(seg)
    return st, done is None or done.status is SegStatus.SEALED


@attrs.frozen
class RolledQueue:
    queue: str
    head: str  # the group the new segment opened on
    sealing_seg: int  # the segment that was open
    new_seg: int
    sealed: bool

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def roll_queue(store: ZkStore, reader: ReplicaReader, queue: str) -> RolledQueue:
    """Seal the open segment of ``queue``'s head and open the next one, on the same head or
    the next group as the queue's ``roll_to`` says (``ordq.coordinator.state.roll``), then seal the
    old one: producers continue on the new segment
    with the next seq; the old one can be popped once every subscription read it.
    IllegalTransition when the queue has no open segment (no writable group)."""
    st, _ = store.load_state(queue)
    cfg = store.queue_config(queue)
    for _ in range(10):
        open_seg = st.open_segment
        if open_seg is None:
            raise IllegalTransition("roll", f"queue {queue!r} has no open segment (no group takes writes)")
        try:
            st = store.apply(queue, roll_transition(cfg, open_seg.gid, open_seg.seg))
        except IllegalTransition:
            st, _ = store.load_state(queue)  # a failover or another roll meanwhile: roll what is open now
            continue
        new = st.open_segment
        assert new is not None
        st, sealed = seal_now(store, reader, st, open_seg.seg)
        return RolledQueue(queue, new.gid, open_seg.seg, new.seg, sealed)
    raise IllegalTransition("roll", f"queue {queue!r}: its open segment kept moving; try again")


def stranded_queues(store: ZkStore, gid: str) -> list[str]:
    """The queues that draining ``gid`` now would leave with an empty send list."""
    out = []
    for queue in store.list_queues():
        st, _ = store.load_state(queue)
        if gid not in st.send:
            continue
        facts, _ = store.facts(st, with_cursors=False)
        after = sm.remove_from_send(st, gid, attrs.evolve(facts, drained=facts.drained | {gid}))
        if not after.send:
            out.append(queue)
    return out


@attrs.frozen
class UndrainedQueue:
    queue: str
    admitted: bool
    why_not: str | None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def undrain_group(store: ZkStore, gid: str) -> list[UndrainedQueue]:
    """Clear the drain mark and admit ``gid`` at the tail of the send lists it may join now
    (``QueueState.admission_order``: live, and no unread segments while another group takes
    writes); the coordinator daemon admits it to the others once it may."""
    store.get_group(gid)
    store.set_group_drained(gid, False)
    out = []
    for queue in store.list_queues():
        st, _ = store.load_state(queue)
        if gid not in st.groups:
            continue
        if gid in st.send:
            out.append(UndrainedQueue(queue, True, None))
            continue
        def admit(s: sm.QueueState, f: sm.Facts) -> sm.QueueState:
            if gid in s.send:
                return s
            if s.eligible(gid, f) and gid not in s.admission_order(f):
                raise IllegalTransition("admit", f"group {gid} still holds unconsumed segments of {s.queue} (admitted "
                                        "once they are read, or as soon as no other group takes writes)")
            return sm.admit(s, gid, f)

        try:
            st = store.apply(queue, admit)
            out.append(UndrainedQueue(queue, True, None))
        except IllegalTransition as exc:
            out.append(UndrainedQueue(queue, False, exc.reason))
    return out


def remove_group(store: ZkStore, gid: str) -> list[str]:
    """Unregister ``gid``: take it out of every queue it serves, then delete it. Refused while
    its processes are live, while it is in a send list (drain it first) or while it holds
    segments not yet consumed. Returns the queues it was taken out of."""
    store.get_group(gid)
    blockers = []
    serving = []
    for queue in store.list_queues():
        st, _ = store.load_state(queue)
        if gid not in st.groups:
            continue
        serving.append(queue)
        if gid in st.send:
            blockers.append(f"it is in the send list of {queue} (drain it first: ordq group drain {gid})")
        elif st.has_backlog(gid):
            segs = ",".join(str(s.seg) for s in st.consume if s.gid == gid)
            blockers.append(f"it holds segments {segs} of {queue} not yet consumed by every subscription")
    live = store.live_members(gid)
    if live:
        blockers.append(f"its processes are live ({', '.join(sorted(live))}): stop them first")
    if blockers:
        raise IllegalTransition("remove group", f"group {gid}: " + "; ".join(blockers))
    for queue in serving:
        store.apply(queue, lambda s, _f: sm.remove_group(s, gid) if gid in s.groups else s)
    store.remove_group(gid)
    return serving




# -- a queue's groups ----------------------------------------------------------------------------


def add_group_to_queue(store: ZkStore, queue: str, gid: str) -> sm.QueueState:
    """Let ``gid`` serve ``queue``: it joins the end of the send list at once when it is live
    and not drained, else when it becomes so (the coordinator admits it)."""
    check_name("group", gid)
    store.get_group(gid)  # GroupNotFound
    store.apply(queue, lambda s, _f: sm.add_group(s, gid))
    # A second write: the facts (liveness) are read for the queue's groups, now with gid.
    return store.apply(queue, lambda s, f: sm.admit(s, gid, f) if s.eligible(gid, f) else s)


def remove_group_from_queue(store: ZkStore, queue: str, gid: str, *, force: bool = False) -> sm.QueueState:
    """Stop ``gid`` serving ``queue``: it leaves the send list (a head is failed over), and is
    removed once it holds no segment subscriptions still need. IllegalTransition, after it
    left the send list, while it still holds some (run it again once they are read); and,
    unless ``force``, before anything when it is the only group taking writes."""
    check_name("group", gid)
    st, _ = store.load_state(queue)
    if gid not in st.groups:
        raise IllegalTransition("remove_group", f"group {gid} does not serve queue {queue}")
    if st.send == (gid,) and not force:
        raise IllegalTransition("remove_group", f"group {gid} is the only group taking writes to {queue}: its "
                                "producers would wait (add another group first, or pass --force)")

    def leave(s: sm.QueueState, facts: sm.Facts) -> sm.QueueState:
        # One write: between a write that takes it out of the send list and one that removes
        # it, the daemon (which reacts to the change at once) would admit it again.
        if gid in s.send:
            s = sm.remove_from_send(s, gid, facts)
        return s if s.has_backlog(gid) else sm.remove_group(s, gid)

    st = store.apply(queue, leave)
    held = [s.seg for s in st.consume if s.gid == gid]
    if held:
        raise IllegalTransition("remove_group", f"group {gid} left the send list of {queue} but still holds segments "
                                f"{held} that subscriptions have not read: run this again once they are popped "
                                f"(ordq queue describe {queue})")
    return st
