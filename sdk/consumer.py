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
commit up to ``zk_outage_s``.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import attrs
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from ordq.common.errors import (
    AlreadyExists,
    BrokerUnavailable,
    ClosedError,
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    CorruptLog,
    GapDetected,
    HandlerError,
    IllegalTransition,
    NotLeader,
    OrdqError,
    PermissionDenied,
    RetentionOvertook,
    SubscriptionNotFound,
    WaitTimeout,
)
from ordq.common.security import Credentials, lookup
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.paths import Paths, check_name, check_zk_hosts
from ordq.coordinator.state import Cursor, Segment, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.sdk._consumer_core import CommitConfig, CommitPolicy, DeliveryFilter
from ordq.sdk._lease import SessionLease, acquire_within, release_bounded
from ordq.sdk._queue_view import QueueView
from ordq.sdk._zk_start import connect
from ordq.sdk.audit import AuditWriter, new_writer_id
from ordq.sdk.failure import FailurePolicy
from ordq.sdk.keyed import KeyedWorkers
from ordq.sdk.metrics import ConsumerMetrics
from ordq.sdk.parking import BlockedMessage, FailureHandling, stored_policy, worker_key_filter
from ordq.wire.batch import decode_batch
from ordq.wire.transport import BrokerTransport, FetchResult, Reader

log = logging.getLogger("ordq.consumer")
T = TypeVar("T")

# A periodic commit is a request to the coordinator made on the delivering thread: bounded
# short, and after one that got no answer the next waits this long (delivery goes on; what is
# not committed is redelivered at worst).
COMMIT_TIMEOUT_S = 3.0
COMMIT_RETRY_S = 1.0


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    zk_hosts: str
    queue: str
    subscription: str
    root: str = "/ordq"
    # Where a new subscription starts: earliest | latest | "seq N" (an application that keeps
    # its position in its own database resumes exactly there) | "time T" (as for sub reset).
    start: str = "earliest"
    commit: CommitConfig = CommitConfig()
    fetch_max_bytes: int = 4 << 20
    fetch_wait_ms: int = 200  # long-poll when nothing is readable
    leader_timeout_s: float | None = None
    zk_session_timeout_s: float = 2.0
    # how long start() tries to reach ZooKeeper before CoordinationUnavailable
    zk_connect_timeout_s: float = 10.0
    # ZooKeeper digest credential "user:password" when the root is protected (docs/SECURITY.md)
    # poll() rides out a ZooKeeper outage (a lost ensemble node, a re-election) this long,
    # reading from the replicas it knows, before it raises CoordinationUnavailable
    zk_outage_s: float = 30.0
    audit_dir: Path | None = None
    # What ``run(handler)`` does when the handler raises (sdk/failure.py): block, park or
    # raise, after how many attempts, with which waits between them. None: the subscription's
    # policy (``ordq sub policy``), else block with the default ladder.
    on_failure: FailurePolicy | None = None
    consumer_id: str = attrs.field(factory=new_writer_id)
    # TLS files and token for the brokers (ordq/common/security.py); None: as registered for zk_hosts.
    credentials: Credentials | None = None
    # Prometheus series (sdk/metrics.py), opt-in: served at HOST:PORT (port 0: any; the URL is
    # ``Consumer.metrics_url``) and/or kept in the application's registry.
    metrics_listen: str | None = None
    metrics_registry: CollectorRegistry | None = None

    def __attrs_post_init__(self) -> None:
        check_zk_hosts(self.zk_hosts)
        check_name("queue", self.queue)
        check_name("subscription", self.subscription)
        Paths(self.root)  # InvalidName for a bad root
        from ordq.sdk.positions import parse_reset_target

        parse_reset_target(self.start.split())  # ConfigError for a bad start
        if self.fetch_max_bytes < 1024 or self.fetch_wait_ms < 0:
            raise ConfigError("fetch_max_bytes must be >= 1024 and fetch_wait_ms >= 0")
        if self.zk_outage_s < 0:
            raise ConfigError("zk_outage_s must be >= 0")
        if self.zk_session_timeout_s <= 0:
            raise ConfigError("zk_session_timeout_s must be > 0")
        if self.zk_connect_timeout_s <= 0:
            raise ConfigError("zk_connect_timeout_s must be > 0")
        if self.leader_timeout_s is not None and self.leader_timeout_s < 0:
            raise ConfigError("leader_timeout_s must be >= 0 or None (wait forever)")


class Delivered(NamedTuple):
    """One delivered message. A NamedTuple, like ``ordq.broker_group.log.Message``, not an attrs
    class: one is built per message on the hot path (~0.3 µs instead of ~1.5 µs)."""

    seq: int
    seg: int
    offset: int
    payload: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_us: int


