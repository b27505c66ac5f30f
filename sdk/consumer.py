"""Ordered consumer: one elected consumer per (queue, subscription) reads the cursor's
segment, delivers each seq once and in order, and moves on segment by segment.

Guarantee: messages are handed to the application in seq order, each seq once per consumer
instance; a missing seq raises ``GapDetected`` (never skipped). Only one instance delivers at a
time: before handing out a message the consumer checks, by its own clock, that it still holds
the subscription's lease (``ordq.sdk._lease``); when it cannot be sure it hands out nothing, and
when the lease is gone it raises ``NotLeader`` and commits nothing more.

What is committed (docs/SDK.md, "What is committed"): never past what the application
finished. A message counts as finished once the application asks for another (the next step
of ``for m in consumer``, another ``poll``) or says so (``commit()``, ``commit(through=m)``).
The message in hand when a loop breaks or raises, and the last ``poll`` batch, are not
finished: ``close`` and leaving ``with`` commit only what was, so they are redelivered to the
next consumer. The cursor is written with a conditional write, checked against this
consumer's lock node, every N messages / T ms and on close. With ``run_keyed`` (opt-in),
messages are hashed by key to N worker threads (per-key order, not global) and commits cover
only the contiguous prefix of finished messages.

Reading: the master of the segment's group, or its slave when the master is down; what one
read returns waits in a buffer and is handed out as the application asks (``poll`` takes up
to ``max_messages``). At the end of a ``sealing`` segment the consumer asks the coordinator to
seal it; at the end of a sealed one it advances its cursor to the next segment and asks for a
``pop``. What it knows of ZooKeeper (the queue's state, the groups' live processes) is cached
in ``ordq.sdk._queue_view``.

Who writes what (issue 23): the consumer only reads ZooKeeper, and holds its contender node in
the subscription's election (and, in ``run``, its alarm and the parked ledger: sdk/parking.py).
Cursor commits, creating the subscription, seals, pops and the parking queue are requests to
the elected coordinator (coordinator/client.py), which checks the consume token and that the
commit comes from the election's holder. While no coordinator answers the consumer goes on
delivering; commits wait (tried again every ``COMMIT_RETRY_S``) and ``close`` retries its
commit up to ``coordinator_outage_s``.

The parts (this module is the façade that wires them): ``_consumer_lease`` (lease and the
checks before handing out), ``_consumer_read`` (reading), ``_consumer_commit`` (delivery and
commit), ``_consumer_policies`` (``run``/``run_keyed``: the keyed and failure policies).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs
from kazoo.client import KazooClient

from ordq.common.errors import (
    AlreadyExists,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    NotLeader,
    OrdqError,
    SubscriptionNotFound,
    WaitTimeout,
)
from ordq.common.security import lookup
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.paths import Paths
from ordq.coordinator.state import Cursor
from ordq.coordinator.store import ZkStore
from ordq.sdk._consumer_commit import Committer, Handout
from ordq.sdk._consumer_core import CommitPolicy
from ordq.sdk._consumer_lease import LeaseChecks
from ordq.sdk._consumer_policies import FailurePolicies
from ordq.sdk._consumer_read import SegmentReader
from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats, Delivered
from ordq.sdk._lease import SessionLease, acquire_within, release_bounded
from ordq.sdk._queue_view import QueueView
from ordq.sdk._zk_start import connect
from ordq.sdk.audit import AuditWriter
from ordq.sdk.metrics import ConsumerMetrics, ConsumerSnapshot
from ordq.sdk.parking import BlockedMessage
from ordq.wire.transport import BrokerTransport

log = logging.getLogger("ordq.consumer")
T = TypeVar("T")


class Consumer:
    """Iterate it (``for m in consumer``) or call ``poll()``; see the module docstring for
    what is committed when."""

    def __init__(self, config: ConsumerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._client: KazooClient | None = None
        self._store: ZkStore | None = None
        self._coord: CoordinatorClient | None = None  # commits, seals, pops, subscribing: asked of the coordinator
        self._election: Any = None  # the kazoo Lock of the subscription
        self._lease: SessionLease | None = None
        self._view: QueueView | None = None  # the queue's state and replicas, cached
        self._closed = False
        self._stats = ConsumerStats()
        self._policy = CommitPolicy(config.commit)
        self._audit = (
            AuditWriter(config.audit_dir, "deliveries", writer_id=config.consumer_id) if config.audit_dir else None
        )
        self._handout = Handout(config, self._policy, self._stats, audit=self._audit,
                                read_position=lambda: self._require(self._reader).cursor)
        # The parts made by start(): the lease checks, commits, reading, run()/run_keyed().
        self._checks: LeaseChecks | None = None
        self._commits: Committer | None = None
        self._reader: SegmentReader | None = None
        self._policies: FailurePolicies | None = None
        self._metrics: ConsumerMetrics | None = None
        self.metrics_url: str | None = None  # where config.metrics_listen serves, once started

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Leaving the block commits what the application finished (never the message or poll
        # batch in hand). After NotLeader nothing is committed: the lease is gone.
        if exc is None:
            self._close(lease_error=False)
            return
        try:
            self._close(lease_error=isinstance(exc, NotLeader))
        except OrdqError as close_exc:
            # The application's error is the one to see; the commit's is a consequence.
            log.warning("queue %s/%s: closing after %s: %s", self.config.queue, self.config.subscription,
                        type(exc).__name__, close_exc)

    def start(self) -> None:
        """Connect, create the subscription if needed (``start``), wait to be elected, read the
        cursor. On any error nothing is left running (ZooKeeper session, lease, channels)."""
        try:
            self._start()
        except BaseException:
            self._shutdown()
            raise

    def _start(self) -> None:
        cfg = self.config
        creds = cfg.credentials or lookup(cfg.zk_hosts or "", cfg.root)
        if self._transport is None:
            from ordq.wire.client import GrpcTransport

            self._transport = GrpcTransport(credentials=creds)
        self._client, zk = connect(cfg.zk_hosts or "", cfg.root, creds, session_timeout_s=cfg.lease_ttl_s,
                                   connect_timeout_s=cfg.connect_timeout_s,
                                   who=f"consumer {cfg.queue}/{cfg.subscription}", stopped=lambda: self._closed)
        paths = Paths(cfg.root)
        self._store = store = ZkStore(self._client, paths)
        self._coord = coord = CoordinatorClient(self._store, credentials=creds)
        self._view = view = QueueView(self._store, self._client, cfg.queue)
        zk(self._ensure_subscription, "read or create the subscription")
        self._election = election = self._client.Lock(paths.sub_leader(cfg.queue, cfg.subscription), cfg.consumer_id)
        if not zk(acquire_within(election, cfg.leader_timeout_s), "join the subscription's election"):
            raise WaitTimeout(
                f"{cfg.queue}/{cfg.subscription}: not elected consumer in {cfg.leader_timeout_s}s"
            )
        self._lease = lease = SessionLease(self._client, f"{self._election.path}/{self._election.node}",
                                           session_timeout_s=cfg.lease_ttl_s)
        lease.start()
        cursor, version = zk(lambda: store.get_cursor(cfg.queue, cfg.subscription), "read the cursor")
        handout = self._handout
        handout.finished_base = cursor
        self._checks = checks = LeaseChecks(lease, cfg)
        self._commits = commits = Committer(cfg, store, coord, view, self._policy, self._stats,
                                            holder=lambda: lease.node, finished=handout.finished_pos,
                                            audit=self._audit, version=version)
        self._reader = reader = SegmentReader(cfg, view, self._transport, coord, self._stats, start=cursor,
                                              moved=handout.moved, segment_done=commits.segment_done,
                                              lease_confirmed=checks.confirmed)
        self._policies = FailurePolicies(cfg, store, coord, handout=handout, checks=checks, committer=commits,
                                         reader=reader, poll=self.poll, read_more=self._read_more)
        self._policy.committed(time.monotonic())
        zk(view.refresh, "read the queue")
        if cfg.metrics_listen is not None or cfg.metrics_registry is not None:
            self._metrics = ConsumerMetrics(cfg, self._metrics_snapshot)
            self.metrics_url = self._metrics.server.url if self._metrics.server is not None else None

    def _ensure_subscription(self) -> None:
        store, cfg = self._require(self._store), self.config
        try:
            store.get_cursor(cfg.queue, cfg.subscription)
            return
        except SubscriptionNotFound:
            pass
        # The coordinator creates it (clients may not: coordinator/acl.py), resolving the start
        # target as `ordq sub create --start` does.
        try:
            self._require(self._coord).subscribe(cfg.queue, cfg.subscription, cfg.start.split())
        except AlreadyExists:
            pass  # another consumer of the subscription created it first

    def close(self) -> None:
        """Commit what the application finished (not the message or ``poll`` batch in hand:
        call ``commit()`` first to include it), release the subscription and disconnect.
        Raises ``NotLeader`` if the lease was lost before that commit could be written."""
        self._close(lease_error=False)

    def _close(self, *, lease_error: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if (not lease_error and self._commits is not None and self._lease is not None
                    and self._lease.lost_reason is None and self._policy_pending()):
                self._commits.riding_out(self._handout.finished_pos())
        finally:
            if self._audit is not None:
                self._audit.close()
            if self._policies is not None:
                self._policies.close_audit()
            self._shutdown()

    def _shutdown(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._policies is not None:
            self._policies.close()
        if self._lease is not None:
            self._lease.stop()
        if self._election is not None and self._client is not None:
            release_bounded(self._client, self._election, self.config.lease_ttl_s)
        if self._coord is not None:
            self._coord.close()
        if self._client is not None:
            self._client.stop()
            self._client.close()
        if self._reader is not None:
            self._reader.close()
        if self._transport is not None:
            self._transport.close()

    def _policy_pending(self) -> bool:
        return self._stats.delivered > 0 or (self._commits is not None and self._commits.version >= 0)

    def statistics(self) -> ConsumerStats:
        p, r = self._policies, self._reader
        f = p.failing if p is not None else None
        cur = r.cursor if r is not None else Cursor(seg=0)
        return attrs.evolve(
            self._stats, seg=cur.seg, offset=cur.offset, last_seq=r.filter.last_seq if r is not None else -1,
            duplicates_dropped=r.filter.duplicates_dropped if r is not None else 0, parked=f.parked if f else 0,
            replayed=f.replayed if f else 0, alarms=f.alarms if f else 0,
            redeliveries=f.redeliveries if f else 0,
        )

    def _metrics_snapshot(self) -> ConsumerSnapshot:
        """What the metrics collector shows (read on its scrape thread)."""
        st = self.statistics()
        reader = self._require(self._reader)
        buffered = self._handout.buffer
        lag = len(buffered) + reader.unread()
        try:  # the buffer holds the next seqs, contiguous: what was handed out ends before it
            handed = buffered[0].seq - 1 if buffered else st.last_seq
        except IndexError:  # emptied meanwhile by the consumer's thread
            handed = st.last_seq
        blocked = self.blocked
        return ConsumerSnapshot(stats=st, lag_messages=lag, read_ts_us=reader.read_ts_us, handed_seq=handed,
                                alarmed=self.alarmed, blocked_attempts=blocked.attempts if blocked is not None else 0,
                                stalled_since=reader.stalled_since)

    @property
    def blocked(self) -> BlockedMessage | None:
        """``run``/``run_keyed``: the (lowest) message being retried after its handler failed."""
        return self._policies.blocked() if self._policies is not None else None

    @property
    def alarmed(self) -> bool:
        """True while a message is blocked past its failure policy's attempts (the alarm)."""
        return self._policies.alarmed() if self._policies is not None else False

    # -- consuming ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Delivered]:
        """Messages one by one. A message counts as finished when the loop asks for the next;
        the one in hand when the loop breaks or raises does not (it is redelivered)."""
        while True:
            yield self._take_one()

    def _take_one(self) -> Delivered:
        handout = self._handout
        handout.finish_handed()
        while True:
            while not handout.buffer:
                self._read_more(None)
                handout.finish_handed()
            now = time.monotonic()
            checks = self._require(self._checks)
            if (now < checks.next_check and not self._policy.due_count()) or self._hand_out_ok(now):
                break
        return handout.take_one()

    def poll(self, timeout_s: float | None = None, *, max_messages: int | None = None) -> list[Delivered]:
        """One read round: up to ``max_messages`` messages (all that one read returned when
        None; maybe none after a long-poll of ``timeout_s``, default ``fetch_wait_ms``).

        Calling ``poll`` again tells the consumer that the application finished the messages
        of earlier calls: only those are committed (every N messages / T ms, and on close),
        never the ones this call returns unless ``commit()`` says so, so a crash while
        handling a batch redelivers it. Messages read but not returned (past
        ``max_messages``) wait for the next call; they are never committed before."""
        if max_messages is not None and max_messages < 1:
            raise ConfigError(f"max_messages must be >= 1, not {max_messages}")
        handout = self._handout
        handout.finish_handed()
        if not handout.buffer:
            self._read_more(timeout_s)
            handout.finish_handed()
            if not handout.buffer:
                return []
        if not self._hand_out_ok(time.monotonic()):
            return []  # not sure of the lease right now: hand out nothing
        return handout.take(max_messages)

    def _hand_out_ok(self, now: float) -> bool:
        """Before handing out: the lease and a periodic commit of what is finished, if one is
        due, then the lease again (``LeaseChecks.before_hand_out``)."""
        return self._require(self._checks).before_hand_out(now, self._require(self._commits).if_due)

    def _mark_finished(self, m: Delivered) -> None:
        """The application finished ``m`` (a message handed out) and everything before it."""
        self._handout.mark_finished(m)

    def _read_more(self, timeout_s: float | None) -> None:
        """A read round into the (empty) buffer, after a periodic commit if one is due."""
        if self._closed:
            raise ClosedError("consumer is closed")
        reader, commits, checks = self._require(self._reader), self._require(self._commits), self._require(self._checks)
        view = self._require(self._view)
        try:
            if commits.due(time.monotonic()):  # else: later
                commits.commit_finished()
            self._handout.buffer.extend(reader.read_round(timeout_s))
        except CoordinationUnavailable as exc:
            # Reads go on from the replicas we know while ZooKeeper is away; what needs it
            # (commits, moving on, sealing) is tried again next round, up to coordinator_outage_s.
            # (Handing out waits for the lease: _hand_out_ok.)
            checks.zk_unavailable(exc)
            view.mark_changed()  # read the state again once ZooKeeper answers
            time.sleep(0.05)
            return
        if view.connected():
            checks.zk_answered()

    def run(self, handler: Callable[[Delivered], object], *, stop: threading.Event | None = None) -> None:
        """Call ``handler(m)`` for each message, in order, until ``stop`` is set. A message is
        finished when its handler returns. When the handler raises, the failure policy
        (``config.on_failure``, else the subscription's, else ``block``) decides (docs/SDK.md,
        "A message that keeps failing"): ``block`` tries the same message again after each
        wait of its ladder and never skips it (``blocked`` says which one; past the attempts
        the alarm shows in ``ordq sub list``); ``park`` moves it, after its attempts, to the
        subscription's parking queue with a record in its ledger (``ordq sub parked``) and
        goes on; ``raise`` raises HandlerError. Parked messages an operator asked to replay
        are handed to ``handler`` between two messages (sdk/parking.py). Every attempt first
        makes sure the lease still holds (NotLeader otherwise)."""
        self._require(self._policies).run(handler, stop=stop)

    def run_keyed(self, handler: Callable[[Delivered], object], *, workers: int,
                  stop: threading.Event | None = None, max_pending: int = 256, drain: bool = True) -> None:
        """Deliver to ``workers`` threads by key until ``stop`` is set or a handler fails.

        Worker ``zlib.crc32(key) % workers`` (no key: the empty key, worker 0) calls
        ``handler(m)`` for its messages one at a time in seq order: per-key order, keys in
        parallel, no order across keys. A worker queue holds at most ``max_pending`` messages
        (reading waits for room). Periodic commits (``CommitConfig``) and the one on close
        cover only the contiguous prefix of finished messages. A worker checks the lease
        before every call of the handler: once it cannot be sure, no handler starts.

        Returns once ``stop`` is set and the workers stopped: with ``drain`` after they
        finished every queued message, else after the calls in progress (a handler is never
        interrupted; queued messages are abandoned). Call it from the consumer's thread and
        close the consumer after it (``stop`` is how another thread ends it). The read
        position is then the finished prefix: the next read redelivers from the first message
        not finished, including later ones that did finish (at-least-once).

        Raises ``HandlerError(queue, subscription, seq, key)`` from the handler's exception
        (the lowest failed seq) once every worker stopped: no commit covers that seq.
        ``NotLeader`` when the lease was lost. Consumer errors (``GapDetected``, ...) stop the
        workers likewise and propagate; ``ConfigError`` for ``workers`` or ``max_pending`` < 1.
        """
        if workers < 1 or max_pending < 1:
            raise ConfigError("run_keyed needs workers >= 1 and max_pending >= 1")
        if self._closed:
            raise ClosedError("consumer is closed")
        self._require(self._policies).run_keyed(handler, workers=workers, stop=stop, max_pending=max_pending,
                                                drain=drain)

    def commit(self, through: Delivered | None = None) -> None:
        """Say the application finished every message handed out (or, with ``through``,
        that message and all before it), and write the cursor now, conditionally.
        ConflictError: someone else moved it (an admin reset); NotLeader: the lease is gone."""
        if self._handout.keyed is not None:
            raise ConfigError("commit() is not for keyed delivery: run_keyed commits what finished")
        if through is None:
            self._handout.finish_handed()
        else:
            self._handout.mark_finished(through)
        self._require(self._commits).riding_out(self._handout.finished_pos())

    @staticmethod
    def _require(part: T | None) -> T:
        if part is None:
            raise ClosedError("consumer not started")
        return part
