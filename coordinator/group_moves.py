"""A dead group's heads moved as one event (issue 43): which queues move, in what order, and
how their writes are cut into bounded ZooKeeper transactions. Pure: no I/O, no clock.

Guarantee: every move is the state machine's own ``fail_over`` (``ordq.coordinator.state``),
planned on a queue's state as read with its znode version, and written by the store with that
version checked (``ZkStore.apply_batch``): a batch changes nothing a per-queue CAS would not,
and a queue whose state moved meanwhile loses its CAS and is planned again alone. Only the
number of ZooKeeper round trips changes: at 10^4 queues a group heads ~3,300, which one write
each took 31-38 s to move (issue 43).

Rules:
- Queues written in the last minutes (``busy``) come first, in batches of their own and small
  ones (``BUSY_BATCH``): a producer may be waiting on each; the idle ones follow in batches
  bounded by count and bytes, well under ZooKeeper's 1 MB request limit (jute.maxbuffer).
- A queue whose transition is refused (``IllegalTransition``: its head moved meanwhile) or
  whose state does not parse is left to the per-queue round; nothing here raises for one queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from ordq.common.errors import IllegalTransition
from ordq.coordinator import state as sm
from ordq.coordinator.state import Facts, QueueState
from ordq.coordinator.store_values import StateVersion, StateWrite

T = TypeVar("T")

# Queues per transaction: a fail_over rewrites a state znode of ~0.3-2 KB.
BATCH = 200
# Bytes of new states per transaction: a quarter of ZooKeeper's default 1 MB request limit.
BATCH_BYTES = 256 * 1024
# Busy queues per transaction: small, so the first busy queue's write is not held behind many.
BUSY_BATCH = 16


@attrs.frozen
class Move:
    """One queue's fail_over, planned: the state it was planned on (``version``) and the new one."""

    queue: str
    version: StateVersion
    before: QueueState
    after: QueueState
    busy: bool
    size: int  # bytes of ``after`` as written (what counts against ``BATCH_BYTES``)


@attrs.define
class MovePhases:
    """Where a dead group's moves spent their time (issue 43: every head moved 7.9-10.9 s after
    the verdict at 10^5 queues, goal 10 s, and nothing told the planning from the writes). The
    caller measures; ``line`` says it in the log. ``*_cpu_s``: CPU of the moving thread (time
    it ran, not waited for ZooKeeper or the GIL); ``process_cpu_s``: every thread's."""

    rows_s: float = 0.0  # the rows (state, version, facts) of the queues to move
    plan_s: float = 0.0  # ``plan_moves`` and ``batches``
    plan_cpu_s: float = 0.0
    turns_s: float = 0.0  # waiting for the service's urgent requests (pacing.py) before idle transactions
    writes_s: float = 0.0  # the transactions sent and answered (turns and seals queued not counted)
    writes_cpu_s: float = 0.0
    seals_s: float = 0.0  # the moved queues' seals queued (``_seal_moved``)
    total_s: float = 0.0
    process_cpu_s: float = 0.0
    in_flight: int = 0  # the bound on transactions sent and not yet answered
    transactions: int = 0
    redone: int = 0  # transactions that failed and were done again part by part
    revalidations: int = 0  # batches checked again against the deletion log
    queue_events: int = 0  # the view's watches of queue nodes that fired meanwhile

    def line(self) -> str:
        return (f"in {self.total_s:.2f} s: rows {self.rows_s:.2f} s, plan {self.plan_s:.2f} s "
                f"(cpu {self.plan_cpu_s:.2f}), {self.transactions} transactions ({self.in_flight} in flight at most) "
                f"{self.writes_s:.2f} s (cpu {self.writes_cpu_s:.2f}), turns waited {self.turns_s:.2f} s, "
                f"seals queued {self.seals_s:.2f} s; the process's cpu {self.process_cpu_s:.2f} s; "
                f"{self.redone} transactions redone, {self.revalidations} revalidations, "
                f"{self.queue_events} queue watches fired")


def dead_head(st: QueueState, facts: Facts) -> tuple[str, int] | None:
    """(gid, seg) of the open segment when its group is not live (both processes), else None:
    the queue's head must fail over (as ``duties.plan`` says first)."""
    open_seg = st.open_segment
    if open_seg is None or open_seg.gid in facts.live_groups:
        return None
    return open_seg.gid, open_seg.seg


def plan_moves(queues: Iterable[tuple[str, QueueState, StateVersion, Facts]], busy: frozenset[str] | set[str],
               size_of: Mapping[str, int] | None = None) -> list[Move]:
    """The fail_over of every queue whose head group is dead, busy ones first (each part in the
    order given). ``queues``: (name, state, version, facts); ``size_of``: bytes of a new state
    (default: an estimate from its segments), for ``batches``."""
    hot: list[Move] = []
    cold: list[Move] = []
    for name, st, version, facts in queues:
        dead = dead_head(st, facts)
        if dead is None:
            continue
        try:
            after = sm.fail_over(st, dead[0], dead[1], facts)
        except IllegalTransition:
            continue  # the per-queue round decides (and counts) it
        size = (size_of or {}).get(name, estimate_size(after))
        move = Move(queue=name, version=version, before=st, after=after, busy=name in busy, size=size)
        (hot if move.busy else cold).append(move)
    return hot + cold


def estimate_size(st: QueueState) -> int:
    """An upper bound of the bytes ``st`` takes as JSON (the exact size is the store's)."""
    return 256 + len(st.queue) + 64 * len(st.groups) + 160 * len(st.consume)


def batches(moves: list[Move], *, max_count: int = BATCH, max_bytes: int = BATCH_BYTES,
            busy_count: int = BUSY_BATCH) -> list[list[Move]]:
    """``moves`` cut in order into transactions: no batch mixes busy and idle queues, a busy
    batch holds at most ``busy_count``, an idle one ``max_count``, and none more than
    ``max_bytes`` unless a single move is larger (then it goes alone)."""
    if max_count < 1 or busy_count < 1 or max_bytes < 1:
        raise ValueError("batch bounds must be >= 1")
    return _cut(moves, size_of=lambda m: m.size, limit_of=lambda m: busy_count if m.busy else max_count,
                max_bytes=max_bytes, together=lambda a, b: a.busy == b.busy)


def transactions(writes: Sequence[StateWrite]) -> list[list[StateWrite]]:
    """``writes`` (queue, version read, new state) cut in order into transactions bounded as the
    moves' are (``BATCH`` states, ``BATCH_BYTES`` bytes): the batched seals, pops and admits."""
    return _cut(writes, size_of=lambda w: estimate_size(w[2]), limit_of=lambda _w: BATCH, max_bytes=BATCH_BYTES)


def _cut(items: Iterable[T], *, size_of: Callable[[T], int], limit_of: Callable[[T], int], max_bytes: int,
         together: Callable[[T, T], bool] = lambda _a, _b: True) -> list[list[T]]:
    """``items`` cut in order: a part ends before an item that may not go ``together`` with its
    first, that would make it longer than ``limit_of(item)`` or larger than ``max_bytes``."""
    out: list[list[T]] = []
    part: list[T] = []
    part_bytes = 0
    for item in items:
        grow = size_of(item)
        if part and (not together(part[0], item) or len(part) >= limit_of(item) or part_bytes + grow > max_bytes):
            out.append(part)
            part, part_bytes = [], 0
        part.append(item)
        part_bytes += grow
    if part:
        out.append(part)
    return out
