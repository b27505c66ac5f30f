"""Which producer epoch a broker lets write or fence a queue: only the one ZooKeeper issued,
and for writes only with the key it was issued with.

A producer leader gets its epoch from the coordinator's Claim (coordinator/service.py), which
bumps the queue's ``producer_epoch`` and stores the SHA-256 of a fresh random key
(``producer_key``) in the same write, and returns the key to that caller only. Without this
gate a broker took any epoch at least its segment's fence, so a hand-made client claiming a
high epoch could write into an open segment and fence the real leader out; without the key, a
second holder of a produce token could write with the current epoch (readable by anyone in
ZooKeeper) and have the real leader's next batch acked over its own.

Cost: the epoch, key hash and the last key seen to hash to it are cached per queue; a claim
equal to them passes with one dict lookup and two compares (the hot path: one check per
produce request, no ZooKeeper read, no hashing). Any other claim — a new leader's first
request, a deposed leader, a rogue client — reads ZooKeeper afresh (``lookup`` syncs first, so
a write another client just made is seen) and is judged against that. The cache is only a
shortcut: every claim that differs from it is re-read, so a deleted and re-created queue (its
epoch back to 0) is judged right too. State from before keys (no ``producer_key``): any key.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable

from ordq.common.errors import EpochNotIssued, FencedError

# lookup(queue) -> the epoch, or (epoch, key hash or None), as ZooKeeper holds them now
Lookup = Callable[[str], "int | tuple[int, str | None]"]


def judge(queue: str, claimed: int, current: int) -> None:
    """Refuse ``claimed`` unless it is ``current``: lower is a deposed leader (FencedError),
    higher was never issued (EpochNotIssued)."""
    if claimed < current:
        raise FencedError(queue, claimed, current)
    if claimed > current:
        raise EpochNotIssued(queue, claimed, current)


def key_matches(key_hash: str | None, key: str) -> bool:
    """Whether ``key`` is the one issued with an epoch whose state keeps ``key_hash``."""
    return key_hash is None or hmac.compare_digest(hashlib.sha256(key.encode()).hexdigest(), key_hash)


class EpochGate:
    def __init__(self, lookup: Lookup) -> None:
        """``lookup(queue)``: the queue's producer epoch (and key hash) in ZooKeeper, read fresh."""
        self._lookup = lookup
        # queue -> (lookup number, epoch, key hash or None, a key verified against that hash or None)
        self._known: dict[str, tuple[int, int, str | None, str | None]] = {}
        self._lock = threading.Lock()
        self.lookups = 0  # ZooKeeper reads started (tests check the hot path makes none)
        self.key_refusals = 0  # writes refused for a missing or wrong key

    def knows(self, queue: str, claimed: int, key: str | None = None) -> bool:
        """Would ``check`` pass ``claimed`` (with ``key``, for a write) from the cache alone?"""
        known = self._known.get(queue)
        return (known is not None and known[1] == claimed
                and (key is None or known[2] is None or known[3] == key))

    def check(self, queue: str, claimed: int, key: str | None = None, *,
              read: Callable[[], tuple[int, str | None]] | None = None) -> None:
        """Refuse ``claimed`` unless it is the issued epoch; with ``key`` (a Produce's
        ``epoch_key``; None: a control call, whose callers the gate of certificates checks)
        unless it is also the key issued with it (EpochNotIssued). ``read``: when the cache
        does not decide, returns (epoch, key hash) as ZooKeeper holds them now, read as
        ``lookup`` would (synced) by a caller that needs other reads in the same round trip."""
        if self.knows(queue, claimed, key):
            return
        known = self._known.get(queue)
        if key is not None and known is not None and known[1] == claimed and key_matches(known[2], key):
            self._verified(queue, known, key)
            return
        with self._lock:
            self.lookups += 1
            number = self.lookups
        found = self._lookup(queue) if read is None else read()
        current, digest = (found, None) if isinstance(found, int) else found
        with self._lock:
            # Two lookups in flight: the one started last wins, so a slow, older answer never
            # puts a superseded epoch back on the fast path.
            known = self._known.get(queue)
            if known is None or known[0] < number:
                keep = known[3] if known is not None and known[1:3] == (current, digest) else None
                self._known[queue] = (number, current, digest, keep)
        judge(queue, claimed, current)
        if key is not None:
            if not key_matches(digest, key):
                with self._lock:
                    self.key_refusals += 1
                raise EpochNotIssued(queue, claimed, current, key_mismatch=True)
            known = self._known.get(queue)
            if known is not None and known[1:3] == (current, digest):
                self._verified(queue, known, key)

    def _verified(self, queue: str, known: tuple[int, int, str | None, str | None], key: str) -> None:
        """Remember ``key`` as the one that hashes to the cached hash: the next check is a compare."""
        with self._lock:
            if self._known.get(queue) == known:
                self._known[queue] = (known[0], known[1], known[2], key)

    def forget(self, queue: str) -> None:
        with self._lock:
            self._known.pop(queue, None)
