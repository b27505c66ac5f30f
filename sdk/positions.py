"""Moving a subscription's cursor (``ordq sub reset``).

Guarantee: a cursor is written only while this process holds the subscription's consumer
lease itself (so no consumer runs on the old cursor meanwhile), unless forced, and only if
neither the cursor nor the queue state moved since the target was computed (so it is inside
the consume list: I5). A reset cursor names the position of its target message *and*
``last_seq = target seq - 1``: the consumer's delivery filter drops seqs <= ``last_seq``, so
moving back must lower it, and moving forward must raise it to exactly the message before, or
the filter would raise a gap.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from ordq.common.errors import BrokerUnavailable, ConfigError, ConflictError, OrdqError
from ordq.coordinator import state as sm
from ordq.coordinator.state import Cursor, QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.sdk.replicas import (
    Location,
    ReplicaReader,
    SeqNotFound,
    format_time_us,
    last_readable_seq,
    locate_seq,
    locate_time,
    parse_time,
)


class SubscriptionHeld(OrdqError):
    """A consumer holds the subscription: resetting its cursor under it is refused."""

    retriable = True

    def __init__(self, queue: str, sub: str, holder: str) -> None:
        super().__init__(
            f"subscription {queue}/{sub} is held by consumer {holder!r}: stop it first, or pass --force "
            "(that consumer then stops: its next cursor commit fails)"
        )
        self.queue = queue
        self.sub = sub
        self.holder = holder


# -- resetting a subscription ------------------------------------------------------------------


@attrs.frozen
class ResetTarget:
    kind: str  # earliest | latest | seq | time
    seq: int | None = None
    time_us: int | None = None

    def __str__(self) -> str:
        if self.kind == "seq":
            return f"seq {self.seq}"
        if self.kind == "time":
            assert self.time_us is not None
            return f"time {format_time_us(self.time_us)}"
        return self.kind


def parse_reset_target(words: Sequence[str], *, now_s: Callable[[], float] = time.time) -> ResetTarget:
    """``earliest`` | ``latest`` | ``seq N`` | ``time T`` (T as in ``parse_time``)."""
    usage = "a target is one of: earliest | latest | seq N | time T"
    if len(words) == 1 and words[0] in ("earliest", "latest"):
        return ResetTarget(words[0])
    if len(words) == 2 and words[0] == "seq":
        try:
            seq = int(words[1])
        except ValueError:
            raise ConfigError(f"bad seq {words[1]!r}: {usage}") from None
        if seq < 0:
            raise ConfigError(f"seq must be >= 0, not {seq}")
        return ResetTarget("seq", seq=seq)
    if len(words) == 2 and words[0] == "time":
        return ResetTarget("time", time_us=parse_time(words[1], now_s=now_s))
    raise ConfigError(f"bad reset target {' '.join(words)!r}: {usage}")


def latest_cursor(store: ZkStore, reader: ReplicaReader, st: QueueState) -> Cursor:
    """After the last readable message. Needs every segment that is not sealed readable: the
    cursor's ``last_seq`` must be exact or the consumer would see a gap."""
    extents = reader.extents(st)
    last = last_readable_seq(st, extents)
    if last is None:
        bad = next(e for e in extents if e.end is None)
        raise BrokerUnavailable(f"group {bad.gid}", f"no replica answered for segment {bad.seg}")
    if not extents:
        return Cursor(seg=st.next_seg, offset=0, last_seq=last)
    tail = extents[-1]
    assert tail.end is not None
    if tail.status is SegStatus.SEALED:
        return Cursor(seg=tail.seg + 1, offset=0, last_seq=last)
    return Cursor(seg=tail.seg, offset=tail.end, last_seq=last)


def resolve_target(store: ZkStore, reader: ReplicaReader, st: QueueState,
                   target: ResetTarget) -> tuple[Cursor, Location | None]:
    """The cursor a target means in state ``st`` (and the message it starts at, if any)."""
    if target.kind == "earliest":
        return st.earliest_cursor(), None
    if target.kind == "latest":
        return latest_cursor(store, reader, st), None
    if target.kind == "seq":
        assert target.seq is not None
        try:
            loc = locate_seq(store, reader, st.queue, target.seq, state=st)
        except SeqNotFound:
            latest = latest_cursor(store, reader, st)
            if target.seq == latest.last_seq + 1:
                return latest, None  # the next message to be produced: same as latest
            raise
        return loc.cursor(), loc
    if target.kind == "time":
        assert target.time_us is not None
        found = locate_time(store, reader, st.queue, target.time_us, state=st)
        if found is None:
            return latest_cursor(store, reader, st), None
        return found.cursor(), found
    raise ConfigError(f"unknown reset target {target.kind!r}")


