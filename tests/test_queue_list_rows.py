"""A ``queue list`` row's readable end and stored count (``queue_list.readable_of``, issue 43:
computed without an ``Extent`` per segment) are what the extents say: ``last_readable_seq``
of them and the sum of their ends, (None, None) when one is unknown. Pure: no I/O."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ordq.admin.queue_list import GroupEnds, readable_of
from ordq.coordinator.state import QueueState, Segment, SegStatus
from ordq.sdk.replicas import Extent, last_readable_seq

GIDS = ("g1", "g2", "g3")


def _segment(seg: int, gid: str, status: SegStatus, end: int | None) -> Segment:
    if status is not SegStatus.SEALED:
        return Segment(seg, gid, status)
    return Segment(seg, gid, status, end=end, first_seq=None if not end else seg * 10,
                   last_seq=None if not end else seg * 10 + end - 1)


segments = st.lists(st.tuples(st.sampled_from(GIDS), st.sampled_from(list(SegStatus)),
                              st.one_of(st.none(), st.integers(0, 5))), max_size=5)
# per group: no answer, or (named ends of some segments, whether it named all it holds)
answers = st.dictionaries(st.sampled_from(GIDS), st.tuples(st.dictionaries(st.integers(0, 4), st.integers(0, 5)),
                                                           st.booleans()))


class _Reader:
    """A replica's extent of a segment its group's answer did not name (an older broker)."""

    def extent(self, queue: str, s: Segment) -> Extent:
        end = None if s.seg % 3 == 0 else s.seg % 4
        return Extent(s.seg, s.gid, s.status, end, 0, None if not end else 100 + s.seg, "slave")


def _extent(queue: str, s: Segment, ends: dict[str, GroupEnds], reader: _Reader) -> Extent:
    """The extent ``queue list`` showed before readable_of, one segment at a time."""
    if s.status is SegStatus.SEALED:
        return Extent(s.seg, s.gid, s.status, s.end, s.first_seq, s.last_seq, "zookeeper")
    group = ends.get(s.gid)
    if group is None:
        return Extent(s.seg, s.gid, s.status, None, None, None, None)
    end: Any = group.ends.get((queue, s.seg))
    if end is None:
        return (Extent(s.seg, s.gid, s.status, 0, None, None, "master")
                if s.status is SegStatus.OPEN or group.included else reader.extent(queue, s))
    n = int(end.end)
    return Extent(s.seg, s.gid, s.status, n, None, int(end.last_seq) if end.last_seq >= 0 and n > 0 else None, "master")


@given(segments, answers, st.integers(-1, 3))
def test_a_row_s_readable_end_and_stored_count_are_what_its_extents_say(
        segs: list[tuple[str, SegStatus, int | None]], answered: dict[str, tuple[dict[int, int], bool]],
        trimmed: int) -> None:
    state = QueueState(queue="q", groups=GIDS, trimmed_seq=trimmed,
                       consume=tuple(_segment(i, gid, status, end) for i, (gid, status, end) in enumerate(segs)))
    ends = {gid: GroupEnds({("q", seg): SimpleNamespace(end=n, first_seq=0 if n else -1, last_seq=50 + n if n else -1)
                            for seg, n in named.items()}, included)
            for gid, (named, included) in answered.items()}
    extents = [_extent("q", s, ends, _Reader()) for s in state.consume]
    stored = None if any(e.end is None for e in extents) else sum(e.end or 0 for e in extents)
    expected = (last_readable_seq(state, extents), stored)
    assert readable_of(state, ends, _Reader()) == expected  # type: ignore[arg-type]
