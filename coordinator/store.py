"""ZooKeeper store: loads queue state, applies pure transitions, writes them conditionally.

Guarantee: every change of a queue's send and consume lists is one versioned write of its one
``state`` znode (DESIGN §2), so concurrent writers never lose an update and a deposed writer
cannot corrupt it: ``apply`` re-reads and re-applies on a version conflict. A transition that
reads subscription cursors (``pop``) also checks their versions in the same transaction.

Rules: this module and its parts (``store_base``: the client, bounded requests and the one
translation of kazoo's exceptions to ``ordq.common.errors``; ``store_groups``; ``store_cursors``;
``store_subs``; ``store_create``; ``store_topics``; the values in ``store_values``) are the only
place that talks kazoo for ordq state. No policy lives here: decisions are in
``ordq.coordinator.state``.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import attrs
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from ordq.common.errors import (
    AlreadyExists,
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    CorruptState,
    GroupNotFound,
    OrdqError,
    QueueNotFound,
    SubscriptionNotFound,
    WaitTimeout,
)
from ordq.coordinator import state as sm
from ordq.coordinator.pacing import in_flight
from ordq.coordinator.paths import Paths, check_name
from ordq.coordinator.state import Cursor, Facts, QueueState
from ordq.coordinator.store_base import OP_TIMEOUT_S, new_client, raise_first
from ordq.coordinator.store_create import NewQueue
from ordq.coordinator.store_leases import LeaseRecords
from ordq.coordinator.store_subs import SubscriptionRecords
from ordq.coordinator.store_topics import TopicRecords
from ordq.coordinator.store_values import (
    QueueConfig,
    StateVersion,
    StateWrite,
    Transition,
    json_bytes,
    json_value,
    parse_state,
)
from ordq.coordinator.topics import topic_of
from ordq.coordinator.zk_tls import CONNECT_TIMEOUT_S

# Queues created per ZooKeeper transaction by ``create_queues``: 4 nodes each (~700 B), so
# ~140 KB a transaction, well under ZooKeeper's 1 MB request limit (jute.maxbuffer).
CREATE_BATCH = 200
# The session timeout of a ZooKeeper session that holds only watches, beside a process's own
# session (a broker's state watches: broker_group/service.py; the leading coordinator's view:
# ``CoordinatorDaemon``'s ``watch_store``). Why a session of their own: when a connection drops,
# kazoo hands each of its watches an event, one by one, in the connection's thread, before it
# reconnects (307 ms for 33,334 watches at load 4, scale43k), which turned blips into lost
# 1 s sessions of the session that holds a process's liveness or leadership. It holds no
# ephemeral node, so nothing fails over when it is slow, and the longer it is, the fewer blips
# cost a re-read of what it watches (ZooKeeper may cap it: maxSessionTimeout).
WATCH_SESSION_S = 10.0

log = logging.getLogger("ordq.coordinator")
RETRY_PAUSE_MAX_S = 0.05  # the longest pause before a lost conditional write is tried again (apply)
_RETRY = random.Random()  # its jitter (not the module's: a seeded test's sequence stays its own)


@attrs.frozen
class Known:
    """A queue's state as read (with its znode version), the facts around it and the versions
    of the group configs its drain marks were read from: ``ZkStore.apply``'s first attempt."""

    state: QueueState
    version: StateVersion
    facts: Facts
    group_versions: Mapping[str, int]