_new_delivered = tuple.__new__


@attrs.define
class ConsumerStats:
    delivered: int = 0
    duplicates_dropped: int = 0
    commits: int = 0
    segments_done: int = 0
    seals_run: int = 0
    seg: int = 0
    offset: int = 0
    last_seq: int = -1
    parked: int = 0  # messages run()/run_keyed() moved to the parking queue
    replayed: int = 0  # parked messages handed to the handler again (ordq sub parked replay)
    alarms: int = 0  # messages that blocked past the policy's attempts (export it as a metric)
    redeliveries: int = 0  # run()/run_keyed(): handler attempts repeated after a failure
    gaps: int = 0  # GapDetected raised


class Consumer:
    """Iterate it (``for m in consumer``) or call ``poll()``; see the module docstring for
    what is committed when."""

    def __init__(self, config: ConsumerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._reads: Reader | None = None  # this consumer's reads: one Read stream kept open between fetches
        self._client: KazooClient | None = None
        self._store: ZkStore | None = None
        self._coord: CoordinatorClient | None = None  # commits, seals, pops, subscribing: asked of the coordinator
        self._commit_retry_at = float("-inf")  # monotonic: no periodic commit before (the last got no answer)
        self._election: Any = None  # the kazoo Lock of the subscription
        self._lease: SessionLease | None = None
        self._failing: FailureHandling | None = None  # run()/run_keyed(): the failure policy at work
        self._closed = False
        self._cursor = Cursor(seg=0)  # where the next read starts (past dropped duplicates too)
        self._buffer: deque[Delivered] = deque()  # read, not handed out yet
        self._in_hand: Delivered | None = None  # the last message handed out, not finished
        self._done: Delivered | None = None  # the last finished message (None: _finished_base)
        self._finished_base = self._cursor  # finished position when _done is None
        self._keyed: KeyedWorkers | None = None  # while run_keyed runs: what is done is theirs to say
        self._cursor_version = -1
        self._filter = DeliveryFilter(config.queue, last_seq=-1)
        self._policy = CommitPolicy(config.commit)
        self._next_check = float("-inf")  # monotonic time of the next lease/commit check
        self._stats = ConsumerStats()
        # For the metrics (sdk/metrics.py): the last fetch's (seg, readable end), the timestamp
        # of the newest message read, since when no replica of the current segment answers.
        self._read_end = (-1, 0)
        self._read_ts_us = 0
        self._stalled_since: float | None = None
        # (seg, address) of the replica that last failed a read of that segment (corrupt, not
        # served, down): the other one is asked first until the cursor leaves the segment.
        self._avoid: tuple[int, str] | None = None
        self._served_by = ""  # address of the replica that answered the last fetch
        self._metrics: ConsumerMetrics | None = None
        self.metrics_url: str | None = None  # where config.metrics_listen serves, once started
        self._view: QueueView | None = None  # the queue's state and replicas, cached
        self._zk_down_since: float | None = None
        self._commits_in_doubt: list[Cursor] = []  # commits that got no answer since the last one that did
        self._pop_after: int | None = None  # last_seq of a sealed segment whose pop waits for a later commit
        self._audit = (
            AuditWriter(config.audit_dir, "deliveries", writer_id=config.consumer_id) if config.audit_dir else None
        )
        self._skips: AuditWriter | None = None  # parked and replayed messages, made on first use

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
        creds = cfg.credentials or lookup(cfg.zk_hosts, cfg.root)
        if self._transport is None:
            from ordq.wire.client import GrpcTransport

            self._transport = GrpcTransport(credentials=creds)
        self._client, zk = connect(cfg.zk_hosts, cfg.root, creds.zk_auth, session_timeout_s=cfg.zk_session_timeout_s,
                                   connect_timeout_s=cfg.zk_connect_timeout_s,
                                   who=f"consumer {cfg.queue}/{cfg.subscription}", stopped=lambda: self._closed)
        paths = Paths(cfg.root)
        self._store = store = ZkStore(self._client, paths)
        self._coord = CoordinatorClient(self._store, credentials=creds)
        self._view = view = QueueView(self._store, self._client, cfg.queue)
        zk(self._ensure_subscription, "read or create the subscription")
        self._election = election = self._client.Lock(paths.sub_leader(cfg.queue, cfg.subscription), cfg.consumer_id)
        if not zk(acquire_within(election, cfg.leader_timeout_s), "join the subscription's election"):
            raise WaitTimeout(
                f"{cfg.queue}/{cfg.subscription}: not elected consumer in {cfg.leader_timeout_s}s"
            )
        self._lease = SessionLease(self._client, f"{self._election.path}/{self._election.node}",
                                   session_timeout_s=cfg.zk_session_timeout_s)
        self._lease.start()
        self._cursor, self._cursor_version = zk(lambda: store.get_cursor(cfg.queue, cfg.subscription),
                                                "read the cursor")
        self._finished_base = self._cursor
        self._filter = DeliveryFilter(cfg.queue, last_seq=self._cursor.last_seq)
        self._policy.committed(time.monotonic())
        zk(view.refresh, "read the queue")
        if cfg.metrics_listen is not None or cfg.metrics_registry is not None:
            self._metrics = ConsumerMetrics(self)
            self.metrics_url = self._metrics.server.url if self._metrics.server is not None else None

    def _ensure_subscription(self) -> None:
        store, cfg = self._require_store(), self.config
        try:
            store.get_cursor(cfg.queue, cfg.subscription)
            return
        except SubscriptionNotFound:
            pass
        # The coordinator creates it (clients may not: coordinator/acl.py), resolving the start
        # target as `ordq sub create --start` does.
        try:
            self._require_coord().subscribe(cfg.queue, cfg.subscription, cfg.start.split())
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
            if (not lease_error and self._store is not None and self._lease is not None
                    and self._lease.lost_reason is None and self._policy_pending()):
                self._commit_riding_out(self._finished_pos())
        finally:
            for audit in (self._audit, self._skips):
                if audit is not None:
                    audit.close()
            self._shutdown()

    def _shutdown(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._failing is not None:
            self._failing.close()
        if self._lease is not None:
            self._lease.stop()
        if self._election is not None and self._client is not None:
            release_bounded(self._client, self._election, self.config.zk_session_timeout_s)
        if self._coord is not None:
            self._coord.close()
        if self._client is not None:
            self._client.stop()
            self._client.close()
        if self._reads is not None:
            self._reads.close()
        if self._transport is not None:
            self._transport.close()

    def _policy_pending(self) -> bool:
        return self._stats.delivered > 0 or self._cursor_version >= 0

    def statistics(self) -> ConsumerStats:
        f = self._failing
        return attrs.evolve(
            self._stats, seg=self._cursor.seg, offset=self._cursor.offset, last_seq=self._filter.last_seq,
            duplicates_dropped=self._filter.duplicates_dropped, parked=f.parked if f else 0,
            replayed=f.replayed if f else 0, alarms=f.alarms if f else 0,
            redeliveries=f.redeliveries if f else 0,
        )

    @property
    def blocked(self) -> BlockedMessage | None:
        """``run``/``run_keyed``: the (lowest) message being retried after its handler failed."""
        return self._failing.blocked() if self._failing is not None else None

    @property
    def alarmed(self) -> bool:
        """True while a message is blocked past its failure policy's attempts (the alarm)."""
        return self._failing.alarmed() if self._failing is not None else False

    # -- what the application finished -------------------------------------------------------

    def _finish_handed(self) -> None:
        """The application asked for more (or said so): everything handed out is finished.
        With nothing left in the buffer, that is the read position itself (past duplicates
        dropped at the end of the last read)."""
        if self._in_hand is not None:
            self._done, self._in_hand = self._in_hand, None
        if not self._buffer and self._keyed is None:
            self._done, self._finished_base = None, self._cursor

    def _mark_finished(self, m: Delivered) -> None:
        """The application finished ``m`` (a message handed out) and everything before it."""
        if m.seq <= (self._done.seq if self._done is not None else self._finished_base.last_seq):
            return  # finished already
        last = self._in_hand
        if last is None or m.seq > last.seq:
            raise ConfigError(f"seq {m.seq} was not handed out by this consumer")
        if m.seq == last.seq:
            self._finish_handed()
        else:
            self._done = m

    def _finished_pos(self) -> Cursor:
        """The position after the last finished message: what a commit may write."""
        if self._keyed is not None:
            return self._keyed.position()
        done = self._done
        if done is None:
            return self._finished_base
        return Cursor(seg=done.seg, offset=done.offset + 1, last_seq=done.seq)

    # -- consuming ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Delivered]:
        """Messages one by one. A message counts as finished when the loop asks for the next;
        the one in hand when the loop breaks or raises does not (it is redelivered)."""
        while True:
            yield self._take_one()

    def _take_one(self) -> Delivered:
        self._finish_handed()
        while True:
            while not self._buffer:
                self._read_more(None)
                self._finish_handed()
            now = time.monotonic()
            if (now < self._next_check and not self._policy.due_count()) or self._checks(now):
                break
        m = self._buffer.popleft()
        self._in_hand = m
        self._handed(m)
        return m

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
        self._finish_handed()
        if not self._buffer:
            self._read_more(timeout_s)
            self._finish_handed()
            if not self._buffer:
                return []
        if not self._checks(time.monotonic()):
            return []  # not sure of the lease right now: hand out nothing
        buf = self._buffer
        if max_messages is None or max_messages >= len(buf):
            out = list(buf)
            buf.clear()
        else:
            out = [buf.popleft() for _ in range(max_messages)]
        self._in_hand = out[-1]
        self._handed_batch(out)
        return out

    def _checks(self, now: float) -> bool:
        """Before handing out: the lease (NotLeader when it is gone; False when not sure now,
        after waiting a little) and a periodic commit of what is finished, if one is due."""
        if not self._lease_confirmed():
            return False
        lease = self._require_lease()
        if self._periodic_commit_due(now):
            try:
                self._commit(self._finished_pos(), timeout_s=COMMIT_TIMEOUT_S)
            except CoordinationUnavailable:
                pass  # tried again after COMMIT_RETRY_S; the lease keeps the outage clock
            # The commit blocks (a round trip; seconds on a loaded box, or the process frozen
            # meanwhile): the lease confirmed before it proves nothing now. A consumer frozen
            # here past its session handed out one more message beside its successor (issue 26).
            if not self._lease_confirmed():
                return False
            now = time.monotonic()
        # Next look: when a timed commit is due, or the lease runs out if sooner (a renewal
        # meanwhile only makes that look early and cheap).
        self._next_check = min(now + self.config.commit.every_ms / 1000.0, lease.valid_until)
        return True

    def _lease_confirmed(self) -> bool:
        """The lease holds by our clock (waiting a little for a renewal when it is about to
        run out); False when not sure now; NotLeader when it is gone."""
        lease = self._require_lease()
        if not lease.valid() and not lease.wait_valid(self.config.fetch_wait_ms / 1000.0):
            if lease.lost_reason is not None:
                raise NotLeader(self.config.queue, self.config.subscription, lease.lost_reason)
            self._unsure_of_zookeeper()
            return False
        self._zk_down_since = None
        return True

    def _unsure_of_zookeeper(self) -> None:
        """No lease renewal answered for a while: hand out nothing; after ``zk_outage_s`` of
        this, raise CoordinationUnavailable."""
        now = time.monotonic()
        if self._zk_down_since is None:
            self._zk_down_since = now
        if now - self._zk_down_since > self.config.zk_outage_s:
            raise CoordinationUnavailable(
                f"queue {self.config.queue}/{self.config.subscription}: no answer from ZooKeeper for "
                f"{now - self._zk_down_since:.1f}s; cannot be sure this consumer still leads")
        log.warning("queue %s/%s: lease not confirmed by ZooKeeper; delivering nothing until it is",
                    self.config.queue, self.config.subscription)

    def _handed(self, m: Delivered) -> None:
        self._stats.delivered += 1
        self._policy.delivered(1)
        self._audit_out([m])

    def _handed_batch(self, out: list[Delivered]) -> None:
        self._stats.delivered += len(out)
        self._policy.delivered(len(out))
        self._audit_out(out)

    def _audit_out(self, out: list[Delivered]) -> None:
        """Audit rows of messages about to be handed out; they reach the OS before the
        application sees the messages (docs/AUDIT_FORMAT.md)."""
        if self._audit is not None:
            now_us = time.time_ns() // 1000
            self._audit.write_rows([self._audit_row(m, now_us) for m in out])

    def _read_more(self, timeout_s: float | None) -> None:
        """A read round into the (empty) buffer, after a periodic commit if one is due."""
        if self._closed:
            raise ClosedError("consumer is closed")
        try:
            if self._periodic_commit_due(time.monotonic()):  # else: later
                self._commit(self._finished_pos(), timeout_s=COMMIT_TIMEOUT_S)
            self._buffer.extend(self._read_round(timeout_s))
        except CoordinationUnavailable as exc:
            # Reads go on from the replicas we know while ZooKeeper is away; what needs it
            # (commits, moving on, sealing) is tried again next round, up to zk_outage_s.
            # (Handing out waits for the lease: _checks.)
            now = time.monotonic()
            if self._zk_down_since is None:
                self._zk_down_since = now
            if now - self._zk_down_since > self.config.zk_outage_s:
                raise
            log.warning("queue %s/%s: ZooKeeper unavailable for %.1fs, retrying: %s", self.config.queue,
                        self.config.subscription, now - self._zk_down_since, exc)
            self._require_view().mark_changed()  # read the state again once ZooKeeper answers
            time.sleep(0.05)
            return
        if self._require_view().connected():
            self._zk_down_since = None

    def _sync_keyed(self) -> None:
        """Keyed delivery: count the messages the workers finished since the last look, so the
        commit policy commits them (a move to the next segment counts as one)."""
        assert self._keyed is not None
        pos = self._keyed.position()
        if pos != self._finished_base:
            self._policy.delivered(max(1, pos.last_seq - self._finished_base.last_seq))
            self._finished_base = pos

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
        failing = self._start_failure_handling(FailurePolicy(), keyed=False)

        def wait(delay_s: float) -> bool:
            if stop is not None:
                return stop.wait(delay_s)
            time.sleep(delay_s)
            return False

        while stop is None or not stop.is_set():
            if failing.changed.is_set():
                failing.changed.clear()
                if not failing.resolve(handler, mine=lambda key: True, may_start=self._run_may_start, wait=wait):
                    return  # stopped while a replayed message was retried: it stays asked for
            batch = self.poll(max_messages=1)
            if not batch:
                continue
            if not failing.attempt(batch[0], handler, may_start=self._run_may_start, wait=wait,
                                   on_park=failing.park):
                return  # stopped while blocked: the message stays unfinished
            self._finish_handed()

    def _start_failure_handling(self, default: FailurePolicy, *, keyed: bool) -> FailureHandling:
        cfg, store = self.config, self._require_store()
        policy = cfg.on_failure or stored_policy(store, cfg.queue, cfg.subscription) or default
        if self._failing is not None:
            self._failing.close()
        self._failing = FailureHandling(cfg, store, policy, audit=self._skips_audit(), keyed=keyed,
                                        coordinator=self._require_coord())
        return self._failing

    def _skips_audit(self) -> AuditWriter | None:
        if self.config.audit_dir is None:
            return None
        if self._skips is None:
            self._skips = AuditWriter(self.config.audit_dir, "skips", writer_id=self.config.consumer_id)
        return self._skips

    def _run_may_start(self) -> None:
        while not self._lease_confirmed():
            pass  # not sure of the lease: no new attempt until it is (NotLeader if lost)

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
        self._finish_handed()  # messages handed out before this call count as done
        start = self._finished_pos()
        failing = self._start_failure_handling(FailurePolicy(on_failure="raise", attempts=1), keyed=True)

        # A retry gives up when the workers stop; with ``drain``, only a blocked message does
        # (block retries for ever): one that park or raise decides within its attempts goes on.
        gives_up = stop if (not drain or failing.policy.on_failure == "block") else None

        def handle(m: Delivered) -> bool:  # on the key's worker
            if failing.follows_parked_key(m):
                return True
            return failing.attempt(m, handler, may_start=self._worker_may_start,
                                   wait=lambda s: pool.wait(s, gives_up), on_park=failing.park)

        def replay(worker: int) -> None:  # on the worker, between its messages: ordered with its keys
            failing.resolve(handler, mine=worker_key_filter(worker, workers), may_start=self._worker_may_start,
                            wait=lambda s: pool.wait(s, gives_up))

        pool = KeyedWorkers(handle, workers=workers, max_pending=max_pending, start=start,
                            may_start=self._worker_may_start, on_control=replay,
                            name=f"ordq-keyed-{self.config.subscription}")
        self._keyed, self._finished_base = pool, start
        clean = False
        try:
            while (stop is None or not stop.is_set()) and pool.failure is None and pool.fatal is None:
                if failing.changed.is_set():  # an operator replayed or dropped: each worker looks
                    failing.changed.clear()
                    pool.control(stop=stop, waiting=self._commit_if_due)
                for m in self._take_batch_keyed():
                    if not pool.submit(m, stop=stop, waiting=self._commit_if_due):
                        break
            clean = True
        finally:
            pool.stop(drain=drain and clean and pool.failure is None and pool.fatal is None)
            self._sync_keyed()
            self._keyed = None
            done = self._finished_base
            self._done = self._in_hand = None
            self._buffer.clear()
            if done != self._cursor:
                # Read on from the first message not finished (the queued ones were dropped).
                self._cursor = done
                self._filter.last_seq = done.last_seq
        if pool.fatal is not None:
            raise pool.fatal
        if pool.failure is not None:
            m, exc = pool.failure
            if isinstance(exc, HandlerError):  # the policy's (raise): from the handler's exception
                raise exc
            raise HandlerError(self.config.queue, self.config.subscription, m.seq, m.key) from exc

    def _take_batch_keyed(self) -> list[Delivered]:
        """Keyed delivery: everything one read returned, once the lease is sure (the workers
        check it again before each message)."""
        self._sync_keyed()
        if not self._buffer:
            self._read_more(None)
            if not self._buffer:
                return []
        if not self._checks(time.monotonic()):
            return []
        out = list(self._buffer)
        self._buffer.clear()
        self._stats.delivered += len(out)
        self._audit_out(out)
        return out

    def _worker_may_start(self) -> None:
        """Called by a keyed worker before each handler call: returns when the lease is sure,
        raises NotLeader when it is gone (CoordinationUnavailable after ``zk_outage_s``)."""
        lease = self._require_lease()
        if lease.valid():
            return
        if lease.wait_valid(self.config.zk_outage_s):
            return
        if lease.lost_reason is not None:
            raise NotLeader(self.config.queue, self.config.subscription, lease.lost_reason)
        raise CoordinationUnavailable(f"queue {self.config.queue}/{self.config.subscription}: lease not "
                                      f"confirmed by ZooKeeper for {self.config.zk_outage_s}s")

    def _commit_if_due(self) -> None:
        """While keyed delivery waits for queue room: commit what finished if it is time."""
        self._sync_keyed()
        if self._periodic_commit_due(time.monotonic()):
            try:
                self._commit(self._finished_pos(), timeout_s=COMMIT_TIMEOUT_S)
            except CoordinationUnavailable:
                pass  # the next read round tries again and keeps the outage clock

    def commit(self, through: Delivered | None = None) -> None:
        """Say the application finished every message handed out (or, with ``through``,
        that message and all before it), and write the cursor now, conditionally.
        ConflictError: someone else moved it (an admin reset); NotLeader: the lease is gone."""
        if self._keyed is not None:
            raise ConfigError("commit() is not for keyed delivery: run_keyed commits what finished")
        if through is None:
            self._finish_handed()
        else:
            self._mark_finished(through)
        self._commit_riding_out(self._finished_pos())

    def _commit_riding_out(self, cursor: Cursor) -> None:
        """Commit ``cursor``, riding out a ZooKeeper or coordinator outage of up to
        ``zk_outage_s`` as ``poll`` does (the coordinator answers UNAVAILABLE while it cannot
        reach ZooKeeper); CoordinationUnavailable after that."""
        deadline = time.monotonic() + self.config.zk_outage_s
        while True:
            try:
                self._commit(cursor)
                return
            except CoordinationUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _periodic_commit_due(self, now: float) -> bool:
        """A commit is due by the policy, ZooKeeper is up (the coordinator checks the lock node
        there) and the last attempt did not just go unanswered."""
        return self._policy.due(now) and now >= self._commit_retry_at and self._require_view().connected()

    def _commit(self, cur: Cursor, *, timeout_s: float | None = None) -> None:
        if self._audit is not None:
            # The audit rows of what the cursor covers reach the file first: after a crash the
            # standby starts past them, so rows still in the buffer would read as lost.
            self._audit.flush()
        store, q, sub = self._require_store(), self.config.queue, self.config.subscription
        coord = self._require_coord()
        holder = self._require_lease().node  # the coordinator commits only for the election's holder
        try:
            try:
                self._cursor_version = coord.commit(q, sub, cur, self._cursor_version, holder, timeout_s=timeout_s)
            except ConflictError:
                # A commit of ours may have landed without our hearing of it (the client sends
                # again after a lost answer; an earlier one timed out): then the cursor moved to
                # one we wrote, not to another consumer's. Go on from there; anything else is
                # a real conflict.
                now, version = store.get_cursor(q, sub)
                if now == cur:
                    self._cursor_version = version
                elif now in self._commits_in_doubt:
                    self._cursor_version = coord.commit(q, sub, cur, version, holder, timeout_s=timeout_s)
                else:
                    raise
        except CoordinationUnavailable:
            self._commits_in_doubt.append(cur)
            self._commit_retry_at = time.monotonic() + COMMIT_RETRY_S
            raise
        self._commits_in_doubt.clear()
        self._commit_retry_at = float("-inf")
        self._policy.committed(time.monotonic())
        self._stats.commits += 1
        if self._pop_after is not None and cur.last_seq > self._pop_after:
            self._pop_after = None
            try:
                self._try_pop()
            except OrdqError as exc:  # the commit is done; popping only frees disk (the daemon does it too)
                log.debug("queue %s: pop after commit deferred: %s", self.config.queue, exc)

    def _read_round(self, timeout_s: float | None) -> list[Delivered]:
        view = self._require_view()
        st = view.state()
        cur = self._cursor
        segment = st.segment(cur.seg)
        wait_ms = self.config.fetch_wait_ms if timeout_s is None else int(timeout_s * 1000)
        if segment is None:
            head = st.consume[0].seg if st.consume else st.next_seg
            if cur.seg < head:
                # Dropped by retention before we read it: resume at the head. If it held seqs
                # we have not delivered, the seq filter sees the gap there (a resend may have
                # put some of them in the next segment too): never a silent skip.
                self._moved(Cursor(seg=head, offset=0, last_seq=self._filter.last_seq))
                return []
            view.wait_change(wait_ms)  # the next segment does not exist yet
            return []
        if segment.status is SegStatus.SEALED and cur.offset >= (segment.end or 0):
            self._advance(segment)
            return []
        res = self._fetch(segment, cur.offset, max_wait_ms=wait_ms)
        if res is None:
            return []
        self._read_end = (segment.seg, res.readable_end)
        last_before = self._filter.last_seq
        try:
            try:
                delivered = self._deliver(segment, res.batches)
            except CorruptLog as exc:
                # A copy that rotted (or bytes damaged on the way): the same range from the
                # other replica. Both bad: raised (never skipped).
                bad = self._served_by
                log.warning("queue %s seg %d: broker %s sent a corrupt batch reading from offset %d (%s); "
                            "reading the same range from the other replica", self.config.queue, segment.seg, bad,
                            cur.offset, exc)
                self._avoid = (segment.seg, bad)
                res = self._fetch(segment, cur.offset, max_wait_ms=0, skip=bad)
                if res is None:
                    return []
                delivered = self._deliver(segment, res.batches)
        except GapDetected as gap:
            # A consumer frozen past its session resumes behind a successor that read, committed
            # and popped on: the "gap" is the successor's progress. It is deposed (NotLeader),
            # not overtaken by retention (whose advice, a reset to earliest, redelivers all).
            if not self._lease_confirmed():
                # Not sure yet: read this again later. The filter admitted the seqs before the
                # gap, which were never handed out: forget them, or the reread drops them.
                self._filter.last_seq = last_before
                return []
            self._stats.gaps += 1
            if gap.expected_seq <= st.trimmed_seq:  # the missing seqs were in popped segments
                raise RetentionOvertook(self.config.queue, self.config.subscription, gap.expected_seq,
                                        gap.got_seq) from gap
            raise
        if delivered:
            self._read_ts_us = delivered[-1].timestamp_us
        if not res.batches:
            if segment.status is SegStatus.SEALING:
                self._seal(segment)  # at its readable end: decide the end ourselves
            elif res.sealed:
                view.refresh()  # the replica knows more than our cached state
        return delivered

    def _deliver(self, segment: Segment, batches: list[bytes]) -> list[Delivered]:
        """Decode what a fetch returned into the messages to hand out (new seqs only, in order)
        and move the read position past them. Audit rows are written when handed out."""
        cur = self._cursor
        out: list[Delivered] = []
        offset = cur.offset
        limit = segment.end if segment.status is SegStatus.SEALED else None
        seg = segment.seg
        # Every batch decoded (CRC checked) before anything moves: a corrupt one raises with
        # the filter and the cursor untouched, so the range can be read again elsewhere.
        for header, messages in [decode_batch(raw) for raw in batches]:
            first_off, first_seq, n = header.first_offset, header.first_seq, header.count
            if (first_off >= offset and (limit is None or first_off + n <= limit)
                    and self._filter.admit_run(first_seq, n)):
                # Fast path: the whole batch is new and continues the stream exactly.
                out.extend(_new_delivered(Delivered, (first_seq + i, seg, first_off + i, m[0], m[1], m[2], m[3]))
                           for i, m in enumerate(messages))
                offset = first_off + n
                continue
            for i, m in enumerate(messages):
                off = first_off + i
                if off < offset or (limit is not None and off >= limit):
                    continue
                offset = off + 1
                seq = first_seq + i
                if not self._filter.admit(seq):
                    continue
                out.append(_new_delivered(Delivered, (seq, seg, off, m.payload, m.key, m.headers, m.timestamp_us)))
        self._cursor = Cursor(seg=segment.seg, offset=offset, last_seq=self._filter.last_seq)
        return out

    def _audit_row(self, m: Delivered, now_us: int) -> tuple[object, ...]:
        cfg = self.config
        return (cfg.queue, cfg.subscription, cfg.consumer_id, m.seq, m.seg, m.offset, (m.key or b"").hex(),
                zlib.crc32(m.payload), m.timestamp_us, now_us)

    def _advance(self, segment: Segment) -> None:
        """Done with a sealed segment: move the cursor on, commit it, and try to pop."""
        self._moved(Cursor(seg=segment.seg + 1, offset=0, last_seq=self._filter.last_seq))
        self._stats.segments_done += 1
        self._commit(self._finished_pos(), timeout_s=COMMIT_TIMEOUT_S)
        # Refused while nothing after this segment is stored (it keeps the queue's newest
        # message for a new producer leader: state.holds_newest): try again once a commit
        # covers a later seq, as no coordinator daemon may be running to do it.
        self._pop_after = segment.last_seq
        self._try_pop()
        self._require_view().refresh()

    def _try_pop(self) -> None:
        # The coordinator pops what every subscription passed (nothing when another is still
        # behind, someone popped it already, or it is kept) and answers with the state.
        try:
            self._require_view().learnt(self._require_coord().pop(self.config.queue))
        except IllegalTransition:
            pass

    def _moved(self, cursor: Cursor) -> None:
        """The read position moved on without delivering anything (next segment, or past a
        segment dropped by retention). Only called in a read round, when the buffer is empty
        and the application finished everything handed out before (keyed: once finished)."""
        self._cursor = cursor
        if self._keyed is not None:
            self._keyed.moved(cursor)
            self._sync_keyed()
            return
        self._done, self._finished_base = None, cursor

    def _seal(self, segment: Segment) -> None:
        """At the end of a sealing segment: ask the coordinator to seal it (DESIGN §5)."""
        try:
            self._require_view().learnt(self._require_coord().seal(self.config.queue, segment.seg))
            self._stats.seals_run += 1
        except BrokerUnavailable:
            # Both processes of the group are down: wait at this segment until one returns.
            self._require_view().wait_change(self.config.fetch_wait_ms)

    def _fetch(self, segment: Segment, offset: int, *, max_wait_ms: int,
               max_bytes: int | None = None, skip: str | None = None) -> FetchResult | None:
        """Read from the master, or the slave when the master is down (or refused the read:
        a corrupt copy, not served there); None when neither answers (the caller waits at
        this segment: consumers never skip it). ``skip``: an address not to ask this time.
        A replica that failed a read of this segment is asked last until the cursor moves on."""
        view = self._require_view()
        if self._reads is None:
            self._reads = self._require_transport().reader()
        reads = self._reads
        members = view.replicas(segment.gid)
        errors: list[tuple[str, str]] = []
        denied: list[PermissionDenied] = []
        avoid = self._avoid[1] if self._avoid is not None and self._avoid[0] == segment.seg else None
        master = members.get("master")
        roles = ("slave", "master") if master is not None and master.address == avoid else ("master", "slave")
        for role in roles:
            info = members.get(role)
            if info is None:
                view.mark_stale(segment.gid)  # look again next time: it may be back
                continue
            if info.address == skip:
                continue
            try:
                res = reads.fetch(info.address, self.config.queue, segment.seg, offset,
                                      max_bytes=max_bytes or self.config.fetch_max_bytes, max_wait_ms=max_wait_ms,
                                      known_end=segment.end if segment.status is SegStatus.SEALED else None)
                self._stalled_since = None
                self._served_by = info.address
                if errors and self._avoid != (segment.seg, errors[0][0]):
                    self._avoid = (segment.seg, errors[0][0])
                    log.warning("queue %s seg %d: read from offset %d refused by %s; read from the %s at %s "
                                "instead", self.config.queue, segment.seg, offset, "; ".join(e for _, e in errors),
                                role, info.address)
                return res
            except OrdqError as exc:
                errors.append((info.address, f"{role} {info.address}: {exc}"))
                view.mark_stale(segment.gid)
                if isinstance(exc, PermissionDenied):
                    denied.append(exc)
        if denied and len(denied) == len(errors):
            # Every replica asked refused this consumer's token (revoked, or without the
            # consume role): final, as for the producer; waiting would only spin (issue 24).
            # One replica refusing while the other failed otherwise is not final: a broker
            # whose token reload failed refuses every token until it loads again.
            raise denied[0]
        if self._stalled_since is None:
            self._stalled_since = time.monotonic()
        log.info("queue %s seg %d: no replica readable (%s)", self.config.queue, segment.seg,
                 "; ".join(e for _, e in errors) or "none live")
        view.wait_change(max(max_wait_ms, 50))
        return None

    # -- helpers -----------------------------------------------------------------------------

    def _require_store(self) -> ZkStore:
        if self._store is None:
            raise ClosedError("consumer not started")
        return self._store

    def _require_coord(self) -> CoordinatorClient:
        if self._coord is None:
            raise ClosedError("consumer not started")
        return self._coord

    def _require_lease(self) -> SessionLease:
        if self._lease is None:
            raise ClosedError("consumer not started")
        return self._lease

    def _require_view(self) -> QueueView:
        if self._view is None:
            raise ClosedError("consumer not started")
        return self._view

    def _require_transport(self) -> BrokerTransport:
        if self._transport is None:
            raise ClosedError("consumer not started")
        return self._transport
