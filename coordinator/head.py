"""The coordinator's protocol steps on a queue's head for its producer (DESIGN §5, Producer):
taking over after a claim, and failing the head over. Run by the coordinator service
(``coordinator/service.py``) on a producer's request; the producer itself writes no ZooKeeper
and calls no control RPC (it holds a client certificate, which brokers refuse them from).

Rules:
- Talks only to ZooKeeper (CAS transitions of ``ordq.coordinator.state``) and to brokers (Fence,
  Seal) through an injected ``HeadTransport``; holds no batches and no producer state, so the
  producer decides what to resend. Imports nothing of broker_group.
- Never moves the head for a deposed leader: every CAS it writes first checks that no
  successor bumped the epoch (``FencedError`` otherwise, nothing changed).
- Never guesses where seq continues: when no replica of the open segment answers it seals
  what it can and waits (bounded by ``no_group_timeout_s``) with a clear status.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import attrs

from ordq.common.errors import (
    BrokerUnavailable,
    ConfigError,
    CoordinationUnavailable,
    FencedError,
    IllegalTransition,
    NoGroupAvailable,
    OrdqError,
    PermissionDenied,
    WaitTimeout,
)
from ordq.coordinator import state as sm
from ordq.coordinator.seal import run_seal
from ordq.coordinator.state import QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.wire.transport import ReplicaEnd, SealTransport

log = logging.getLogger("ordq.coordinator.head")

# A replica without a Fence reply: where ("g1 master ADDRESS"), and its error (None: not live)
FenceFailure = tuple[str, OrdqError | None]

# Why no group takes writes (backlog does not count when none does: DESIGN I4)
NO_WRITABLE_GROUP = "no group of the queue has master and slave live (and is not drained, nor out of disk space)"


class HeadTransport(SealTransport, Protocol):
    """What the head protocol needs from brokers: Seal, the repair copy, and Fence."""

    def fence(self, address: str, queue: str, seg: int, epoch: int) -> ReplicaEnd: ...


@attrs.frozen
class Takeover:
    """Where a new leader writes: its epoch, the head segment, and the last stored message as
    (seq, seg, offset) — None for an empty queue; seg and offset -1 when only the seq is known."""

    epoch: int
    gid: str
    seg: int
    last: tuple[int, int, int] | None


class HeadProtocol:
    def __init__(self, store: ZkStore, transport: HeadTransport, queue: str, *, no_group_timeout_s: float) -> None:
        self.store, self.transport, self.queue = store, transport, queue
        self.no_group_timeout_s = no_group_timeout_s

    def take_over(self, epoch: int) -> Takeover:
        """After the claim bumped the epoch to ``epoch``: fence the open segment, bring its
        replicas level, find where seq continues. FencedError when a later claim won.

        Bounded: the head moves at most once per group of the send list, and not at all when
        a replica refuses the Fence (ConfigError: a refusal, e.g. tokens on a plaintext cluster,
        whose coordinators then have no right to fence, is the same on every group); past
        that, BrokerUnavailable names each replica's answer. Unbounded, a claim whose fences
        all failed made a new segment every ~15 ms for as long as its producer asked (stop 84:
        700 segments of an empty queue in 40 s)."""
        store = self.store
        deadline = time.monotonic() + self.no_group_timeout_s
        moves, most = 0, None
        while True:
            st, _ = store.load_state(self.queue)
            self.check_epoch(st, epoch)
            if most is None:  # one move per group of the send list as the claim found it (it shrinks as heads fail)
                most = max(len(st.send), 1)
            open_seg = st.open_segment
            if open_seg is None:
                self._seal_all_sealing(st)
                st = self._wait_for_head(deadline)
                continue
            replies, failures = self._fence_replicas(open_seg.gid, open_seg.seg, epoch)
            ends = {r.end for r in replies.values() if r is not None}
            if len(ends) == 1 and len(replies) == 2 and all(replies.values()):
                reply = next(r for r in replies.values() if r is not None)
                last: tuple[int, int, int] | None
                if reply.end > 0:
                    assert reply.last_seq is not None
                    last = (reply.last_seq, open_seg.seg, reply.end - 1)
                else:
                    st = self._seal_all_sealing(st)
                    last = _last_of_sealed(st)
                return Takeover(epoch=epoch, gid=open_seg.gid, seg=open_seg.seg, last=last)
            said = "; ".join(f"{where}: {exc or 'not live'}" for where, exc in failures) or "their ends differ"
            if any(isinstance(exc, PermissionDenied) for _, exc in failures):
                raise ConfigError(f"queue {self.queue}: the brokers refuse this coordinator's Fence of segment "
                                  f"{open_seg.seg} ({said}); the head is not moved (docs/SECURITY.md)")
            if moves >= most:
                raise BrokerUnavailable(f"group {open_seg.gid}", f"queue {self.queue}: segment {open_seg.seg} "
                                        f"could not be fenced ({said}), after the head moved {moves} times in "
                                        "this claim: it moves no further until a replica answers")
            # One replica down or the two disagree: move on to a new segment and seal this one
            # (the Seal protocol decides its end from whoever answers).
            self.fail_over_from(open_seg.gid, open_seg.seg, epoch)
            moves += 1

    def check_epoch(self, st: QueueState, epoch: int) -> None:
        if st.producer_epoch > epoch:
            raise FencedError(self.queue, epoch, st.producer_epoch)

    def fail_over_from(self, gid: str, seg: int, epoch: int, *, wait: bool = True) -> QueueState:
        """CAS fail_over(gid, seg); if someone already moved the head, follow it. Starts the
        seal of the old segment in the background. Returns a state with an open segment.

        FencedError, changing nothing, when a successor bumped the epoch: a deposed leader
        (e.g. one resumed after a hang, its ack deadline long past) must not fail over and
        seal the segment its successor now writes to."""
        deadline = time.monotonic() + self.no_group_timeout_s

        def fail_over(s: QueueState, f: sm.Facts) -> QueueState:
            self.check_epoch(s, epoch)  # checked on the very state the CAS writes over
            return sm.fail_over(s, gid, seg, f)

        while True:
            try:
                st = self.store.apply(self.queue, fail_over)
                break
            except IllegalTransition:
                st, _ = self.store.load_state(self.queue)
                break
            except CoordinationUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.seal_in_background(seg)
        if st.open_segment is None and wait:
            st = self._wait_for_head(deadline)
        return st

    def roll(self, transition: Any, seg: int) -> QueueState:
        """CAS the roll ``transition`` of ``seg`` (IllegalTransition: someone moved the head
        first, the caller follows the state); seal the rolled segment in the background."""
        st = self.store.apply(self.queue, transition)
        self.seal_in_background(seg)
        return st

    def seal_in_background(self, seg: int) -> None:
        threading.Thread(target=self._seal_quietly, args=(seg,), name="ordq-seal", daemon=True).start()

    def wait_for_head(self) -> QueueState:
        """A state with an open segment, admitting groups, bounded by ``no_group_timeout_s``."""
        return self._wait_for_head(time.monotonic() + self.no_group_timeout_s)

    def _fence_replicas(self, gid: str, seg: int, epoch: int) -> tuple[dict[str, Any], list[FenceFailure]]:
        """Each replica's Fence reply (None: not live, or it failed) and, for those without
        one, where and why (``("g1 master ADDRESS", the error)``; ``("g1 slave", None)``: not live)."""
        members = self.store.live_members(gid)
        replies: dict[str, Any] = {}
        failures: list[FenceFailure] = []
        for role in ("master", "slave"):
            info = members.get(role)
            if info is None:
                replies[role] = None
                failures.append((f"{gid} {role}", None))
                continue
            try:
                replies[role] = self.transport.fence(info.address, self.queue, seg, epoch)
            except FencedError:
                raise
            except OrdqError as exc:
                replies[role] = None
                failures.append((f"{gid} {role} {info.address}", exc))
        return replies, failures

    def _seal_all_sealing(self, st: QueueState) -> QueueState:
        for s in st.consume:
            if s.status is SegStatus.SEALING:
                st = self._seal_blocking(s.seg)
        return st

    def _seal_blocking(self, seg: int) -> QueueState:
        """Seal ``seg``; while no replica answers (a double fault), wait with a clear status."""
        deadline = time.monotonic() + self.no_group_timeout_s
        while True:
            try:
                return run_seal(self.store, self.transport, self.queue, seg)
            except BrokerUnavailable as exc:
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(
                        "segment replicas", f"segment {seg}: no replica answers, cannot know where seq continues"
                    ) from exc
                log.warning("queue %s: waiting for a replica of segment %d", self.queue, seg)
                time.sleep(0.2)

    def _seal_quietly(self, seg: int) -> None:
        try:
            run_seal(self.store, self.transport, self.queue, seg)
        except OrdqError as exc:
            log.info("queue %s: seal of segment %d deferred: %s", self.queue, seg, exc)

    def _wait_for_head(self, deadline: float) -> QueueState:
        """Until some group is writable: admit every eligible group, again on each state change
        and at least every 0.5 s. A group becomes eligible when its two processes are live
        again or its backlog was consumed (popped), and no one else may be there to admit it:
        the coordinator daemon is optional. NoGroupAvailable at ``deadline``."""
        store, q = self.store, self.queue
        while True:
            try:
                st = store.apply(q, sm.admit_all)
                if st.open_segment is not None:
                    return st
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoGroupAvailable(q, NO_WRITABLE_GROUP)
                return store.wait_state(q, lambda s: s.open_segment is not None, timeout_s=min(left, 0.5))
            except (WaitTimeout, CoordinationUnavailable):
                if time.monotonic() >= deadline:
                    raise NoGroupAvailable(q, NO_WRITABLE_GROUP) from None


def _last_of_sealed(st: QueueState) -> tuple[int, int, int] | None:
    best: tuple[int, int, int] | None = None
    for s in st.consume:
        if s.status is SegStatus.SEALED and s.end and s.last_seq is not None:
            best = (s.last_seq, s.seg, s.end - 1)
    if best is None and st.trimmed_seq >= 0:
        return (st.trimmed_seq, -1, -1)
    return best
