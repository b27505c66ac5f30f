"""A dead group's moves planned in process: ``group_moves.plan_moves`` and ``batches`` over the
states of the queues one of 3 groups heads (issue 43: at 10^5 queues ~33,333 fail_overs, planned
in 1.7-2.3 s of wall time in a loaded leader before the first transaction went out; here, its
CPU alone). No I/O, no collector (as the leader plans: ``daemon_gc.collections_held``); not a
test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_plan [--queues 33333] [--runs 5] [--json]

Printed per run: the thread CPU of the plan and its µs per move; the median of the runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from ordq.coordinator import state as sm
from ordq.coordinator.group_moves import batches, plan_moves
from ordq.coordinator.state import Facts
from ordq.coordinator.store_values import StateVersion

GROUPS = ("g1", "g2", "g3")


def rows(count: int) -> list[tuple[str, sm.QueueState, StateVersion, Facts]]:
    """``count`` queues headed by g1 (as created and admitted on 3 live groups), g1 now dead."""
    live = Facts(live_groups=frozenset(GROUPS))
    dead = Facts(live_groups=frozenset(GROUPS[1:]))
    out = []
    for i in range(count):
        st = sm.admit_all(sm.create(f"idle-{i:06d}", GROUPS, incarnation=f"{i:032x}"), live)
        out.append((st.queue, st, StateVersion(1, 0), dead))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", type=int, default=33_333, help="queues the dead group heads")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    planned = rows(args.queues)
    gc.disable()
    runs = []
    for _ in range(args.runs):
        started = time.thread_time()
        parts = batches(plan_moves(planned, set()))
        took = time.thread_time() - started
        runs.append({"cpu_s": round(took, 3), "us_per_move": round(took / args.queues * 1e6, 1),
                     "transactions": len(parts)})
        del parts
    median = statistics.median(r["cpu_s"] for r in runs)
    result = {"queues": args.queues, "runs": runs, "median_cpu_s": median,
              "median_us_per_move": round(median / args.queues * 1e6, 1)}
    if args.json:
        print(json.dumps(result))
        return
    for r in runs:
        print(f"plan of {args.queues} moves: {r['cpu_s']:.3f} s CPU, {r['us_per_move']:.1f} µs a move, "
              f"{r['transactions']} transactions")
    print(f"median {median:.3f} s, {result['median_us_per_move']} µs a move")


if __name__ == "__main__":
    main()
