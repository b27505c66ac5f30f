"""Ordered producer: one leader per queue (a lease from the coordinator) writes to the send
head, fails over without reordering, and is fenced when a successor takes over.

Guarantee: ``send()`` futures resolve in seq order, each only when its batch is synced on
master and slave. After a broker failure every unacked batch is resent, in order, with the
same seqs, to the new head segment, so the stored history holds every acked seq and consumers
see each seq once, in order. A ``FencedError`` means another leader took over: stop.

Threads: callers of ``send`` add to the core under a lock and wake the producer's event loop
(``ordq.common.loop``) only when a batch is cut or due, at most once per batch; the loop writes the
produce stream, reads its acks and settles them, and keeps the linger and ack-deadline timers
(``ordq.sdk._producer_io``). Failover's blocking calls run on a worker thread. Batching and the
window are ``ordq.sdk._producer_core``. The loop is a thread of the producer's own, or the
caller's running loop (``host_io_here``: the asyncio API, no hand-off between threads).

The cluster: the producer holds no ZooKeeper session (issue 37). It speaks to the coordinator
service (``ordq.coordinator.client``) only: the producer lease of its queue (Acquire, renewed by
heartbeats, ``ordq.sdk._lease_client``; standbys wait in Acquire), its epoch (Claim with the
lease, which also fences and recovers the tail), fail over and roll (with the epoch and its key),
and what it reads (Describe: the queue's settings, a head's master address, the tail's replicas).
The epoch key the Claim returns goes with every Produce; a refusal (PermissionDenied,
EpochNotIssued) is final.

The lease guards the Claim only; what keeps one writer per queue is the epoch, which the brokers
check on every write (DESIGN §5 Producer). So:
- a lease that *lapses* (a pause, a loaded box, the coordinator away) changes nothing: the
  producer writes on at its epoch, since a successor could write only after a Claim, which
  fences the open segment first. If the coordinator then revives the lease, that is counted
  (``ProducerStats.lease_lapses``) and logged by the lease, nothing more.
- a lease *lost* (the coordinator granted it to another holder after ours expired) is counted
  (``lease_lost``) and logged. The successor's Claim fences this producer: its writes are then
  refused and it stops with ``FencedError`` (final: another leader took over). Until that Claim
  (the successor may be slow, or die before claiming) this producer is still the only writer
  of its epoch, so it writes on: safe, for the Claim recovers the tail it stored, in order. It
  also asks for the lease again (``lease_rejoins``): should the successor die before claiming,
  it holds the lease again and standbys wait behind it as before. Its epoch is checked with a
  Describe at the loss and after each wait and rejoin, so a producer the successor's Claim
  superseded stops with ``FencedError`` at once, even while it sends nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import attrs

from ordq.common.errors import (
    BrokerUnavailable,
    ClosedError,
    FencedError,
    LeaseLost,
    MessageTooLarge,
    OrdqError,
    PermissionDenied,
    WaitTimeout,
)
from ordq.common.loop import HostedLoop, LoopHost, LoopThread
from ordq.common.security import Credentials
from ordq.common.stages import stamp
from ordq.coordinator.client import CoordinatorClient, Refusal
from ordq.sdk._cluster import open_coordinator
from ordq.sdk._futures import BatchOutcome, SendFuture
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk._producer_core import BATCH_FRAMING_BYTES, ProducerCore, message_bytes
from ordq.sdk._producer_io import ProducerIO
from ordq.sdk._producer_types import ProducerConfig, ProducerStats, StoredMessage
from ordq.sdk.audit import AuditWriter
from ordq.sdk.delay import with_deliver_at
from ordq.wire.batch import Message, decode_batch
from ordq.wire.transport import AsyncProduceStream, BrokerTransport

if TYPE_CHECKING:
    from ordq.sdk.metrics import ProducerMetrics, ProducerSnapshot
    from ordq.wire.aio_client import AioTransport

log = logging.getLogger("ordq.producer")
T = TypeVar("T")
_new_message = tuple.__new__  # Message(...) without its Python-level __new__ (fields positional)


class Producer(ProducerIO):
    """Use as a context manager, or ``start()`` / ``close()``."""

    def __init__(self, config: ProducerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport  # control calls (fence, seal, reads); the data path is self._aio
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._core: ProducerCore | None = None
        self._stats = ProducerStats()
        self._failure: BaseException | None = None
        self._closed = False
        self._fatal: BaseException | None = None
        self._resolving = 0  # acks taken off the window whose futures and audit rows are not done yet
        self._loop: LoopHost | None = None
        self._lease_timer: asyncio.TimerHandle | None = None  # the next _check_lease
        self._loop_host: HostedLoop | None = None  # host_io_here(): the caller's loop, not a thread of our own
        self._aio: AioTransport | None = None
        self._stream: AsyncProduceStream | None = None
        self._wake_pending = False  # a wake-up of the loop is scheduled and has not run yet
        self._seg: int | None = None
        self._gid: str | None = None
        self._last: tuple[int, int, int] | None = None  # (seq, seg, offset) of the stored tail
        self._audit = AuditWriter(config.audit_dir, "acks", writer_id=config.producer_id) if config.audit_dir else None
        self._open_outcome = BatchOutcome()
        self._send_us: dict[int, int] = {}  # first seq of batch -> send time (audit only)
        self._coordinator: CoordinatorClient | None = None  # the producer's one line to the cluster
        self._epoch_key = ""  # the Claim's secret: sent with every Produce
        self._links: dict[str, tuple[str, str]] = {}  # master address -> its and its slave's lean links
        self._lease: CoordinatorLease | None = None
        self._standby_logged = False
        self._rejoining = False  # a lost lease is being asked for again (``_rejoin``)
        self._max_message = config.batching.max_batch_bytes - BATCH_FRAMING_BYTES  # until start() reads the queue's
        self._max_message_of = "this producer's max_batch_bytes"
        # Rolling the segment we write once it reaches the queue's size or age (the coordinator
        # does it too; whoever is first wins the conditional write, the other one is refused).
        self._segment_limits: tuple[int, float] | None = None  # (bytes, seconds), read at start
        self._seg_bytes = 0  # acked on the current segment by this producer
        self._seg_started: float | None = None  # monotonic time of its first ack
        self._rolling = False
        # Sent on the current segment; past the size nothing more is sent there until it rolled
        # (``_past_size``: its roll failed, writes go on past the size on it).
        self._seg_sent = 0
        self._past_size = False
        self._metrics: ProducerMetrics | None = None
        self.metrics_url: str | None = None  # where config.metrics_listen serves, once started
        self._init_io()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def host_io_here(self) -> None:
        """Before ``start``, on a running event loop's thread: run this producer's I/O (its
        stream, acks and timers) on that loop instead of a thread of its own, so a send awaited
        there costs no hand-off between threads (``ordq.sdk.aio.AsyncProducer`` does this).
        Then ``start``, ``flush`` and ``close`` wait for that loop: call them from another
        thread (``asyncio.to_thread``), never from the loop itself."""
        if self._core is not None or self._closed:
            raise RuntimeError("host_io_here() comes before start()")
        self._loop_host = HostedLoop("ordq-producer")

    def start(self) -> None:
        """Reach the coordinator, wait for the producer lease (standbys block here), claim the
        epoch and take over the tail. On any error nothing is left running (lease, channels).

        Raises QueueNotFound, WaitTimeout (no lease within ``leader_timeout_s``),
        CoordinationUnavailable (no coordinator within ``connect_timeout_s``), PermissionDenied."""
        try:
            self._start()
        except BaseException:
            self._shutdown()
            raise

    def _start(self) -> None:
        cfg = self.config
        self._coordinator, creds = coord, creds = open_coordinator(cfg.bootstrap, cfg.zk_hosts, cfg.root,
                                                                   cfg.credentials)
        if self._transport is None:
            from ordq.wire.client import GrpcTransport

            self._transport = GrpcTransport(credentials=creds)
        # The first call goes at once to a coordinator it knows (a follower names the leader):
        # asking who leads first was a round trip more before every producer's first message.
        queue_cfg = coord.describe(cfg.queue, with_config=True, timeout_s=cfg.connect_timeout_s,
                                   reach_s=cfg.connect_timeout_s).config  # QueueNotFound
        queue_limit = queue_cfg.max_message_bytes
        self._segment_limits = (queue_cfg.segment_bytes, queue_cfg.segment_age_s)
        batch_limit = cfg.batching.max_batch_bytes - BATCH_FRAMING_BYTES
        if queue_limit <= batch_limit:
            self._max_message, self._max_message_of = queue_limit, f"queue {cfg.queue!r} max_message_bytes"
        else:
            self._max_message, self._max_message_of = batch_limit, "this producer's max_batch_bytes"
        self._lease = lease = CoordinatorLease(coord, "producer", cfg.queue, "", cfg.producer_id,
                                               ttl_s=cfg.lease_ttl_s, on_refused=self._on_standby)
        deadline = None if cfg.leader_timeout_s is None else time.monotonic() + cfg.leader_timeout_s
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)  # 0: ask once
            if not lease.acquire(left, stopped=lambda: self._closed):
                if self._closed:
                    raise ClosedError("producer closed while it waited for the producer lease")
                raise WaitTimeout(f"queue {cfg.queue!r}: the producer lease was not granted in "
                                  f"{cfg.leader_timeout_s}s (another producer leads)")
            # The coordinator checks the lease, bumps the epoch (bound to a key only we learn),
            # fences the open segment and finds where seq continues.
            try:
                t = coord.claim(cfg.queue, lease.held, wait_s=cfg.no_group_timeout_s)
                break
            except LeaseLost as exc:  # paused between the grant and the claim, and superseded
                with self._lock:
                    self._stats.lease_lost += 1
                log.warning("queue %s: producer %s lost its lease before it claimed (%s); waiting again",
                            cfg.queue, cfg.producer_id, exc.reason)
        self._epoch_key = t.key
        next_seq = t.last[0] + 1 if t.last is not None else 0
        with self._lock:
            self._core = ProducerCore(cfg.batching, epoch=t.epoch, next_seq=next_seq)
            self._last = t.last
            self._stats.epoch = t.epoch
        address = self._master_address(t.gid)
        self._loop = self._loop_host or LoopThread("ordq-producer")
        self._loop.start()
        self._loop.run(self._start_io(creds, t.gid, t.seg, address))
        log.info("queue %s: producer %s leads at epoch %d, seg %d, next seq %d",
                 cfg.queue, cfg.producer_id, t.epoch, t.seg, next_seq)
        self._loop.call_soon(self._check_lease)
        if cfg.metrics_listen is not None or cfg.metrics_registry is not None:
            from ordq.sdk.metrics import ProducerMetrics  # prometheus_client: only when asked for

            self._metrics = ProducerMetrics(cfg, self._metrics_snapshot)
            self.metrics_url = self._metrics.server.url if self._metrics.server is not None else None

    def _on_standby(self, refusal: Refusal) -> None:
        """The lease is held by another producer: say once that this one waits as its standby."""
        if not self._standby_logged:
            self._standby_logged = True
            log.warning("queue %s: producer %s waits as a standby: the producer lease is held by %s",
                        self.config.queue, self.config.producer_id, refusal.holder or "another producer")

    # -- the lease after the claim (module docstring: what a lapse and a loss mean) ----------------

    def _check_lease(self) -> None:
        """On the loop, every quarter of the lease's ttl: a lease lost (its renewal thread was
        refused) starts the rejoin on a thread of its own (the loop's worker stays free for
        failovers; the coordinator may keep it waiting a long time)."""
        lease, loop = self._lease, self._loop
        if lease is None or loop is None or self._closed or self._fatal is not None:
            return
        if lease.lost_reason is not None and not self._rejoining:
            self._rejoining = True
            threading.Thread(target=self._rejoin, args=(lease,), name="ordq-producer-rejoin", daemon=True).start()
        self._lease_timer = loop.loop.call_later(max(self.config.lease_ttl_s / 4, 0.05), self._check_lease)

    def _rejoin(self, lease: CoordinatorLease) -> None:
        """Thread: the lease was lost. Stop with FencedError if a successor claimed; else ask
        for the lease again, checking the epoch after every wait (module docstring)."""
        assert self._core is not None
        epoch, cfg = self._core.epoch, self.config
        log.warning("queue %s: producer %s lost its lease (%s); it writes on at epoch %d until a successor's "
                    "claim fences it, and asks for the lease again", cfg.queue, cfg.producer_id,
                    lease.lost_reason, epoch)
        try:
            while not self._closed and self._fatal is None:
                if self._superseded(epoch):
                    return
                if lease.acquire(cfg.lease_ttl_s, stopped=lambda: self._closed):
                    if not self._superseded(epoch):
                        log.warning("queue %s: producer %s holds its lease again, still at epoch %d", cfg.queue,
                                    cfg.producer_id, epoch)
                    self._rejoining = False  # (a later loss rejoins again)
                    return
        except PermissionDenied as exc:  # a final refusal (a revoked token): the brokers refuse it too
            self._stop_from_lease(exc)
        except OrdqError as exc:  # e.g. the queue deleted: its writes are refused as well (no more tries)
            log.warning("queue %s: producer %s cannot ask for its lease again: %s", cfg.queue, cfg.producer_id, exc)

    def _superseded(self, epoch: int) -> bool:
        """Has a successor claimed a later epoch? Then stop with FencedError now (idle or not)."""
        try:
            current = self._require_coordinator().describe(self.config.queue).state.producer_epoch
        except OrdqError as exc:  # unsure now: the brokers still fence us if it is so
            log.debug("queue %s: epoch not read: %s", self.config.queue, exc)
            return False
        if current <= epoch:
            return False
        self._stop_from_lease(FencedError(self.config.queue, epoch, current))
        return True

    def _stop_from_lease(self, exc: FencedError | PermissionDenied) -> None:
        """Any thread: stop as a broker's refusal of the stream would (final, no failover)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon(self._fail_current, exc)

    def _fail_current(self, exc: BaseException) -> None:
        """On the loop: fail the current stream with ``exc`` (fatal: the producer stops). With no
        stream (a failover under way) the coordinator's FailOver meets the same fence."""
        with self._mutex:
            stream = self._stream
            if stream is not None:
                self._fail_locked(stream, exc)

    async def _close_io(self) -> None:
        if self._lease_timer is not None:  # (on a hosted loop it would outlive us: the loop goes on)
            self._lease_timer.cancel()
        await super()._close_io()

    async def _start_io(self, creds: Credentials, gid: str, seg: int, address: str) -> None:
        from ordq.wire.aio_client import AioTransport

        self._aio = AioTransport(credentials=creds)
        self._open_stream(gid, seg, address)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush what was sent, wait for its acks (bounded), stop, release leadership."""
        if self._closed:
            return
        try:
            if self._fatal is None and self._loop is not None:
                self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            self._shutdown()

    def _shutdown(self) -> None:
        """Stop the loop (stream, channels), fail what is pending, then give the lease back
        (a standby may start at once: nothing of ours is written any more)."""
        self._closed = True
        if self._loop is not None:
            try:
                self._loop.run(self._close_io(), 5.0)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.debug("queue %s: closing the produce stream: %r", self.config.queue, exc)
            self._loop.stop()
        self._fail_pending(ClosedError("producer closed before the message was acked"))
        if self._audit is not None:
            self._audit.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._lease is not None:
            self._lease.stop(release=True, timeout_s=self.config.lease_ttl_s)
        if self._coordinator is not None:
            self._coordinator.close()
        if self._transport is not None:
            self._transport.close()

    # -- sending -----------------------------------------------------------------------------

    def send(
        self,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timeout_s: float | None = None,
        deliver_at: float | datetime.datetime | None = None,
    ) -> SendFuture:
        """Queue one message; returns a future resolved with its (seq, seg, offset) once both
        replicas synced it (``ordq.sdk._futures.SendFuture``: result/exception/done/
        add_done_callback). Blocks while ``max_inflight_bytes`` are unacked (backpressure).

        ``deliver_at`` (Unix seconds, or an aware datetime): no consumer hands the message out
        before then, and the messages after it wait behind it (order holds; docs/SDK.md,
        "Delayed delivery"). It travels in the message as the header ``ordq-deliver-at``.

        Raises MessageTooLarge, FencedError (another leader took over), ClosedError;
        ConfigError for a bad ``deliver_at``.
        """
        if deliver_at is not None:
            headers = with_deliver_at(headers, deliver_at)
        # The per-message path: ~1 µs here is ~5 % of the producer's CPU at 50k msgs/s, hence
        # the size computed once, the tuple built directly and the bare mutex below.
        size = message_bytes(payload, key, headers)
        if size > self._max_message:
            raise MessageTooLarge(size, self._max_message, self._max_message_of)
        msg = _new_message(Message, (payload, key, tuple(headers) if headers else (), time.time_ns() // 1000))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._mutex:  # the lock of self._lock, entered without Condition's Python wrapper
            while True:
                self._raise_if_stopped()
                assert self._core is not None
                if not self._core.window_full():
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout("send(): in-flight window stayed full")
                self._lock.wait(left if left is not None else 0.1)
            core = self._core
            # add() gives the message seq next_seq + open_count, whether or not it cuts first.
            seq = core.next_seq + core.open_count
            stamp("send")
            if core.starts_batch(size):
                self._open_outcome = BatchOutcome()  # one per batch: they are acked together
                stamp("P.open", (seq,))
            fut = SendFuture(seq, self._open_outcome)
            cut_before = core.next_seq
            now = time.monotonic()
            core.add(msg, fut, now, size)
            self._stats.sent += 1
            if not self._wake_pending and core.open_count == 1:
                # Wake the loop only when it has something to act on: a batch was cut (a full
                # one), this message opened a batch that is due at once (an idle pipe), or one
                # that lingers while no linger timer is armed. A timer armed for an earlier
                # batch fires before this one's deadline, and the loop then arms its own: while
                # acks come within the linger, no wake-up per batch; never one per message.
                # Without the last case a batch opened after the loop's last pump waited for
                # the ack of the one in flight however late it came (issue 39: P.open -> P.take).
                due = core.next_deadline()
                if core.next_seq != cut_before or (due is not None and (due <= now or self._linger_timer is None)):
                    self._wake_locked()
        return fut

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait until it is acked."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            assert self._core is not None
            self._core.flush()
            self._wake_locked()
            while self._core.unacked or self._core.open_count or self._resolving:
                self._raise_if_stopped()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"flush(): {len(self._core.unacked)} batches still unacked; "
                                      + self._state_locked())
                self._lock.wait(min(left, 0.1) if left is not None else 0.1)
            if self._fatal is not None:  # it stopped and failed what was pending: not acked
                raise self._fatal

    def _state_locked(self) -> str:
        """Where a send waits, for an error that says it (a flush that times out names the head,
        the stream, a failover or roll in progress and the oldest send's age)."""
        core = self._core
        assert core is not None
        oldest = core.oldest_sent_at()
        age = f"{time.monotonic() - oldest:.1f} s" if oldest is not None else "none sent"
        return (f"head {self._gid} seg {self._seg}, stream {'open' if self._stream is not None else 'none'}, "
                f"{core.inflight_batches} in flight (oldest {age}), {core.open_count} open, "
                f"{self._resolving} resolving, failing over: {self._failure is not None}, rolling: {self._rolling}, "
                f"wake pending: {self._wake_pending}")

    def _raise_if_stopped(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise ClosedError("producer is closed")

    def statistics(self) -> ProducerStats:
        with self._lock:
            stats = attrs.evolve(self._stats)
        aio = self._aio
        if aio is not None:
            stats.link_fallbacks = aio.link_fallbacks
        lease = self._lease
        if lease is not None:  # its renewal thread counts; a loss at the claim is counted here
            stats.lease_lapses += lease.stats.lapses
            stats.lease_lost += lease.stats.lost
            stats.lease_rejoins += lease.stats.rejoins
        return stats

    def _metrics_snapshot(self) -> ProducerSnapshot:
        """What the metrics collector shows (read on its scrape thread)."""
        from ordq.sdk.metrics import ProducerSnapshot

        core = self._core
        return ProducerSnapshot(stats=self.statistics(), inflight_bytes=core.inflight_bytes if core is not None else 0)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped this producer (``FencedError``: another leader took over), or
        None while it runs; what its next ``send``/``flush`` would raise."""
        return self._fatal

    def last_committed(self) -> StoredMessage | None:
        """The last message stored for the queue when this producer took over, or the last
        one it got acked since — what an application resumes its source from. None: the
        queue has never stored a message.

        Never raises for a message that cannot be read back: its ``seq`` (and position) are
        known from the takeover, so the result carries them with ``message=None`` and
        ``message_error``; call again to retry the read (e.g. once the group is back)."""
        with self._lock:
            last = self._last
        if last is None:
            return None
        seq, seg, offset = last
        if seg < 0:
            return StoredMessage(seq=seq, seg=None, offset=None, message=None,
                                 message_error="its segment was already dropped")
        try:
            message = self._read_message(seg, offset)
        except ClosedError:
            raise
        except OrdqError as exc:
            return StoredMessage(seq=seq, seg=seg, offset=offset, message=None, message_error=str(exc))
        return StoredMessage(seq=seq, seg=seg, offset=offset, message=message)

    # -- helpers -----------------------------------------------------------------------------

    def _require_coordinator(self) -> CoordinatorClient:
        if self._coordinator is None:
            raise ClosedError("producer not started")
        return self._coordinator

    def _require_transport(self) -> BrokerTransport:
        if self._transport is None:
            raise ClosedError("producer not started")
        return self._transport

    def _read_message(self, seg: int, offset: int) -> Message:
        coord, transport = self._require_coordinator(), self._require_transport()
        described = coord.describe(self.config.queue, with_live=True)  # the state and its groups' replicas
        segment = described.state.segment(seg)
        if segment is None:
            raise OrdqError(f"segment {seg} holding the last message was already popped")
        for info in (described.live or {}).get(segment.gid, {}).values():
            try:
                res = transport.fetch(info.address, self.config.queue, seg, offset, max_bytes=1, max_wait_ms=0)
            except OrdqError:
                continue
            for raw in res.batches:
                header, messages = decode_batch(raw)
                if header.first_offset <= offset < header.end_offset:
                    return messages[offset - header.first_offset]
        raise BrokerUnavailable(f"group {segment.gid}", f"cannot read segment {seg} offset {offset}")
