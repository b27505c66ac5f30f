"""Which producer epoch a broker lets write or fence a queue: only the one ZooKeeper issued.

A producer leader gets its epoch by bumping the queue's ``producer_epoch`` in ZooKeeper
(``coordinator.state.bump_epoch``) before it fences and writes. Without this gate a broker
took any epoch at least its segment's fence, so a hand-made client claiming a high epoch
could write into an open segment and fence the real leader out.

Cost: the epoch last seen per queue is cached; a claim equal to it passes with one dict
lookup (the hot path: one check per produce request, no ZooKeeper read). Any other claim —
a new leader's first request, a deposed leader, a rogue client — reads ZooKeeper afresh
(``lookup`` syncs first, so a write another client just made is seen) and is judged
against that. The cache is only a shortcut: every claim that differs from it is re-read,
so a deleted and re-created queue (its epoch back to 0) is judged right too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ordq.errors import EpochNotIssued, FencedError


def judge(queue: str, claimed: int, current: int) -> None:
    """Refuse ``claimed`` unless it is ``current``: lower is a deposed leader (FencedError),
    higher was never issued (EpochNotIssued)."""
    if claimed < current:
        raise FencedError(queue, claimed, current)
    if claimed > current:
        raise EpochNotIssued(queue, claimed, current)


class EpochGate:
    def __init__(self, lookup: Callable[[str], int]) -> None:
        """``lookup(queue)``: the queue's producer epoch in ZooKeeper, read fresh."""
        self._lookup = lookup
        self._known: dict[str, tuple[int, int]] = {}  # queue -> (lookup number, epoch)
        self._lock = threading.Lock()
        self.lookups = 0  # ZooKeeper reads started (tests check the hot path makes none)

    def knows(self, queue: str, claimed: int) -> bool:
        """Would ``check`` pass ``claimed`` from the cache alone (no ZooKeeper read)?"""
        known = self._known.get(queue)
        return known is not None and known[1] == claimed

    def check(self, queue: str, claimed: int) -> None:
        known = self._known.get(queue)
        if known is not None and known[1] == claimed:
            return
        with self._lock:
            self.lookups += 1
            number = self.lookups
        current = self._lookup(queue)
        with self._lock:
            # Two lookups in flight: the one started last wins, so a slow, older answer never
            # puts a superseded epoch back on the fast path.
            known = self._known.get(queue)
            if known is None or known[0] < number:
                self._known[queue] = (number, current)
        judge(queue, claimed, current)

    def forget(self, queue: str) -> None:
        with self._lock:
            self._known.pop(queue, None)
