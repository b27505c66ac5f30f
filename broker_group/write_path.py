"""The write path: produce requests accepted by the master, replicated batches by the slave,
group commit, and acks.

Guarantees (DESIGN §4): a produce batch is acked only when master and slave have both synced
it, and acks return in order. (A stream with ``local_acks`` is acked once this master synced
it: its producer takes the slave's synced end from the slave and settles on both,
synced_watch.py.) The master assigns offsets, writes locally and forwards the same
bytes to the slave at once; one sync thread group-commits every batch that arrived meanwhile,
but for a lone small request (a synchronous send's), which the loop commits itself while the
disk is quick (broker_group/loop_sync.py).
Only the producer epoch ZooKeeper issued may write (broker_group/epochs.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ordq.broker_group.disk_room import out_of_space
from ordq.broker_group.epochs import EpochGate
from ordq.broker_group.first_write import FirstWrite
from ordq.broker_group.loop_sync import LoopSyncRule
from ordq.broker_group.replica import Placement, Refused, Role
from ordq.broker_group.replica_commits import ReplicaCommits
from ordq.broker_group.segments import SegmentStore
from ordq.broker_group.shared import Segment, Shared
from ordq.common import stages
from ordq.common.errors import ClosedError, ConfigError, CorruptLog, DiskFull, MessageTooLarge, OrdqError
from ordq.common.loop import Signal
from ordq.common.stages import stamp
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import SegmentNotWritable, short

log = logging.getLogger("ordq.broker")

SLAVE_CONNECT_WAIT_S = 1.0
# A request that comes while others are being committed (or, on the master, are not yet
# answered by the slave) is appended and synced on a thread: the master's sync thread, the
# slave's replica thread (replica_commits.py), so the loop reads (on the lean links: decrypts)
# the next requests meanwhile, as gRPC's threads do. A lone one (a synchronous send's) is synced
# on the loop, with no thread hand-off between the request and its ack (issue 39): on the
# master, after its batches went to the slave, so the slave's sync runs beside it. Unless it is
# large, or the disk was slow a moment ago (loop_sync.py): the loop then keeps serving.


@attrs.define(eq=False)
class ProduceStreamState:
    """Acks owed on one produce stream, in order."""

    pending: list[tuple[Segment, Placement]] = attrs.field(factory=list)
    error: OrdqError | None = None
    done: bool = False
    # A new segment's first ack was taken: its timing, for the handler to log once written
    first_write: FirstWrite | None = None
    # Fired when acks may be due that no LAC move it waits on will announce: a batch placed in
    # another segment than the one its handler waits on while it owed none, a resent batch
    wake: Signal | None = None
    # The segment whose LAC moves its handler waits on (``WritePath.ack_signals``): that of its
    # first ack owed, or, owing none, of its last (a stream's next batch usually goes there too)
    waits_on: Segment | None = None
    # Its acks say "synced on the master" only (asked by a request's ``local_acks``): the producer
    # settles a batch once the slave's synced end, which it watches on the slave itself, covers it
    # too (ordq/wire/lean_produce.py). The slave's answer then reaches the producer in one hop.
    local_acks: bool = False


class WritePath:
    """Accepts, stores and acks batches; ``replication`` is the master's link to its slave
    (set once it is started; None on a slave)."""

    def __init__(self, shared: Shared, segments: SegmentStore, fsync_seconds: Any) -> None:
        self.shared = shared
        self.segments = segments
        self._fsync_seconds = fsync_seconds  # the metrics' histogram of one group commit
        self.replication: Any = None  # master: ordq.broker_group.replication.ReplicationLink
        self._message_limits: dict[str, int] = {}  # queue -> max_message_bytes, read on first use
        # Only the producer epoch ZooKeeper issued may write or fence (broker_group/epochs.py).
        self.epochs = EpochGate(self._issued_epoch)
        # The sync thread waits on its own condition (same lock): the many ``changed()`` of
        # the data path must not wake it for nothing (a thread switch and the GIL, per batch).
        self._dirty_cv = threading.Condition(shared.lock)
        self._held = 0  # produce requests waiting in _hold_back (a sync's end must wake them)
        self._dirty: list[Segment] = []
        self.streams: set[ProduceStreamState] = set()
        self._inflight_bytes = 0  # master: accepted, not yet synced here (see max_inflight_bytes)
        # Slave: the thread that group-commits replicated requests (all but a lone small one)
        self.replica_commits = ReplicaCommits(self.commit, self._merged)
        self.loop_sync = LoopSyncRule()  # which lone requests the loop commits itself (guarded by cv)

    def stop(self) -> None:
        """Caller holds cv, ``shared.stopping`` set: the sync thread ends."""
        self._dirty_cv.notify_all()

    def _issued_epoch(self, queue: str) -> tuple[int, str | None]:
        """The queue's producer epoch and its key hash as ZooKeeper holds them now (synced)."""
        store = self.shared.require_store()
        store.producer_epoch(queue)  # syncs: a claim another client just made is seen
        st, _ = store.load_state(queue)
        return st.producer_epoch, st.producer_key

    def _write_ready(self, queue: str, seg: int, epoch: int, key: str = "") -> bool:
        """Can a produce request for (queue, seg, epoch, key) be taken on the loop without a
        ZooKeeper read (its segment exists, its epoch, key and message limit are known)?"""
        return (self.epochs.knows(queue, epoch, key) and queue in self._message_limits
                and (queue, seg) in self.shared.segments)

    def _prepare_write(self, queue: str, seg: int, epoch: int, key: str = "",
                       timing: FirstWrite | None = None) -> None:
        """In a worker thread: the ZooKeeper reads a produce request may need first (the
        epoch ZooKeeper issued and its key, the segment's creation, the queue's message limit).
        ``timing``: a new segment's first write, given each step's duration."""
        if (queue, seg) not in self.shared.segments:
            self._prepare_segment(queue, seg, epoch, key, timing)
            return
        self.epochs.check(queue, epoch, key)
        if queue not in self._message_limits:
            self._message_limits[queue] = self.shared.require_store().queue_config(queue).max_message_bytes

    def _prepare_segment(self, queue: str, seg: int, epoch: int, key: str, timing: FirstWrite | None) -> None:
        """A new segment's first write (after a failover or a roll: on a producer's way to its
        next ack). What it needs from ZooKeeper comes in one round trip: the queue's state
        (synced first when the epoch is not known here: it says the issued epoch and key, and
        whether the segment is this group's open one) and its message limit (read again for a
        new segment). Once ZooKeeper placed the segment here, the slave is told to create its
        copy while this master creates its own (``ReplicationLink.announce``)."""
        started = time.monotonic()
        st, queue_config = self.shared.require_store().state_and_config(
            queue, sync=not self.epochs.knows(queue, epoch, key))
        if timing is not None:
            timing.step("zk", time.monotonic() - started)
        self.epochs.check(queue, epoch, key, read=lambda: (st.producer_epoch, st.producer_key))
        self._message_limits[queue] = queue_config.max_message_bytes
        self.segments.for_write(queue, seg, epoch, state=st, timing=timing,
                                placed=lambda: self.shared.loop.call_soon(self._announce, queue, seg))

    def _announce(self, queue: str, seg: int) -> None:
        """On the loop: have the slave create its copy of a new segment now (master only)."""
        if self.replication is not None:
            self.replication.announce(queue, seg)

    async def accept_produce(self, stream: ProduceStreamState, req: pb.ProduceRequest) -> None:
        """Master, on the loop: place each batch, queue it for the slave and the local sync."""
        if self.shared.config.role is not Role.MASTER:
            raise ConfigError(f"this is the slave of group {self.shared.config.gid}: producers write to the master")
        headers = [self._checked_header(raw) for raw in req.batches]
        timing: FirstWrite | None = None  # the first write of a segment new here: timed (first_write.py)
        # The epoch key on every request, not only the first: nothing is stored without it.
        while not self._write_ready(req.queue, req.seg, req.epoch, req.epoch_key):
            if timing is None and (req.queue, req.seg) not in self.shared.segments:
                timing = FirstWrite(req.queue, req.seg, time.monotonic())
            await self.shared.loop.run_blocking(self._prepare_write, req.queue, req.seg, req.epoch, req.epoch_key,
                                                timing)
        s = self.shared.segments[(req.queue, req.seg)]
        if timing is not None:
            timing.ready = time.monotonic()
        self._check_message_sizes(req.queue, req.batches)
        link = self.replication
        # Just after start the slave stream may still be connecting: a short wait spares
        # the producer a needless failover. A broken stream fails producers by itself.
        deadline = time.monotonic() + SLAVE_CONNECT_WAIT_S
        while link is not None and not link.connected and not self.shared.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self.shared.signal.wait(left)
        if link is None or not link.connected:
            raise SegmentNotWritable(self.shared.address, req.queue, req.seg, "the slave is not connected")
        await self.confirm_session(req.queue, req.seg)
        await self._hold_back(link)
        resent = False  # a batch already stored and synced here: its ack may be due at once
        on_loop: list[bytes] = []  # a lone small request's batches: committed here, not by the sync thread
        wake_sync = False  # the sync thread has batches to commit
        with self.shared.cv:
            # owing none, its handler may wait on another segment's LAC than this one's (ack_signals)
            elsewhere = not stream.pending and stream.waits_on is not s
            # Alone: nothing else is unsynced here (no ack of this master's waits behind this
            # commit while it holds the loop), the batches reach the slave before the commit
            # starts (the lean link writes at once; gRPC's sender would wait for it), and no
            # reader in a worker holds the log (the loop would wait for its read). Batches the
            # slave has not answered yet do not count (stop 93): their answer, read after this
            # commit, waits one sync for the loop, and the sync thread's two hand-offs cost
            # the request more, most on a busy box (bench_e2e at 2,000 msgs/s: e2e p99 7.3-8.0
            # against 7.4-10.2 ms; the noisy-neighbour drill's abused p99 12.0-14.2 against 13.7-15.9).
            alone = self._inflight_bytes == 0 and link.forwards_at_once and not s.io_lock.locked()
            for raw, h in zip(req.batches, headers, strict=True):
                if h.epoch != req.epoch:
                    raise ConfigError(f"batch epoch {h.epoch} differs from the stream's epoch {req.epoch}")
                try:
                    p = s.replica.place(req.epoch, h.first_seq, h.count)
                except Refused as exc:
                    raise self._refused(s, exc) from None
                if p.duplicate:
                    self.shared.stats.duplicates += 1
                    resent = True
                else:
                    stamped = batch_format.stamp_offset(raw, p.first_offset)
                    if not s.first_write_ms:  # the segment's age, for rolling by age
                        s.first_write_ms = int(time.time() * 1000)
                    s.pending.append(stamped)
                    self._inflight_bytes += len(stamped)
                    link.forward(s, stamped)
                    self.shared.stats.batches_in += 1
                    self.shared.stats.messages_in += h.count
                    self.shared.stats.bytes_in += len(raw)
                stream.pending.append((s, p))
            if timing is not None and s.first_write is None:
                timing.placed = time.monotonic()
                s.first_write = timing
            if alone and s.pending and self.loop_sync.on_loop(sum(map(len, s.pending)), time.monotonic()):
                on_loop, s.pending = s.pending, []
                s.syncing += 1
                self.shared.stats.loop_commits += 1
            else:
                if s.pending and s not in self._dirty:
                    self._dirty.append(s)
                wake_sync = True
            if (resent or elsewhere) and stream.wake is not None:
                stream.wake.fire()
        try:
            link.flush()  # to the slave now (lean link), or by the sender as soon as this task yields
        finally:
            if on_loop:  # counted in ``syncing``: committed whatever the link did (Fence and Seal wait for it)
                self.commit(s, on_loop, inflight=sum(map(len, on_loop)))
            elif wake_sync:
                # Once the batches went to the slave, not before: woken first, the sync thread
                # took the GIL from the loop in the middle of that write (its TLS step lets the
                # GIL go), and the slave got them late (fast39p, py-spy of the master).
                with self.shared.cv:
                    self._dirty_cv.notify()

    async def confirm_session(self, queue: str, seg: int) -> None:
        """The session guard (DESIGN §6): no write past the session. While ZooKeeper has been
        silent for more than a third of the session, or its quorum unheard for half of it
        (``shared.session_doubt``), the session may have expired and a successor been made:
        wait, on the loop, for kazoo to reconnect or the quorum probe to be answered. kazoo
        resumes the same session only if ZooKeeper still holds it, and the quorum answers a
        probe only while it does, so either proves this master was not replaced: take the
        write. A segment frozen by a lost session, no answer by
        ``Shared.session_wait_until`` (two sessions after the doubt began; connected, or lost and
        registering again, at least one session after the write began waiting) or a stop: refuse
        (SegmentNotWritable; the producer fails over). On a loaded box kazoo suspends a
        connection whose ping answer came a few hundred ms late and resumes the same session
        within a second or so: those writes are late, not refused (issue 26: the README's
        demo failed over a second time on such a refusal)."""
        shared = self.shared
        doubt = shared.session_doubtful(time.monotonic())
        if doubt is None:
            return
        waiting_since = time.monotonic()
        with shared.cv:
            shared.session_waiting += 1
        try:
            while doubt is not None:
                left = shared.session_wait_until(waiting_since) - time.monotonic()
                # A lost session froze the segments held then (``_on_zk_state``): refused at
                # once, as place() would; one made since waits for liveness registered again.
                s = shared.segments.get((queue, seg))
                frozen = shared.zk_session_lost and (s is None or not s.replica.writable)
                if frozen or shared.stopping or left <= 0:
                    raise SegmentNotWritable(shared.address, queue, seg, doubt)
                await shared.signal.wait(left)  # fired on every ZooKeeper state change and probe answer
                doubt = shared.session_doubtful(time.monotonic())
        finally:
            with shared.cv:
                shared.session_waiting -= 1
        with shared.cv:
            shared.stats.session_confirmed += 1

    async def place_replica(self, queue: str, seg: int, batches: list[bytes], lac: int
                            ) -> tuple[Segment, list[bytes]]:
        """Slave, on the loop: take the master's batches at the master's offsets (checked and
        counted in the copy's state and in ``syncing``, not yet written) and learn the master's
        LAC. Returns the segment and the batches taken, which the caller commits
        (``commit_replica``): none when the copy was sealed here first."""
        headers = [self._checked_header(raw) for raw in batches]
        s = self.shared.segments.get((queue, seg))
        if s is None and headers and headers[0].first_offset > 0:
            # No copy here (removed once read by every subscription, or never had) and the
            # batch does not start it: refused before a copy is made. A partition can hold
            # such a batch in a TCP buffer past the seal and the removal (issue 28's lab).
            raise ConfigError(f"replicated batch at offset {headers[0].first_offset} of {short(queue)}/{seg}: "
                              "no copy of that segment here")
        timing: FirstWrite | None = None
        if s is None:
            timing = FirstWrite(queue, seg, time.monotonic())
            s = await self.shared.loop.run_blocking(self.segments.for_replica, queue, seg, timing)
            timing.ready = time.monotonic()
        accepted: list[bytes] = []
        with self.shared.cv:
            if timing is not None and s.first_write is None:
                s.first_write = timing
            # The master's LAC counts only what this copy reported synced: one past what this
            # copy holds (with this request's batches) is not a LAC but a lie, and taking it
            # would let readers of this copy see batches the master never had acked.
            # (A sealed copy no longer reads up to a LAC: nothing to check there.)
            most = s.replica.next_offset + sum(h.count for h in headers)
            if lac > most and not s.replica.sealed:
                raise ConfigError(f"replicated LAC {lac} of {short(queue)}/{seg} is past this copy's end {most}")
            if lac >= 0:
                s.replica.peer_progress(lac)
                self.shared.lac_moved((s,))
            if s.replica.sealed:
                # Sealed here first (the Seal protocol reached us before these in-flight
                # batches): ignore them; the protocol copies any difference from the master.
                return s, accepted
            for raw, h in zip(batches, headers, strict=True):
                try:
                    s.replica.accept_replica(h.epoch, h.first_offset, h.first_seq, h.count)
                except Refused as exc:
                    raise self._refused(s, exc) from None
                accepted.append(raw)
                self.shared.stats.batches_in += 1
                self.shared.stats.messages_in += h.count
                self.shared.stats.bytes_in += len(raw)
            if accepted:
                s.syncing += 1
        return s, accepted

    def commit_replica(self, s: Segment, accepted: list[bytes], *, alone: bool
                       ) -> concurrent.futures.Future[None] | None:
        """Slave, on the loop: commit what ``place_replica`` took. Right here (None) when it is
        ``alone`` (no answer owed before its own), nothing is committing and it is small: a
        synchronous send's request, with no thread hand-off between it and its answer. Else
        on the replica thread, in its next group commit (replica_commits.py; the future of
        that commit), so the loop reads the master's next requests meanwhile."""
        if alone and self.replica_commits.idle():
            with self.shared.cv:
                on_loop = self.loop_sync.on_loop(sum(map(len, accepted)), time.monotonic())
                if on_loop:
                    self.shared.stats.loop_commits += 1
            if on_loop:
                self.commit(s, accepted)
                return None
        return self.replica_commits.add(s, accepted)

    def _merged(self, s: Segment, n: int) -> None:
        """``n`` placed requests of ``s`` are committed as one: one count in ``syncing``."""
        with self.shared.cv:
            s.syncing -= n - 1

    def _check_message_sizes(self, queue: str, batches: Sequence[bytes]) -> None:
        """Master: refuse a batch holding a message over the queue's ``max_message_bytes``
        (the SDK checks before sending; this stops any other client). A batch no longer than
        the limit cannot hold a larger message, so only longer ones are walked."""
        limit = self._message_limits[queue]
        for raw in batches:
            if len(raw) > limit:
                largest = batch_format.largest_message(raw)
                if largest > limit:
                    self.shared.stats.refused_too_large += 1
                    raise MessageTooLarge(largest, limit, f"queue {queue!r} max_message_bytes")

    def _checked_header(self, raw: bytes) -> batch_format.BatchHeader:
        """CRC and structure of a batch from the network. The master also walks the message
        lengths (a CRC-valid batch from a buggy encoder must not reach the log, where every
        reader would trip on it); the slave trusts what its master checked."""
        if len(raw) > self.shared.config.max_batch_bytes:
            raise MessageTooLarge(len(raw), self.shared.config.max_batch_bytes)
        check = batch_format.check_messages if self.shared.config.role is Role.MASTER else batch_format.parse_header
        try:
            return check(raw)
        except (CorruptLog, ValueError) as exc:
            raise ConfigError(f"malformed batch: {exc}") from exc

    def _refused(self, s: Segment, exc: Refused) -> OrdqError:
        if exc.kind == "not_writable":
            return SegmentNotWritable(self.shared.address, s.replica.queue, s.replica.seg, exc.why)
        return ConfigError(f"queue {s.replica.queue!r} segment {s.replica.seg}: {exc.why}")

    def sync_loop(self) -> None:
        """Master: group commit. One write + fdatasync per segment covers every batch that
        arrived while the previous sync ran; nothing is acked before it."""
        while True:
            with self.shared.cv:
                while not self._dirty and not self.shared.stopping:
                    self._dirty_cv.wait()
                if self.shared.stopping:
                    return
                work = [(s, s.pending) for s in self._dirty]
                for s, _ in work:
                    s.pending = []
                    s.syncing += 1
                self._dirty.clear()
            for s, batches in work:
                self.commit(s, batches, inflight=sum(map(len, batches)))

    async def _hold_back(self, link: Any) -> None:
        """While more than ``max_inflight_bytes`` wait for a sync here or on the slave, do not
        take this request (its stream is not read meanwhile: the sender is held back by gRPC
        flow control, and the broker's memory stays bounded)."""
        limit = self.shared.config.max_inflight_bytes
        waited = False
        try:
            while not self.shared.stopping:
                with self.shared.cv:
                    if self._inflight_bytes + link.lag(time.monotonic())[0] <= limit:
                        return
                    if not waited:
                        self.shared.stats.held_back += 1
                        self._held += 1
                        waited = True
                await self.shared.signal.wait(0.05)
        finally:
            if waited:
                with self.shared.cv:
                    self._held -= 1

    def commit(self, s: Segment, batches: list[bytes], *, inflight: int = 0) -> None:
        """Append ``batches`` (checked when they arrived) to ``s``'s log and fdatasync them,
        then count them synced (and ``inflight`` bytes no longer in flight). The caller
        counted this commit in ``s.syncing``. A failed write cuts the log back to what is
        durable and freezes the segment."""
        error: OrdqError | None = None
        end = None
        took = 0.0  # the write and fdatasync, in seconds
        role = "M" if self.shared.config.role is Role.MASTER else "S"  # stage stamps' prefix
        stamp(f"{role}.sync", batch_format.first_seqs, batches)
        try:
            # The log is locked to append and write, and again to count the sync, but not
            # across the fdatasync: fetches read the synced prefix meanwhile (Fence, Seal and
            # Reconcile wait for ``syncing`` to drop, so nothing truncates it in between).
            with s.io_lock:
                assert s.log is not None
                started = time.perf_counter()
                for b in batches:
                    s.log.append(b, verify_crc=False)
                written = s.log.begin_sync()
                end = s.log.synced_end
            while written is not None:  # more than one write past the log's TEAR_WINDOW
                failed = None
                try:
                    os.fdatasync(written.fd)
                except OSError as exc:
                    failed = exc
                with s.io_lock:
                    end = s.log.end_sync(written, failed)
                    written = s.log.begin_sync()
            stamp(f"{role}.synced", batch_format.first_seqs, batches)
            took = time.perf_counter() - started
            self._fsync_seconds.observe(took)
        except (DiskFull, OSError, ValueError, CorruptLog, ClosedError) as exc:
            error = exc if isinstance(exc, OrdqError) else DiskFull(f"write failed: {exc}")
            log.error("segment %s/%d: write failed, segment frozen: %s", *s.key, error)
            if out_of_space(exc):
                self.shared.disk_room.ran_out(f"segment {s.key[0]}/{s.key[1]}")
            self._drop_unsynced(s)
        with self.shared.cv:
            s.syncing -= 1
            self._inflight_bytes -= inflight
            if self.loop_sync.synced(took, time.monotonic()):
                self.shared.stats.slow_syncs += 1
            lac = s.replica.lac
            if error is None and end is not None:
                s.replica.synced(end)
                if s.synced_signal is not None:  # a produce stream acks this copy's syncs
                    s.synced_signal.fire()
                self.shared.stats.syncs += 1
                self.shared.stats.batches_synced += len(batches)
                if s.first_write is not None and s.first_write.synced is None:
                    s.first_write.synced = time.monotonic()
            else:
                self._fail_segment(s, error or DiskFull("write failed"))
            if error is not None:
                self.shared.changed()
            elif s.replica.lac != lac or self._held:
                self.shared.lac_moved((s,) if s.replica.lac != lac else ())
            else:
                # Usually the slave's answer, not this sync, moves the LAC: waking the loop
                # for nothing would cost a wake-up per batch. Fence/Seal wait here on _cv.
                self.shared.cv.notify_all()

    @staticmethod
    def _drop_unsynced(s: Segment) -> None:
        """After a failed group commit, forget batches appended but not synced, so the log ends
        exactly at what is durable (a later reconcile appends from there)."""
        with s.io_lock:
            if s.log is None:
                return
            try:
                s.log.truncate(s.log.synced_end)
            except (OrdqError, OSError, ValueError) as exc:
                log.error("segment %s/%d: cannot drop unsynced batches: %s", *s.key, exc)

    def _fail_segment(self, s: Segment, error: OrdqError) -> None:
        """The disk refused a write: stop writing this segment and fail its producers (they
        fail over; nothing half-written is served because the log truncated to synced)."""
        s.replica.freeze(f"write failed: {error}")
        if s.log is not None:
            s.replica.next_offset = s.replica.local_synced  # what was dropped never existed
        for stream in self.streams:
            if any(seg is s for seg, _ in stream.pending) and stream.error is None:
                stream.error = error

    def freeze_writable(self, why: str, *, empty_too: bool = True, error: str | None = None) -> int:
        """Caller holds _cv. Freeze every segment this master could still write (``empty_too``:
        those holding nothing yet as well) and fail every produce stream: its producers fail
        over. Returns how many segments were frozen."""
        frozen = 0
        for s in self.shared.segments.values():
            if s.replica.writable and (empty_too or s.replica.next_offset > 0):
                s.replica.freeze(why)
                frozen += 1
        self.fail_streams(SegmentNotWritable(self.shared.address, "*", -1, error or why))
        return frozen

    def fail_streams(self, error: OrdqError, *, only: Callable[[Segment], bool] | None = None) -> None:
        """Caller holds _cv. Fail every produce stream (that waits on a matching segment)."""
        for stream in self.streams:
            if stream.error is None and (only is None or any(only(seg) for seg, _ in stream.pending)):
                stream.error = error
        self.shared.changed()

    def ack_signals(self, stream: ProduceStreamState) -> tuple[Signal, ...]:
        """Caller holds _cv: what the stream's handler waits on for its next acks: the LAC of
        the segment of its first ack owed (acks go in order: no other can be released first;
        owing none, of its last: ``waits_on``), the broker's other changes (``Shared.changes``:
        a failed segment or link, a stop, the stream's end) and its own ``wake``
        (``accept_produce``); never another queue's LAC moves (issue 39)."""
        own = () if stream.wake is None else (stream.wake,)
        if stream.pending:
            stream.waits_on = stream.pending[0][0]
        if stream.waits_on is None:
            return (*own, self.shared.changes)
        return (*own, *self.shared.segment_signals(stream.waits_on, acks="local" if stream.local_acks else True))

    def take_ready_acks(self, stream: ProduceStreamState) -> list[pb.Ack]:
        """Caller holds _cv: the acks at the head of the stream whose batches the LAC covers
        (with ``local_acks``: this copy's synced end), contiguous runs merged into one ack."""
        out: list[pb.Ack] = []
        n = 0
        local = stream.local_acks
        for s, p in stream.pending:
            if (s.replica.local_synced if local else s.replica.lac) < p.end_offset:
                break
            n += 1
            prev = out[-1] if out else None
            if (prev is not None and prev.seg == s.replica.seg and prev.first_offset + prev.count == p.first_offset
                    and prev.first_seq + prev.count == p.first_seq):
                prev.count += p.count
            else:
                out.append(pb.Ack(seg=s.replica.seg, first_offset=p.first_offset, first_seq=p.first_seq,
                                  count=p.count))
        if n:
            if stages.on():
                stamp("M.ack", [p.first_seq for _, p in stream.pending[:n]])
            fw = stream.pending[n - 1][0].first_write
            if fw is not None and fw.done is None:  # a new segment's first ack: reported by the handler
                fw.done = time.monotonic()
                stream.first_write = fw
            del stream.pending[:n]
            self.shared.stats.acks += n
        return out
