"""The producer's data path on its event loop (``ordq.common.loop``): the produce stream's writes
and ack reads, the linger and ack-deadline timers, settling acked batches, and failover.

Rules:
- Everything here runs on the producer's loop thread, under the producer's lock where it
  touches the core, except ``_fail_over`` and ``_roll`` (blocking calls to the coordinator
  service, on a worker thread: they are rare).
- A refusal (PermissionDenied, EpochNotIssued: this process may not write with this epoch)
  is final, like Fenced: pending and later sends fail with it at once; no failover. A head
  that cannot check tokens now (TokensUnavailable: its token store is unreadable) is no
  refusal: the same segment is opened again, bounded by ``no_group_timeout_s``.
- An ack is settled where it is read: the window moves, the audit rows are written and the
  futures resolve on the loop thread, with no hop between the response and the outcome.
- Order: batches reach the stream only through ``_pump``, under the lock, in seq order; after
  a failure nothing is sent until the unacked suffix is rewound onto the new stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any

import attrs

from ordq.common.errors import (
    BrokerUnavailable,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    EpochNotIssued,
    FencedError,
    MessageTooLarge,
    NoGroupAvailable,
    OrdqError,
    PermissionDenied,
    TokensUnavailable,
)
from ordq.common.stages import stamp
from ordq.sdk._futures import SendFuture
from ordq.sdk._producer_core import PendingBatch
from ordq.sdk._producer_lookup import LiveLookup
from ordq.sdk._producer_types import FailoverTimes
from ordq.wire.transport import Ack, AsyncProduceStream

if TYPE_CHECKING:
    from ordq.common.loop import LoopHost
    from ordq.coordinator.client import CoordinatorClient
    from ordq.coordinator.store_values import LiveInfo
    from ordq.sdk._producer_core import ProducerCore
    from ordq.sdk._producer_types import ProducerConfig, ProducerStats
    from ordq.sdk.audit import AuditWriter
    from ordq.sdk.metrics import ProducerMetrics
    from ordq.wire.aio_client import AioTransport

log = logging.getLogger("ordq.producer")

# Refused by every group alike (fenced: another leader took over; too large or malformed; not
# ours to write: no permission, or an epoch key that is not the one issued): failing over
# would only walk the send list.
_FATAL = (FencedError, MessageTooLarge, ConfigError, PermissionDenied, EpochNotIssued)
# The ack deadline fired this late (or 10 % of the send timeout, if more): the producer's own
# loop was starved, not (yet) the head. At most this many extra send timeouts are granted.
_LATE_S = 0.05
# A head that cannot check tokens now (TokensUnavailable) is asked again after this pause.
_TOKENS_AGAIN_S = 0.2
_STARVED_EXTRA = 4.0
# A FailOver the coordinator could not serve (its ZooKeeper silent) is asked again after this
# pause, doubling up to the second figure, until ``no_group_timeout_s`` from the failure.
_COORDINATION_AGAIN_S = (0.1, 1.0)
# While a new head's master is not live, the coordinator is asked for it again this often.
_MASTER_POLL_S = 0.05


def _first_seqs(batches: list[PendingBatch]) -> list[int]:
    """Stage stamps' keys (ordq/common/stages.py)."""
    return [b.first_seq for b in batches]


def _settled_first_seqs(settled: list[tuple[list[PendingBatch], Ack]]) -> list[int]:
    return [b.first_seq for done, _ack in settled for b in done]


@attrs.define
class FailoverPacing:
    """How long the ack deadline gives a head, from this producer's recent failovers (issue 26).

    A producer that failed over within the last ``window_timeouts`` send timeouts gives the
    next head ``send_timeout_s`` × 2^k (k such failovers, at most ``max_factor`` ×): a machine
    so loaded that a new head cannot sync the resent backlog within one send timeout must not
    make the producer walk the whole send list, sealing a segment on every group. The first
    failover of a quiet period keeps the plain send timeout (a single fault is as fast as
    before); a broken stream or a refusal is a definite answer and never waits for this.

    Pure: times come in as arguments; the loop owns it (no lock of its own)."""

    send_timeout_s: float
    window_timeouts: float = 10.0
    max_factor: int = 8
    _at: collections.deque[float] = attrs.field(factory=collections.deque)

    def failed_over(self, now: float) -> None:
        self._at.append(now)

    def recent(self, now: float) -> int:
        """Failovers within the window before ``now``."""
        window = self.send_timeout_s * self.window_timeouts
        while self._at and now - self._at[0] > window:
            self._at.popleft()
        return len(self._at)

    def ack_timeout(self, now: float) -> float:
        return self.send_timeout_s * min(2 ** self.recent(now), self.max_factor)


