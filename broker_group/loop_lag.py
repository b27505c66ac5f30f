"""How late the broker's event loop runs a callback due now: the loop lag (issue 25).

Every handler, the lean links and the acks run on one loop (dataplane.py): a step that holds
it (or a thread that holds the GIL it needs) delays every neighbour's ack by as long. A timer
due every ``every_s`` (20 ms) records how late it ran, into ``ordq_broker_loop_lag_seconds``; a second
with a lag of ``LOG_LAG_S`` or more is logged once, with its count and its longest lag, so a
drill's windows can be read against the broker's log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("ordq.broker")

# The probe's period. Every 5 ms cost an idle broker 15-27 ms of CPU a second (190 wake-ups,
# issue 39; bench/bench_loop_lag.py); every 20 ms, 7.5 ms. A stall of 20 ms or more is always
# seen; a shorter one by chance.
EVERY_S = 0.02
LOG_LAG_S = 0.025  # a lag this long or longer is told in the log (one line per second at most)
# loop lag: ~0-1 ms idle (uvloop's timers have ms resolution), tens of ms when something holds it
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class LoopLagProbe:
    """On ``loop``: a callback every ``every_s``; each run's lateness observed into ``histogram``
    (a prometheus Histogram child). ``start`` and ``stop`` from the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, histogram: Any, every_s: float = EVERY_S) -> None:
        self._loop, self._histogram, self._every_s = loop, histogram, every_s
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.worst_s = 0.0  # the longest lag since start
        self._second = 0  # the whole second the lags below are counted in
        self._second_long, self._second_worst = 0, 0.0

    def start(self) -> None:
        self._schedule(time.monotonic())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, now: float) -> None:
        self._due = now + self._every_s
        self._timer = self._loop.call_later(self._every_s, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        lag = max(0.0, now - self._due)
        self._histogram.observe(lag)
        self.worst_s = max(self.worst_s, lag)
        self._tell(now, lag)
        self._schedule(now)

    def _tell(self, now: float, lag: float) -> None:
        second = int(now)
        if second != self._second:
            if self._second_long:
                log.info("loop lag: %d callbacks %.0f ms or more late in the second before %.3f (wall), the longest "
                         "%.1f ms", self._second_long, LOG_LAG_S * 1000, time.time(), self._second_worst * 1000)
            self._second, self._second_long, self._second_worst = second, 0, 0.0
        if lag >= LOG_LAG_S:
            self._second_long += 1
            self._second_worst = max(self._second_worst, lag)
