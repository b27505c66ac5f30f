"""A ``queue list`` row's readable end and stored count (``queue_list.readable_of``, issue 43:
computed without an ``Extent`` per segment) are what the extents say: ``last_readable_seq``
of them and the sum of their ends, (None, None) when one is unknown. A row's JSON text made at
once (``api.row_texts``) is the text of its dict (``api.queue_row``), and a long listing's
text is what ``--json`` prints of its rows. Pure: no I/O."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ordq.admin.api import queue_row, row_texts
from ordq.admin.queue_list import GroupEnds, list_rows, readable_of
from ordq.coordinator.state import QueueState, Segment, SegStatus
from ordq.output import LONG_LIST, json_items_text, json_text
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

    transport = None  # no group is asked (``open_ends``): every segment of the long listing is sealed

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


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
seqs = st.one_of(st.none(), st.integers(-1, 2**63 - 1))


@given(names, st.lists(names, max_size=3), st.lists(names, max_size=3), segments, st.integers(0, 2**40),
       st.one_of(st.none(), st.lists(names, max_size=3)), seqs, seqs)
def test_a_row_s_text_made_at_once_is_the_text_of_its_dict(
        queue: str, groups: list[str], send: list[str], segs: list[tuple[str, SegStatus, int | None]], epoch: int,
        subs: list[str] | None, last_seq: int | None, stored: int | None) -> None:
    """Any names (escapes, non-ASCII), lists empty or not, numbers or None; the same maker
    twice (its kept list texts)."""
    state = QueueState(queue=queue, groups=tuple(groups), send=tuple(send), producer_epoch=epoch,
                       consume=tuple(_segment(i, gid, status, end) for i, (gid, status, end) in enumerate(segs)))
    encode = json.JSONEncoder(sort_keys=True, default=str).encode  # json_text's of a long list's item
    row_text = row_texts()
    for _ in range(2):
        assert row_text(state, subs, last_seq, stored) == encode(queue_row(state, subs, last_seq, stored))


class _Copy:
    """The coordinator's copy (``known``) and ZooKeeper's part of a listing: every state known,
    every other queue's subscriptions not (read)."""

    def __init__(self, states: dict[str, QueueState]) -> None:
        self.states = states

    def __call__(self, queues: Any) -> dict[str, Any]:
        return {q: (self.states[q], 1, [] if i % 2 else None) for i, q in enumerate(queues)}

    def load_states(self, queues: Any, with_subs: bool = False) -> dict[str, Any]:
        return {q: (self.states[q], 2, ["s"] if with_subs else None) for q in queues}  # the subscriptions it lacks

    def live_members(self, gid: str) -> dict[str, Any]:
        raise AssertionError("no group is asked: every segment is sealed")


def test_a_long_listing_s_text_made_at_once_is_what_json_prints_of_its_rows() -> None:
    """The coordinator's ``queue list --json`` text of more than LONG_LIST queues, row texts at
    once, is byte for byte ``json_text`` of the rows, in the same order."""
    n = LONG_LIST + 7
    states = {f"q-{i:05d}": QueueState(queue=f"q-{i:05d}", groups=GIDS, send=GIDS[i % 3:] + GIDS[:i % 3],
                                       producer_epoch=i % 4, consume=tuple(
                                           _segment(s, GIDS[s % 3], SegStatus.SEALED, s) for s in range(i % 3)))
              for i in range(n)}
    names = sorted(states, reverse=True)  # the order given is kept
    copy = _Copy(states)
    rows, _ = list_rows(copy, _Reader(), names, copy, queue_row)  # type: ignore[arg-type]
    texts, _ = list_rows(copy, _Reader(), names, copy, row_texts())  # type: ignore[arg-type]
    assert [r["queue"] for r in rows] == names
    assert json_items_text(texts) == json_text(rows)


class _Groups:
    """The groups' part of a listing: each group's master answers ``OpenSegments`` with an end of
    every segment asked about (``include``) and of every open one of ``held``; the calls kept."""

    def __init__(self, held: dict[str, list[tuple[str, int]]]) -> None:
        self.held = held
        self.calls: list[tuple[str, list[tuple[str, int]]]] = []
        self.transport = self

    def open_segments(self, address: str, include: Any = ()) -> Any:
        self.calls.append((address, sorted(include)))
        named = sorted(set(self.held.get(address, [])) | set(include))
        return SimpleNamespace(included=True, segments=[
            SimpleNamespace(queue=q, seg=seg, end=SimpleNamespace(end=seg + 1, last_seq=seg)) for q, seg in named])


