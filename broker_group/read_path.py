"""The read path: Fetch and Read answers from a copy of a segment, within the memory budget.

Guarantees (DESIGN §4): readers never see past the LAC of an open segment, nor past the end
of a sealed one (nor past the end ZooKeeper decided, when the reader tells it). A sealed
copy's bytes are CRC-checked on the way out; a corrupt copy is set aside and repaired from
the peer, never served.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence

import attrs

from ordq.broker_group.answer import Answer, encode
from ordq.broker_group.budget import NO_ANSWER_LIMIT, TOKEN, BudgetConfig, Lease, MemoryBudget, ReadPace
from ordq.broker_group.metrics import count_fetch
from ordq.broker_group.request_time import ChargeSum, RequestTime
from ordq.broker_group.segments import SegmentStore
from ordq.broker_group.shared import Segment, Shared
from ordq.common.errors import BrokerUnavailable, CorruptLog, SegmentNotFound
from ordq.common.loop import Alarm, KeyedLocks, Signal
from ordq.common.stages import stamp
from ordq.coordinator.state import SegStatus
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb

log = logging.getLogger("ordq.broker")

INLINE_READ_MESSAGES = 4096  # a fetch of more messages reads the log in a worker thread, off the loop
# A token's Read stream's first answer carries at most this much; each answer its reader takes
# doubles it, up to the token's own limit (Lease.answer_bytes: 4 MiB alone) by the fifth. One
# token's 24 streams opened at once and never read, alone on their broker, were each built a
# 4 MiB answer at once (~100 MiB read and copied for nobody); such a stream now costs 256 KiB.
# A neighbour queue on another broker of the same machine: its acks' p50 in the 250 ms after
# such a burst 5.1-5.3 -> 2.3-3.3 ms, their p99 the same (docs/BENCHMARKS.md, stop 76).
FIRST_STREAM_ANSWER_BYTES = 256 << 10
# A segment this replica holds no copy of, found open on this group in ZooKeeper (a queue not
# written yet: its first batch creates it here), is answered empty again for this long without
# reading ZooKeeper (``ReadPath._absent_open``). An idle consumer of a queue never written read
# the queue's state at every long poll's end: two reads a second each (stop 100). Why it is safe:
# the answer is "nothing yet, not sealed", which waiting one more second would give too. A batch
# acked in that segment was placed on both replicas, so this one then holds it (the map is looked
# at first); a seal is told to the consumer by its own state (its renewals' stamp), and a sealed
# segment with messages but no copy here is what a replica restarted on an empty disk has: its
# map starts empty.
ABSENT_OPEN_S = 1.0
ABSENT_OPEN_KEEP = 100_000  # entries kept at most (past it the expired ones go, then all)


@attrs.define(eq=False)
class ReadAccount:
    """What one Fetch call or Read stream holds and owes, kept from one answer to the next
    (issue 39: a budget grant, two releases, a timer per wait and a request-time charge per
    answer were the largest block of the master's loop after its TLS writes at 2,000 msgs/s):

    - ``lease``: its bytes in the memory budget. A Read stream keeps ``keep`` bytes
      (``min_grant_bytes``, 64 KiB) of room between its answers: a caught-up reader's answer
      (a batch or a few) is read within that room, with no grant and no release; an answer
      that needs more (the room was filled, the reader is behind, or the stream's first)
      is granted as before, and what passes ``keep`` is given back once the answer is sent.
      The budget's bound is unchanged: an answer is still read within bytes granted from the
      budget, plus at most the one batch that passes them (charged), and the room a stream
      keeps is charged to it while it waits, as an answer's bytes are.
    - ``alarm``: one timer for its long polls (``ordq.common.loop.Alarm``), not one per wait.
    - ``charges``: its answers' request-time cost (their bytes' copies and encryption, a
      worker's read) charged to its token in sums of at least 1 ms (``ChargeSum``).
    The token's read rate (``ReadPace``) is still asked before every answer and charged every
    answer's bytes. ``close`` when the call or stream ends."""

    lease: Lease
    alarm: Alarm
    charges: ChargeSum
    keep: int  # room kept between answers (0: a Fetch call, given back when it ends)
    behind: bool = True  # the last answer stopped short of the readable end (or none yet)
    # The most its next answer may carry: a token's Read stream starts at
    # FIRST_STREAM_ANSWER_BYTES and doubles it with each answer its reader takes (``sent``)
    cap: int = NO_ANSWER_LIMIT

    async def room(self, want: int, wait_s: float | None) -> int:
        """The bytes this answer may read, at most ``want`` (a token's: ``Lease.answer_bytes``):
        the room kept, or more granted (waiting for the token's read rate either way)."""
        lease = self.lease
        want = min(want, lease.answer_bytes(), self.cap)
        if lease.bytes < want and (self.behind or lease.bytes < self.keep):
            await lease.acquire(want - lease.bytes, wait_s=wait_s)
        else:
            await lease.paced()
        return min(lease.bytes, want)

    def answered(self, answer: Answer, upto: int, byte_cost_s: float) -> None:
        """The answer is built: the lease holds its bytes (or the room kept, if more); its
        copies into gRPC and its encryption on the way out are charged as its bytes."""
        self.lease.settle(answer.batch_bytes, keep=self.keep)
        self.behind = answer.end_offset < upto
        self.charges.add(byte_cost_s)

    def sent(self) -> None:
        """The answer left (gRPC or the link took it): keep only the room kept; the next may
        carry twice as much."""
        self.lease.release(self.keep)
        self.cap = min(self.cap * 2, NO_ANSWER_LIMIT)

    def close(self) -> None:
        self.lease.release()
        self.alarm.close()
        self.charges.flush()


def token_read_pace(config: BudgetConfig, request_time: RequestTime) -> ReadPace | None:
    """Each token's read rate (None: ``read_rate_bytes`` unset), paced only while another
    token is active (work-conserving, issue 39), however idle the loop
    (``RequestTime.others_active``)."""
    if config.read_rate_bytes is None:
        return None
    # A bucket of two answers, not the connection's 32 MiB share: a token's 24 Read streams
    # opened at once were all given their first answers at once, and the neighbour queue's
    # acks waited behind that burst (noisy-neighbour drill: the worst acks came in the first
    # 0.5 s of each abuse window). A steady reader's rate is the same either way. Two answers
    # of the size a token gets while paced (contended_answer_bytes: pacing is contention's).
    burst = min(config.holder_bytes, 2 * config.contended_answer_limit)
    return ReadPace(config.read_rate_bytes, burst=burst, contended=request_time.others_active,
                    tail_factor=config.tail_read_factor, tail_burst=config.tail_read_burst_bytes)


class ReadPath:
    def __init__(self, shared: Shared, segments: SegmentStore, repair_kick: threading.Event,
                 request_time: RequestTime) -> None:
        self.shared = shared
        self.segments = segments
        self._repair_kick = repair_kick  # the reconciler runs a round now
        self.request_time = request_time  # each token's share of the loop (request_time.py)
        config = shared.config
        # One memory budget for what calls hold (broker_group/budget.py); its own signal, so
        # that a released answer wakes only the calls waiting for room.
        self.budget = MemoryBudget(config.budget)
        self.read_pace = token_read_pace(config.budget, request_time)
        self.room = Signal(shared.loop)
        self._read_slots = KeyedLocks()  # one worker at a time builds a token's answers: _read_slot
        self._pace_turns = KeyedLocks()  # a token's answers wait for its read rate in turn (Lease.paced)
        # (queue, seg) -> until when (monotonic) it is answered as open and empty here (ABSENT_OPEN_S);
        # set by a worker's ``_fetch_absent``, read on the loop (single dict operations)
        self._absent_open: dict[tuple[str, int], float] = {}

    def lease(self, holders: Sequence[str], queue: str | None = None) -> Lease:
        """A call's share of the memory budget, charged to ``holders`` (budget.holders_of);
        ``queue``: the queue it reads (its token's read rate asks who else is active)."""
        return Lease(self.budget, self.room, holders, self.shared.address, self.read_pace,
                     self.request_time.others_active, queue, self._pace_turns)

    def wrote(self, queue: str, n: int) -> None:
        """``n`` bytes of a produce request were placed in ``queue``: what its tokens may read
        back unpaced (``ReadPace.fresh``)."""
        if self.read_pace is not None:
            self.read_pace.wrote(queue, n)

    def account(self, holders: Sequence[str], queue: str, *, stream: bool = False) -> ReadAccount:
        """What a Fetch call (or, ``stream``, a Read stream) of ``queue`` holds and owes
        (``ReadAccount``; a token's stream's answers start at FIRST_STREAM_ANSWER_BYTES); its
        token counts as active on ``queue`` (``RequestTime.on_queue``)."""
        keep = self.budget.config.min_grant_bytes if stream else 0
        token = next((h for h in holders if h.startswith(TOKEN)), None)
        rt = self.request_time
        rt.on_queue(token, queue)
        cap = FIRST_STREAM_ANSWER_BYTES if stream and token is not None else NO_ANSWER_LIMIT  # a peer's: its grant
        return ReadAccount(self.lease(holders, queue), Alarm(),
                           ChargeSum(lambda seconds: rt.charge(token, seconds, time.monotonic())), keep, cap=cap)

    async def fetch(self, req: pb.FetchRequest, account: ReadAccount | None = None, *,
                    wait_s: float | None = None) -> Answer:
        """On the loop: whole batches from (seg, offset) up to the LAC or the sealed end,
        long-polling while nothing is readable (woken by its segment's LAC moves and the
        broker's other changes, not by other segments' LAC moves: ``Shared.segment_signals``).
        With an ``account`` the answer is charged to its lease (shorter when the budget has
        less room; waiting up to ``wait_s`` for room, then ResourceExhausted) and its cost to
        its token; the caller gives the room back once the answer is sent
        (``ReadAccount.sent``, ``close``)."""
        if account is None:  # a call of this process's own: its waits on a timer of their own
            alarm = Alarm()
            try:
                return await self._fetch(req, None, alarm, wait_s)
            finally:
                alarm.close()
        return await self._fetch(req, account, account.alarm, wait_s)

    async def _fetch(self, req: pb.FetchRequest, account: ReadAccount | None, alarm: Alarm,
                     wait_s: float | None) -> Answer:
        shared = self.shared
        shared.stats.fetches += 1
        known_end = req.known_end if req.known_end >= 0 else None
        deadline = time.monotonic() + min(req.max_wait_ms, shared.config.max_fetch_wait_ms) / 1000.0
        key = (req.queue, req.seg)
        s = shared.segments.get(key)
        while s is None and not shared.stopping:
            if deadline <= time.monotonic():
                break
            await alarm.wait(deadline, shared.changes)  # a segment added here: ``changed``
            shared.stats.read_wakeups += 1
            s = shared.segments.get(key)
        if s is None:
            if self._absent_open.get(key, 0.0) > time.monotonic():
                return encode([], offset=req.offset, end_offset=req.offset, readable_end=0, sealed=False)
            return await shared.loop.run_blocking(self._fetch_absent, req)
        r = s.replica
        while True:
            with shared.cv:
                signals = shared.segment_signals(s)
                if s.corrupt is not None:
                    raise s.corrupt
                if (r.sealed and known_end is not None and req.offset >= r.local_synced
                        and r.local_synced < known_end):
                    self._repair_kick.set()
                    raise BrokerUnavailable(self.shared.address, f"this copy of {req.queue}/{req.seg} holds "
                                            f"{r.local_synced} of its sealed end {known_end}; "
                                            "reconciling from the peer")
                upto = r.readable_end(known_end)
                sealed = r.sealed
            if upto > req.offset or sealed or shared.stopping or deadline <= time.monotonic():
                break
            await alarm.wait(deadline, *signals)
            shared.stats.read_wakeups += 1
        if upto <= req.offset:
            return encode([], offset=req.offset, end_offset=req.offset, readable_end=upto, sealed=sealed)
        max_bytes = min(max(req.max_bytes, 1), self.shared.config.max_fetch_bytes)
        if account is not None:
            max_bytes = await account.room(max_bytes, wait_s)
        # Read on the loop when the log is free (page cache: microseconds for what a
        # follower asks); behind a sync holding it, or for a long read, in a worker, which
        # also encodes the answer: a 32 MiB answer's join held the loop (and with it every
        # neighbour's produce and ack) for tens of ms (issue 25, the noisy-neighbour drill).
        # A sealed segment's bytes may have rotted since they were written and scanned:
        # they are CRC-checked on the way out (docs/BENCHMARKS.md, "Outbound CRC check").
        verify = sealed and self.shared.config.verify_sealed_reads
        try:
            if upto - req.offset <= INLINE_READ_MESSAGES and s.io_lock.acquire(blocking=False):
                try:
                    batches, answer = self._answer(self._read_locked(s, req.offset, max_bytes, upto, verify),
                                                   req.offset, upto, sealed)
                finally:
                    s.io_lock.release()
            else:
                token = account.lease.token if account is not None else None
                async with self._read_slot(token):
                    batches, answer, took = await self.shared.loop.run_blocking(self._read_answer, s, req.offset,
                                                                                max_bytes, upto, sealed, verify)
                # A worker's read and encoding hold the GIL the loop needs: charged to the token
                # as its loop time is (request_time.py).
                if account is not None:
                    account.charges.add(took)
        except CorruptLog as exc:
            self.set_aside(s, exc)
            raise
        if account is not None:
            account.answered(answer, upto, self.request_time.config.byte_cost_s(answer.batch_bytes))
        count_fetch(self.shared.stats, batches, answer.end_offset, answer.batch_bytes)
        stamp("M.read", batch_format.first_seqs, batches)
        return answer

    @contextlib.asynccontextmanager
    async def _read_slot(self, token: str | None) -> AsyncIterator[None]:
        """One worker at a time builds a token's answers (the group's peers: no limit). Each
        worker building an answer takes the GIL from the loop in turns: one token's 24 Read
        streams opened at once had 8 answers built in parallel (its 32 MiB share), and the
        neighbour queue's acks waited 5-8x their quiet p99 (noisy-neighbour drill)."""
        if token is None:
            yield
            return
        async with self._read_slots.hold(token):
            yield

    @staticmethod
    def _answer(batches: list[bytes], offset: int, upto: int, sealed: bool) -> tuple[list[bytes], Answer]:
        end = batch_format.parse_header(batches[-1], verify_crc=False).end_offset if batches else offset
        return batches, encode(batches, offset=offset, end_offset=end, readable_end=upto, sealed=sealed)

    def _read_answer(self, s: Segment, offset: int, max_bytes: int, upto: int, sealed: bool,
                     verify: bool) -> tuple[list[bytes], Answer, float]:
        """In a worker: the answer, and the CPU seconds this thread spent on it."""
        t0 = time.thread_time()
        batches, answer = self._answer(self._read(s, offset, max_bytes, upto, verify), offset, upto, sealed)
        return batches, answer, time.thread_time() - t0

    def _read(self, s: Segment, offset: int, max_bytes: int, upto: int, verify: bool) -> list[bytes]:
        with s.io_lock:
            return self._read_locked(s, offset, max_bytes, upto, verify)

    @staticmethod
    def _read_locked(s: Segment, offset: int, max_bytes: int, upto: int, verify: bool) -> list[bytes]:
        if s.log is None:  # set aside as corrupt since the check
            raise s.corrupt or BrokerUnavailable("?", f"segment {s.key} is not served")
        return s.log.read(offset, max_bytes=max_bytes, upto=upto, verify_crc=verify)

    def set_aside(self, s: Segment, exc: CorruptLog) -> None:
        """A served read found bytes that no longer match their CRC: take this copy out of
        service (every later read of it is refused with ``exc``, so readers go to the peer),
        count it, say so, and have the reconciler rebuild it from the peer (its rename keeps
        the bad file as evidence). Only a sealed copy is checked, and only a sealed one can
        be rebuilt: its end is decided in ZooKeeper."""
        with s.io_lock:  # never together with _cv (module docstring)
            if s.log is None:
                return  # set aside already (another reader found it first)
            s.log.close()
            s.log = None
        with self.shared.cv:
            s.corrupt = exc
            s.reconciled = False
            s.replica.freeze("corrupt log")
            self.shared.stats.corrupt_segments += 1
            self.shared.stats.corrupt_reads += 1
            self.shared.changed()
        log.error("segment %s/%d: a served read found corrupt bytes (%s); this copy is not served and is "
                  "being repaired from the peer", *s.key, exc)
        self._repair_kick.set()

    def _fetch_absent(self, req: pb.FetchRequest) -> Answer:
        """In a worker thread: a fetch of a segment this replica holds no copy of (open on this
        group in ZooKeeper: answered so for ``ABSENT_OPEN_S`` without reading it again)."""
        self.shared.stats.absent_state_reads += 1
        z, _ = self.segments.zk_segment(req.queue, req.seg)
        if z is None or z.gid != self.shared.config.gid:
            raise SegmentNotFound(req.queue, req.seg)
        if z.status is SegStatus.SEALED and z.end:
            # Sealed with messages, yet no copy here (this replica restarted on an empty
            # disk): the reader must go to the peer, not wait here for data that never comes.
            raise BrokerUnavailable(self.shared.address, f"holds no copy of sealed segment {req.queue}/{req.seg} "
                                    f"({z.end} messages): read it from the peer")
        if z.status is SegStatus.OPEN:
            self._remember_absent_open((req.queue, req.seg))
        return encode([], offset=req.offset, end_offset=req.offset, readable_end=0,
                      sealed=z.status is SegStatus.SEALED and not z.end)

    def _remember_absent_open(self, key: tuple[str, int]) -> None:
        now = time.monotonic()
        known = self._absent_open
        if len(known) >= ABSENT_OPEN_KEEP:
            for old in [k for k, until in list(known.items()) if until <= now]:
                known.pop(old, None)
            if len(known) >= ABSENT_OPEN_KEEP:
                known.clear()
        known[key] = now + ABSENT_OPEN_S
