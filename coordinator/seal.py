"""The Seal protocol (DESIGN §5): decide a ``sealing`` segment's end from its replicas.

Guarantee: an acked batch is on both replicas, so it is in whichever replica answers; the end
chosen is the longest answering replica's durable end, so nothing acked is cut off. Entries
past the last ack were never acked: the producer resends them with the same seqs to the next
segment and consumers drop the duplicates by seq. Any party may run it; it is idempotent
(a second run finds the replicas already sealed and the CAS already done).

Rules: ``decide`` is pure; ``run_seal`` does the I/O through a ``SealTransport``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import attrs

from ordq.common.errors import BrokerUnavailable, IllegalTransition, OrdqError
from ordq.common.security import Credentials
from ordq.coordinator import state as sm
from ordq.coordinator.duties import OpenSegment
from ordq.coordinator.group_moves import transactions
from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import Known, ZkStore
from ordq.coordinator.store_values import LiveInfo, StateVersion, StateWrite
from ordq.wire.transport import BatchSealTransport, ReplicaEnd, SealTransport

log = logging.getLogger("ordq.coordinator")


@attrs.frozen
class SealPlan:
    end: int
    first_seq: int | None
    last_seq: int | None
    bytes: int = 0  # of the longest copy: what the segment takes on each replica once copied
    copy_to: str | None = None  # role of the shorter replica, to copy [its end, end)
    copy_from: str | None = None


def decide(replies: Mapping[str, ReplicaEnd | None]) -> SealPlan:
    """From the replicas' answers (role -> end, None when it did not answer) to the plan."""
    answered = {role: r for role, r in replies.items() if r is not None}
    if not answered:
        raise BrokerUnavailable("all replicas", "no replica of the segment answered Seal")
    longest_role = max(sorted(answered), key=lambda role: answered[role].end)
    longest = answered[longest_role]
    first_seq = next((r.first_seq for r in answered.values() if r.first_seq is not None), None)
    plan = SealPlan(end=longest.end, first_seq=first_seq if longest.end else None,
                    last_seq=longest.last_seq if longest.end else None, bytes=longest.bytes)
    shorter = [role for role, r in answered.items() if r.end < longest.end]
    if shorter:
        plan = attrs.evolve(plan, copy_to=shorter[0], copy_from=longest_role)
    return plan


def run_seal(store: ZkStore, transport: SealTransport, queue: str, seg: int, *,
             known: tuple[sm.QueueState, StateVersion] | None = None,
             members: Mapping[str, LiveInfo] | None = None) -> sm.QueueState:
    """Seal ``seg`` of ``queue`` if it is ``sealing`` and return the resulting state.

    ``known``: (state, version) the caller already read, ``members``: the segment group's live
    processes it knows (the coordinator daemon's watched copies), used instead of reading them
    again (issue 29: after a head master's death one seal per queue it headed). A stale copy is
    harmless: the write checks the version (a conflict re-reads), and a replica that does not
    answer at a stale address counts as not answering.

    Raises BrokerUnavailable when no replica answers (consumers wait at that segment;
    producers are not blocked)."""
    st, version = known if known is not None else store.load_state_to_write(queue)
    target = st.segment(seg)
    if target is None or target.status is SegStatus.SEALED:
        return st if known is None else run_seal(store, transport, queue, seg)  # a copy may be old: read
    if target.status is not SegStatus.SEALING:
        if known is not None:
            return run_seal(store, transport, queue, seg)
        raise IllegalTransition("seal", f"segment {seg} of {queue} is {target.status.value}")
    if members is None:
        members = store.live_members(target.gid)
    replies: dict[str, ReplicaEnd | None] = {}
    for role in ("master", "slave"):
        info = members.get(role)
        try:
            replies[role] = transport.seal(info.address, queue, seg) if info else None
        except OrdqError:
            replies[role] = None
    plan = decide(replies)
    # The seal reads no facts: the first attempt writes against the state read above (its
    # version checked), without reading liveness, drain marks and cursors again (issue 29: a
    # failover of 10,000 idle queues is as many seals).
    first = Known(state=st, version=version, facts=sm.Facts(), group_versions={})
    try:
        st = store.apply(queue, lambda s, _f: sm.seal(s, seg, plan.end, plan.first_seq, plan.last_seq,
                                                      at_ms=int(time.time() * 1000), size=plan.bytes),
                         known=first)
    except IllegalTransition:
        st, _ = store.load_state(queue)  # sealed by someone else meanwhile: idempotent
        done = st.segment(seg)
        if done is None or done.status is SegStatus.SEALED:
            return st
        raise
    if plan.copy_to is not None and plan.copy_from is not None:
        # After the CAS: a broker copies only up to the sealed end ZooKeeper records, from its
        # registered peer (broker_group/repair.py). Best effort: a replica that cannot copy
        # now reconciles by itself (its reconcile thread) before serving past what it holds.
        to, frm = members[plan.copy_to], members[plan.copy_from]
        done = st.segment(seg)
        try:
            transport.copy_from_peer(to.address, queue, seg, frm.address,
                                     done.end if done is not None and done.end is not None else plan.end)
        except OrdqError:
            pass
    return st