def test_the_queues_the_copy_lacks_are_asked_again_and_only_those_it_still_lacks_read() -> None:
    """Issue 43: right after a group's failure the leader's copy lacks the queues whose writes
    it has in flight (their watches fired, the answers not back yet); a listing read each from a
    busy ZooKeeper (2.4 s at 10^5 queues). Now the copy is asked again once the others' rows
    are made; only what it still lacks is read. The rows are those of a copy that held every
    state at once, in the order given; a sealing segment first seen in a late state is asked of
    its group then. Failing first: every queue the first answer lacked was read."""
    sealing, open_seg = _segment(0, "g1", SegStatus.SEALING, None), _segment(1, "g2", SegStatus.OPEN, None)
    states = {f"q{i}": QueueState(queue=f"q{i}", groups=("g1", "g2"), send=("g2",), consume=(sealing, open_seg))
              for i in range(6)}
    states["q9"] = QueueState(queue="q9", groups=("g2",), send=("g2",), consume=(open_seg,))
    first_lacks, still_lacks = {"q1", "q2", "q9"}, {"q2"}
    asked: list[list[str]] = []

    def known(queues: Any) -> dict[str, Any]:
        queues = list(queues)
        asked.append(queues)
        lacking = first_lacks if len(asked) == 1 else still_lacks
        return {q: (states[q], 1, []) for q in queues if q not in lacking}

    class _Zk:
        read: list[str] = []

        def live_members(self, gid: str) -> dict[str, Any]:
            return {"master": SimpleNamespace(address=gid)}

        def load_states(self, queues: Any, with_subs: bool = False) -> dict[str, Any]:
            self.read += list(queues)
            return {q: (states[q], 1, [] if with_subs else None) for q in queues}

    names = ["q9", "q5", "q4", "q3", "q2", "q1", "q0"]
    zk = _Zk()
    groups = _Groups({"g2": [(q, 1) for q in states]})
    rows, corrupt = list_rows(zk, groups, names, known, queue_row)  # type: ignore[arg-type]
    assert zk.read == ["q2"] and asked[1] == ["q1", "q2", "q9"] and corrupt == []
    once = _Groups({"g2": [(q, 1) for q in states]})
    expected, _ = list_rows(zk, once, names, lambda qs: {q: (states[q], 1, []) for q in qs}, queue_row)  # type: ignore[arg-type]
    assert rows == expected and [r["queue"] for r in rows] == names
    assert rows[-1]["stored"] == 3 and rows[-1]["last_seq"] == 1  # each segment's end from its group's answer
    # g1 asked about the sealing segments of the states known first, then of q1 and q2 (q9's g2 was asked)
    assert groups.calls == [("g1", [("q0", 0), ("q3", 0), ("q4", 0), ("q5", 0)]), ("g2", []),
                            ("g1", [("q1", 0), ("q2", 0)])], groups.calls


def test_the_handler_s_text_is_json_text_of_its_rows_also_when_queues_went_meanwhile() -> None:
    """``queue list --json``'s text from the coordinator's handler (``admin_verbs``) is byte for
    byte ``json_text`` of its rows: more than LONG_LIST rows made as text at once; LONG_LIST + 3
    names of which 3 were deleted meanwhile (read: gone), a short list's indented layout. The
    text comes apart from the answer's JSON when asked (``TextAnswer``)."""
    import contextlib

    from ordq.admin.api import admin_verbs
    from ordq.coordinator.admin_api import AdminCall, TextAnswer

    n = LONG_LIST + 3
    states = {f"q-{i:05d}": QueueState(queue=f"q-{i:05d}", groups=GIDS, send=GIDS[:1], producer_epoch=i)
              for i in range(n)}
    gone = {"q-00007", "q-00500", "q-01001"}

    class _Store(_Copy):
        def list_queues(self) -> list[str]:
            return list(self.states)

        def load_states(self, queues: Any, with_subs: bool = False) -> dict[str, Any]:
            return {q: (self.states[q], 2, []) for q in queues if q not in gone}

    for lacking, rows_shown in ((set(), n), (gone, n - 3)):
        store = _Store(states)
        verbs = admin_verbs(lambda _s: contextlib.nullcontext(_Reader()),  # type: ignore[arg-type,return-value]
                            known=lambda qs, lacking=lacking: {q: (states[q], 1, []) for q in qs if q not in lacking})
        handle = verbs["queue list"].handler
        plain = handle(AdminCall(store, {"limit": n + 1}, None))
        inside = handle(AdminCall(store, {"limit": n + 1, "rows_as_text": True}, None))
        apart = handle(AdminCall(store, {"limit": n + 1, "rows_as_text": True, "text_apart": True}, None))
        assert len(plain["rows"]) == rows_shown
        assert inside["rows_text"] == json_text(plain["rows"])
        assert isinstance(apart, TextAnswer) and apart.text == inside["rows_text"]
        assert apart.data == {k: v for k, v in inside.items() if k != "rows_text"}


def test_a_listing_s_phases_are_told_in_order_with_what_each_counted() -> None:
    """The line a long listing logs (``Phases``): each phase's seconds in order, then the counts."""
    from ordq.admin.queue_list import Phases

    phases = Phases()
    phases.done("names", names=100_000)
    phases.done("states read", read=1234)
    line = phases.line()
    assert line.startswith("names ") and line.index("names ") < line.index("states read ")
    assert line.endswith("; names 100,000; read 1,234") and phases.total_s >= 0


def test_the_handler_makes_the_rows_with_the_collector_held() -> None:
    """Issue 43: at 10^5 queues a listing's rows are ~100,000 containers alive until its answer,
    and the young collections they triggered took 0.2-0.9 s each in the loaded leader
    (scale43q). The handler makes them with the collector held (``daemon_gc.collections_held``)
    and it is back on after. Failing first: on the old code the copy was asked with it on."""
    import contextlib
    import gc

    from ordq.admin.api import admin_verbs
    from ordq.coordinator.admin_api import AdminCall

    states = {f"q-{i}": QueueState(queue=f"q-{i}", groups=GIDS, send=GIDS[:1]) for i in range(3)}

    class _Store(_Copy):
        def list_queues(self) -> list[str]:
            return list(self.states)

    seen: list[bool] = []

    def known(qs: Any) -> dict[str, Any]:
        seen.append(gc.isenabled())
        return {q: (states[q], 1, []) for q in qs}

    verbs = admin_verbs(lambda _s: contextlib.nullcontext(_Reader()), known=known)  # type: ignore[arg-type,return-value]
    was = gc.isenabled()
    gc.enable()  # (whatever an earlier test of this process left)
    try:
        got = verbs["queue list"].handler(AdminCall(_Store(states), {}, None))
        assert [r["queue"] for r in got["rows"]] == sorted(states)
        assert seen == [False]
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
