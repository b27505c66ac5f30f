"""Ordered consumer: one consumer per (queue, subscription) holds the subscription's lease from
the coordinator, reads the cursor's segment, delivers each seq in order, and moves on segment by
segment.

Guarantee: messages are handed to the application in seq order, never with a gap (a missing
seq raises ``GapDetected``, never skipped). Only one instance delivers at a time: before handing
out a message the consumer checks, by its own clock, that it still holds the subscription's
consumer lease (``ordq.sdk._lease_client``: trusted for less than the coordinator keeps it, counted
from before the renewal was sent); when it cannot be sure it hands out nothing.

A lease lost (the coordinator granted it to another consumer after ours lapsed: a pause, load,
a partition) does not end the consumer (issue 37, "clients that stay"): it drops what it read
and did not hand out, waits as a standby until granted again, reads the committed cursor and
goes on from there; ``statistics().rejoins`` counts it and one WARNING line says so. The
messages after the committed cursor are delivered again (at-least-once), in order, never with
a gap. A lapse the coordinator revives (nobody took the lease) just resumes. Only a final
refusal ends it: ``PermissionDenied`` (revoked token), ``QueueNotFound`` /
``SubscriptionNotFound`` (deleted).

What is committed (docs/SDK.md, "What is committed"): never past what the application
finished. A message counts as finished once the application asks for another (the next step
of ``for m in consumer``, another ``poll``) or says so (``commit()``, ``commit(through=m)``).
The message in hand when a loop breaks or raises, and the last ``poll`` batch, are not
finished: ``close`` and leaving ``with`` commit only what was, so they are redelivered to the
next consumer. The cursor is written by the coordinator with a conditional write, only for the
lease's current holder (generation and key), every N messages / T ms and on close. With
``run_keyed`` (opt-in), messages are hashed by key to N worker threads (per-key order, not
global) and commits cover only the contiguous prefix of finished messages.

Reading: the master of the segment's group, or its slave when the master is down; what one
read returns waits in a buffer and is handed out as the application asks (``poll`` takes up
to ``max_messages``). At the end of a ``sealing`` segment the consumer asks the coordinator to
seal it; at the end of a sealed one it advances its cursor to the next segment and asks for a
``pop``. What it knows of the queue (its state, the groups' live processes) comes from the
coordinator's Describe, cached in ``ordq.sdk._queue_view``.

Who writes what (issue 37): the consumer holds no ZooKeeper session. Its lease, cursor commits,
creating the subscription, seals, pops, the parking queue, the alarm and the parked ledger
(sdk/parking.py) are requests to the elected coordinator (coordinator/client.py), which checks
the consume token and the lease. While no coordinator answers the consumer reads on from the
replicas it knows and hands out while its lease is still sure; commits wait (tried again every
``COMMIT_RETRY_S``) and ``close`` retries its commit up to ``coordinator_outage_s``.

The parts (this module is the façade that wires them): ``_consumer_lease`` (the checks before
handing out), ``_consumer_read`` (reading), ``_consumer_commit`` (delivery and commit),
``_consumer_policies`` (``run``/``run_keyed``: the keyed and failure policies).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs

from ordq.common.errors import (
    AlreadyExists,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    LeaseLost,
    OrdqError,
    SubscriptionNotFound,
    WaitTimeout,
)
from ordq.common.stages import stamp
from ordq.coordinator.client import CoordinatorClient, Described
from ordq.coordinator.state import Cursor
from ordq.sdk._cluster import open_coordinator
from ordq.sdk._consumer_commit import COMMIT_TIMEOUT_S, Committer, Handout
from ordq.sdk._consumer_core import CommitPolicy
from ordq.sdk._consumer_delay import DelayReporter, read_delay_ms
from ordq.sdk._consumer_lease import LeaseChecks, LeaseGone
from ordq.sdk._consumer_policies import FailurePolicies
from ordq.sdk._consumer_read import SegmentReader
from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats, Delivered
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk._queue_view import QueueView
from ordq.sdk.audit import AuditWriter
from ordq.sdk.metrics import ConsumerMetrics, ConsumerSnapshot
from ordq.sdk.parking import BlockedMessage
from ordq.wire.transport import BrokerTransport

log = logging.getLogger("ordq.consumer")


def _seqs(delivered: list[Delivered]) -> list[int]:
    """Stage stamps' keys (ordq/common/stages.py): the seqs handed out."""
    return [d.seq for d in delivered]