# How many segments a SealMany call names is the caller's (coordinator/daemon_seals.py
# SEAL_BATCH); the seal transitions are written in transactions bounded as the moves' are
# (``group_moves.transactions``).


def seal_batch(store: ZkStore, transport: BatchSealTransport, gid: str,
               items: Sequence[tuple[str, int, sm.QueueState, StateVersion]],
               members: Mapping[str, LiveInfo]) -> list[str]:
    """Seal many ``sealing`` segments of one group at once (issue 43: after it headed thousands
    of queues and died): one SealMany call per replica its members name, ``decide`` per segment
    as ``run_seal`` does, then the seal transitions of all of them in bounded ZooKeeper
    transactions sent together (``ZkStore.apply_batches``), each against the (state, version)
    given; the copies a shorter replica needs follow, as in ``run_seal``. ``items``: (queue,
    seg, state, version), each segment on ``gid``. A seal whose state moved meanwhile is written
    again once on the state read then. Returns the queues not sealed here (no replica answered
    for it, its state moved twice, or it was not ``sealing``): the caller seals them one by one
    (``run_seal``), which reads afresh. Raises BrokerUnavailable when no replica
    answers at all."""
    refs = [(q, seg) for q, seg, _st, _v in items]
    answers: dict[str, dict[tuple[str, int], ReplicaEnd | None]] = {}
    why: list[str] = []  # each replica's failure, for the log (scale43n: a slave's ZooKeeper blip)
    for role in ("master", "slave"):
        info = members.get(role)
        if info is None:
            why.append(f"{role}: not live")
            continue
        try:
            answers[role] = transport.seal_many(info.address, refs)
        except OrdqError as exc:
            why.append(f"{role}: {type(exc).__name__}: {exc}")
    if not answers:
        raise BrokerUnavailable(f"group {gid}", f"no replica answered SealMany ({'; '.join(why)})")
    now_ms = int(time.time() * 1000)
    plans: dict[str, tuple[int, SealPlan]] = {}
    for q, seg, _st, _version in items:
        replies = {role: got.get((q, seg)) for role, got in answers.items()}
        if any(r is not None for r in replies.values()):
            plans[q] = (seg, decide(replies))
    done, conflicted, left = _write_seals(store, gid, [(q, st, v) for q, _seg, st, v in items if q in plans], plans,
                                          now_ms)
    unanswered = [q for q, _seg, _st, _v in items if q not in plans]
    reasons = {"no replica sealed it": len(unanswered), "not sealing on the group": len(left)}
    left += unanswered
    if conflicted:
        # Their states moved since they were read (a pop of an earlier segment, a hand-over's
        # admit): the replicas' ends still hold (a sealed copy's end never changes), so the seals
        # are written again on the states read now, in batches. Until stop 74 each went one by
        # one (``run_seal``: its Seal calls again, its own write): at 10^5 queues a spread back
        # after a failover left a third of every batch so, 20,515 of them in one run.
        fresh = store.load_states(conflicted)
        again = [(q, got[0], got[1]) for q in conflicted
                 if (got := fresh.get(q)) is not None and not isinstance(got, Exception)]
        unread = sorted(set(conflicted) - {q for q, _st, _v in again})  # deleted meanwhile, or corrupt
        redone, conflicted, still = _write_seals(store, gid, again, plans, now_ms)
        done += redone
        left += still + unread
        reasons.update({"not sealing when read again": len(still), "gone or corrupt when read again": len(unread),
                    "moved twice": len(conflicted)})
    if left or conflicted:  # why they go one by one (stop 74: whole batches of a group just back, cause unknown)
        log.info("group %s: of a seal batch of %d, %d left to seal one by one: %s", gid, len(items),
                 len(left) + len(conflicted), ", ".join(f"{n} {reason}" for reason, n in reasons.items() if n))
    for q in done:
        seg, plan = plans[q]
        if plan.copy_to is not None and plan.copy_from is not None:
            try:  # best effort, as in run_seal: the replica reconciles by itself otherwise
                transport.copy_from_peer(members[plan.copy_to].address, q, seg, members[plan.copy_from].address,
                                         plan.end)
            except OrdqError:
                pass
    return left + conflicted


