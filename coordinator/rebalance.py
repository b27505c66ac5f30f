"""Heads spread back (issue 43): after a group returns, or one is added, which idle queues'
heads move to it, so that each live group heads about as many queues as the others. Pure: no
I/O, no clock.

Guarantee: every move is the state machine's ``hand_over`` (a roll to another group of the
queue's send list), planned on a queue's state as read with its znode version, and written by
the store with that version checked (``ZkStore.apply_batch``), so it changes nothing a roll
would not; a queue whose state moved meanwhile loses its version check and is planned again
next time. A queue written lately (``busy``: the caller's probe saw its open segment grow) is
never moved: its producer is mid-stream.

Rules:
- Only groups in ``live`` (both processes registered, not drained) count, give or receive;
  a queue whose head is not live is the failover's (``group_moves``), not this.
- A move goes from a group heading more queues to one heading at least two fewer, and only to
  a group already in that queue's send list (I4: admitted there); each move narrows the gap.
- At most ``max_moves`` moves (the caller's bound on moves per second); the order is
  deterministic (fullest group first, queues by name), so a dry run shows what a run does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ordq.common.errors import IllegalTransition
from ordq.coordinator import state as sm
from ordq.coordinator.group_moves import Move, estimate_size
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_values import StateVersion


def head_counts(heads: Iterable[str | None], live: Iterable[str]) -> dict[str, int]:
    """Queues headed by each live group (groups heading none count 0)."""
    counts = dict.fromkeys(sorted(set(live)), 0)
    for h in heads:
        if h is not None and h in counts:
            counts[h] += 1
    return counts


def even(counts: Mapping[str, int]) -> bool:
    """Whether no move can narrow these head counts (``head_counts``): fewer than two live
    groups, or none heads two more queues than another."""
    return len(counts) < 2 or max(counts.values()) - min(counts.values()) < 2


def plan_spread(queues: Iterable[tuple[str, QueueState, StateVersion]], live: frozenset[str] | set[str],
                busy: frozenset[str] | set[str], *, max_moves: int) -> list[Move]:
    """The ``hand_over`` moves that bring the live groups' head counts closer (module doc).
    ``queues``: (name, state, version)."""
    if max_moves < 0:
        raise ValueError("max_moves must be >= 0")
    rows = list(queues)
    counts = head_counts((st.head for _q, st, _v in rows), live)
    if max_moves == 0 or even(counts):
        return []  # even already: no move (and no sort of every queue, each pass: 10^5 of them)
    # the queues each live group heads that may move: idle, with an open segment on the head
    movable: dict[str, list[tuple[str, QueueState, StateVersion]]] = {g: [] for g in counts}
    for q, st, v in sorted(rows, key=lambda r: r[0]):
        open_seg = st.open_segment
        if st.head in movable and q not in busy and open_seg is not None and open_seg.gid == st.head:
            movable[st.head].append((q, st, v))
    moves: list[Move] = []
    taken: dict[str, int] = dict.fromkeys(counts, 0)  # next candidate index per donor
    while len(moves) < max_moves:
        moved = False
        for donor in sorted(counts, key=lambda g: (-counts[g], g)):
            candidates = movable[donor]
            while taken[donor] < len(candidates):
                q, st, v = candidates[taken[donor]]
                taken[donor] += 1
                to = min((g for g in st.send if g in counts and counts[g] <= counts[donor] - 2),
                         key=lambda g: (counts[g], g), default=None)
                if to is None:
                    continue
                open_seg = st.open_segment
                assert open_seg is not None
                try:
                    after = sm.hand_over(st, donor, open_seg.seg, to)
                except IllegalTransition:
                    continue
                moves.append(Move(queue=q, version=v, before=st, after=after, busy=False,
                                  size=estimate_size(after)))
                counts[donor] -= 1
                counts[to] += 1
                moved = True
                break
            if moved:
                break
        if not moved:
            break
    return moves


def spread_of(queues: Iterable[QueueState], live: Iterable[str]) -> Mapping[str, int]:
    """Head counts per live group of these states (what ``ordq group rebalance`` shows)."""
    return head_counts((st.head for st in queues), live)
