"""Stage stamps (ordq/common/stages.py): off by default, one line per stamp when on, the
per-step breakdown of a merged timeline (issue 39's latency breakdown); keyed lines written and
read back, each batch followed through its stages by its first seq at any rate, and
garbage-collection pauses paired per process."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common import stages
from ordq.common.stages import Stamp, gc_pauses, keyed_breakdown, parse_line, spans
from ordq.wire.batch import Message, encode_batch, first_seqs


def test_off_by_default_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "_folder", None)
    monkeypatch.chdir(tmp_path)
    stages.stamp("send")
    assert list(tmp_path.iterdir()) == []


def test_a_child_started_with_the_variable_stamps_into_its_own_file(tmp_path: Path) -> None:
    env = {**os.environ, stages.ENV: str(tmp_path)}
    code = "from ordq.common.stages import stamp; stamp('a'); stamp('b')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    (f,) = tmp_path.iterdir()
    names = [line.split()[1] for line in f.read_text().splitlines()]
    assert [n for n in names if not n.startswith("gc.")] == ["a", "b"]  # its collections are stamped too
    times = [t for t, _ in stages.read_stamps(tmp_path)]
    assert times == sorted(times)


def test_breakdown_times_each_step_of_each_round() -> None:
    us = 1000  # ns
    stamps = [(0, "send"), (10 * us, "P.write"), (30 * us, "woke"),   # warm-up round, skipped
              (100 * us, "send"), (110 * us, "P.write"), (150 * us, "woke"),
              (200 * us, "send"), (230 * us, "P.write"), (250 * us, "woke")]
    b = stages.breakdown(stamps, "send", "woke", skip=1)
    assert b.rounds == 2
    assert b.path == ("send", "P.write", "woke") and b.path_rounds == 2
    assert (b.total.count, b.total.p50_us, b.total.p99_us) == (2, 50.0, 50.0)
    steps = {(s.start, s.end): s for s in b.steps}
    assert steps[("send", "P.write")].mean_us == 20.0
    assert steps[("P.write", "woke")].p90_us == 40.0
    assert stages.lines(b)[0].startswith("2 rounds; commonest path (2): send > P.write > woke")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**9), st.sampled_from(["send", "x", "y", "woke"])), max_size=60))
def test_breakdown_accounts_for_every_step_between_stamps(stamps: list[tuple[int, str]]) -> None:
    """However the stamps interleave: each step's count is the number of consecutive pairs
    of a round, no step is negative, and a round's total is at least each of its steps."""
    stamps.sort()
    b = stages.breakdown(stamps, "send", "woke")
    rounds = sum(1 for _, n in stamps if n == "send")
    first = next((i for i, (_, n) in enumerate(stamps) if n == "send"), len(stamps))
    assert sum(s.count for s in b.steps) == len(stamps) - first - rounds
    assert all(s.p50_us >= 0 for s in b.steps)
    assert b.rounds <= rounds


@pytest.fixture
def stamping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Stamps on into tmp_path for this test only (the module's globals restored after)."""
    monkeypatch.setattr(stages, "_folder", None)
    monkeypatch.setattr(stages, "_fd", None)
    monkeypatch.setattr(stages, "_every", 1)
    monkeypatch.delenv(stages.ENV, raising=False)
    monkeypatch.delenv(stages.SAMPLE_ENV, raising=False)
    stages.enable(tmp_path)
    yield tmp_path
    fd = stages._fd
    if fd is not None:
        os.close(fd)
    if stages._on_gc in gc.callbacks:
        gc.callbacks.remove(stages._on_gc)


def test_keys_are_written_and_read_back_with_the_pid(stamping: Path) -> None:
    stages.stamp("P.write", [7, 12])
    stages.stamp("woke")
    stages.stamp("M.request", first_seqs, [encode_batch([Message(b"x", None, (), 1)], epoch=1, first_seq=40)])
    got = [s for s in stages.read_keyed(stamping) if not s.name.startswith("gc.")]
    assert [(s.name, s.keys) for s in got] == [("P.write", (7, 12)), ("woke", ()), ("M.request", (40,))]
    assert {s.pid for s in got} == {int(f.name) for f in stamping.iterdir()}
    # the unkeyed view (bench_stages' breakdown) sees names only
    assert [n for _, n in stages.read_stamps(stamping) if not n.startswith("gc.")] == ["P.write", "woke", "M.request"]


def test_a_stamp_whose_keys_fail_is_still_no_error(stamping: Path) -> None:
    """Keys read from a request before it is checked (M.request): garbage must not raise."""
    stages.stamp("M.request", first_seqs, [b"short"])
    assert stages.on()


def test_off_the_keys_are_never_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "_folder", None)

    def boom(_: object) -> list[int]:
        raise AssertionError("computed while off")

    stages.stamp("M.ack", boom, None)
    assert not stages.on()


