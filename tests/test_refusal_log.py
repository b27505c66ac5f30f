"""Which refused calls reach the coordinator's log (coordinator/refusal_log.py): pure, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.coordinator.refusal_log import RefusalLog

KINDS = [("Subscribe", "AlreadyExists"), ("Pop", "PermissionDenied"), ("Subscribe", "PermissionDenied")]


@settings(deadline=None)  # pure and fast; at load 25 one example was descheduled for 390 ms
@given(st.integers(1, 5), st.floats(0.1, 2.0),
       st.lists(st.tuples(st.sampled_from(KINDS), st.floats(0.0, 0.5)), max_size=150))
def test_each_kind_writes_at_most_its_lines_per_window_and_loses_no_count(
        lines: int, every_s: float, refusals: list[tuple[tuple[str, str], float]]) -> None:
    """Refusals of several kinds at any rate (time steps of 0-0.5 s): for each kind, at most
    ``lines`` written in each window; the first refusal of a kind after a window ended is
    written; every refusal is either written or told by a later written line, or still held."""
    book = RefusalLog(lines=lines, every_s=every_s)
    now = 0.0
    written: dict[tuple[str, str], list[float]] = {}
    told = {k: 0 for k in KINDS}
    total = {k: 0 for k in KINDS}
    last: dict[tuple[str, str], float] = {}  # the start of the kind's window
    for kind, step in refusals:
        now += step
        total[kind] += 1
        fresh = kind not in last or now - last[kind] >= every_s
        if fresh:
            last[kind] = now
        held = book.admit(kind, now)
        if fresh:
            assert held is not None, "the first refusal of a window was not written"
        if held is not None:
            written.setdefault(kind, []).append(now)
            told[kind] += held
        in_window = [t for t in written.get(kind, []) if t >= last[kind]]
        assert len(in_window) <= lines
    for kind in KINDS:
        still = book._kinds.get(kind, (0.0, 0, 0))[2]
        assert len(written.get(kind, [])) + told[kind] + still == total[kind]


def test_a_flood_of_one_kind_is_a_few_lines_a_second_and_the_next_line_tells_the_rest() -> None:
    book = RefusalLog(lines=2, every_s=1.0)
    kind = ("Subscribe", "AlreadyExists")
    out = [book.admit(kind, i * 0.01) for i in range(100)]  # 100 refusals in one second
    assert out[:2] == [0, 0] and all(x is None for x in out[2:])
    assert book.admit(("Pop", "PermissionDenied"), 0.5) == 0  # another kind has its own lines
    assert book.admit(kind, 1.0) == 98  # the next window's first line tells the 98 held back
    assert book.admit(kind, 1.1) == 0
    with pytest.raises(ConfigError):
        RefusalLog(lines=0)