T = TypeVar("T")


class Consumer:
    """Iterate it (``for m in consumer``) or call ``poll()``; see the module docstring for
    what is committed when."""

    def __init__(self, config: ConsumerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._coord: CoordinatorClient | None = None  # lease, commits, seals, pops, subscribing, describing
        self._lease: CoordinatorLease | None = None
        self._view: QueueView | None = None  # the queue's state and replicas, cached
        self._closed = False
        self._stats = ConsumerStats()
        self._policy = CommitPolicy(config.commit)
        self._audit = (
            AuditWriter(config.audit_dir, "deliveries", writer_id=config.consumer_id) if config.audit_dir else None
        )
        # Where each instance began (the verifier judges the subscription from there on).
        self._starts = (
            AuditWriter(config.audit_dir, "starts", writer_id=config.consumer_id) if config.audit_dir else None
        )
        self._handout = Handout(config, self._policy, self._stats, audit=self._audit,
                                read_position=lambda: self._require(self._reader).cursor)
        # The parts made by start(): the lease checks, commits, reading, run()/run_keyed().
        self._checks: LeaseChecks | None = None
        self._commits: Committer | None = None
        self._reader: SegmentReader | None = None
        self._policies: FailurePolicies | None = None
        self._metrics: ConsumerMetrics | None = None
        self._delays: DelayReporter | None = None  # delayed delivery: the settings and the waiting report
        self.metrics_url: str | None = None  # where config.metrics_listen serves, once started

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Leaving the block commits what the application finished (never the message or poll
        # batch in hand).
        if exc is None:
            self._close()
            return
        try:
            # Leaving on an error (or Ctrl-C): the closing commit is tried once, bounded short,
            # not through a coordinator outage: the error is not held back for up to
            # coordinator_outage_s (what is not committed is delivered again, never lost).
            self._close(ride_out=False)
        except OrdqError as close_exc:
            # The application's error is the one to see; the commit's is a consequence.
            log.warning("queue %s/%s: closing after %s: %s", self.config.queue, self.config.subscription,
                        type(exc).__name__, close_exc)

    def start(self) -> None:
        """Reach the coordinator, create the subscription if needed (``start``), wait for the
        subscription's lease (a standby waits here, up to ``leader_timeout_s``), read the
        cursor. On any error nothing is left running (lease, channels)."""
        try:
            self._start()
        except BaseException:
            self._shutdown()
            raise

    def _start(self) -> None:
        cfg = self.config
        self._coord, creds = coord, creds = open_coordinator(cfg.bootstrap, cfg.zk_hosts, cfg.root, cfg.credentials)
        if self._transport is None:
            from ordq.wire.client import GrpcTransport

            self._transport = GrpcTransport(credentials=creds)
        self._view = view = QueueView(coord, cfg.queue, cfg.subscription, every_s=cfg.fetch_wait_ms / 1000.0)
        self._ensure_subscription()
        self._lease = lease = CoordinatorLease(coord, "consumer", cfg.queue, cfg.subscription, cfg.consumer_id,
                                               ttl_s=cfg.lease_ttl_s, proof=cfg.member_lease,
                                               on_state=view.heard, state_wanted=lambda: view.idling)
        if not lease.acquire(cfg.leader_timeout_s, stopped=lambda: self._closed):
            raise WaitTimeout(f"{cfg.queue}/{cfg.subscription}: no consumer lease in {cfg.leader_timeout_s}s")
        got = self._describe_cursor()
        assert got.cursor is not None
        cursor = got.cursor
        handout = self._handout
        handout.finished_base = cursor
        self._audit_start(cursor)
        # The subscription's delay, before any message is handed out (sdk/delay.py).
        handout.gate.delay_us = read_delay_ms(coord, lease, timeout_s=cfg.connect_timeout_s) * 1000
        self._checks = checks = LeaseChecks(lease, cfg)
        self._commits = commits = Committer(cfg, coord, view, self._policy, self._stats,
                                            held=lambda: lease.held, finished=handout.finished_pos,
                                            audit=self._audit, version=got.cursor_version, cursor=cursor)
        self._reader = reader = SegmentReader(cfg, view, self._transport, coord, self._stats, start=cursor,
                                              moved=handout.moved, segment_done=commits.segment_done,
                                              lease_confirmed=checks.confirmed)
        self._policies = FailurePolicies(cfg, coord, lease, handout=handout, checks=checks, committer=commits,
                                         reader=reader, poll=self.poll, read_more=self._read_more,
                                         rejoin=self._rejoin, wait_for_time=self._wait_for_time)
        self._delays = DelayReporter(coord, lease, handout.gate, name=f"ordq-delay-{cfg.subscription}")
        self._policy.committed(time.monotonic())
        if cfg.metrics_listen is not None or cfg.metrics_registry is not None:
            self._metrics = ConsumerMetrics(cfg, self._metrics_snapshot)
            self.metrics_url = self._metrics.server.url if self._metrics.server is not None else None

    def _audit_start(self, cursor: Cursor) -> None:
        """The audit row of where this instance begins: after ``cursor`` (docs/AUDIT_FORMAT.md,
        "starts"), before it hands out anything."""
        if self._starts is not None:
            cfg = self.config
            self._starts.write_rows([(cfg.queue, cfg.subscription, self._handout.audit_consumer, cursor.last_seq,
                                      cursor.seg, cursor.offset, time.time_ns() // 1000)])

    def _describe_cursor(self) -> Described:
        """The queue as the coordinator has it now, with the subscription's cursor (the view
        learns the state and replicas); retried up to ``connect_timeout_s``."""
        cfg = self.config
        got = self._require(self._coord).describe(cfg.queue, subscription=cfg.subscription, with_live=True,
                                                  timeout_s=cfg.connect_timeout_s)
        self._require(self._view).learn(got)
        return got

    def _ensure_subscription(self) -> None:
        cfg = self.config
        coord = self._require(self._coord)
        try:
            self._describe_cursor()
            return
        except SubscriptionNotFound:
            pass
        # The coordinator creates it (clients may not), resolving the start target as
        # `ordq sub create --start` does.
        try:
            coord.subscribe(cfg.queue, cfg.subscription, cfg.start.split(), timeout_s=cfg.connect_timeout_s)
        except AlreadyExists:
            pass  # another consumer of the subscription created it first

    def _rejoin(self, reason: str) -> None:
        """The coordinator granted the subscription's lease to another consumer after ours
        lapsed (``reason``): drop what was read and not handed out, wait as a standby until the
        lease is ours again, and read on from the committed cursor (redelivering what was
        handed out after it). Final refusals (PermissionDenied, QueueNotFound,
        SubscriptionNotFound) propagate."""
        cfg, lease = self.config, self._require(self._lease)
        handout, reader = self._handout, self._require(self._reader)
        was = reader.filter.last_seq
        handout.buffer.clear()  # nothing read is handed out from here on
        # The periodic commit in flight lands or fails before the cursor is read (written by
        # the old generation, the coordinator refuses it if the lease went to another).
        self._require(self._commits).drain()
        if not lease.acquire(None, stopped=lambda: self._closed):
            raise ClosedError("consumer is closed")
        while True:
            try:
                got = self._describe_cursor()
                # the delay may have changed meanwhile: known again before any hand-out
                handout.gate.delay_us = read_delay_ms(self._require(self._coord), lease,
                                                      timeout_s=cfg.connect_timeout_s) * 1000
                break
            except CoordinationUnavailable as exc:  # granted, but the cursor unread: again
                self._require(self._checks).coordinator_unavailable(exc)
        assert got.cursor is not None
        cursor = got.cursor
        self._stats.rejoins += 1
        handout.rejoined(cursor, self._stats.rejoins)
        self._audit_start(cursor)
        reader.rejoined(cursor)
        self._require(self._commits).rejoined(got.cursor_version, cursor)
        self._require(self._checks).rejoined()
        log.warning("queue %s/%s: lease lost (%s); rejoined as %s at generation %d, reading on from the "
                    "committed cursor (seg %d offset %d, seq %d; read up to seq %d before: delivered again)",
                    cfg.queue, cfg.subscription, reason, cfg.consumer_id, lease.held.generation, cursor.seg,
                    cursor.offset, cursor.last_seq, was)

    def close(self) -> None:
        """Commit what the application finished (not the message or ``poll`` batch in hand:
        call ``commit()`` first to include it), release the subscription's lease (a standby
        takes over at once) and disconnect. When the lease was lost meanwhile nothing is
        committed (logged: what finished since the last commit is delivered again)."""
        self._close()

    def _close(self, *, ride_out: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            commits, finished = self._commits, self._handout.finished_pos()
            # Nothing finished since the cursor was last written or read: nothing to write (a
            # consumer closed while no coordinator answered waited coordinator_outage_s for it).
            if commits is not None and self._lease is not None and finished != commits.committed:
                try:
                    if self._lease.lost_reason is not None:
                        raise LeaseLost("consumer", self.config.queue, self.config.subscription,
                                        self._lease.lost_reason)
                    if ride_out:
                        commits.riding_out(finished)
                    else:
                        commits.commit(finished, timeout_s=COMMIT_TIMEOUT_S)
                except LeaseLost as exc:
                    log.warning("queue %s/%s: closed without its last commit (%s): what finished since the "
                                "last commit is delivered again", self.config.queue, self.config.subscription,
                                exc.reason)
        finally:
            for audit in (self._audit, self._starts):
                if audit is not None:
                    audit.close()
            if self._policies is not None:
                self._policies.close_audit()
            self._shutdown()

    def _shutdown(self) -> None:
        if self._delays is not None:
            self._delays.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._policies is not None:
            self._policies.close()
        if self._commits is not None:
            self._commits.close()
        if self._lease is not None:
            self._lease.stop(timeout_s=min(self.config.lease_ttl_s, 2.0))
        if self._coord is not None:
            self._coord.close()
        if self._reader is not None:
            self._reader.close()
        if self._transport is not None:
            self._transport.close()

    def statistics(self) -> ConsumerStats:
        p, r = self._policies, self._reader
        f = p.failing if p is not None else None
        cur = r.cursor if r is not None else Cursor(seg=0)
        return attrs.evolve(
            self._stats, seg=cur.seg, offset=cur.offset, last_seq=r.filter.last_seq if r is not None else -1,
            duplicates_dropped=r.filter.duplicates_dropped if r is not None else 0, parked=f.parked if f else 0,
            replayed=f.replayed if f else 0, alarms=f.alarms if f else 0,
            redeliveries=f.redeliveries if f else 0, lease_lapses=self._lease.stats.lapses if self._lease else 0,
            time_waits=self._handout.gate.waits, read_link_fallbacks=r.link_fallbacks if r is not None else 0,
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
        held = self._handout.gate.held
        return ConsumerSnapshot(stats=st, lag_messages=lag, read_ts_us=reader.read_ts_us, handed_seq=handed,
                                alarmed=self.alarmed, blocked_attempts=blocked.attempts if blocked is not None else 0,
                                stalled_since=reader.stalled_since, waiting_due_us=held[1] if held else 0,
                                delay_ms=self._handout.gate.delay_us // 1000)

    @property
    def blocked(self) -> BlockedMessage | None:
        """``run``/``run_keyed``: the (lowest) message being retried after its handler failed."""
        return self._policies.blocked() if self._policies is not None else None

    @property
    def waiting_on_time(self) -> tuple[int, float] | None:
        """(seq, due time in Unix seconds) of the message at the head of the line while it is
        held for its time (delayed delivery: docs/SDK.md), else None. Later messages wait
        behind it: the consumer is waiting on time, not stuck."""
        held = self._handout.gate.held
        return None if held is None else (held[0], held[1] / 1e6)

    @property
    def delay_s(self) -> float:
        """The subscription's delay this consumer applies now (``ordq sub create|alter
        --delay``; a change reaches it within a few seconds): no message is handed out before
        its timestamp plus this."""
        return self._handout.gate.delay_us / 1e6

    @property
    def rejoining(self) -> bool:
        """True while the subscription's lease is someone else's and this consumer waits, as a
        standby, to be granted it again (``statistics().rejoins`` counts the rejoins done)."""
        return self._lease is not None and self._lease.lost_reason is not None

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
            try:
                while not handout.buffer:
                    self._read_more(None)
                    handout.finish_handed()
                if not handout.due_count(1):  # the head of the line waits for its time
                    self._wait_for_time(None)
                    continue
                now = time.monotonic()
                checks = self._require(self._checks)
                if (now < checks.next_check and not self._policy.due_count()) or self._hand_out_ok(now):
                    break
            except LeaseGone as gone:
                self._rejoin(gone.reason)
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
        try:
            if not handout.buffer:
                self._read_more(timeout_s)
                handout.finish_handed()
                if not handout.buffer:
                    return []
            due = handout.due_count(max_messages)
            if not due:  # the head of the line waits for its time: up to timeout_s for it
                self._wait_for_time(timeout_s)
                due = handout.due_count(max_messages)
                if not due:
                    return []
            if not self._hand_out_ok(time.monotonic()):
                return []  # not sure of the lease right now: hand out nothing
        except LeaseGone as gone:
            self._rejoin(gone.reason)  # the batch in hand is delivered again from the cursor
            return []
        out = handout.take(due)
        stamp("C.poll", _seqs, out)
        return out

    def _hand_out_ok(self, now: float) -> bool:
        """Before handing out: a periodic commit of what is finished started, if one is due
        (written on the commit thread), then the lease (``LeaseChecks.before_hand_out``)."""
        return self._require(self._checks).before_hand_out(now, self._require(self._commits).start_if_due)

    def _wait_for_time(self, timeout_s: float | None) -> None:
        """The head of the buffer is held for its time (delayed delivery): keep the lease sure
        and commit what finished if it is time (LeaseGone when the lease is lost meanwhile),
        then sleep until it is due, at most ``timeout_s`` (None: ``fetch_wait_ms``)."""
        if self._closed:
            raise ClosedError("consumer is closed")
        now = time.monotonic()
        if now >= self._require(self._checks).next_check or self._policy.due_count():
            self._hand_out_ok(now)  # as before a hand-out: only when a look is due (cheap per message)
        left = self._handout.head_due_in_s()
        cap = self.config.fetch_wait_ms / 1000.0 if timeout_s is None else timeout_s
        if left > 0 and cap > 0:
            time.sleep(min(left, cap))

    def _mark_finished(self, m: Delivered) -> None:
        """The application finished ``m`` (a message handed out) and everything before it."""
        self._handout.mark_finished(m)

    def _read_more(self, timeout_s: float | None) -> None:
        """A read round into the (empty) buffer, after starting a periodic commit if one is due."""
        if self._closed:
            raise ClosedError("consumer is closed")
        reader, commits, checks = self._require(self._reader), self._require(self._commits), self._require(self._checks)
        view = self._require(self._view)
        try:
            commits.start_if_due(time.monotonic())
            self._handout.buffer.extend(reader.read_round(timeout_s))
        except LeaseLost:
            # A segment's commit refused for the lease: nothing was written; the lease's renewal tells
            # soon whether it lapsed (revived: go on) or was granted to another (LeaseGone: rejoin).
            checks.confirmed()
            return
        except CoordinationUnavailable as exc:
            # Reads go on from the replicas we know while no coordinator answers; what needs
            # one (commits, moving on, sealing) is tried again next round, up to
            # coordinator_outage_s. (Handing out waits for the lease: _hand_out_ok.)
            checks.coordinator_unavailable(exc)
            view.mark_changed()  # read the state again once a coordinator answers
            time.sleep(0.05)
            return
        if view.connected():
            checks.coordinator_answered()

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
        makes sure the lease still holds; when it was lost the consumer rejoins and the message
        is tried again from the committed cursor."""
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
        When the lease is lost the workers stop (no drain), the consumer rejoins and keyed
        delivery goes on from the committed cursor. Consumer errors (``GapDetected``, ...) stop the
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
        ConflictError: someone else moved it (an admin reset); LeaseLost (a NotLeader): the
        lease is not ours now, nothing was written (the consumer rejoins at the next read and
        delivers again from the committed cursor)."""
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