def test_collections_are_stamped_while_on(stamping: Path) -> None:
    gc.collect()
    names = [s.name for s in stages.read_keyed(stamping)]
    assert "gc.start" in names and "gc.stop" in names
    assert all(p >= 0 for ps in gc_pauses(stages.read_keyed(stamping)).values() for p in ps)


def test_torn_lines_are_skipped() -> None:
    assert parse_line(1, "12") is None
    assert parse_line(1, "12 P.write 3,") is None
    assert parse_line(1, "x P.write") is None
    assert parse_line(5, "12 P.write 3,4") == Stamp(12, 5, "P.write", (3, 4))


def test_batches_in_flight_together_are_told_apart_by_key() -> None:
    """Two batches overlap (the second opens before the first is acked): each keeps its own
    times, and the slow one makes the tail."""
    path = ["P.open", "M.request", "P.resolved"]
    stamps = [Stamp(0, 1, "P.open", (0,)), Stamp(1_000, 1, "P.open", (5,)),
              Stamp(2_000, 2, "M.request", (0, 5)),
              Stamp(3_000, 1, "P.resolved", (0,)), Stamp(90_000, 1, "P.resolved", (5,))]
    b = keyed_breakdown(stamps, path)
    assert b.batches == 2 and b.tail == 1
    arrivals = {a.stage: a for a in b.arrivals}
    assert arrivals["M.request"].p99_us == 2.0 and arrivals["M.request"].tail_p50_us == 1.0
    assert arrivals["P.resolved"].tail_p50_us == 89.0

    assert b.total.mean_us == 46.0 and b.total.p99_us == 89.0


def test_a_batch_seen_twice_at_a_stage_counts_its_first_arrival() -> None:
    stamps = [Stamp(0, 1, "P.open", (0,)), Stamp(5_000, 2, "M.request", (0,)), Stamp(9_000, 2, "M.request", (0,)),
              Stamp(10_000, 1, "P.resolved", (0,))]
    b = keyed_breakdown(stamps, ["P.open", "M.request", "P.resolved"])
    assert [a.p50_us for a in b.arrivals] == [0.0, 5.0, 10.0]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c"]), st.integers(0, 10**9)), max_size=60))
def test_arrivals_are_never_negative_and_count_only_whole_rounds(rows: list[tuple[int, str, int]]) -> None:
    stamps = sorted((Stamp(ns, 1, name, (key,)) for key, name, ns in rows), key=lambda s: s.ns)
    b = keyed_breakdown(stamps, ["a", "b", "c"])
    firsts: dict[int, dict[str, int]] = {}
    for s in stamps:
        firsts.setdefault(s.keys[0], {}).setdefault(s.name, s.ns)
    whole = [k for k, at in firsts.items() if "a" in at and "c" in at and at["c"] >= at["a"]]
    assert b.batches == len(whole)
    assert 0 <= b.tail <= b.batches
    for a in b.arrivals:
        assert a.count <= b.batches
        if a.stage in ("a", "c"):
            assert a.p50_us >= 0 and a.count == b.batches


def test_gc_pauses_pair_per_process() -> None:
    stamps = [Stamp(0, 1, "gc.start", (0,)), Stamp(10, 2, "gc.start", (2,)), Stamp(3_000, 1, "gc.stop", (0,)),
              Stamp(50_010, 2, "gc.stop", (2,)), Stamp(60_000, 1, "gc.stop", (0,))]
    assert gc_pauses(stamps) == {1: [3.0], 2: [50.0]}


