"""Consumer bookkeeping without I/O: exactly-once-in-order filter, cursor commit policy, and
the finished-prefix tracker of keyed parallel delivery.

Rules:
- ``DeliveryFilter`` is the last gate before the application: a seq <= the last delivered is
  a duplicate (a resend after failover, or a replay) and is dropped; seq == last + 1 is
  delivered; anything larger is a gap: raise ``GapDetected`` and never skip.
- ``CommitPolicy`` decides *when* to write the cursor (every N messages or T ms, and on
  close), never *what*: the cursor is always the position after the last delivered message.
- ``FinishedTracker`` decides *what* may be committed when messages finish out of order
  (keyed workers): the position after the highest seq below which every dispatched seq is
  finished, never past an unfinished one.
- No clocks, threads or I/O: time comes in as ``now_s``; callers that share a tracker between
  threads hold their own lock.
"""

from __future__ import annotations

from collections import deque

import attrs

from ordq.common.errors import ConfigError, GapDetected
from ordq.coordinator.state import Cursor


@attrs.define
class DeliveryFilter:
    queue: str
    last_seq: int  # highest seq delivered (or committed as delivered); -1 before the first
    duplicates_dropped: int = 0

    def admit(self, seq: int) -> bool:
        """True: deliver it (and it becomes the last). False: duplicate, drop it.
        Raises GapDetected when ``seq`` skips ahead."""
        if seq <= self.last_seq:
            self.duplicates_dropped += 1
            return False
        if seq != self.last_seq + 1:
            raise GapDetected(self.queue, expected_seq=self.last_seq + 1, got_seq=seq)
        self.last_seq = seq
        return True

    def admit_run(self, first_seq: int, count: int) -> bool:
        """Admit ``first_seq .. first_seq+count-1`` at once if it continues the last delivered
        seq exactly (the common case: a whole new batch); else admit nothing and return False
        (the caller then goes message by message through ``admit``)."""
        if count < 1 or first_seq != self.last_seq + 1:
            return False
        self.last_seq = first_seq + count - 1
        return True


@attrs.frozen(kw_only=True)
class CommitConfig:
    """When the consumer commits its cursor by itself: every ``every_messages`` finished
    messages or ``every_ms`` ms, whichever comes first. Each commit is a coordinator call and a
    ZooKeeper write (an fdatasync in its log; issue 39: ~8 ms of the coordinator's and
    ZooKeeper's CPU a commit, and a sync beside the brokers' on a shared disk); a consumer that
    crashes redelivers at most this much to its successor."""

    every_messages: int = 10_000
    every_ms: float = 1000.0

    def __attrs_post_init__(self) -> None:
        if self.every_messages < 1 or self.every_ms <= 0:
            raise ConfigError("commit every_messages must be >= 1 and every_ms > 0")


@attrs.define
class CommitPolicy:
    config: CommitConfig
    _since_commit: int = 0
    _last_commit_s: float = 0.0

    def delivered(self, n: int = 1) -> None:
        self._since_commit += n

    def due(self, now_s: float) -> bool:
        if self._since_commit == 0:
            return False
        return (
            self._since_commit >= self.config.every_messages
            or (now_s - self._last_commit_s) * 1000.0 >= self.config.every_ms
        )

    def due_count(self) -> bool:
        """Due by message count alone (a cheap check per message)."""
        return self._since_commit >= self.config.every_messages

    def committed(self, now_s: float) -> None:
        self._since_commit = 0
        self._last_commit_s = now_s


@attrs.define
class FinishedTracker:
    """The contiguous finished prefix of messages dispatched in seq order, finished in any order.

    ``dispatched(seq, after)`` registers a message (``after``: the cursor just past it) in
    strictly increasing seq order; ``finished(seq)`` marks it done; ``position`` is the cursor
    after the highest seq below which every dispatched seq is finished (None until one is).
    ``moved(cursor)`` records a read position that moved on without a new message (past
    dropped duplicates, to the next segment): it takes effect once everything dispatched
    before it is finished. Each call is O(1) amortised: a seq enters ``_order`` once and leaves
    it once.
    """

    position: Cursor | None = None
    _order: deque[int] = attrs.field(factory=deque)  # dispatched seqs not yet behind position
    _after: dict[int, Cursor] = attrs.field(factory=dict)  # seq in _order -> cursor after it
    _done: set[int] = attrs.field(factory=set)  # finished seqs still in _order
    _last: int | None = None  # highest seq dispatched

    def dispatched(self, seq: int, after: Cursor) -> None:
        if self._last is not None and seq <= self._last:
            raise ValueError(f"seq {seq} dispatched after {self._last}: must increase")
        self._last = seq
        self._order.append(seq)
        self._after[seq] = after

    def finished(self, seq: int) -> None:
        if seq not in self._after or seq in self._done:
            raise ValueError(f"seq {seq} finished but not pending (never dispatched, or finished twice)")
        self._done.add(seq)
        order = self._order
        # Only the head of the order can advance the position; every seq is popped once.
        while order and order[0] in self._done:
            head = order.popleft()
            self._done.discard(head)
            self.position = self._after.pop(head)

    def moved(self, cursor: Cursor) -> None:
        if not self._order:
            self.position = cursor  # nothing outstanding: the new position holds at once
        else:
            # The move resumes right after the last dispatched seq, so it is that message's
            # "after" cursor, reached when it (and everything before it) is finished.
            last = self._order[-1]
            if cursor.last_seq != last:
                raise ValueError(f"moved to {cursor} while seq {last} is the last dispatched")
            self._after[last] = cursor

    @property
    def pending(self) -> int:
        """Dispatched messages not yet behind ``position`` (finished or not)."""
        return len(self._order)

    @property
    def unfinished(self) -> int:
        return len(self._order) - len(self._done)
