"""Subscriptions and their cursors in ZooKeeper: creating and deleting one, committing,
resetting, and the consumer election that decides who may commit.

Guarantee: a cursor changes only with a version check (``commit_cursor``, ``reset_cursor``);
a commit with a ``holder`` applies only while that lock node exists (a consumer whose session
expired cannot move the cursor).

Rules: a part of ``ZkStore`` (coordinator/store.py) over ``ZkBase``'s requests; kazoo errors
become ordq's here, as everywhere in the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from ordq.common.errors import (
    AlreadyExists,
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    NotLeader,
    OrdqError,
    QueueNotFound,
    SubscriptionNotFound,
)
from ordq.coordinator import state as sm
from ordq.coordinator.acl import SUB_PARENTS
from ordq.coordinator.paths import check_name
from ordq.coordinator.state import Cursor, QueueState
from ordq.coordinator.store_base import ZkBase, raise_first
from ordq.coordinator.store_values import StateVersion, json_bytes, json_value, parse_state


class CursorRecords(ZkBase):
    """Subscriptions and their cursors (a part of ZkStore)."""

    def create_subscription(self, queue: str, sub: str, *, at: str | Cursor = "earliest",
                            settings: Mapping[str, Any] | None = None) -> Cursor:
        """Create ``sub`` at ``earliest`` (the oldest kept message) or at an explicit cursor.
        (``latest`` needs the open segment's current end: the SDK resolves it to a Cursor.)
        ``settings`` (``sub create --delay``) are written in the same transaction: no consumer
        can read the subscription without them."""
        check_name("subscription", sub)
        if not isinstance(at, Cursor) and at != "earliest":
            raise ConfigError(f"subscription start must be 'earliest' or a cursor, not {at!r}")
        path = self.paths.sub(queue, sub)
        for _attempt in range(50):
            st, version = self.load_state_to_write(queue)
            cursor = at if isinstance(at, Cursor) else st.earliest_cursor()
            sm.check_invariants(st, {sub: cursor})
            with self._errors():
                # The state is written again, unchanged, with a version check, in the same
                # transaction (issue 43: a segment sealed empty is popped with no subscription).
                # Both orders are then safe: a pop that landed since we read the state fails
                # this write (read again: the cursor goes to the new head), and a pop planned on
                # "no subscription" before this landed fails its own write (its version moved)
                # and is planned again with this cursor. A check alone would not stop the
                # latter: the new cursor before the head (I5).
                # With the parents of what its consumers may create (election, alarm, ledger):
                # clients may not create them (coordinator/acl.py).
                tx = self.client.transaction()
                tx.set_data(self.paths.state(queue), json_bytes(st.to_dict()), version=version.znode)
                tx.create(path, json_bytes(cursor.to_dict()), acl=self._acl_of(path))
                for name in SUB_PARENTS:
                    tx.create(f"{path}/{name}", b"", acl=self._acl_of(f"{path}/{name}"))
                if settings:
                    where = self.paths.sub_settings(queue, sub)
                    tx.create(where, json_bytes(dict(settings)), acl=self._acl_of(where))
                self._check_deletions(tx, version.deletions)  # last: the indices above stay
                results = self._wait(tx.commit_async())
            if isinstance(results[1], NodeExistsError):
                raise AlreadyExists(f"subscription {sub!r} of queue {queue!r} already exists")
            if isinstance(results[0], NoNodeError) or isinstance(results[1], NoNodeError):
                raise QueueNotFound(queue)
            if isinstance(results[0], BadVersionError) or isinstance(results[-1], BadVersionError):
                continue  # the state moved, or a queue was deleted: read it again
            raise_first(results)
            return cursor
        raise ConflictError(f"queue {queue!r}: subscription {sub!r} not created after 50 conflicting writes")

    def list_subscriptions(self, queue: str) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.subs(queue)))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc

    def subscription_count(self, queue: str) -> int:
        """How many subscriptions ``queue`` has: one stat read (its node's child count), where
        ``list_subscriptions`` reads every name (a queue at its bound of 1,000: ~45 KB to decode)."""
        with self._errors():
            stat = self._read(self.client.exists_async, self.paths.subs(queue))
        if stat is None:
            raise QueueNotFound(queue)
        return int(stat.numChildren)

    def has_subscription(self, queue: str, sub: str) -> bool:
        with self._errors():
            return self._read(self.client.exists_async, self.paths.sub(queue, sub)) is not None

    def get_cursor(self, queue: str, sub: str) -> tuple[Cursor, int]:
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.sub(queue, sub))
            except NoNodeError as exc:
                self.queue_config(queue)  # QueueNotFound first
                raise SubscriptionNotFound(queue, sub) from exc
        return Cursor.from_dict(json_value(data)), stat.version

    def cursor_and_state(self, queue: str, sub: str) -> tuple[Cursor, int, QueueState]:
        """``get_cursor`` and ``load_state``'s state in one round trip: both reads are sent
        before either answer is awaited (kazoo pipelines them on its one connection and
        ZooKeeper answers a session in order, so the state is read after the cursor, as when
        asked one after the other). What a Commit reads: its time was its ZooKeeper requests,
        each waiting its turn behind other callers' on the session (issue 38, stop k).
        SubscriptionNotFound, or QueueNotFound when the queue is gone."""

        def both() -> tuple[Any, Any]:
            asked = (self.client.get_async(self.paths.sub(queue, sub)), self.client.get_async(self.paths.state(queue)))
            answers = []
            for request in asked:
                try:
                    answers.append(self._wait(request))
                except NoNodeError:
                    answers.append(None)
            return answers[0], answers[1]

        with self._errors():
            cursor, state = self._retry.copy()(both)
        if state is None:
            raise QueueNotFound(queue)
        if cursor is None:
            raise SubscriptionNotFound(queue, sub)
        return Cursor.from_dict(json_value(cursor[0])), cursor[1].version, parse_state(queue, state[0])

    def commit_cursor(self, queue: str, sub: str, cursor: Cursor, version: int, *,
                      holder: tuple[str, int] | None = None) -> int:
        """Write the cursor if nobody else did since ``version``; return the new version.
        ConflictError when it moved (another consumer or an admin reset took over).

        ``holder``: the committer's consumer lease as ``(lease node, version)``: the write
        applies, in the same transaction, only while that node is at that version (no grant
        since: coordinator/store_leases.py), so a consumer whose lease was granted again
        cannot move the cursor: NotLeader instead."""
        path, data = self.paths.sub(queue, sub), json_bytes(cursor.to_dict())
        for _ in range(50):
            try:
                with self._errors():
                    return self._write_cursor(queue, sub, path, data, version, holder)
            except CoordinationUnavailable:
                # The write was in flight when the connection dropped: look whether it landed.
                with self._errors():
                    try:
                        now, stat = self._read(self.client.get_async, path)
                    except NoNodeError as exc:
                        raise SubscriptionNotFound(queue, sub) from exc
                if stat.version == version + 1 and now == data:
                    return int(stat.version)  # it did (or another wrote the very same cursor)
                if stat.version != version:
                    raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}") from None
                # it did not: write it again
        raise CoordinationUnavailable(f"cursor of {queue}/{sub}: 50 writes lost on the way to ZooKeeper")

    def _write_cursor(self, queue: str, sub: str, path: str, data: bytes, version: int,
                      holder: tuple[str, int] | None) -> int:
        if holder is None:
            try:
                return int(self._wait(self.client.set_async(path, data, version=version)).version)
            except BadVersionError as exc:
                raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}") from exc
            except NoNodeError as exc:
                raise SubscriptionNotFound(queue, sub) from exc
        tx = self.client.transaction()
        tx.check(holder[0], holder[1])  # the lease node, as at its grant
        tx.set_data(path, data, version=version)
        results = self._wait(tx.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            return int(results[1].version)
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise NotLeader(queue, sub, "its consumer lease was granted again since")
        if isinstance(results[1], BadVersionError):
            raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}")
        if isinstance(results[1], NoNodeError):
            raise SubscriptionNotFound(queue, sub)
        raise CoordinationUnavailable(f"cursor of {queue}/{sub}: unexpected transaction results {results!r}")

    def reset_cursor(self, queue: str, sub: str, cursor: Cursor, *, cursor_version: int,
                     state_version: StateVersion) -> int:
        """An operator's reset: write ``cursor`` only if neither the cursor nor the queue state
        changed since they were read at these versions (so the target, checked against that
        state, is still inside the consume list: I5). Returns the new cursor version;
        ConflictError when either moved (read both again and retry)."""
        with self._errors():
            tx = self.client.transaction()
            tx.check(self.paths.state(queue), state_version.znode)
            tx.set_data(self.paths.sub(queue, sub), json_bytes(cursor.to_dict()), version=cursor_version)
            self._check_deletions(tx, state_version.deletions)
            results = self._wait(tx.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            return int(results[1].version)
        if any(isinstance(r, NoNodeError) for r in results):
            self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound
        if any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
            raise ConflictError(f"cursor of {queue}/{sub} or the queue state moved during the reset")
        raise_first(results)
        raise ConflictError(f"cursor reset of {queue}/{sub} failed: {results}")  # pragma: no cover

    def subscription_holder(self, queue: str, sub: str) -> str | None:
        """The holder of the subscription's consumer lease (issue 37) as last granted; None
        when none was granted or it was released. SubscriptionNotFound when it is gone."""
        from ordq.coordinator.leases import Kind, LeaseName

        record, _ = self.read_lease(LeaseName(Kind.CONSUMER, queue, sub))  # type: ignore[attr-defined]
        if record is not None and not record.released:
            return str(record.holder)
        self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound
        return None

    def delete_subscription(self, queue: str, sub: str) -> None:
        with self._errors():
            try:
                self._delete_tree(self.paths.sub(queue, sub))
            except NoNodeError as exc:  # kazoo's recursive delete ignored a missing node
                self.queue_config(queue)  # QueueNotFound first
                raise SubscriptionNotFound(queue, sub) from exc
            except NotEmptyError as exc:  # a node was created under it meanwhile
                raise OrdqError(str(exc)) from exc
