"""Creating queues: one queue (``ZkStore.create_queue``) or a topic's partitions with the topic's
record (``store_topics``), each in one ZooKeeper transaction.

Guarantee: all the queues and records of one creation exist, or none does; each queue is created
with its eligible groups admitted (writable at once when they are live), and the drain marks that
admission read are checked in the same transaction (a group drained meanwhile is not admitted).

Rules: a part of ``ZkStore`` (coordinator/store.py) over ``store_groups``; no policy (admission
is ``state.admit_all``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import attrs
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from ordq.common.errors import AlreadyExists, ConfigError, ConflictError, GroupNotFound
from ordq.coordinator import state as sm
from ordq.coordinator.acl import QUEUE_PARENTS
from ordq.coordinator.paths import check_name
from ordq.coordinator.state import Facts, QueueState
from ordq.coordinator.store_base import raise_first
from ordq.coordinator.store_groups import GroupRecords
from ordq.coordinator.store_values import QueueConfig, json_bytes

MAX_ATTEMPTS = 50


@attrs.frozen
class NewQueue:
    """A queue to create: its name, its groups (in order: the first eligible one is its head)
    and its settings."""

    queue: str
    groups: tuple[str, ...]
    config: QueueConfig


@attrs.frozen
class NewNode:
    """Another node written in the same transaction (a topic's record): created, or with
    ``version`` set, overwritten only if still at that version (else ConflictError). ``what``
    names it in errors ("topic 'orders'")."""

    path: str
    data: bytes
    what: str
    version: int | None = None


class QueueCreation(GroupRecords):
    """Creates queues (and the records that go with them) in one transaction."""

    def _create_queues(self, queues: Sequence[NewQueue], nodes: Sequence[NewNode] = (), *,
                       incarnation: str | None = None) -> list[QueueState]:
        """Create ``queues`` and ``nodes`` in one transaction (the parents of ``nodes`` must
        exist); return each queue's initial state. AlreadyExists naming the first queue or node
        that exists; GroupNotFound; ConflictError after 50 lost races with drain marks.
        ``incarnation``: the queues' (default: a new one each)."""
        gids = list(dict.fromkeys(g for q in queues for g in q.groups))
        for q in queues:
            check_name("queue", q.queue)
            if not q.groups:
                raise ConfigError("a queue needs at least one broker group (add one: ordq group add G)")
        with self._errors():
            self._wait(self.client.ensure_path_async(self.paths.queues))
        created = [sm.create(q.queue, q.groups, incarnation=incarnation or uuid.uuid4().hex[:12]) for q in queues]
        for _ in range(MAX_ATTEMPTS):
            # Admitted in the creating write (issue 29: one write, not a create and an apply):
            # the drain marks it read are checked in the same transaction, as ``apply`` does.
            drained, group_versions = self._drained_with_versions(gids)
            for gid in gids:
                if gid not in group_versions:
                    raise GroupNotFound(gid)
            live, full = self.liveness(gids)
            facts = Facts(live_groups=live, drained=drained, disk_full=full)
            initial = [sm.admit_all(st, facts) for st in created]
            with self._errors():
                tx = self.client.transaction()
                what: list[str] = []  # what each operation of the transaction is about
                for gid, version in group_versions.items():
                    tx.check(self.paths.group(gid), version)
                    what.append("")
                for node in nodes:
                    if node.version is None:
                        tx.create(node.path, node.data, acl=self._acl_of(node.path))
                    else:
                        tx.set_data(node.path, node.data, version=node.version)
                    what.append(node.what)
                for q, st in zip(queues, initial, strict=True):
                    added = self._add_queue_nodes(tx, q.queue, q.config, st)
                    what.extend([f"queue {q.queue!r}"] * added)
                deletions = self._ask_deletions()  # read before the creation (``WrittenStates.created``)
                results = self._wait(tx.commit_async())
                deleted_before = self._deletions(deletions)
            failed = [(w, r) for w, r in zip(what, results, strict=False) if not isinstance(r, RolledBackError)
                      and isinstance(r, Exception)]
            for w, r in failed:
                if isinstance(r, NodeExistsError):
                    raise AlreadyExists(f"{w} already exists")
                if w and not w.startswith("queue ") and isinstance(r, (BadVersionError, NoNodeError)):
                    raise ConflictError(f"{w} changed meanwhile; try again")
            if any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
                continue  # a drain mark changed (or a group went) meanwhile: read again
            raise_first(results)
            for q, st in zip(queues, initial, strict=True):
                self.written.created(q.queue, st, deleted_before)
            return initial
        names = ", ".join(q.queue for q in queues[:3]) + (", ..." if len(queues) > 3 else "")
        raise ConflictError(f"queue {names}: gave up creating it after {MAX_ATTEMPTS} conflicting writes")

    def _add_queue_nodes(self, tx: Any, queue: str, config: QueueConfig, initial: QueueState) -> int:
        """Add the creation of one queue's nodes to the transaction ``tx``: its settings, its
        state, its subscriptions' parent and the parents clients create under (coordinator/acl.py).
        Returns the number of operations added."""
        tx.create(self.paths.queue(queue), json_bytes(attrs.asdict(config)), acl=self._acl_of(self.paths.queue(queue)))
        tx.create(self.paths.state(queue), json_bytes(initial.to_dict()), acl=self._acl_of(self.paths.state(queue)))
        tx.create(self.paths.subs(queue), b"", acl=self._acl_of(self.paths.subs(queue)))
        for name in QUEUE_PARENTS:  # the producer election's parent: clients may not create it
            path = f"{self.paths.queue(queue)}/{name}"
            tx.create(path, b"", acl=self._acl_of(path))
        return 3 + len(QUEUE_PARENTS)

    def _exists(self, path: str) -> bool:
        with self._errors():
            return self._read(self.client.exists_async, path) is not None
