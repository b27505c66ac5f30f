"""Freezes of the disk under a drill's cluster (drills/device_stalls.py) and what the
security-control-plane drill's judgement leaves out for them (stop h). Pure, but for one read
of this machine's /proc/diskstats."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ordq.drills import control_plane_judge as judge
from ordq.drills import device_stalls as ds


def run(*steps: tuple[int, int, int]) -> list[ds.DiskSample]:
    """Samples from (µs at, completions so far, in flight)."""
    return [ds.DiskSample(t, done, n) for t, done, n in steps]


def test_a_freeze_is_io_in_flight_with_none_done_for_long_enough() -> None:
    ms = 1000
    samples = run((0, 10, 1), (20 * ms, 12, 1), (40 * ms, 12, 2), (160 * ms, 12, 3), (180 * ms, 40, 0),
                  (200 * ms, 40, 0), (400 * ms, 40, 0),  # idle: nothing in flight, no freeze
                  (420 * ms, 41, 1), (440 * ms, 41, 1), (500 * ms, 42, 1))  # 20 ms: too short
    assert ds.stalls(samples) == [(20 * ms, 180 * ms)]
    assert ds.stalls(samples, min_us=10 * ms) == [(20 * ms, 180 * ms), (420 * ms, 500 * ms)]
    assert ds.stalls(run((0, 1, 1), (50 * ms, 1, 1), (150 * ms, 1, 1))) == [(0, 150 * ms)]  # frozen to the end
    assert ds.stalls([]) == [] and ds.stalls(run((0, 1, 1))) == []


def test_an_idle_stretch_is_nothing_in_flight_and_none_done_for_long_enough() -> None:
    ms = 1000
    samples = run((0, 10, 1), (20 * ms, 12, 0), (40 * ms, 12, 0), (160 * ms, 12, 0), (180 * ms, 13, 0),  # 140 ms
                  (200 * ms, 13, 2), (400 * ms, 13, 2),  # frozen, not idle
                  (420 * ms, 14, 0), (500 * ms, 14, 0),  # 80 ms: too short
                  (520 * ms, 15, 0), (600 * ms, 15, 0), (700 * ms, 15, 0))  # idle to the end
    assert ds.idle(samples) == [(20 * ms, 160 * ms), (520 * ms, 700 * ms)]
    assert ds.idle(samples, min_us=50 * ms) == [(20 * ms, 160 * ms), (420 * ms, 500 * ms), (520 * ms, 700 * ms)]
    assert ds.idle([]) == [] and ds.idle(run((0, 1, 0))) == []


def test_samples_in_flight_during_a_freeze_are_left_out() -> None:
    frozen = [(1_000_000, 1_400_000)]
    samples = [(900_000, 50.0), (950_000, 60.0), (1_200_000, 250.0), (1_500_000, 5.0), (100, 10.0)]
    kept, n = ds.outside(samples, frozen)
    assert kept == [(900_000, 50.0), (1_500_000, 5.0), (100, 10.0)] and n == 2  # 950 ms + 60 ms reaches it
    assert ds.per_window(frozen, [(0, 1_000_000), (1_000_000, 2_000_000)]) == 1
    assert ds.per_window(frozen, [(0, 1_000_000)]) == 0


@given(st.lists(st.tuples(st.integers(0, 10**7), st.floats(0, 1000)), max_size=50),
       st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**6)), max_size=5))
def test_what_is_kept_overlaps_no_freeze_and_nothing_else_is_dropped(
        samples: list[tuple[int, float]], spans: list[tuple[int, int]]) -> None:
    frozen = [(a, a + d) for a, d in spans]
    kept, n = ds.outside(samples, frozen)
    assert n == len(samples) - len(kept)
    for at, ms in kept:
        assert all(at + ms * 1000 < a or at > b for a, b in frozen)
    assert all(s in kept for s in samples if not any(s[0] <= b and s[0] + s[1] * 1000 >= a for a, b in frozen))


def test_a_frozen_attack_window_is_judged_without_its_freeze() -> None:
    """Stop h's runs: one freeze of the disk in one attack window set its p99 (an idle control
    window with a freeze was 7.9x its quiet one). Left out of both sides, the windows are judged
    on what the attack did: here nothing."""
    ms = 1000  # µs
    windows = [(0, 100 * ms, 200 * ms), (200 * ms, 300 * ms, 400 * ms), (400 * ms, 500 * ms, 600 * ms),
               (600 * ms, 700 * ms, 800 * ms)]
    frozen = [(300 * ms, 330 * ms), (700 * ms, 730 * ms)]  # in attack windows 2 and 4
    samples = [(t * ms, 300.0 if any(a <= t * ms < b for a, b in frozen) else 10.0) for t in range(800)]
    assert statistics.median(judge.window_ratios(samples, windows, [0, 1, 2, 3])) > judge.LATENCY_RATIO
    kept, n = ds.outside(samples, frozen)
    assert n == 2 * 41  # sent from 10 ms before it (still in flight) to its end, both ends counted
    assert judge.window_ratios(kept, windows, [0, 1, 2, 3]) == [1.0] * 4


def test_the_disk_under_a_folder_is_read() -> None:
    device = ds.device_of(Path(__file__).parent)
    if device is None:  # not on a block device here (tmpfs, overlay): nothing to read
        assert ds.device_of(Path("/proc")) is None
        return
    first = ds.read(device)
    assert first is not None and first.done >= 0 and first.in_flight >= 0
    assert ds.read("no-such-device") is None


def test_the_drills_verdict_leaves_a_freeze_out_of_both_sides_and_tells_it(tmp_path: Path) -> None:
    """check_control_plane on a run whose attack windows 2 and 4 each held a freeze of the disk
    (its acks 300 ms), the attack itself costing nothing: every latency rule passes, and the
    freezes are told per kind of window; unwatched (as before stop h), the same run fails."""
    from ordq.drills.audit import AckRow
    from ordq.drills.runner import DrillContext, LoadConfig

    ms = 1000
    windows = [(i * 10_000 * ms, i * 10_000 * ms + 4_000 * ms, (i + 1) * 10_000 * ms) for i in range(4)]
    frozen = [(14_500 * ms, 14_900 * ms), (34_500 * ms, 34_900 * ms)]
    sends = range(0, 40_000 * ms, 2 * ms)  # 500 a second
    acks = [AckRow("p1", i, 0, at + int((300 if any(a <= at < b for a, b in frozen) else 10) * ms), at)
            for i, at in enumerate(sends)]
    commits = [(at, 300.0 if any(a <= at < b for a, b in frozen) else 12.0) for at in range(0, 40_000 * ms, 20 * ms)]

    def verdict(stalls: list[tuple[int, int]] | None) -> tuple[list[tuple[str, bool]], list[str]]:
        ctx = DrillContext(cluster=None, drill=None, round=1, rng=random.Random(0), queue="q",  # type: ignore[arg-type]
                           run_dir=tmp_path, load=LoadConfig())
        ctx.notes.update({"neighbour_windows": windows, "window_variants": ["attack"] * 4, "commit_samples": commits,
                          "device_stalls": stalls, "device": "vda", "neighbour_judgement": "test: cgroups",
                          "device_idle": [(4_500 * ms, 4_800 * ms)]})
        return judge.check_control_plane(ctx, acks, []), [text for _t, text in ctx.events]

    judged, told = verdict(frozen)
    assert all(ok for _what, ok in judged), judged
    assert any("froze 2 times" in t and "quiet 0 in 16 s, attacked 2 in 24 s" in t for t in told), told
    assert any("sat idle under the stream (told, kept) 1 times" in t and "quiet 0 in 16 s, attacked 1 in 24 s" in t
               for t in told), told  # told, and (the verdict passed) not left out
    judged, told = verdict(None)
    assert not all(ok for _what, ok in judged) and any("was not watched" in t for t in told)


def test_the_noisy_neighbour_drills_verdict_leaves_a_freeze_out_the_same_way(tmp_path: Path) -> None:
    """check_neighbour (the security-noisy-neighbour drill) on a run whose abuse windows 2 and 4
    each held a freeze of the disk, the abuse itself costing nothing: it passes, the freezes told
    per kind of window by the same helper as the control-plane drill's; unwatched, it fails."""
    from ordq.drills import neighbour
    from ordq.drills.audit import AckRow
    from ordq.drills.runner import DrillContext, LoadConfig

    ms = 1000
    windows = [(i * 8_000 * ms, i * 8_000 * ms + 3_000 * ms, (i + 1) * 8_000 * ms) for i in range(4)]
    frozen = [(11_500 * ms, 11_900 * ms), (27_500 * ms, 27_900 * ms)]
    acks = [AckRow("p1", i, 0, at + int((300 if any(a <= at < b for a, b in frozen) else 10) * ms), at)
            for i, at in enumerate(range(0, 32_000 * ms, 2 * ms))]

    def verdict(stalls: list[tuple[int, int]] | None) -> tuple[list[tuple[str, bool]], list[str]]:
        ctx = DrillContext(cluster=None, drill=None, round=1, rng=random.Random(0), queue="q",  # type: ignore[arg-type]
                           run_dir=tmp_path, load=LoadConfig())
        ctx.notes.update({"neighbour_windows": windows, "device_stalls": stalls, "device": "vda",
                          "neighbour_judgement": "test: cgroups"})
        return neighbour.check_neighbour(ctx, acks, []), [text for _t, text in ctx.events]

    judged, told = verdict(frozen)
    assert all(ok for _what, ok in judged), judged
    assert any("froze 2 times" in t and "quiet 0 in 12 s, abused 2 in 20 s" in t and "both sides: 412 acks" in t
               for t in told), told
    judged, told = verdict(None)
    assert not all(ok for _what, ok in judged) and any("was not watched" in t for t in told)


def test_the_watch_reads_the_disk_until_stopped() -> None:
    device = ds.device_of(Path(__file__).parent)
    if device is None:
        return
    watch = ds.DiskWatch(device).start()
    time.sleep(0.1)
    frozen, idle = watch.stop()
    assert isinstance(frozen, list) and isinstance(idle, list) and len(watch.samples) >= 2
