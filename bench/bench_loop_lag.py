"""What the broker's loop-lag probe (broker_group/loop_lag.py) costs an idle loop, by period.

Usage: .venv/bin/python -m bench.bench_loop_lag [--periods-ms 5,20,50] [--seconds 5]

For each period: the probe alone on a fresh uvloop loop (as in a broker, observing into a
prometheus Histogram child), run ``--seconds``; prints its CPU (this process's, ms a second)
and the loop's voluntary context switches a second (its wake-ups). Nothing else runs on the
loop, so the figures are the probe's own: what an idle broker pays for it.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from prometheus_client import CollectorRegistry, Histogram

from ordq.broker_group.loop_lag import EVERY_S, LAG_BUCKETS, LoopLagProbe
from ordq.common.loop import new_loop


def measure(period_s: float, seconds: float) -> tuple[float, float]:
    """(CPU ms a second, wake-ups a second) of the probe alone at ``period_s``."""
    histogram = Histogram("lag", "the probe's", ["b"], buckets=LAG_BUCKETS, registry=CollectorRegistry()).labels("b")
    loop = new_loop()
    try:
        probe = LoopLagProbe(loop, histogram, every_s=period_s)
        loop.call_soon(probe.start)
        cpu0, switches0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        loop.run_until_complete(asyncio.sleep(seconds))
        cpu = time.process_time() - cpu0
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches0
        probe.stop()
    finally:
        loop.close()
    return cpu / seconds * 1000, switches / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--periods-ms", default="5,20,50", help="comma-separated probe periods, ms")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long each period runs")
    args = ap.parse_args()
    for ms in (float(p) for p in args.periods_ms.split(",")):
        cpu_ms, wakeups = measure(ms / 1000, args.seconds)
        default = " (the default)" if ms / 1000 == EVERY_S else ""
        print(f"probe every {ms:g} ms{default}: {cpu_ms:.1f} ms of CPU a second, {wakeups:.0f} wake-ups a second")


if __name__ == "__main__":
    main()
