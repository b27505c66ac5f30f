"""The broker's loop-lag probe (broker_group/loop_lag.py) on a real event loop: a step that
holds the loop shows as a late callback, logged once for its second."""

from __future__ import annotations

import asyncio
import logging
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
    assert len(lines) == 1 and "1 callbacks" in lines[0], lines
