"""Per-key counts of what is open or waiting (calls of a token, calls in flight), kept as small
as what they count: a key whose count reaches zero is dropped.

Rules: pure; the caller guards the dict (its loop or its lock)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")


def count_up(counts: dict[K, int], key: K) -> int:
    """One more for ``key``; returns its count now."""
    n = counts[key] = counts.get(key, 0) + 1
    return n


def count_down(counts: dict[K, int], key: K) -> None:
    """One fewer for ``key``; at zero (or below: never counted up) it is dropped."""
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
