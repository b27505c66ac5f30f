"""Stage stamps (ordq/common/stages.py): off by default, one line per stamp when on, and the
per-step breakdown of a merged timeline (issue 39's latency breakdown)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common import stages


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
    assert names == ["a", "b"]
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