@attrs.frozen
class ResetResult:
    queue: str
    subscription: str
    target: str
    before: Cursor
    after: Cursor
    starts_at: Location | None  # the message delivered next, when known
    forced: bool
    held_by: str | None  # who held the subscription when forced

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "subscription": self.subscription, "target": self.target,
                "before": self.before.to_dict(), "after": self.after.to_dict(),
                "next_seq": self.starts_at.seq if self.starts_at else None,
                "forced": self.forced, "held_by": self.held_by}


def admin_id(action: str) -> str:
    return f"ordq-admin-{action}-{socket.gethostname()}-{os.getpid()}"


def reset_subscription(store: ZkStore, reader: ReplicaReader, queue: str, sub: str, target: ResetTarget, *,
                       force: bool = False, attempts: int = 10) -> ResetResult:
    """Move ``sub``'s cursor to ``target``. Refused (SubscriptionHeld) while a consumer holds
    the subscription unless ``force``; the write is conditional on the cursor and the queue
    state not moving since the target was computed, re-computed on a conflict."""
    store.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
    with _consumer_lease(store, queue, sub, "reset") as holder:
        if holder is not None and not force:
            raise SubscriptionHeld(queue, sub, holder)
        for _ in range(attempts):
            st, state_version = store.load_state(queue)
            before, cursor_version = store.get_cursor(queue, sub)
            cursor, starts_at = resolve_target(store, reader, st, target)
            sm.check_invariants(st, {sub: cursor})
            try:
                store.reset_cursor(queue, sub, cursor, cursor_version=cursor_version, state_version=state_version)
            except ConflictError:
                continue  # a consumer committed, or the lists changed: compute again
            return ResetResult(queue, sub, str(target), before, cursor, starts_at, force and holder is not None,
                               holder)
    raise ConflictError(f"{queue}/{sub}: the cursor or the queue kept moving; reset not done after {attempts} tries")


def create_subscription(store: ZkStore, reader: ReplicaReader, queue: str, sub: str,
                        target: ResetTarget) -> tuple[Cursor, Location | None]:
    """Create ``sub`` starting at ``target`` (earliest | latest | seq N | time T, as for a
    reset): its first consumer delivers from there. AlreadyExists when it exists (use
    ``sub reset`` to move it). Returns its cursor and the message it starts at, when known."""
    st, _ = store.load_state(queue)  # QueueNotFound first
    cursor, starts_at = resolve_target(store, reader, st, target)
    store.create_subscription(queue, sub, at=cursor)
    return cursor, starts_at


def delete_subscription(store: ZkStore, queue: str, sub: str, *, force: bool = False) -> str | None:
    """Delete ``sub`` and its cursor, so it no longer keeps segments from being popped.
    Refused (SubscriptionHeld) while a consumer holds it, unless ``force``: that consumer then
    finds the subscription gone (SubscriptionNotFound, final) and stops. Returns the holder it
    was deleted under, if forced."""
    store.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound
    with _consumer_lease(store, queue, sub, "delete") as holder:
        if holder is not None and not force:
            raise SubscriptionHeld(queue, sub, holder)
        store.delete_subscription(queue, sub)
    return holder


@contextlib.contextmanager
def _consumer_lease(store: ZkStore, queue: str, sub: str, action: str) -> Iterator[str | None]:
    """Hold the subscription's consumer lease from the coordinator for the block (yields None),
    so no consumer starts meanwhile (one granted after reads the cursor as the block left it);
    else yield the id of the consumer holding it."""
    from ordq.common.security import of_store
    from ordq.coordinator.client import CoordinatorClient, Held

    with CoordinatorClient(store, credentials=of_store(store)) as coord:
        got = coord.acquire("consumer", queue, sub, admin_id(action), ttl_ms=60_000)
        if not isinstance(got, Held):
            yield got.holder or "?"
            return
        try:
            yield None
        finally:
            try:
                coord.release(got, timeout_s=5.0)
            except OrdqError:  # deleted with the subscription, or unreachable: it runs out
                pass