def _write_seals(store: ZkStore, gid: str, rows: Sequence[tuple[str, sm.QueueState, StateVersion]],
                 plans: Mapping[str, tuple[int, SealPlan]], now_ms: int) -> tuple[list[str], list[str], list[str]]:
    """The seal transition of each row's segment (``plans``: queue -> (seg, plan)), written
    against the row's (state, version) in bounded transactions sent together
    (``ZkStore.apply_batches``). Returns (written, moved since: a version check lost, left: the
    segment not ``sealing`` on ``gid`` in the state given)."""
    writes: list[StateWrite] = []
    left: list[str] = []
    for q, st, version in rows:
        seg, plan = plans[q]
        target = st.segment(seg)
        if target is None or target.status is not SegStatus.SEALING or target.gid != gid:
            left.append(q)
            continue
        try:
            new = sm.seal(st, seg, plan.end, plan.first_seq, plan.last_seq, at_ms=now_ms, size=plan.bytes)
        except IllegalTransition:
            left.append(q)
            continue
        writes.append((q, version, new))
    done: list[str] = []
    conflicted: list[str] = []
    # every transaction sent before the first answer is awaited: their round trips and log
    # syncs overlap (one after another, a batch of 500 waited three of each); the groups'
    # drain marks are not read by a seal: no check beside the states
    for ok, lost in store.apply_batches(transactions(writes), {}):
        done += ok
        conflicted += lost
    return done, conflicted, left


def make_sealer(store: ZkStore, credentials: Credentials | None = None) -> Callable[..., None] | None:
    """A (queue, seg, known=, members=) -> None runner (``run_seal``) over the gRPC transport,
    or None if it is unavailable.
    ``credentials``: what it presents to brokers (a coordinator's certificate); None: those
    registered for the cluster."""
    try:
        from ordq.wire.client import GrpcSealTransport
    except ImportError:
        return None
    from ordq.common.security import of_store

    transport = GrpcSealTransport(credentials=credentials or of_store(store))

    def sealer(queue: str, seg: int, *, known: tuple[sm.QueueState, StateVersion] | None = None,
               members: Mapping[str, LiveInfo] | None = None) -> None:
        run_seal(store, transport, queue, seg, known=known, members=members)

    return sealer


def make_batch_sealer(store: ZkStore, credentials: Credentials | None = None) -> Callable[..., list[str]] | None:
    """A (gid, items, members) -> queues left runner (``seal_batch``) over the gRPC transport,
    or None if it is unavailable. ``credentials`` as for ``make_sealer``."""
    try:
        from ordq.wire.client import GrpcSealTransport
    except ImportError:
        return None
    from ordq.common.security import of_store

    transport = GrpcSealTransport(credentials=credentials or of_store(store))

    def many(gid: str, items: Sequence[tuple[str, int, sm.QueueState, StateVersion]],
             members: Mapping[str, LiveInfo]) -> list[str]:
        return seal_batch(store, transport, gid, items, members)

    return many


def make_prober(store: ZkStore, credentials: Credentials | None = None
                ) -> Callable[[str], Mapping[tuple[str, int], OpenSegment]] | None:
    """An asker of a head master (by address) of every open segment it holds, as
    {(queue, seg): OpenSegment} (for rolling by size and age, and frozen segments), or None
    if the broker client is unavailable. ``credentials`` as for ``make_sealer``."""
    try:
        from ordq.wire.client import GrpcTransport
    except ImportError:
        return None
    from ordq.common.security import of_store

    transport = GrpcTransport(credentials=credentials or of_store(store))

    def prober(address: str) -> Mapping[tuple[str, int], OpenSegment]:
        answer = transport.open_segments(address)
        return {(s.queue, int(s.seg)): OpenSegment(bytes=int(s.end.bytes),
                                                   first_write_ms=int(s.end.first_write_ms) or None,
                                                   frozen=bool(s.end.frozen),
                                                   acked_bytes=int(s.end.acked_bytes)
                                                   if s.end.HasField("acked_bytes") else None)
                for s in answer.segments}

    return prober
