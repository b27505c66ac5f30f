"""The consumer's delivery and commit: what was handed to the application, what it finished,
and the cursor commits of what finished.

Guarantee (docs/SDK.md, "What is committed"): a commit never covers more than the application
finished. A message counts as finished once the application asks for another or says so
(``Handout.finish_handed``, ``mark_finished``); with keyed delivery, the contiguous prefix the
workers finished. Commits are requests to the coordinator carrying this consumer's lease
(``held``: generation and key; the coordinator refuses any other with LeaseLost); one that got
no answer is kept "in doubt", so that a later conflict with it is recognised as our own write.

Periodic commits are written on the committer's own thread, off the hand-out path (issue 39:
a blocking Commit before handing out made the consumer's p99). The delivering thread takes the
finished position when one is due (``start_if_due``) and hands it over; one is in flight at a
time, and every commit the delivering thread writes itself (explicit, at a segment's end, on
close, after a rejoin) first waits for the one in flight, so the cursor only moves forward and
never past what was finished when it was taken. A crash before the write lands redelivers from
the committed cursor, as before.

Rules: ``Handout`` holds no I/O but the audit rows of what it hands out; ``Committer`` commits
and pops and never decides what is finished (it asks ``finished``, on the delivering thread).
Neither checks the lease: the consumer does, last thing before handing out
(``ordq.sdk._consumer_lease``); the coordinator writes a commit only for the lease's holder.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable

from ordq.common.errors import (
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    IllegalTransition,
    LeaseLost,
    OrdqError,
)
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.state import Cursor, QueueState
from ordq.sdk._consumer_core import CommitPolicy
from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats, Delivered
from ordq.sdk._queue_view import QueueView
from ordq.sdk.audit import AuditWriter
from ordq.sdk.delay import TimeGate
from ordq.sdk.keyed import KeyedWorkers

log = logging.getLogger("ordq.consumer")

# A periodic commit is a request to the coordinator, bounded short, and after one that got no
# answer the next waits this long (delivery goes on; what is not committed is redelivered at worst).
COMMIT_TIMEOUT_S = 3.0
COMMIT_RETRY_S = 1.0


class Handout:
    """The read buffer, the message in hand and what the application finished."""

    def __init__(self, config: ConsumerConfig, policy: CommitPolicy, stats: ConsumerStats, *,
                 audit: AuditWriter | None, read_position: Callable[[], Cursor]) -> None:
        self.config = config
        self._policy = policy
        self._stats = stats
        self._audit = audit
        self._read_position = read_position  # where the next read starts (past dropped duplicates too)
        self.buffer: deque[Delivered] = deque()  # read, not handed out yet
        self.in_hand: Delivered | None = None  # the last message handed out, not finished
        self.done: Delivered | None = None  # the last finished message (None: finished_base)
        self.finished_base = Cursor(seg=0)  # finished position when done is None
        self.keyed: KeyedWorkers | None = None  # while run_keyed runs: what is done is theirs to say
        self.handed_max = -1  # the highest seq handed out
        # The audit rows' consumer: a new instance after each rejoin (docs/AUDIT_FORMAT.md), as
        # the verifier judges each instance from the cursor it started at.
        self.audit_consumer = config.consumer_id
        self.handed_before_rejoin = -1  # the highest seq handed out before the last rejoin
        # Delayed delivery (sdk/delay.py): only the due prefix of the buffer is handed out.
        self.gate = TimeGate()

    def due_count(self, limit: int | None = None) -> int:
        """How many messages from the head of the buffer are due now (at most ``limit``): 0
        while the head is held for its time (``gate`` says until when)."""
        buf = self.buffer
        if not buf:
            self.gate.due_prefix((), 0)  # nothing held
            return 0
        return self.gate.due_prefix(buf, time.time_ns() // 1000, limit)

    def head_due_in_s(self) -> float:
        """Seconds until the head of the buffer is due (0: due, or nothing buffered)."""
        if not self.buffer:
            return 0.0
        return max(self.gate.due_of(self.buffer[0]) - time.time_ns() // 1000, 0) / 1e6

    def finish_handed(self) -> None:
        """The application asked for more (or said so): everything handed out is finished.
        With nothing left in the buffer, that is the read position itself (past duplicates
        dropped at the end of the last read)."""
        if self.in_hand is not None:
            self.done, self.in_hand = self.in_hand, None
        if not self.buffer and self.keyed is None:
            self.done, self.finished_base = None, self._read_position()

    def mark_finished(self, m: Delivered) -> None:
        """The application finished ``m`` (a message handed out) and everything before it."""
        if m.seq <= (self.done.seq if self.done is not None else self.finished_base.last_seq):
            return  # finished already
        last = self.in_hand
        if (last is None or m.seq > last.seq) and m.seq <= self.handed_before_rejoin:
            return  # handed out before a rejoin: it comes again from the cursor, nothing to finish now
        if last is None or m.seq > last.seq:
            raise ConfigError(f"seq {m.seq} was not handed out by this consumer")
        if m.seq == last.seq:
            self.finish_handed()
        else:
            self.done = m

    def finished_pos(self) -> Cursor:
        """The position after the last finished message: what a commit may write."""
        if self.keyed is not None:
            return self.keyed.position()
        done = self.done
        if done is None:
            return self.finished_base
        return Cursor(seg=done.seg, offset=done.offset + 1, last_seq=done.seq)

    def moved(self, cursor: Cursor) -> None:
        """The read position moved on to ``cursor`` without delivering anything (next segment,
        or past a segment dropped by retention). Only called in a read round, when the buffer
        is empty and the application finished everything handed out before (keyed: once
        finished)."""
        if self.keyed is not None:
            self.keyed.moved(cursor)
            self.sync_keyed()
            return
        self.done, self.finished_base = None, cursor

    def rejoined(self, cursor: Cursor, rejoins: int) -> None:
        """The lease was granted again (the ``rejoins``th time): what was read and not handed
        out is dropped, and the committed ``cursor`` is where the application's finished
        position stands."""
        self.audit_consumer = f"{self.config.consumer_id}#{rejoins}"
        self.buffer.clear()
        self.in_hand = self.done = None
        self.finished_base = cursor
        self.handed_before_rejoin = self.handed_max

    def sync_keyed(self) -> None:
        """Keyed delivery: count the messages the workers finished since the last look, so the
        commit policy commits them (a move to the next segment counts as one)."""
        assert self.keyed is not None
        pos = self.keyed.position()
        if pos != self.finished_base:
            self._policy.delivered(max(1, pos.last_seq - self.finished_base.last_seq))
            self.finished_base = pos

    def keyed_start(self, pool: KeyedWorkers, start: Cursor) -> None:
        self.keyed, self.finished_base = pool, start

    def keyed_end(self) -> Cursor:
        """Keyed delivery ended: what the workers finished is the finished position; what was
        read past it is dropped (read again from there)."""
        self.sync_keyed()
        self.keyed = None
        self.done = self.in_hand = None
        self.buffer.clear()
        return self.finished_base

    def take_one(self) -> Delivered:
        m = self.buffer.popleft()
        self.in_hand = m
        self.handed_max = max(self.handed_max, m.seq)
        self._stats.delivered += 1
        self._policy.delivered(1)
        self._audit_out([m])
        return m

    def _pop(self, max_messages: int | None) -> list[Delivered]:
        """The first ``max_messages`` buffered (all of them for None), taken off the buffer."""
        buf = self.buffer
        if max_messages is None or max_messages >= len(buf):
            out = list(buf)
            buf.clear()
            return out
        return [buf.popleft() for _ in range(max_messages)]

    def take(self, max_messages: int | None) -> list[Delivered]:
        out = self._pop(max_messages)
        self.in_hand = out[-1]
        self.handed_max = max(self.handed_max, out[-1].seq)
        self._stats.delivered += len(out)
        self._policy.delivered(len(out))
        self._audit_out(out)
        return out

    def take_keyed(self, max_messages: int | None = None) -> list[Delivered]:
        """Everything buffered (or the first ``max_messages``), for the keyed workers (their
        pool counts what finishes)."""
        out = self._pop(max_messages)
        self._stats.delivered += len(out)
        self._audit_out(out)
        return out

    def _audit_out(self, out: list[Delivered]) -> None:
        """Audit rows of messages about to be handed out; they reach the OS before the
        application sees the messages (docs/AUDIT_FORMAT.md)."""
        if self._audit is not None:
            now_us = time.time_ns() // 1000
            self._audit.write_rows([self._audit_row(m, now_us) for m in out])

    def _audit_row(self, m: Delivered, now_us: int) -> tuple[object, ...]:
        cfg = self.config
        # due_us: when it was due (delayed delivery), empty when at once (docs/AUDIT_FORMAT.md)
        due = self.gate.due_of(m) if (m.headers or self.gate.delay_us > 0) else 0
        return (cfg.queue, cfg.subscription, self.audit_consumer, m.seq, m.seg, m.offset, (m.key or b"").hex(),
                zlib.crc32(m.payload), m.timestamp_us, now_us, due or "")


class Committer:
    """Cursor commits (periodic on its own thread; explicit, at a segment's end and on close on
    the caller's) and the pops they allow."""

    def __init__(self, config: ConsumerConfig, coordinator: CoordinatorClient, view: QueueView,
                 policy: CommitPolicy, stats: ConsumerStats, *, held: Callable[[], Held],
                 finished: Callable[[], Cursor], audit: AuditWriter | None, version: int,
                 cursor: Cursor) -> None:
        self.config = config
        self._coord = coordinator
        self._view = view
        self._policy = policy
        self._stats = stats
        self._held = held  # the consumer lease: the coordinator commits only for its current holder
        self._finished = finished
        self._audit = audit
        self.version = version  # of the cursor node, as last written or read
        self.committed = cursor  # the cursor as last written or read: a close with nothing new writes nothing
        self._retry_at = float("-inf")  # monotonic: no periodic commit before (the last got no answer)
        self._in_doubt: list[Cursor] = []  # commits that got no answer since the last one that did
        self._pop_after: int | None = None  # last_seq of a sealed segment whose pop waits for a later commit
        # The periodic commit's thread and what it hands back to the delivering thread.
        self._cond = threading.Condition()
        self._queued: Cursor | None = None  # handed to the commit thread, not taken yet
        self._busy = False  # a periodic commit is queued or being written
        self._again = False  # the last periodic one got no answer or was refused: due again at _retry_at
        self._failed: OrdqError | None = None  # a final refusal, raised on the delivering thread
        self._learnt: QueueState | None = None  # a pop's answer, for the view (the delivering thread's)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def due(self, now: float) -> bool:
        """A periodic commit is due by the policy (or the last got no answer, or was refused for
        the lease: the lease's renewal says soon whether it is still ours), none is in flight,
        and the last attempt did not just fail."""
        return (self._policy.due(now) or self._again) and now >= self._retry_at and not self._busy

    def rejoined(self, version: int, cursor: Cursor) -> None:
        """The lease was granted again and ``cursor`` read at ``version`` (after ``drain``):
        commits start over there."""
        self.version, self.committed = version, cursor
        self._in_doubt.clear()
        self._pop_after = None
        self._retry_at = float("-inf")
        self._again, self._learnt, self._failed = False, None, None  # of the generation before
        self._policy.committed(time.monotonic())

    def start_if_due(self, now: float) -> None:
        """On the delivering thread: if a periodic commit is due, take what finished now and
        hand it to the commit thread; never waits for the write. Raises here what an earlier
        one was finally refused with (ConflictError: an admin reset; PermissionDenied...)."""
        failed, learnt = self._failed, self._learnt
        if failed is not None:
            self._failed = None
            raise failed
        if learnt is not None:
            self._learnt = None
            self._view.learnt(learnt)
        if not self.due(now):
            return
        cursor = self._finished()
        self._policy.committed(now)  # counts again from here; _again retries one that fails
        self._again = False
        with self._cond:
            self._busy, self._queued = True, cursor
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"ordq-commit-{self.config.subscription}")
            self._thread.start()

    def _run(self) -> None:
        """The commit thread: write each handed-over cursor, one at a time."""
        while True:
            with self._cond:
                while self._queued is None and not self._stopping:
                    self._cond.wait()
                cursor, self._queued = self._queued, None
            if cursor is None:
                return
            try:
                self._write(cursor, timeout_s=COMMIT_TIMEOUT_S, learnt=self._learnt_later)
            except (CoordinationUnavailable, LeaseLost):
                self._again = True  # tried again after COMMIT_RETRY_S; the lease keeps the outage clock
            except OrdqError as exc:
                self._failed = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _learnt_later(self, state: QueueState) -> None:
        self._learnt = state

    def drain(self) -> None:
        """Wait for the periodic commit in flight, if any (bounded: its calls have timeouts)."""
        with self._cond:
            while self._busy:
                self._cond.wait()

    def close(self) -> None:
        """Stop the commit thread once the commit in flight, if any, is written."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def riding_out(self, cursor: Cursor) -> None:
        """Commit ``cursor``, riding out a ZooKeeper or coordinator outage of up to
        ``coordinator_outage_s`` as ``poll`` does (the coordinator answers UNAVAILABLE while it cannot
        reach ZooKeeper); CoordinationUnavailable after that."""
        deadline = time.monotonic() + self.config.coordinator_outage_s
        while True:
            try:
                self.commit(cursor)
                return
            except CoordinationUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def commit(self, cur: Cursor, *, timeout_s: float | None = None) -> None:
        """On the delivering thread: write ``cur`` now, after the periodic commit in flight."""
        self.drain()
        self._write(cur, timeout_s=timeout_s, learnt=self._view.learnt)
        self._policy.committed(time.monotonic())

    def _write(self, cur: Cursor, *, timeout_s: float | None, learnt: Callable[[QueueState], None]) -> None:
        """One conditional write of the cursor (one thread at a time: ``commit`` drains the
        commit thread first), then the pop it allows, whose answer goes to ``learnt``."""
        if self._audit is not None:
            # The audit rows of what the cursor covers reach the file first: after a crash the
            # standby starts past them, so rows still in the buffer would read as lost.
            self._audit.flush()
        q, sub = self.config.queue, self.config.subscription
        coord = self._coord
        holder = self._held()
        try:
            try:
                self.version = coord.commit(q, sub, cur, self.version, holder, timeout_s=timeout_s)
            except ConflictError:
                # A commit of ours may have landed without our hearing of it (the client sends
                # again after a lost answer; an earlier one timed out): then the cursor moved to
                # one we wrote, not to another consumer's. Go on from there; anything else is
                # a real conflict.
                got = coord.describe(q, subscription=sub, timeout_s=timeout_s)
                assert got.cursor is not None
                now, version = got.cursor, got.cursor_version
                if now == cur:
                    self.version = version
                elif now in self._in_doubt:
                    self.version = coord.commit(q, sub, cur, version, holder, timeout_s=timeout_s)
                else:
                    raise
        except CoordinationUnavailable:
            self._in_doubt.append(cur)
            self._retry_at = time.monotonic() + COMMIT_RETRY_S
            raise
        except LeaseLost:
            # Not ours now: lapsed (a renewal may revive it) or granted to another (the lease
            # learns it at its next renewal and the consumer rejoins). Nothing was written.
            self._retry_at = time.monotonic() + COMMIT_RETRY_S
            raise
        self.committed = cur
        self._in_doubt.clear()
        self._retry_at = float("-inf")
        self._stats.commits += 1
        if self._pop_after is not None and cur.last_seq > self._pop_after:
            self._pop_after = None
            try:
                learnt(self._pop())
            except IllegalTransition:
                pass
            except OrdqError as exc:  # the commit is done; popping only frees disk (the daemon does it too)
                log.debug("queue %s: pop after commit deferred: %s", self.config.queue, exc)

    def segment_done(self, last_seq: int | None) -> None:
        """The read position left a sealed segment (its last seq ``last_seq``): commit, and
        try to pop it."""
        self.commit(self._finished(), timeout_s=COMMIT_TIMEOUT_S)
        # Refused while nothing after this segment is stored (it keeps the queue's newest
        # message for a new producer leader: state.holds_newest): try again once a commit
        # covers a later seq, as no coordinator daemon may be running to do it.
        self._pop_after = last_seq
        try:
            self._view.learnt(self._pop())
        except IllegalTransition:
            pass

    def _pop(self) -> QueueState:
        # The coordinator pops what every subscription passed (nothing when another is still
        # behind, someone popped it already, or it is kept) and answers with the state.
        return self._coord.pop(self.config.queue)
