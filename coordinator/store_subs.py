"""What ZooKeeper keeps per subscription besides its cursor: the failure policy, the blocked
alarm and the ledger of parked messages (sdk/failure.py decides what goes in them).

Rules: a part of ``ZkStore`` (coordinator/store.py) over the cursors' (``store_cursors``); kazoo errors
become ordq's here, as everywhere in the store. The ledger's records change only with a
version check (``update_parked``): the consumer and an operator may change one at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from ordq.common.errors import ConflictError, NotFound
from ordq.coordinator.paths import check_name
from ordq.coordinator.store_cursors import CursorRecords
from ordq.coordinator.store_values import json_bytes, json_value


class SubscriptionRecords(CursorRecords):
    """Policy, alarm and parked-message ledger of a subscription (a part of ZkStore)."""

    def set_sub_policy(self, queue: str, sub: str, policy: Mapping[str, Any]) -> None:
        self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
        self._put_json(self.paths.sub_policy(queue, sub), policy)

    def sub_policy(self, queue: str, sub: str) -> dict[str, Any] | None:
        return self._get_json(self.paths.sub_policy(queue, sub))

    def set_sub_settings(self, queue: str, sub: str, settings: Mapping[str, Any]) -> None:
        """Write the subscription's settings (``ordq sub alter``): {"delay_ms": N}."""
        self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
        self._put_json(self.paths.sub_settings(queue, sub), settings)

    def sub_settings(self, queue: str, sub: str) -> dict[str, Any]:
        """The subscription's settings ({} when none were set)."""
        return self._get_json(self.paths.sub_settings(queue, sub)) or {}

    def set_waiting(self, queue: str, sub: str, record: Mapping[str, Any] | None) -> None:
        """Show (``record``: {holder, seq, due_us, at_us}) or clear what the subscription's
        consumer waits on: the head of the line held for its time (sdk/delay.py)."""
        path = self.paths.sub_waiting(queue, sub)
        if record is not None:
            self._put_json(path, record)
            return
        with self._errors(), contextlib.suppress(NoNodeError):
            self._wait(self.client.delete_async(path))

    def waiting(self, queue: str, sub: str) -> dict[str, Any] | None:
        """What the subscription's consumer last reported waiting on (None: nothing)."""
        return self._get_json(self.paths.sub_waiting(queue, sub))

    def set_blocked(self, queue: str, sub: str, record: Mapping[str, Any] | None, *, owner: str,
                    ephemeral: bool = True) -> None:
        """Show (a node ``blocked/<owner>``) or clear the message the subscription's consumer
        ``owner`` is blocked on. Ephemeral when a consumer's own session writes it (it goes
        with that session); the coordinator writes it persistent for a consumer lease holder
        and clears it when the lease is released or granted to another (``clear_blocked``)."""
        path = f"{self.paths.sub_blocked(queue, sub)}/{check_name('consumer', owner)}"
        if record is not None:
            try:
                self._put_json(path, record, ephemeral=ephemeral)
            except (NoNodeError, NoChildrenForEphemeralsError) as exc:
                # no parent: a subscription made before issue 23 and not upgraded (ordq up)
                raise NotFound(f"{queue}/{sub}: no alarm node (run ordq up to upgrade the tree)") from exc
            return
        with self._errors(), contextlib.suppress(NoNodeError):
            self._wait(self.client.delete_async(path))

    def clear_blocked(self, queue: str, sub: str, *, keep: str | None) -> int:
        """Delete every consumer's alarm under the subscription but ``keep``'s; how many."""
        base = self.paths.sub_blocked(queue, sub)
        gone = 0
        with self._errors():
            try:
                names = self._read(self.client.get_children_async, base)
            except NoNodeError:
                return 0
            for name in names:
                if name == keep:
                    continue
                # NotEmpty, NoAuth: no alarm an ordq consumer shows (`ordq up` repairs what someone
                # else made); a grant or a release must not fail on it
                with contextlib.suppress(NoNodeError, NotEmptyError, NoAuthError):
                    self._wait(self.client.delete_async(f"{base}/{name}"))
                    gone += 1
        return gone

    def blocked(self, queue: str, sub: str) -> dict[str, Any] | None:
        """The alarm its consumer shows (the newest, should two consumers' sessions overlap)."""
        found = self.blocked_alarm(queue, sub)
        return found[0] if found is not None else None

    def blocked_alarm(self, queue: str, sub: str) -> tuple[dict[str, Any], int] | None:
        """The alarm and when it was raised (ZooKeeper's ctime, ms); None when there is none."""
        base = self.paths.sub_blocked(queue, sub)
        best: tuple[dict[str, Any], int] | None = None
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, base)
                names = self._read(self.client.get_children_async, base)
            except NoNodeError:
                return None
            if data:  # an older consumer's alarm: the node itself (gone with its session)
                return dict(json_value(data)), int(stat.ctime)
            for name in names:
                try:
                    data, stat = self._read(self.client.get_async, f"{base}/{name}")
                except NoNodeError:
                    continue  # cleared meanwhile
                except NoAuthError:  # a node no ordq process made (`ordq up` repairs it): not an alarm
                    continue
                if data and (best is None or stat.ctime > best[1]):
                    best = dict(json_value(data)), int(stat.ctime)
        return best

    def _put_json(self, path: str, record: Mapping[str, Any], *, ephemeral: bool = False) -> None:
        """Create or overwrite the node at ``path`` with ``record`` as JSON."""
        with self._errors():
            try:
                self._wait(self.client.create_async(path, json_bytes(dict(record)), ephemeral=ephemeral))
            except NodeExistsError:
                self._wait(self.client.set_async(path, json_bytes(dict(record))))

    def _get_json(self, path: str) -> dict[str, Any] | None:
        """The JSON record at ``path``; None when there is no node."""
        with self._errors():
            try:
                data, _ = self._read(self.client.get_async, path)
            except NoNodeError:
                return None
        return dict(json_value(data))

    def record_parked(self, queue: str, sub: str, seq: int, record: Mapping[str, Any]) -> None:
        """Add a parked message's record to the subscription's ledger (idempotent per seq)."""
        with self._errors():
            # The parent exists (made with the subscription) unless an older tree was not
            # upgraded: only an admin may create it then.
            self._wait(self.client.ensure_path_async(self.paths.parked(queue, sub)))
            try:
                self._wait(self.client.create_async(self.paths.parked(queue, sub, seq), json_bytes(dict(record))))
            except NodeExistsError:
                pass  # recorded before a restart: the same message, parked again

    def parked(self, queue: str, sub: str) -> list[dict[str, Any]]:
        """The subscription's parked records, in seq order."""
        self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
        with self._errors():
            try:
                names = sorted(self._read(self.client.get_children_async, self.paths.parked(queue, sub)))
            except NoNodeError:
                return []
            out = []
            for name in names:
                try:
                    data, _ = self._read(self.client.get_async, f"{self.paths.parked(queue, sub)}/{name}")
                except NoNodeError:
                    continue
                out.append(json_value(data))
        return out

    def parked_record(self, queue: str, sub: str, seq: int) -> dict[str, Any] | None:
        """The ledger record of ``seq`` (None: none): one read, not the whole ledger."""
        self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound first
        return self._get_json(self.paths.parked(queue, sub, seq))

    def update_parked(self, queue: str, sub: str, seq: int,
                      change: Callable[[dict[str, Any]], dict[str, Any]], *, tries: int = 20) -> dict[str, Any]:
        """Replace the ledger record of ``seq`` by ``change(record)``, conditionally (read,
        change, write if nobody wrote meanwhile; again otherwise). ``change`` raises to refuse
        (its error propagates). Returns the record written. NotFound when there is none."""
        path = self.paths.parked(queue, sub, seq)
        for _ in range(tries):
            with self._errors():
                try:
                    data, stat = self._read(self.client.get_async, path)
                except NoNodeError as exc:
                    raise NotFound(f"{queue}/{sub}: seq {seq} is not in the ledger of parked messages") from exc
                new = change(dict(json_value(data)))
                try:
                    self._wait(self.client.set_async(path, json_bytes(new), version=stat.version))
                    return new
                except BadVersionError:
                    continue  # changed meanwhile: decide again on what is there now
        raise ConflictError(f"{queue}/{sub}: the ledger record of seq {seq} kept changing; try again")

    def parked_signal_version(self, queue: str, sub: str) -> int:
        """How often operators signalled a ledger change (the signal node's version; -1: never)."""
        with self._errors():
            stat = self._read(self.client.exists_async, self.paths.parked_signal(queue, sub))
        return -1 if stat is None else int(stat.version)

    def signal_parked(self, queue: str, sub: str) -> None:
        """Tell the subscription's consumer the ledger changed (an operator replayed or dropped):
        it watches this node (``parked_signal_path``)."""
        path = self.paths.parked_signal(queue, sub)
        with self._errors():
            try:
                self._wait(self.client.create_async(path, b"0"))
            except NodeExistsError:
                self._wait(self.client.set_async(path, b"0"))
