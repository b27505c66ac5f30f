"""The split of batches into stream messages (ordq/wire/framing.py), without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ordq.wire.framing import chunks


@given(st.lists(st.integers(min_value=1, max_value=50)), st.integers(min_value=1, max_value=60))
def test_chunks_keep_order_and_stay_within_the_limit_plus_one_batch(sizes: list[int], limit: int) -> None:
    batches = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    out = list(chunks(batches, limit))
    assert [b for c in out for b in c] == batches
    assert all(c for c in out)
    for c in out:
        # Within the limit, or over it only by its last batch (a chunk ends at the first batch past it).
        assert sum(map(len, c[:-1])) <= limit
        assert len(c) == 1 or sum(map(len, c)) <= limit