class ZkStore(TopicRecords, SubscriptionRecords, LeaseRecords):
    """ordq's view of one cluster in ZooKeeper (under ``paths.root``): queues and their state
    here; groups (``store_groups``), the creation of queues (``store_create``), keyed topics
    (``store_topics``), cursors (``store_cursors``) and what else a subscription keeps
    (``store_subs``) in its parts, over the requests of ``store_base.ZkBase``."""

    @classmethod
    def connect(
        cls, hosts: str, root: str = "/ordq", *, timeout_s: float = 5.0, op_timeout_s: float = OP_TIMEOUT_S,
        auth: str | None = None, daemon: bool = False,
    ) -> ZkStore:
        """Connect a new client (closed by ``close()``); CoordinationUnavailable on failure.
        ``timeout_s`` is the session timeout and bounds the connection, ``op_timeout_s`` each
        later request; ``auth`` (``user:password``) is the ZooKeeper digest identity it acts as
        (docs/SECURITY.md). ``daemon``: the session timeout is a failure detector (a broker's or
        coordinator's 1 s), not a caller's patience, so over TLS the connection may take a
        handshake's budget (coordinator/zk_tls.py): waiting less would give up on a handshake
        under way, and the daemon's retry would start another from scratch."""
        client = new_client(hosts, session_timeout_s=timeout_s, auth=auth)
        wait_s = max(timeout_s, CONNECT_TIMEOUT_S) if daemon and client.use_ssl else timeout_s
        try:
            client.start(timeout=wait_s)
        except KazooTimeoutError as exc:
            client.stop()
            client.close()
            raise CoordinationUnavailable(
                f"cannot reach ZooKeeper at {hosts} within {wait_s:g}s "
                "(is it running? start one with: ordq zk start)"
            ) from exc
        try:
            return cls(client, Paths(root), owns_client=True, op_timeout_s=op_timeout_s)
        except BaseException:  # a bad root, or ZooKeeper gone again: no client left running
            client.stop()
            client.close()
            raise

    def __enter__(self) -> ZkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def remove_group(self, gid: str) -> None:
        """Unregister a group; refused while a queue uses it or a process of it is live."""
        self.get_group(gid)  # GroupNotFound: kazoo's recursive delete ignores a missing node
        for queue in self.list_queues():
            st, _ = self.load_state(queue)
            if gid in st.groups:
                raise OrdqError(f"group {gid!r} still serves queue {queue!r}: remove it there first")
        if self.live_members(gid):
            raise OrdqError(f"group {gid!r} has live processes: stop them first")
        with self._errors():
            try:
                self._delete_tree(self.paths.group(gid))
            except NoNodeError as exc:
                raise GroupNotFound(gid) from exc

    # -- queues ------------------------------------------------------------------------------

    def create_queue(
        self, queue: str, groups: list[str] | None = None, config: QueueConfig | None = None
    ) -> QueueState:
        """Create a queue served by ``groups`` (default: every registered group, rotated by
        the number of queues that exist: ``state.spread``, so queues' heads are spread over the
        groups) and admit every eligible one, so it is writable at once when its groups are live.
        AlreadyExists also when a topic has that name, or the name is one of a topic's
        partitions (``T.pN``)."""
        check_name("queue", queue)
        if groups is None:
            with self._errors():
                self._wait(self.client.ensure_path_async(self.paths.queues))
                stat = self._read(self.client.exists_async, self.paths.queues)
            groups = list(sm.spread(self.list_groups(), stat.numChildren if stat is not None else 0))
        for topic in (queue, topic_of(queue)):
            if topic is not None and self._exists(self.paths.topic(topic)):
                raise AlreadyExists(f"queue {queue!r}: the name belongs to topic {topic!r}")
        [initial] = self._create_queues([NewQueue(queue, tuple(groups), config or QueueConfig())])
        return initial

    def create_queues(
        self, queues: Sequence[str], groups: list[str] | None = None, config: QueueConfig | None = None, *,
        batch: int = CREATE_BATCH, request: str | None = None,
    ) -> tuple[list[QueueState], list[str]]:
        """Create many queues, ``batch`` per ZooKeeper transaction (issue 43: one at a time,
        10^5 queues took 40 minutes), each as ``create_queue`` would (its groups spread when
        ``groups`` is None, its eligible groups admitted in the creating write). Returns the
        states of those created, in order, and the names that already existed (as a queue or a
        topic) and were left alone. Each transaction creates all of its queues or none; one
        that meets a queue created meanwhile is retried without it.

        ``request``: an id of the caller's request (12 hex digits), the created queues'
        incarnation: when a request is sent again (its answer was lost: a timeout), the queues
        its first attempt created count as created, not as existing."""
        if request is not None and not re.fullmatch(r"[0-9a-f]{12}", request):
            raise ConfigError("a creation request's id is 12 hex digits")
        for q in queues:
            check_name("queue", q)
        names = list(dict.fromkeys(queues))
        with self._errors():
            self._wait(self.client.ensure_path_async(self.paths.queues))

        def taken() -> Callable[[str], bool]:
            queues_now, topics_now = set(self.list_queues()), set(self.list_topics())
            return lambda q: q in queues_now or q in topics_now or topic_of(q) in topics_now

        is_taken = taken()
        existing = [q for q in names if is_taken(q)]
        todo = [q for q in names if not is_taken(q)]
        created: list[QueueState] = []
        if request is not None and existing:  # made by an earlier attempt of this very request
            ours = {q: got[0] for q, got in self.load_states(existing).items()
                    if not isinstance(got, CorruptState) and got[0].incarnation == request}
            created += [ours[q] for q in existing if q in ours]
            existing = [q for q in existing if q not in ours]
        every = self.list_groups() if groups is None else None
        count = len(self.list_queues())  # the spread goes on from the queues that exist
        for i in range(0, len(todo), batch):
            part = todo[i:i + batch]
            while part:
                news = [NewQueue(q, tuple(groups) if groups is not None else sm.spread(every or [], count + k),
                                 config or QueueConfig()) for k, q in enumerate(part)]
                try:
                    created += self._create_queues(news, incarnation=request)
                except AlreadyExists:  # created meanwhile by someone else: leave those alone
                    is_taken = taken()
                    existing += [q for q in part if is_taken(q)]
                    part = [q for q in part if not is_taken(q)]
                    continue
                count += len(part)
                break
        return created, existing

    def list_queues(self) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.queues))
            except NoNodeError:
                return []

    def ensure_queues_folder(self) -> None:
        """The cluster's root and its queues folder, made if missing."""
        with self._errors():
            self.client.ensure_path(self.paths.queues)

    def watch_queue_list(self, on_change: Callable[[list[str]], None]) -> None:
        """Call ``on_change(queues)`` now and whenever a queue is created or deleted, for as
        long as the client lives (kazoo's ChildrenWatch re-arms itself; it waits for the
        queues folder to exist)."""
        self.ensure_queues_folder()
        self.client.ChildrenWatch(self.paths.queues, lambda children: on_change(sorted(children)))

    def update_queue_config(self, queue: str, **changes: Any) -> QueueConfig:
        """Change some of a queue's settings (conditionally on the version read)."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.queue(queue))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
            cfg = attrs.evolve(QueueConfig(**json_value(data)), **changes)
            try:
                self._wait(self.client.set_async(self.paths.queue(queue), json_bytes(attrs.asdict(cfg)), stat.version))
            except BadVersionError as exc:
                raise ConflictError(f"queue {queue!r} settings changed meanwhile; try again") from exc
        return cfg

    def delete_queue(self, queue: str) -> None:
        """Delete a queue's records (its brokers then drop its data). Refused for a partition of
        a topic: that is deleted with its topic (``delete_topic``)."""
        cfg = self.queue_config(queue)  # QueueNotFound: kazoo's recursive delete ignores a missing node
        if cfg.topic is not None:
            raise OrdqError(f"queue {queue!r} is a partition of topic {cfg.topic!r}: delete the whole topic with: "
                            f"ordq topic delete {cfg.topic}")
        with self._errors():
            try:
                self._delete_queue(queue)
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
            finally:
                self.written.forget(queue)

    def producer_epoch(self, queue: str) -> int:
        """The queue's producer epoch as ZooKeeper holds it now: ``sync`` first, so an epoch
        another client's session just wrote is seen even through a lagging server."""
        with self._errors():
            self._wait(self.client.sync_async(self.paths.state(queue)))
        return self.load_state(queue)[0].producer_epoch

    def facts(self, st: QueueState, *, with_cursors: bool = True) -> tuple[Facts, dict[str, int]]:
        """Liveness and drain marks of the queue's groups and (optionally) cursors with their
        versions."""
        facts, versions, _ = self._facts_and_versions(st, with_cursors=with_cursors)
        return facts, versions

    def _facts_and_versions(
        self, st: QueueState, *, with_cursors: bool = True
    ) -> tuple[Facts, dict[str, int], dict[str, int]]:
        """Facts, cursor versions and group config versions (the drain marks were read there)."""
        cursors: dict[str, Cursor] = {}
        versions: dict[str, int] = {}
        if with_cursors:
            for sub in self.list_subscriptions(st.queue):
                try:
                    cursors[sub], versions[sub] = self.get_cursor(st.queue, sub)
                except SubscriptionNotFound:
                    continue  # deleted meanwhile
        drained, group_versions = self._drained_with_versions(st.groups)
        live, full = self.liveness(st.groups)
        facts = Facts(live_groups=live, cursors=cursors, drained=drained, disk_full=full)
        return facts, versions, group_versions

    def apply(
        self, queue: str, transition: Transition, *, max_attempts: int = 50, known: Known | None = None
    ) -> QueueState:
        """Apply ``transition`` to the current state with a conditional write; on a version
        conflict re-read and re-apply. ``IllegalTransition`` propagates (the caller decides:
        e.g. a producer whose fail_over lost the race follows the new head).

        ``known``: what the caller already read (the coordinator daemon's watched copies), used
        for the first attempt instead of reading it again; only for a transition that reads no
        cursors (its facts carry none, so none is checked). The state's version and the drain
        marks' versions are checked in the write as always, so a stale copy costs one retry."""
        for attempt in range(max_attempts):
            if attempt == 0 and known is not None:
                current, version = known.state, known.version
                facts = attrs.evolve(known.facts, cursors={})  # unchecked cursors are never used
                cursor_versions: dict[str, int] = {}
                group_versions = {g: v for g, v in known.group_versions.items() if g in current.groups}
            else:
                current, version = self.load_state_to_write(queue)
                facts, cursor_versions, group_versions = self._facts_and_versions(current)
            new = transition(current, facts)
            if new == current:
                return current
            try:
                with self._errors():
                    tx = self.client.transaction()
                    for sub, v in cursor_versions.items():
                        tx.check(self.paths.sub(queue, sub), v)
                    # A drain mark set after we read it must not be overtaken by an admit.
                    for gid, v in group_versions.items():
                        tx.check(self.paths.group(gid), v)
                    self._check_deletions(tx, version.deletions)
                    tx.set_data(self.paths.state(queue), json_bytes(new.to_dict()), version=version.znode)
                    results = self._wait(tx.commit_async())
            except CoordinationUnavailable:
                # The connection dropped with the write in flight: it may or may not have
                # landed. Never guess from the content (another writer may have written the
                # same state, e.g. the same epoch bump): read again and re-apply; the version
                # check keeps that safe, and a transition that already happened now raises
                # IllegalTransition (or bumps once more), as when another writer won the race.
                continue
            if not any(isinstance(r, Exception) for r in results):
                self._written([(queue, version, new)])
                return new
            if not any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
                raise_first(results)
            # Lost a race (state or a cursor moved, or a subscription went): read again, at once
            # the first time (a stale ``known`` copy costs one retry, as said), then after a
            # random pause that grows with the losses. Without it a writer slower than its
            # rivals (starved of CPU) read, planned and lost 50 times in a row (test_store's
            # four racing writers, beside the default tier's other worker).
            if attempt:
                time.sleep(_RETRY.uniform(0.0, min(0.001 * 2 ** (attempt - 1), RETRY_PAUSE_MAX_S)))
        raise ConflictError(f"queue {queue!r}: gave up after {max_attempts} conflicting writes")

    def apply_batch(self, writes: Sequence[StateWrite],
                    group_versions: Mapping[str, int], *, max_attempts: int = 8) -> tuple[list[str], list[str]]:
        """Write many queues' new states in one ZooKeeper transaction (issue 43: a dead group's
        heads, ``coordinator/group_moves.py``): ``writes`` are (queue, version read, new state),
        each new state a transition the caller planned on that version; ``group_versions``: the
        versions of the group configs whose drain marks it read, checked in the same transaction
        (as ``apply`` does). All of a transaction or none lands. A queue whose state moved since
        (its version check fails) is left out, with every other found moved by one round of
        reads (``_still_current``), and the rest written again, up to ``max_attempts``
        transactions. Returns (queues written, queues not written): the caller
        plans the latter again, alone. Never raises for a conflict; CoordinationUnavailable
        (the write may or may not have landed) returns every queue not known written as not
        written, which is safe: their next write checks the version again."""
        todo = list(writes)
        done: list[str] = []
        why = f"{max_attempts} attempts made"  # why the queues still to do are left (said below)
        for _ in range(max_attempts):
            if not todo:
                break
            try:
                if len({v.deletions for _q, v, _s in todo}) > 1:  # one count for all
                    todo = self._revalidated(todo)
                with self._errors():
                    tx, checks = self._state_transaction(todo, group_versions)
                    results = self._wait(tx.commit_async())
            except CoordinationUnavailable as exc:
                why = f"ZooKeeper: {exc}"
                break
            bad = [i for i, r in enumerate(results) if isinstance(r, Exception)
                   and isinstance(r, (BadVersionError, NoNodeError))]
            if not any(isinstance(r, Exception) for r in results):
                self._written(todo)
                done += [q for q, _v, _s in todo]
                todo = []
                break
            if not bad:
                raise_first(results)
            if bad[0] == checks - 1:  # queues were deleted since: those not among them are still good
                try:
                    todo = self._revalidated(todo)
                except CoordinationUnavailable as exc:
                    why = f"ZooKeeper: {exc}"
                    break
                continue
            if bad[0] < checks:  # a drain mark changed: every queue is planned again alone
                why = "a group's drain mark changed since it was read"
                break
            todo.pop(bad[0] - checks)  # ZooKeeper names the first failing op only...
            try:  # ...the others that moved are found by one round of reads
                todo = self._still_current(todo)
            except CoordinationUnavailable as exc:
                why = f"ZooKeeper: {exc}"
                break
        if todo:  # not a lost version check: said (issue 43: scale43r's 200 queues left whole, cause unknown)
            log.warning("a batch of %d states: %d written, %d moved since, %d more not written (%s)", len(writes),
                        len(done), len(writes) - len(done) - len(todo), len(todo), why)
        written = set(done)
        return done, [q for q, _v, _s in writes if q not in written]

    def apply_batches(self, parts: Sequence[Sequence[StateWrite]],
                      group_versions: Mapping[str, int]) -> list[tuple[list[str], list[str]]]:
        """``apply_batch`` of each part, every part's transaction sent before the first answer
        is awaited (issue 43: a dead group's heads at 10^4-10^5 queues, ~200 a transaction; one
        after another each waited its round trip and its log sync); ``stream_batches`` with no
        bound. Returns (written, not written) per part, in order."""
        return list(self.stream_batches(parts, group_versions, limit=max(1, len(parts))))

    def stream_batches(self, parts: Sequence[Sequence[StateWrite]], group_versions: Mapping[str, int], *,
                       limit: int, before_send: Callable[[int], object] | None = None,
                       ) -> Generator[tuple[list[str], list[str]], None, None]:
        """``apply_batch`` of each part, at most ``limit`` transactions sent and not yet answered
        (``pacing.in_flight``: the next is sent as each answer comes); ``before_send(i)`` runs
        before part ``i`` is sent. A part whose transaction fails (a version moved meanwhile)
        is done again by ``apply_batch``, which leaves out the queues that moved. Same guarantee
        as ``apply_batch``, part by part: all of a part's transaction or none lands. Yields
        (written, not written) per part, in order; CoordinationUnavailable while sending ends it
        (the parts not yielded may or may not have landed: their next write checks again)."""
        todo: Sequence[Sequence[StateWrite]] = parts
        if len({v.deletions for part in parts for _q, v, _s in part}) > 1:  # one count for all
            kept = {w[0]: w for w in self._revalidated([w for part in parts for w in part])}
            todo = [[kept[q] for q, _v, _s in part if q in kept] for part in parts]

        def send(i: int) -> Any:
            if not todo[i]:
                return None
            with self._errors():
                return self._state_transaction(todo[i], group_versions)[0].commit_async()

        def answer(i: int, request: Any) -> tuple[list[str], list[str]]:
            part, written = todo[i], []
            try:
                with self._errors():
                    results = self._wait(request) if request is not None else []
            except CoordinationUnavailable as exc:  # may or may not have landed: their next write checks again
                log.warning("a transaction of %d states not answered (%s): left to be planned again", len(part), exc)
                results = None
            if results is not None and not any(isinstance(r, Exception) for r in results):
                self._written(part)
                written = [q for q, _v, _s in part]
            elif results is not None:
                self.batches_redone += 1
                written = self.apply_batch(part, group_versions)[0]
            landed = set(written)
            return written, [q for q, _v, _s in parts[i] if q not in landed]

        for _i, out in in_flight(range(len(parts)), send, answer, limit=limit, before_send=before_send):
            yield out

    def _state_transaction(self, writes: Sequence[StateWrite], group_versions: Mapping[str, int]) -> tuple[Any, int]:
        """A transaction of ``writes`` (of one deletion count: ``_revalidated``) that checks the drain
        marks of their groups (``group_versions``) and that no queue was deleted since, and
        how many checks come before the writes (ZooKeeper names the first failing operation)."""
        groups = sorted({g for _q, _v, st in writes for g in st.groups} & set(group_versions))
        tx = self.client.transaction()
        for gid in groups:
            tx.check(self.paths.group(gid), group_versions[gid])
        if writes:
            self._check_deletions(tx, writes[0][1].deletions)
        for queue, version, new in writes:
            tx.set_data(self.paths.state(queue), json_bytes(new.to_dict()), version=version.znode)
        return tx, len(groups) + 1

    def _still_current(self, writes: Sequence[StateWrite]) -> list[StateWrite]:
        """``writes`` whose queues' states are still at the versions they were planned on, read
        in one round (every read sent before the first answer is awaited). Why: ZooKeeper
        names one failing write per transaction, so a transaction with more moved queues than
        ``apply_batch``'s attempts was left whole (issue 43, scale43r: 200 queues of a dead
        group failed over one by one ~99 s after the verdict)."""
        with self._errors():
            asked = [self.client.exists_async(self.paths.state(q)) for q, _v, _s in writes]
            stats = [self._wait(a) for a in asked]
        return [w for w, stat in zip(writes, stats, strict=True) if stat is not None and stat.version == w[1].znode]

    def _revalidated(self, writes: Sequence[StateWrite]) -> list[StateWrite]:
        """``writes`` as of the deletion count now, those whose queues were not deleted since
        their copies were read (``DeletionLog.kept``); the others are left out (read again)."""
        self.revalidations += 1
        with self._errors():
            log = self._deletion_log()
        return [(q, StateVersion(v.znode, log.count), new) for q, v, new in writes if log.kept(q, v.deletions)]

    def _written(self, writes: Iterable[StateWrite]) -> None:
        for queue, version, new in writes:
            self.written.note(queue, new, version.next())

    # -- waiting -----------------------------------------------------------------------------

    def wait_state(
        self, queue: str, predicate: Callable[[QueueState], bool], *, timeout_s: float
    ) -> QueueState:
        """Block until the queue's state satisfies ``predicate`` (watch-driven)."""
        changed = threading.Event()
        deadline = time.monotonic() + timeout_s
        while True:
            changed.clear()
            with self._errors():
                try:
                    data, _ = self._read(self.client.get_async, self.paths.state(queue), watch=lambda _e: changed.set())
                except NoNodeError as exc:
                    raise QueueNotFound(queue) from exc
            st = parse_state(queue, data)
            if predicate(st):
                return st
            left = deadline - time.monotonic()
            if left <= 0 or not changed.wait(left):
                raise WaitTimeout(
                    f"queue {queue!r}: state did not reach the wanted condition in {timeout_s:g}s"
                )
