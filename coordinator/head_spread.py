"""Heads spread back, the I/O (issue 43): the elected daemon's copies planned by the pure
``coordinator/rebalance.py`` and written with ``ZkStore.apply_batch`` in the moves' bounded
transactions (``group_moves.batches``), each state's version checked. Used by the daemon's own
pass after a group returns (bounded moves a second) and by ``ordq group rebalance`` (the admin
API verb ``group rebalance``), which can also only show the plan (``dry_run``).

Rules: reads nothing from ZooKeeper (the daemon's watched copies are current); what a batch
leaves (a version check lost: someone wrote the queue meanwhile) is simply not moved now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ordq.coordinator.group_moves import Move, batches
from ordq.coordinator.rebalance import even, head_counts, plan_spread
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_values import StateVersion


@attrs.frozen
class SpreadResult:
    before: dict[str, int]  # heads per live group before
    after: dict[str, int]  # ... once the moves written (planned, for a dry run)
    moves: list[tuple[str, str, str]]  # (queue, from, to), planned (dry run) or written
    left: list[str]  # planned but not written (a version check lost)
    dry_run: bool
    busy: int  # queues left alone because a probe saw them written lately
    transactions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "dry_run": self.dry_run, "busy_skipped": self.busy,
                "transactions": self.transactions, "left": self.left,
                "moves": [{"queue": q, "from": f, "to": t} for q, f, t in self.moves]}


def spread_heads(store: Any, rows: Iterable[tuple[str, QueueState, StateVersion]], live: frozenset[str],
                 busy: set[str], group_versions: Mapping[str, int], *, max_moves: int, dry_run: bool,
                 wait_turn: Callable[[], None] = lambda: None) -> SpreadResult:
    """Plan (``plan_spread``) and, unless ``dry_run``, write the moves; ``rows``: (queue, state,
    version) of every queue as the caller's copies hold them; ``live``: the groups with both
    processes live and not drained; ``wait_turn``: called before each transaction (the
    service's urgent requests first, ``coordinator/pacing.py``)."""
    rows = list(rows)
    before = head_counts((st.head for _q, st, _v in rows), live)
    # even (the daemon's pass every 2 s, most of the time): no second count of every queue
    moves = [] if even(before) else plan_spread(rows, live, busy, max_moves=max_moves)
    busy_n = sum(1 for q, st, _v in rows if q in busy and st.head in live)
    if dry_run:
        return SpreadResult(before=before, after=_counts_after(before, moves), moves=_triples(moves), left=[],
                            dry_run=True, busy=busy_n)
    written: list[Move] = []
    left: list[str] = []
    transactions = 0
    for part in batches(moves):
        wait_turn()
        try:
            done, lost = store.apply_batch([(m.queue, m.version, m.after) for m in part], group_versions)
        except Exception:  # noqa: BLE001 - the rest is tried again on the next pass
            left += [m.queue for m in part]
            continue
        transactions += 1 if done else 0
        ok = set(done)
        written += [m for m in part if m.queue in ok]
        left += lost
    return SpreadResult(before=before, after=_counts_after(before, written), moves=_triples(written), left=left,
                        dry_run=False, busy=busy_n, transactions=transactions)


def _triples(moves: list[Move]) -> list[tuple[str, str, str]]:
    return [(m.queue, m.before.head or "", m.after.head or "") for m in moves]


def _counts_after(before: Mapping[str, int], moves: list[Move]) -> dict[str, int]:
    out = dict(before)
    for m in moves:
        if m.before.head in out and m.after.head in out:
            out[m.before.head] -= 1
            out[m.after.head] += 1
    return out