def test_spans_time_one_step_of_each_batch() -> None:
    stamps = [Stamp(0, 2, "M.sync", (0,)), Stamp(100, 2, "M.sync", (9,)), Stamp(700, 2, "M.synced", (0, 9)),
              Stamp(800, 3, "S.sync", (0,))]
    (sync,) = spans(stamps, [("M.sync", "M.synced"), ("S.sync", "S.synced")])
    assert (sync.start, sync.count, sync.p99_us) == ("M.sync", 2, 0.7) and sync.mean_us == pytest.approx(0.65)
    # the consumer's read raced the master's ack: left out, unless signed
    raced = [Stamp(5_000, 3, "C.read", (4,)), Stamp(6_000, 2, "M.ack", (4,)), Stamp(7_000, 2, "M.ack", (5,)),
             Stamp(9_000, 3, "C.read", (5,))]
    assert [s.count for s in spans(raced, [("M.ack", "C.read")])] == [1]
    (both,) = spans(raced, [("M.ack", "C.read")], signed=True)
    assert (both.count, both.mean_us, both.max_us) == (2, 0.5, 2.0)
    assert stages.span_values(raced, "M.ack", "C.read") == [-1.0, 2.0]  # its samples, by first seq


def test_the_step_where_the_tail_fell_behind_comes_first() -> None:
    """Four batches take 1 µs to the master and 3 µs in all; the fifth as long to the master,
    then 90 µs: it lost its time between the master and its ack."""
    stamps = []
    for key, total_us in ((0, 3), (10, 3), (20, 3), (30, 3), (40, 90)):
        t0 = key * 1_000_000
        stamps += [Stamp(t0, 1, "P.open", (key,)), Stamp(t0 + 1_000, 2, "M.request", (key,)),
                   Stamp(t0 + total_us * 1_000, 1, "P.resolved", (key,))]
    b = keyed_breakdown(stamps, ["P.open", "M.request", "P.resolved"])
    assert b.tail == 1
    assert stages.tail_growth(b)[0] == ("M.request", "P.resolved", 87.0)
    assert stages.keyed_lines(b)[-1] == "the tail fell behind the median most at: M.request > P.resolved +87 µs"


def test_one_batch_in_n_is_sampled_the_same_in_every_process() -> None:
    """The pick is the key's alone (every process decides the same), about one in N over
    consecutive first seqs, and batches of any size are picked (no run of seqs is skipped)."""
    for every in (16, 64):
        picked = [k for k in range(200_000) if stages.sampled(k, every)]
        assert abs(len(picked) - 200_000 / every) < 0.05 * 200_000 / every
        assert max(b - a for a, b in zip(picked, picked[1:], strict=False)) < 20 * every
    assert all(stages.sampled(k, 1) for k in range(100))


def test_sampled_stamps_keep_only_the_picked_batches(stamping: Path) -> None:
    stages.enable(stamping, every=64)
    picked = next(k for k in range(1000) if stages.sampled(k, 64))
    other = next(k for k in range(1000) if not stages.sampled(k, 64))
    stages.stamp("P.open", (other,))  # not picked: no line
    stages.stamp("M.request", [other, picked])  # a request holding both: the picked key only
    stages.stamp("P.ack")  # unkeyed: one a batch, so dropped while sampling
    gc.collect()  # the collections' stamps are kept (keyed by generation, not by batch)
    got = [(s.name, s.keys) for s in stages.read_keyed(stamping)]
    assert [g for g in got if not g[0].startswith("gc.")] == [("M.request", (picked,))]
    assert ("gc.start", (2,)) in got


def test_a_child_samples_as_its_parent_asked(tmp_path: Path) -> None:
    env = {**os.environ, stages.ENV: str(tmp_path), stages.SAMPLE_ENV: "64"}
    keys = ([k for k in range(300) if stages.sampled(k, 64)][:2]
            + [k for k in range(300) if not stages.sampled(k, 64)][:3])
    code = f"from ordq.common.stages import stamp\nfor k in {keys}: stamp('P.open', (k,))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert [s.keys[0] for s in stages.read_keyed(tmp_path) if s.name == "P.open"] == keys[:2]

