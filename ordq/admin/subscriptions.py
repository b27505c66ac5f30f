"""An operator's changes to a subscription (``ordq sub create/reset/delete``, served by the
coordinator's admin API): its cursor written in ZooKeeper.

Guarantee: a cursor is reset or deleted only while this process holds the subscription's
consumer lease itself (so no consumer runs on the old cursor meanwhile), unless forced, and a
reset only if neither the cursor nor the queue state moved since the target was computed (so
it is inside the consume list: I5). Targets: ``ordq.sdk.positions``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import attrs

from ordq.common.errors import ConflictError, OrdqError
from ordq.coordinator import state as sm
from ordq.coordinator.state import Cursor
from ordq.coordinator.store import ZkStore
from ordq.sdk.positions import ResetTarget, resolve_target
from ordq.sdk.replicas import Location, ReplicaReader


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
            st, state_version = store.load_state_to_write(queue)
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
                        target: ResetTarget, *, settings: dict[str, Any] | None = None
                        ) -> tuple[Cursor, Location | None]:
    """Create ``sub`` starting at ``target`` (earliest | latest | seq N | time T, as for a
    reset): its first consumer delivers from there. AlreadyExists when it exists (use
    ``sub reset`` to move it). Returns its cursor and the message it starts at, when known."""
    st, _ = store.load_state(queue)  # QueueNotFound first
    cursor, starts_at = resolve_target(store, reader, st, target)
    store.create_subscription(queue, sub, at=cursor, settings=settings)
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
