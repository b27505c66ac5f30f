"""The broker's loop-lag probe (broker_group/loop_lag.py) on a real event loop: a step that
holds the loop shows as a late callback, logged once for its second."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from ordq.broker_group.loop_lag import LoopLagProbe


class _Observed:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


def test_a_step_that_holds_the_loop_shows_as_lag_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen = _Observed()

    async def run() -> LoopLagProbe:
        probe = LoopLagProbe(asyncio.get_running_loop(), seen, every_s=0.005)
        probe.start()
        await asyncio.sleep(0.1)
        time.sleep(0.08)  # a step holding the loop for 80 ms
        await asyncio.sleep(1.1)  # the second of the stall ends: its line is written
        probe.stop()
        return probe

    with caplog.at_level(logging.INFO, logger="ordq.broker"):
        probe = asyncio.run(run())
    assert len(seen.values) >= 100  # ~200 a second
    assert probe.worst_s >= 0.07
    assert sorted(seen.values)[len(seen.values) // 2] < 0.02  # the others ran on time
    lines = [r.getMessage() for r in caplog.records if "loop lag" in r.getMessage()]
    # One line a second at most, and the stall's in exactly one. Not "1 callbacks": on a busy
    # machine (the default tier beside its own workers) another callback was 25 ms late in the
    # same second, and the line rightly counted 2 (CI-like run, stop 66).
    seconds = [re.search(r"the second before (\S+)", line) for line in lines]
    assert len({m[1] for m in seconds if m}) == len(lines), lines
    longest = [float(m[1]) for line in lines if (m := re.search(r"the longest ([0-9.]+) ms", line))]
    assert sum(ms >= 70 for ms in longest) == 1, lines
