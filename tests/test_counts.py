"""Per-key counts drop a key at zero (ordq/common/counts.py), pure."""

from ordq.common.counts import count_down, count_up


def test_a_key_is_kept_while_counted_and_dropped_at_zero() -> None:
    counts: dict[str, int] = {}
    assert count_up(counts, "t") == 1 and count_up(counts, "t") == 2
    count_down(counts, "t")
    assert counts == {"t": 1}
    count_down(counts, "t")
    assert counts == {}
    count_down(counts, "never")  # never counted up: nothing kept
    assert counts == {}