class ProducerIO:
    """The loop side of ``ordq.sdk.producer.Producer`` (which owns the fields declared here)."""

    config: ProducerConfig
    _mutex: threading.RLock
    _lock: threading.Condition
    _core: ProducerCore | None
    _stats: ProducerStats
    _failure: BaseException | None
    _fatal: BaseException | None
    _closed: bool
    _resolving: int
    _last: tuple[int, int, int] | None
    _audit: AuditWriter | None
    _send_us: dict[int, int]
    _metrics: ProducerMetrics | None
    _loop: LoopHost | None
    _aio: AioTransport | None
    _stream: AsyncProduceStream | None
    _gid: str | None
    _seg: int | None
    _wake_pending: bool
    _segment_limits: tuple[int, float] | None
    _seg_bytes: int
    _seg_started: float | None
    _rolling: bool
    _seg_sent: int
    _past_size: bool
    _epoch_key: str
    _links: dict[str, tuple[str, str]]  # a master's address -> its and its slave's lean links ("" for none)

    def _init_io(self) -> None:
        self._linger_timer: asyncio.TimerHandle | None = None
        # when the linger timer is due: kept here, as uvloop's timer due at once is a plain Handle (no ``when()``)
        self._linger_due = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pacing = FailoverPacing(self.config.send_timeout_s)
        # since when the head has answered "cannot check tokens now" in a row (None: it has not)
        self._tokens_since: float | None = None
        # (gid, seg) whose missed ack deadline was forgiven once: the head was still live
        self._graced: tuple[str | None, int | None] | None = None
        # The failover under way, step by step, until its first ack (then ``last_failover``)
        self._fo: FailoverTimes | None = None
        # When the current stream last acked (monotonic; 0.0: not yet): the ack deadline's progress
        self._acked_at = 0.0

    def _require_coordinator(self) -> CoordinatorClient:
        raise NotImplementedError

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- waking the loop (any thread, lock held) ----------------------------------------------

    def _wake_locked(self) -> None:
        """Caller holds the lock: have the loop pump soon; at most one wake-up in flight."""
        if not self._wake_pending and self._loop is not None:
            self._wake_pending = True
            self._loop.call_soon(self._on_wake)

    def _on_wake(self) -> None:
        with self._mutex:
            self._wake_pending = False
            self._pump(time.monotonic())

    # -- sending (loop thread, lock held) -----------------------------------------------------

    def _pump(self, now: float) -> None:
        """Put every batch that is due on the stream, in seq order, and arm the timers: the
        open batch's linger deadline and the oldest unacked batch's ack deadline."""
        core = self._core
        assert core is not None and self._loop is not None
        if self._failure is not None or self._stream is None or self._closed:
            return
        ready = core.take_ready(now, self._segment_room())
        loop = self._loop.loop
        if ready:
            self._seg_sent += sum(len(b.encoded) for b in ready)
            if self._audit is not None:
                now_us = time.time_ns() // 1000
                for b in ready:
                    self._send_us.setdefault(b.first_seq, now_us)
            stamp("P.take", _first_seqs, ready)
            self._stream.send([b.encoded for b in ready])
            if self._deadline_timer is None:
                due_at = now + self._pacing.ack_timeout(now)
                self._deadline_timer = loop.call_at(due_at, self._on_deadline, due_at)
        due = core.next_deadline()
        if due is not None:
            timer = self._linger_timer
            if timer is None or self._linger_due > due:
                if timer is not None:
                    timer.cancel()
                self._linger_timer = loop.call_at(due, self._on_linger)
                self._linger_due = due

    def _on_linger(self) -> None:
        self._linger_timer = None
        with self._mutex:
            self._pump(time.monotonic())

    def _since_progress(self, oldest: float) -> float:
        """Caller holds the lock: since when the head owes an ack: the oldest unacked batch's
        hand-out, or the last ack of this stream if later. A head whose acks keep coming is
        live however deep the window: behind ``max_inflight_bytes`` of pipelined batches the
        oldest one waits window / rate seconds (32 MiB at 16 MB/s: 2 s), which measured the
        queue, not the head (issue 39: 10 of 12 bench_e2e runs failed a healthy head over at
        the start of the pipelined phase, "no ack within 2s", while acks came in every ~0.3 s)."""
        return max(oldest, self._acked_at)

    def _on_deadline(self, due_at: float) -> None:
        """The ack deadline: the head owes an ack (``_since_progress``) and sent none for
        ``send_timeout_s``: it is gone (fail over); else look again when that time is up.

        Unless this producer itself was late: a timer that fires well after ``due_at`` means
        the loop was not scheduled (a busy machine, a pause), and for that long nobody read the
        stream, so a missing ack proves nothing about the head yet. Then the acks read first
        and the deadline looks again, up to ``_STARVED_EXTRA`` timeouts later (issue 26)."""
        self._deadline_timer = None
        assert self._core is not None and self._loop is not None
        with self._mutex:
            oldest = self._core.oldest_sent_at()
            if oldest is None or self._failure is not None:
                return
            now = time.monotonic()
            timeout = self._pacing.ack_timeout(now)  # longer right after failovers (FailoverPacing)
            since = self._since_progress(oldest)
            if now - since < timeout:
                self._deadline_timer = self._loop.loop.call_at(since + timeout, self._on_deadline, since + timeout)
                return
            late = now - due_at
            if late > max(_LATE_S, timeout * 0.1) and now - since < timeout * (1 + _STARVED_EXTRA):
                log.info("producer %s: its own loop ran %.2fs late; reading acks before judging group %s",
                         self.config.queue, late, self._gid)
                again = now + min(late, timeout)
                self._deadline_timer = self._loop.loop.call_at(again, self._on_deadline, again)
                return
            stream = self._stream
            recent = self._pacing.recent(now)
            judge = recent > 0 and self._graced != (self._gid, self._seg)
        if stream is None:
            return
        failure = BrokerUnavailable(f"group {self._gid}", f"no ack within {timeout:g}s (send_timeout_s="
                                    f"{self.config.send_timeout_s:g}, {recent} failovers just before; the oldest "
                                    f"unacked batch sent {now - oldest:.1f}s ago)")
        if judge:  # a failover again, so soon: is this head really failed?
            self._spawn(self._judge_head(stream, failure, timeout))
        else:
            self._fail(stream, failure)

    async def _judge_head(self, stream: AsyncProduceStream, failure: BrokerUnavailable, timeout: float) -> None:
        """After failovers just before, a missed ack deadline alone does not fail the head:
        while its master and slave are both live (as the coordinator reads their ZooKeeper
        sessions: a hung or dead process loses its session), it gets one more ``timeout``, once
        per segment; then it fails over."""
        assert self._loop is not None
        gid, seg = self._gid, self._seg
        try:
            live = await self._loop.run_blocking(self._group_live, gid)
        except OrdqError:
            live = False
        with self._mutex:
            if self._stream is not stream or self._failure is not None or self._closed:
                return
            if live:
                self._graced = (gid, seg)
                log.warning("queue %s: no ack from group %s within %gs, but it is live and this producer just "
                            "failed over: one more %gs before failing it over", self.config.queue, gid, timeout,
                            timeout)
                again = time.monotonic() + timeout
                if self._deadline_timer is not None:  # armed by a send meanwhile
                    self._deadline_timer.cancel()
                self._deadline_timer = self._loop.loop.call_at(again, self._on_deadline, again)
                return
        self._fail(stream, failure)

    def _group_live(self, gid: str | None) -> bool:
        """Worker thread: are the master and slave of ``gid`` both live (the coordinator's Describe)?"""
        return gid is not None and len(self._live_members(gid)) == 2

    def _live_members(self, gid: str, timeout_s: float | None = None) -> dict[str, LiveInfo]:
        """Worker thread: ``gid``'s live processes by role, as the coordinator reads them now
        (Describe with the live processes of the queue's groups: one call; the producer holds no
        ZooKeeper session). {} when ``gid`` is no group of the queue any more."""
        return dict(self._live_of_queue(timeout_s).get(gid, {}))

    def _live_of_queue(self, timeout_s: float | None = None) -> dict[str, dict[str, LiveInfo]]:
        """The live processes of every group of the queue, by gid and role (one Describe)."""
        described = self._require_coordinator().describe(self.config.queue, with_live=True, timeout_s=timeout_s)
        return dict(described.live or {})

    def _cancel_timers(self) -> None:
        for timer in (self._linger_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._linger_timer = self._deadline_timer = None

    # -- the stream ----------------------------------------------------------------------------

    def _open_stream(self, gid: str, seg: int, address: str) -> None:
        """On the loop: open the produce stream to ``gid``'s master for ``seg``; its acks are
        read by a task of its own."""
        assert self._aio is not None and self._core is not None
        new_channel = not self._aio.has_channel(address)
        link, watch = self._links.get(address, ("", ""))
        stream = self._aio.open_produce(address, self.config.queue, seg, self._core.epoch, self._epoch_key,
                                        link, watch)
        if self._fo is not None:
            self._fo = attrs.evolve(self._fo, new_channel=new_channel, opened_at=time.monotonic())
        with self._mutex:
            self._stream, self._gid, self._seg = stream, gid, seg
            self._acked_at = 0.0  # a new head owes its first ack from the first hand-out
            self._seg_bytes, self._seg_started, self._rolling = 0, None, False
            self._seg_sent, self._past_size = 0, False
            self._stats.seg, self._stats.head = seg, gid
        self._spawn(self._read_acks(stream))

    async def _read_acks(self, stream: AsyncProduceStream) -> None:
        try:
            while True:
                acks = await stream.read_acks()
                if not self._on_acks(stream, acks):
                    return
        except OrdqError as exc:
            self._fail(stream, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream is a failover, not a crash
            self._fail(stream, BrokerUnavailable(f"group {self._gid}", repr(exc)))

    def _on_acks(self, stream: AsyncProduceStream, acks: list[Ack]) -> bool:
        """Settle the acks of one response: move the window, send what that made due, write
        the audit rows and resolve the futures. False once this stream is no longer ours."""
        settled: list[tuple[list[PendingBatch], Ack]] = []
        with self._mutex:
            core = self._core
            assert core is not None
            if self._stream is not stream:
                # A late ack from a stream we failed over from: its batch is being resent to
                # the new segment (consumers drop the duplicate); the window follows the new one.
                return False
            if acks:
                self._acked_at = time.monotonic()  # the head is live: the ack deadline counts from here
            for ack in acks:
                try:
                    done = core.on_ack(ack.first_seq, ack.last_seq)
                except ValueError as exc:
                    self._fail_locked(stream, BrokerUnavailable(f"group {self._gid}", str(exc)))
                    break
                self._last = (ack.last_seq, ack.seg, ack.first_offset + ack.count - 1)
                if self._fo is not None:  # the first ack after a failover: its steps are known now
                    self._stats.last_failover = attrs.evolve(self._fo, sent_at=stream.first_write_at,
                                                             acked_at=time.monotonic())
                    self._fo = None
                self._tokens_since = None
                self._count_for_roll(done)
                self._stats.acked += ack.count
                self._stats.batches_acked += len(done)
                settled.append((done, ack))
            stamp("P.acked", _settled_first_seqs, settled)
            self._pump(time.monotonic())  # an ack frees the pipe: the open batch may be due now
            self._resolving += 1  # flush()/close() wait for it: its audit rows are not written yet
        try:
            metrics = self._metrics  # close() may drop it meanwhile
            for done, ack in settled:
                if metrics is not None:
                    metrics.acked(done)
                self._resolve(done, ack)
                stamp("P.resolved", _first_seqs, done)
        finally:
            with self._mutex:
                self._resolving -= 1
                self._lock.notify_all()
        return self._failure is None

    def _resolve(self, done: list[PendingBatch], ack: Ack) -> None:
        offset = ack.first_offset
        if self._audit is not None:
            rows: list[tuple[object, ...]] = []
            ack_us = time.time_ns() // 1000
            queue, pid = self.config.queue, self.config.producer_id
            for b in done:
                send_us = self._send_us.pop(b.first_seq, ack_us)
                rows.extend((queue, pid, b.epoch, b.first_seq + i, ack.seg, offset + i, (m.key or b"").hex(),
                             zlib.crc32(m.payload), send_us, ack_us) for i, m in enumerate(b.messages))
                offset += b.count
            self._audit.write_rows(rows)  # before the futures resolve: an ack seen is an ack recorded
            offset = ack.first_offset
        for b in done:
            first = b.tokens[0]
            assert isinstance(first, SendFuture)
            first._outcome.acked(seg=ack.seg, first_offset=offset, first_seq=b.first_seq)
            offset += b.count

    # -- failure and failover -----------------------------------------------------------------

    def _fail(self, stream: AsyncProduceStream, exc: BaseException) -> None:
        with self._mutex:
            self._fail_locked(stream, exc)

    def _fail_locked(self, stream: AsyncProduceStream, exc: BaseException) -> None:
        """On the loop, lock held: the first failure of the current stream starts a failover
        (or stops the producer when it is fatal); later ones and stale streams' are ignored."""
        if self._stream is not stream or self._failure is not None or self._closed:
            return
        self._failure = exc
        self._lock.notify_all()
        self._fo = FailoverTimes(from_gid=self._gid, from_seg=self._seg, failed_at=time.monotonic())
        self._spawn(self._handle_failure(exc))

    async def _handle_failure(self, failure: BaseException) -> None:
        """The failure of the current stream, handled to its end: a new stream resumed, or the
        producer stopped. Nothing may end it otherwise: ``_failure`` stays set until it is
        done, and while it is set nothing is sent and no timer runs, so a step that raised
        left ``flush()`` waiting for ever with the loop idle. An unforeseen error stops the
        producer instead (final, like any other error past the failover's bound)."""
        try:
            await self._handle_failure_steps(failure)
        except asyncio.CancelledError:
            raise  # close(): the loop is being stopped
        except Exception as exc:  # noqa: BLE001 - a bug or a closed client: stop, never hang flush()
            log.exception("queue %s: handling %r failed", self.config.queue, failure)
            self._stop_fatal(exc)

    async def _handle_failure_steps(self, failure: BaseException) -> None:
        assert self._loop is not None and self._core is not None
        self._cancel_timers()
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
        if isinstance(failure, _FATAL):
            self._stop_fatal(failure)
            return
        if isinstance(failure, TokensUnavailable) and await self._same_head_again(failure):
            return
        first_gid, first_seg = self._gid, self._seg
        try:
            gid, seg, address = await self._loop.run_blocking(self._fail_over)
        except OrdqError as exc:
            self._stop_fatal(exc)
            return
        if self._closed:
            return
        self._resume(gid, seg, address)
        if gid == first_gid:
            log.info("queue %s: segment %s of %s ended (%s); continuing on segment %s", self.config.queue,
                     first_seg, first_gid, failure, seg)
        else:
            log.warning("queue %s: head %s seg %s failed (%s); failed over to %s seg %s", self.config.queue,
                        first_gid, first_seg, failure, gid, seg)
        with self._mutex:
            if gid == first_gid:
                self._stats.rolls += 1
            else:
                self._stats.failovers += 1
                self._pacing.failed_over(time.monotonic())

    async def _same_head_again(self, failure: TokensUnavailable) -> bool:
        """The head's master cannot judge tokens now (its token store is unreadable; issue 24):
        not a refusal and not the head's failure. Open the same segment again after a pause,
        for up to ``no_group_timeout_s`` from the first such answer in a row; False past that
        bound (then it fails over like any head in trouble)."""
        assert self._loop is not None
        now = time.monotonic()
        if self._tokens_since is None:
            self._tokens_since = now
            log.warning("queue %s: group %s cannot check tokens now (%s); sending again for up to %gs",
                        self.config.queue, self._gid, failure, self.config.no_group_timeout_s)
        if now - self._tokens_since >= self.config.no_group_timeout_s:
            return False
        with self._mutex:
            self._stats.tokens_unavailable += 1
        gid, seg = self._gid, self._seg
        await asyncio.sleep(_TOKENS_AGAIN_S)
        if self._closed or gid is None or seg is None:
            return self._closed
        address = await self._loop.run_blocking(self._wait_master, gid, self.config.send_timeout_s)
        if address is None or self._closed:
            return self._closed
        self._resume(gid, seg, address)
        return True

    def _resume(self, gid: str, seg: int, address: str) -> None:
        """On the loop, after a failure: a new stream to ``seg`` on ``gid``, and the unacked
        suffix sent again on it, in order, with the same seqs."""
        assert self._core is not None
        self._open_stream(gid, seg, address)
        with self._mutex:
            self._core.rewind()
            self._failure = None
            self._lock.notify_all()
            self._pump(time.monotonic())

    def _fail_over(self) -> tuple[str, int, str]:
        """Worker thread: ask the coordinator to fail the head over from the segment we wrote
        (it follows whoever moved it first, seals the old segment in the background and
        waits for a writable head) until a head whose master is live: (gid, seg, master
        address). A rolled segment (sealed on a healthy head) ends the stream the same way.
        A coordinator that cannot reach ZooKeeper now is asked again: everything here is
        bounded by ``no_group_timeout_s`` from the failure, on this process's monotonic clock."""
        assert self._gid is not None and self._seg is not None and self._core is not None
        gid, seg, epoch = self._gid, self._seg, self._core.epoch
        cfg = self.config
        deadline = time.monotonic() + cfg.no_group_timeout_s
        pause = _COORDINATION_AGAIN_S[0]
        # The masters' addresses, asked now beside the FailOver (whichever group it answers
        # with): the Describe's round trip overlaps the FailOver's instead of following it.
        early: LiveLookup | None = LiveLookup(lambda: self._live_of_queue(cfg.no_group_timeout_s))
        self._failover_step(asked_at=time.monotonic())
        while True:
            left = max(deadline - time.monotonic(), 0.1)
            try:
                st = self._require_coordinator().fail_over(cfg.queue, gid, seg, epoch, self._epoch_key, wait_s=left)
                self._failover_step(answered_at=time.monotonic())
            except CoordinationUnavailable as exc:
                # The coordinator's ZooKeeper did not answer (a lost quorum, a starved box): no
                # refusal, the same as ZooKeeper away anywhere else. Ask again until the bound
                # (issue 26: the producer gave up for good at the first such answer).
                if time.monotonic() + pause > deadline or self._closed:
                    raise
                log.warning("queue %s: failover from %s seg %s not answered (%s); asking again for up to %.0fs",
                            cfg.queue, gid, seg, exc, deadline - time.monotonic())
                time.sleep(pause)
                pause = min(pause * 2, _COORDINATION_AGAIN_S[1])
                continue
            if st.producer_epoch > epoch:
                raise FencedError(cfg.queue, epoch, st.producer_epoch)
            open_seg = st.open_segment
            if open_seg is None:
                raise NoGroupAvailable(cfg.queue, "the coordinator found no writable group")
            try:
                address = early.master(open_seg.gid, max(deadline - time.monotonic(), 0.1)) if early else None
                if early is not None and address is not None:
                    self._links[address] = (early.link(open_seg.gid), early.link(open_seg.gid, "slave"))
                early = None  # once: a later head is looked up when it is known
                if address is None:  # not live when asked (or unanswered): ask again now
                    address = self._master_address(open_seg.gid)
                self._failover_step(head_at=time.monotonic(), gid=open_seg.gid, seg=open_seg.seg)
                return open_seg.gid, open_seg.seg, address
            except BrokerUnavailable:
                if time.monotonic() > deadline:
                    raise
                # The new head's master is not live (its ZooKeeper session, as the coordinator
                # reads it): failed, or its session lapsed
                # for a moment (a starved machine). It gets up to one ack timeout to come back
                # before we fail over from it too: no walk down the whole send list, sealing a
                # segment on every group, in one burst (issue 26).
                now = time.monotonic()
                waited = self._wait_master(open_seg.gid, min(self._pacing.ack_timeout(now), deadline - now))
                if waited is not None:
                    self._failover_step(head_at=time.monotonic(), gid=open_seg.gid, seg=open_seg.seg)
                    return open_seg.gid, open_seg.seg, waited
                gid, seg = open_seg.gid, open_seg.seg  # the new head is down too: next one
            except CoordinationUnavailable:
                # No coordinator answered while we looked up the new head's master: try again
                # (the fail over is then a no-op that follows the head), bounded.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _failover_step(self, **times: Any) -> None:
        """Worker thread (the loop awaits it meanwhile): note a step of the failover under way."""
        with self._mutex:
            if self._fo is not None:
                self._fo = attrs.evolve(self._fo, **times)

    def _wait_master(self, gid: str, timeout_s: float) -> str | None:
        """Worker thread: the address of ``gid``'s master once it is live, within ``timeout_s``
        (asking the coordinator every ``_MASTER_POLL_S``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._master_address(gid, max(deadline - time.monotonic(), 0.5))
            except (BrokerUnavailable, CoordinationUnavailable):
                if time.monotonic() >= deadline or self._closed:
                    return None
                time.sleep(_MASTER_POLL_S)

    def _master_address(self, gid: str, timeout_s: float | None = None) -> str:
        """Worker thread: the address of ``gid``'s live master (one Describe); BrokerUnavailable
        when it is not live, CoordinationUnavailable when no coordinator answered."""
        live = self._live_members(gid, timeout_s)
        master, slave = live.get("master"), live.get("slave")
        if master is None:
            raise BrokerUnavailable(f"group {gid}", "master not live")
        # its lean produce link and its slave's (where the stream watches the synced end), if served
        self._links[master.address] = (master.produce, slave.produce if slave is not None else "")
        return master.address

    def _stop_fatal(self, exc: BaseException) -> None:
        with self._mutex:
            self._fatal = exc
            self._lock.notify_all()
        self._fail_pending(exc)

    def _fail_pending(self, exc: BaseException) -> None:
        with self._mutex:
            tokens = self._core.drop_all() if self._core is not None else []
        outcomes = {id(fut._outcome): fut._outcome for fut in tokens if isinstance(fut, SendFuture)}
        for outcome in outcomes.values():
            outcome.failed(exc)

    async def _close_io(self) -> None:
        """On the loop, at close: stop the timers, the stream and its reader, the channels."""
        self._cancel_timers()
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._aio is not None:
            await self._aio.close()

    # -- rolling the segment --------------------------------------------------------------------

    def _segment_room(self) -> int | None:
        """Caller holds the lock: how many more bytes may be sent on the current segment (the
        batch that crosses the queue's segment size is the last), None: no bound. A segment
        ends near its size however long its roll takes: at 4 MB/s through 256 KiB segments,
        sending on while the roll was decided and sealed made segments of 1-3 MB on a loaded
        box (issue 26, test_disk); sent bytes wait for the roll instead (a short pause, which
        send() feels once ``max_inflight_bytes`` are pending)."""
        if self._segment_limits is None or self._past_size:
            return None
        return self._segment_limits[0] - self._seg_sent

    def _count_for_roll(self, done: list[PendingBatch]) -> None:
        """Caller holds the lock: once the segment holds the queue's segment size, or its first
        ack is the segment age old, roll it (once per segment, in a thread: ZooKeeper and the
        Seal protocol block)."""
        if self._segment_limits is None or self._rolling:
            return
        now = time.monotonic()
        if self._seg_started is None:
            self._seg_started = now
        self._seg_bytes += sum(len(b.encoded) for b in done)
        size, age = self._segment_limits
        if self._seg_bytes >= size or now - self._seg_started >= age:
            self._rolling = True
            gid, seg = self._gid, self._seg
            assert gid is not None and seg is not None
            threading.Thread(target=self._roll, args=(gid, seg), name="ordq-producer-roll", daemon=True).start()

    def _roll(self, gid: str, seg: int) -> None:
        """Ask the coordinator to roll (``ordq.coordinator.state.roll``; it seals the old segment),
        then continue on the new segment with what was in flight or held back, as after a
        failover (on the same head): the master refuses a write after the seal, but a producer
        that holds its sends at the size sends nothing there any more, so the roll's answer
        ends the stream. Rolled by someone else first: the same. Not rolled: writes go on
        past the size on this segment (the coordinator daemon rolls it)."""
        assert self._core is not None and self._loop is not None
        loop = self._loop
        try:
            st = self._require_coordinator().roll(self.config.queue, gid, seg, self._core.epoch, self._epoch_key)
        except ClosedError:
            return
        except Exception as exc:  # noqa: BLE001 - any error: never leave ``_rolling`` set (sends held for ever)
            log.warning("queue %s: rolling segment %d failed: %s (the coordinator rolls it)", self.config.queue,
                        seg, exc)
            loop.call_soon(self._after_roll, gid, seg, False)
            return
        rolled = st.segment(seg)
        done = rolled is not None and rolled.status.value != "open"
        if done:
            log.info("queue %s: rolled segment %d of %s (size or age limit)", self.config.queue, seg, gid)
        loop.call_soon(self._after_roll, gid, seg, done)

    def _after_roll(self, gid: str, seg: int, rolled: bool) -> None:
        """On the loop: the roll of ``seg`` answered. Rolled: end its stream (the next segment
        follows, ``_handle_failure``); not: send on past the size."""
        with self._mutex:
            stream = self._stream
            if stream is None or (self._gid, self._seg) != (gid, seg) or self._failure is not None or self._closed:
                return  # that stream already ended (the seal refused it, a failover, close)
            if rolled:
                self._fail_locked(stream, BrokerUnavailable(f"group {gid}", f"segment {seg} rolled"))
            else:
                self._past_size = True
                self._pump(time.monotonic())
