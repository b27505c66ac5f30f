"""Ordered producer: one elected leader per queue writes to the send head, fails over
without reordering, and is fenced when a successor takes over.

Guarantee: ``send()`` futures resolve in seq order, each only when its batch is synced on
master and slave. After a broker failure every unacked batch is resent, in order, with the
same seqs, to the new head segment, so the stored history holds every acked seq and consumers
see each seq once, in order. A ``FencedError`` means another leader took over: stop.

Threads: callers of ``send`` (add to the core under a lock), one sender (cuts batches, ships
them, watches the ack deadline, runs failover) and one ack reader per stream. Batching and the
window are ``sdk._producer_core``; the takeover and failover steps against ZooKeeper and the
brokers are ``sdk._head``.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from broker_group.log import Message, decode_batch
from coordinator.paths import Paths, check_name, check_zk_hosts
from coordinator.store import ZkStore, new_client
from ordq.errors import (
    BrokerUnavailable,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    FencedError,
    IllegalTransition,
    MessageTooLarge,
    OrdqError,
    WaitTimeout,
)
from ordq.security import Credentials, lookup
from sdk._futures import BatchOutcome, SendFuture
from sdk._head import HeadProtocol
from sdk._producer_core import BatchingConfig, PendingBatch, ProducerCore, message_bytes
from sdk.audit import AuditWriter, new_writer_id
from sdk.metrics import ProducerMetrics
from sdk.transport import Ack, BrokerTransport, ProduceStream

log = logging.getLogger("ordq.producer")
_new_message = tuple.__new__  # Message(...) without its Python-level __new__ (fields positional)


@attrs.frozen(kw_only=True)
class ProducerConfig:
    """Producer options; every field is keyword-only and validated."""

    zk_hosts: str
    queue: str
    root: str = "/ordq"
    batching: BatchingConfig = BatchingConfig()
    send_timeout_s: float = 2.0  # an unacked batch older than this means the head is gone
    leader_timeout_s: float | None = None  # None: a standby waits until it leads
    no_group_timeout_s: float = 30.0  # how long to wait for a writable group after a failure
    zk_session_timeout_s: float = 2.0
    # ZooKeeper digest credential "user:password" when the root is protected (docs/SECURITY.md)
    audit_dir: Path | None = None
    producer_id: str = attrs.field(factory=new_writer_id)
    # Prometheus series (sdk/metrics.py), opt-in: served at HOST:PORT (port 0: any; the URL is
    # ``Producer.metrics_url``) and/or kept in the application's registry.
    metrics_listen: str | None = None
    metrics_registry: CollectorRegistry | None = None
    # TLS files and token for the brokers (ordq/security.py); None: as registered for zk_hosts
    # in the credentials file (``ordq up`` registers the clusters it starts).
    credentials: Credentials | None = None

    def __attrs_post_init__(self) -> None:
        check_zk_hosts(self.zk_hosts)
        check_name("queue", self.queue)
        Paths(self.root)  # InvalidName for a bad root
        if self.zk_session_timeout_s <= 0:
            raise ConfigError("zk_session_timeout_s must be > 0")
        if self.send_timeout_s <= 0 or self.no_group_timeout_s <= 0:
            raise ConfigError("send_timeout_s and no_group_timeout_s must be > 0")


@attrs.frozen
class StoredMessage:
    """The last message stored for the queue (what ``last_committed()`` returns). ``seq`` is
    always exact; ``message`` is None when it could not be read back, and ``message_error``
    then says why (its segment was already dropped, or no replica of its group answers)."""

    seq: int
    seg: int | None  # None when its segment was already dropped (only the seq is known)
    offset: int | None
    message: Message | None
    message_error: str | None = None


@attrs.define
class ProducerStats:
    sent: int = 0
    acked: int = 0
    batches_acked: int = 0
    failovers: int = 0
    epoch: int = 0
    seg: int | None = None
    head: str | None = None


class Producer:
    """Use as a context manager, or ``start()`` / ``close()``."""

    def __init__(self, config: ProducerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._core: ProducerCore | None = None
        self._stats = ProducerStats()
        self._failure: BaseException | None = None
        self._closed = False
        self._fatal: BaseException | None = None
        self._resolving = 0  # acks taken off the window whose futures and audit rows are not done yet
        self._stream: ProduceStream | None = None
        self._seg: int | None = None
        self._gid: str | None = None
        self._last: tuple[int, int, int] | None = None  # (seq, seg, offset) of the stored tail
        self._audit = AuditWriter(config.audit_dir, "acks", writer_id=config.producer_id) if config.audit_dir else None
        self._open_outcome = BatchOutcome()
        self._send_us: dict[int, int] = {}  # first seq of batch -> send time (audit only)
        self._client: KazooClient | None = None
        self._store: ZkStore | None = None
        self._head: HeadProtocol | None = None
        self._lease: Any = None
        self._sender: threading.Thread | None = None
        self._max_message = config.batching.max_batch_bytes - 64  # until start() reads the queue's
        self._max_message_of = "this producer's max_batch_bytes"
        # Rolling the segment we write once it reaches the queue's size or age (the coordinator
        # does it too; whoever is first wins the conditional write, the other one is refused).
        self._segment_limits: tuple[int, float] | None = None  # (bytes, seconds), read at start
        self._seg_bytes = 0  # acked on the current segment by this producer
        self._seg_started: float | None = None  # monotonic time of its first ack
        self._rolling = False
        self._sealer: Any = None  # the Seal protocol runner, made on the first roll
        self._metrics: ProducerMetrics | None = None
        self.metrics_url: str | None = None  # where config.metrics_listen serves, once started

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Connect, wait to be elected leader (standbys block here), take over the tail.
        On any error nothing is left running (ZooKeeper session, election node, channels)."""
        try:
            self._start()
        except BaseException:
            self._shutdown_zk()
            raise

    def _start(self) -> None:
        cfg = self.config
        creds = cfg.credentials or lookup(cfg.zk_hosts, cfg.root)
        if self._transport is None:
            from broker_group.client import GrpcTransport

            self._transport = GrpcTransport(credentials=creds)
        self._client = new_client(cfg.zk_hosts, session_timeout_s=cfg.zk_session_timeout_s, auth=creds.zk_auth)
        try:
            self._client.start(timeout=10)
        except Exception as exc:
            raise CoordinationUnavailable(f"cannot reach ZooKeeper at {cfg.zk_hosts}") from exc
        paths = Paths(cfg.root)
        self._store = ZkStore(self._client, paths)
        queue_cfg = self._store.queue_config(cfg.queue)  # QueueNotFound early
        queue_limit = queue_cfg.max_message_bytes
        self._segment_limits = (queue_cfg.segment_bytes, queue_cfg.segment_age_s)
        batch_limit = cfg.batching.max_batch_bytes - 64
        if queue_limit <= batch_limit:
            self._max_message, self._max_message_of = queue_limit, f"queue {cfg.queue!r} max_message_bytes"
        else:
            self._max_message, self._max_message_of = batch_limit, "this producer's max_batch_bytes"
        self._head = HeadProtocol(self._store, self._transport, cfg.queue, no_group_timeout_s=cfg.no_group_timeout_s)
        self._lease = self._client.Lock(paths.producer_leader(cfg.queue), cfg.producer_id)
        if not self._lease.acquire(blocking=True, timeout=cfg.leader_timeout_s):
            raise WaitTimeout(f"queue {cfg.queue!r}: not elected producer leader in {cfg.leader_timeout_s}s")
        self._take_over()
        if cfg.metrics_listen is not None or cfg.metrics_registry is not None:
            self._metrics = ProducerMetrics(self)
            self.metrics_url = self._metrics.server.url if self._metrics.server is not None else None
        self._sender = threading.Thread(target=self._send_loop, name="ordq-producer-send", daemon=True)
        self._sender.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush what was sent, wait for its acks (bounded), stop, release leadership."""
        if self._closed:
            return
        try:
            if self._fatal is None and self._sender is not None:
                self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            if self._sender is not None:
                self._sender.join(timeout=5)
            self._fail_pending(ClosedError("producer closed before the message was acked"))
            if self._stream is not None:
                self._stream.close()
            if self._audit is not None:
                self._audit.close()
            self._shutdown_zk()

    def _shutdown_zk(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._lease is not None:
            try:
                self._lease.release()
            except Exception:  # noqa: BLE001 - the session may be gone; the node goes with it
                pass
        if self._client is not None:
            self._client.stop()
            self._client.close()
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
    ) -> SendFuture:
        """Queue one message; returns a future resolved with its (seq, seg, offset) once both
        replicas synced it (``sdk._futures.SendFuture``: result/exception/done/
        add_done_callback). Blocks while ``max_inflight_bytes`` are unacked (backpressure).

        Raises MessageTooLarge, FencedError (another leader took over), ClosedError.
        """
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
            if core.starts_batch(size):
                self._open_outcome = BatchOutcome()  # one per batch: they are acked together
            # add() gives the message seq next_seq + open_count, whether or not it cuts first.
            fut = SendFuture(core.next_seq + core.open_count, self._open_outcome)
            cut_before = core.next_seq
            now = time.monotonic()
            core.add(msg, fut, now, size)
            self._stats.sent += 1
            due = core.next_deadline()
            if due is not None and due <= now:
                # An idle pipe: send it from this thread, sparing a hand-off to the sender.
                self._hand_out(now)
            elif core.open_count == 1 or core.next_seq != cut_before:
                # Wake the sender only when it has something new to act on: a batch was cut,
                # or a new open batch started (its linger deadline). Waking it per message
                # costs a thread switch per message for nothing.
                self._lock.notify_all()
        return fut

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait until it is acked."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            assert self._core is not None
            self._core.flush()
            self._lock.notify_all()
            while self._core.unacked or self._core.open_count or self._resolving:
                self._raise_if_stopped()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"flush(): {len(self._core.unacked)} batches still unacked")
                self._lock.wait(min(left, 0.1) if left is not None else 0.1)
            if self._fatal is not None:  # it stopped and failed what was pending: not acked
                raise self._fatal

    def _raise_if_stopped(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise ClosedError("producer is closed")

    def statistics(self) -> ProducerStats:
        with self._lock:
            return attrs.evolve(self._stats)

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

    # -- takeover and failover (the protocol steps live in sdk/_head.py) ----------------------

    def _take_over(self) -> None:
        """Bump the epoch, fence the open segment, find where seq continues; then serve."""
        t = self._require_head().take_over()
        self._install(t.epoch, t.gid, t.seg, t.last)

    def _install(self, epoch: int, gid: str, seg: int, last: tuple[int, int, int] | None) -> None:
        next_seq = last[0] + 1 if last is not None else 0
        with self._lock:
            self._core = ProducerCore(self.config.batching, epoch=epoch, next_seq=next_seq)
            self._last = last
            self._stats.epoch = epoch
        self._connect(gid, seg)
        log.info("queue %s: producer %s leads at epoch %d, seg %d, next seq %d",
                 self.config.queue, self.config.producer_id, epoch, seg, next_seq)

    def _recover(self, exc: BaseException) -> None:
        """The stream to the head failed (not fenced): fail over, resend the unacked suffix.
        A rolled segment (sealed on a healthy head) ends the stream the same way."""
        first_gid, first_seg = self._gid, self._seg
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        assert self._gid is not None and self._seg is not None and self._core is not None
        gid, seg = self._gid, self._seg
        deadline = time.monotonic() + self.config.no_group_timeout_s
        while True:
            head = self._require_head()
            st = head.fail_over_from(gid, seg, self._core.epoch)
            head.check_epoch(st, self._core.epoch)
            open_seg = st.open_segment
            assert open_seg is not None
            try:
                self._connect(open_seg.gid, open_seg.seg)
                break
            except BrokerUnavailable:
                gid, seg = open_seg.gid, open_seg.seg  # the new head is down too: next one
            except CoordinationUnavailable:
                # ZooKeeper away while we look up the new head's master: try again (the
                # fail_over above is then a no-op that follows the head), bounded.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if self._gid == first_gid:
            log.info("queue %s: segment %s of %s ended (%s); continuing on segment %s", self.config.queue,
                     first_seg, first_gid, exc, self._seg)
        else:
            log.warning("queue %s: head %s seg %s failed (%s); failed over to %s seg %s", self.config.queue,
                        first_gid, first_seg, exc, self._gid, self._seg)
        with self._lock:
            self._core.rewind()
            self._stats.failovers += 1
            self._failure = None
            self._lock.notify_all()

    def _connect(self, gid: str, seg: int) -> None:
        store, transport = self._require_store(), self._require_transport()
        master = store.live_members(gid).get("master")
        if master is None:
            raise BrokerUnavailable(f"group {gid}", "master not live")
        assert self._core is not None
        stream = transport.open_produce(master.address, self.config.queue, seg, self._core.epoch)
        self._stream, self._gid, self._seg = stream, gid, seg
        self._seg_bytes, self._seg_started, self._rolling = 0, None, False
        self._stats.seg, self._stats.head = seg, gid
        threading.Thread(target=self._ack_loop, args=(stream,), name="ordq-producer-acks", daemon=True).start()

    # -- threads -----------------------------------------------------------------------------

    def _hand_out(self, now: float) -> None:
        """Caller holds the lock: put every batch that is due on the stream, in seq order.
        Every send goes through here, under the lock, so batches reach the stream in order
        whichever thread sends them (the stream's ``send`` only queues)."""
        assert self._core is not None
        if self._failure is not None or self._stream is None or self._closed:
            return
        ready = self._core.take_ready(now)
        if not ready:
            return
        if self._audit is not None:
            now_us = time.time_ns() // 1000
            for b in ready:
                self._send_us.setdefault(b.first_seq, now_us)
        try:
            self._stream.send([b.encoded for b in ready])
        except OrdqError as exc:
            self._failure = exc
            self._lock.notify_all()

    def _send_loop(self) -> None:
        """Cuts lingering batches when due, watches the ack deadline, and fails over."""
        timeout = self.config.send_timeout_s
        while True:
            with self._lock:
                core = self._core
                assert core is not None
                while not self._closed and self._failure is None:
                    now = time.monotonic()
                    oldest = core.oldest_sent_at()
                    if oldest is not None and now - oldest > timeout:
                        self._failure = BrokerUnavailable(
                            f"group {self._gid}", f"no ack within send_timeout_s={timeout:g}"
                        )
                        break
                    self._hand_out(now)
                    if self._failure is not None:
                        break
                    waits = [d - now for d in (core.next_deadline(),) if d is not None]
                    oldest = core.oldest_sent_at()
                    if oldest is not None:
                        waits.append(oldest + timeout - now)
                    self._lock.wait(max(min(waits), 0.0005) if waits else 0.1)
                if self._closed:
                    return
                failure = self._failure
            assert failure is not None  # the loop ends only on close or failure
            if isinstance(failure, (FencedError, MessageTooLarge, ConfigError)):
                # Fenced: another leader took over. Refused as too large or malformed: every
                # group would refuse it alike, so failing over would only walk the send list.
                self._stop_fatal(failure)
                return
            try:
                self._recover(failure)
            except OrdqError as exc:
                self._stop_fatal(exc)
                return

    def _ack_loop(self, stream: ProduceStream) -> None:
        try:
            for ack in stream.acks():
                self._on_ack(stream, ack)
        except OrdqError as exc:
            with self._lock:
                if self._stream is stream and self._failure is None:
                    self._failure = exc
                    self._lock.notify_all()
        except Exception as exc:  # noqa: BLE001 - a broken stream is a failover, not a crash
            with self._lock:
                if self._stream is stream and self._failure is None:
                    self._failure = BrokerUnavailable(f"group {self._gid}", repr(exc))
                    self._lock.notify_all()

    def _on_ack(self, stream: ProduceStream, ack: Ack) -> None:
        with self._lock:
            assert self._core is not None
            if self._stream is not stream:
                # A late ack from a stream we failed over from: its batch is being resent to
                # the new segment (consumers drop the duplicate); the window follows the new one.
                return
            try:
                done = self._core.on_ack(ack.first_seq, ack.last_seq)
            except ValueError as exc:
                if self._failure is None:
                    self._failure = BrokerUnavailable(f"group {self._gid}", str(exc))
                self._lock.notify_all()
                return
            self._last = (ack.last_seq, ack.seg, ack.first_offset + ack.count - 1)
            self._count_for_roll(done)
            self._stats.acked += ack.count
            self._stats.batches_acked += len(done)
            self._resolving += 1  # flush()/close() wait for it: its audit rows are not written yet
            self._lock.notify_all()
        metrics = self._metrics  # close() may drop it meanwhile
        if metrics is not None:
            metrics.acked(done)
        try:
            self._resolve(done, ack)
        finally:
            with self._lock:
                self._resolving -= 1
                self._lock.notify_all()

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
        """Seal-and-continue (``coordinator.state.roll``), then seal the old segment: its master
        refuses further writes, our stream ends, and ``_recover`` continues on the new segment
        with what was in flight, as after a failover (on the same head)."""
        from coordinator.seal import make_sealer
        from coordinator.store import roll_transition

        store = self._require_store()
        try:
            store.apply(self.config.queue, roll_transition(store.queue_config(self.config.queue), gid, seg))
        except IllegalTransition:
            return  # rolled or failed over by someone else first
        except OrdqError as exc:
            log.warning("queue %s: rolling segment %d failed: %s (the coordinator rolls it)", self.config.queue,
                        seg, exc)
            return
        log.info("queue %s: rolled segment %d of %s (size or age limit)", self.config.queue, seg, gid)
        if self._sealer is None:
            self._sealer = make_sealer(store)
        sealer = self._sealer
        if sealer is not None:
            try:
                sealer(self.config.queue, seg)
            except OrdqError as exc:  # consumers or the coordinator seal it later
                log.info("queue %s: sealing rolled segment %d deferred: %s", self.config.queue, seg, exc)

    def _resolve(self, done: list[PendingBatch], ack: Ack) -> None:
        offset = ack.first_offset
        rows: list[tuple[object, ...]] | None = [] if self._audit is not None else None
        ack_us = time.time_ns() // 1000
        for b in done:
            if rows is not None:
                send_us = self._send_us.pop(b.first_seq, ack_us)
                rows.extend((self.config.queue, self.config.producer_id, b.epoch, b.first_seq + i, ack.seg,
                             offset + i, (m.key or b"").hex(), zlib.crc32(m.payload), send_us, ack_us)
                            for i, m in enumerate(b.messages))
            offset += b.count
        if rows and self._audit is not None:
            self._audit.write_rows(rows)  # before the futures resolve: an ack seen is an ack recorded
        offset = ack.first_offset
        for b in done:
            first = b.tokens[0]
            assert isinstance(first, SendFuture)
            first._outcome.acked(seg=ack.seg, first_offset=offset, first_seq=b.first_seq)
            offset += b.count

    def _stop_fatal(self, exc: BaseException) -> None:
        with self._lock:
            self._fatal = exc
            self._lock.notify_all()
        self._fail_pending(exc)

    def _fail_pending(self, exc: BaseException) -> None:
        with self._lock:
            tokens = self._core.drop_all() if self._core is not None else []
        outcomes = {id(fut._outcome): fut._outcome for fut in tokens if isinstance(fut, SendFuture)}
        for outcome in outcomes.values():
            outcome.failed(exc)

    # -- helpers -----------------------------------------------------------------------------

    def _require_store(self) -> ZkStore:
        if self._store is None:
            raise ClosedError("producer not started")
        return self._store

    def _require_head(self) -> HeadProtocol:
        if self._head is None or self._store is None:
            raise ClosedError("producer not started")
        return self._head

    def _require_transport(self) -> BrokerTransport:
        if self._transport is None:
            raise ClosedError("producer not started")
        return self._transport

    def _read_message(self, seg: int, offset: int) -> Message:
        store, transport = self._require_store(), self._require_transport()
        st, _ = store.load_state(self.config.queue)
        segment = st.segment(seg)
        if segment is None:
            raise OrdqError(f"segment {seg} holding the last message was already popped")
        for info in store.live_members(segment.gid).values():
            try:
                res = transport.fetch(info.address, self.config.queue, seg, offset, max_bytes=1, max_wait_ms=0)
            except OrdqError:
                continue
            for raw in res.batches:
                header, messages = decode_batch(raw)
                if header.first_offset <= offset < header.end_offset:
                    return messages[offset - header.first_offset]
        raise BrokerUnavailable(f"group {segment.gid}", f"cannot read segment {seg} offset {offset}")
