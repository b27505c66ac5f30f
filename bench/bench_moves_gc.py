"""A dead group's moves over a leader-like heap, with Python's garbage collector on, held off
(``daemon_gc.collections_held``, as the elected coordinator does since scale43p, issue 43), or
held then the young generations collected and the survivors frozen (tried, no gain at 10^5 in a
real leader: docs/BENCHMARKS.md, scale43p). In process, no I/O: not a test; prints numbers
for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_moves_gc [--queues 100001] [--passes 3] [--rounds 2]

The heap: ``--queues`` queues as the daemon's view holds them (a ``QueueEntry`` each, its state
parsed from the JSON ZooKeeper would hold, a config), created on 3 groups with ``state.spread``.
A pass: the rows of the queues g1 heads, their fail_overs planned (``group_moves.plan_moves``) and
cut (``batches``), the new states kept (as the written copies are); then 200,000 small allocations
(what comes after the moves) with the collector as the mode left it. Each mode runs in a process
of its own (a freeze is for good), the modes alternated ``--rounds`` times. Printed per pass: the
pass's thread CPU, the collections during it (count by generation, seconds of thread CPU) and the
collector's seconds over the allocations after; with ``freeze``, the freeze's own seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

MODES = ("on", "held", "freeze")


class Collections:
    """``gc.callbacks`` entry: collections by generation, their thread CPU (in all and by
    generation) and the longest by generation."""

    def __init__(self) -> None:
        self.reset()
        self._started = 0.0

    def reset(self) -> None:
        self.counts, self.seconds = [0, 0, 0], 0.0
        self.by_generation, self.longest = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            g, took = info["generation"], time.thread_time() - self._started
            self.counts[g] += 1
            self.seconds += took
            self.by_generation[g] += took
            self.longest[g] = max(self.longest[g], took)

    def figures(self) -> dict[str, Any]:
        return {"counts": self.counts, "s": [round(s, 3) for s in self.by_generation],
                "longest_s": [round(s, 3) for s in self.longest]}


GROUPS = ("g1", "g2", "g3")


def leader_heap(queues: int) -> dict[str, Any]:
    """``queues`` queues as the leader's view holds them (module doc): queue -> ``QueueEntry``."""
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_view import QueueEntry
    from ordq.coordinator.store_values import QueueConfig, parse_state

    entries: dict[str, Any] = {}
    for k in range(queues):
        st = sm.admit_all(sm.create(f"q{k:06d}", sm.spread(GROUPS, k), incarnation="abcdef0123456789"),
                          sm.Facts(live_groups=frozenset(GROUPS)))
        entries[st.queue] = QueueEntry(state=parse_state(st.queue, json.dumps(st.to_dict()).encode()), version=3,
                                       config=QueueConfig(), stale=set())
    return entries


def one_mode(mode: str, queues: int, passes: int) -> list[dict[str, Any]]:
    from ordq.coordinator import state as sm
    from ordq.coordinator.daemon_gc import collections_held
    from ordq.coordinator.group_moves import batches, plan_moves
    from ordq.coordinator.store_values import StateVersion

    entries = leader_heap(queues)
    gc.collect()
    seen = Collections()
    gc.callbacks.append(seen)
    live = frozenset({"g2", "g3"})
    kept = []
    out = []
    for _ in range(passes):
        def one_pass() -> list[Any]:
            rows = [(q, e.state, StateVersion(e.version, 0), sm.Facts(live_groups=live & set(e.state.groups)))
                    for q, e in entries.items() if e.state is not None and e.state.head == "g1"]
            return batches(plan_moves(rows, set()))

        seen.reset()
        started = time.thread_time()
        if mode == "on":
            parts = one_pass()
        else:
            with collections_held():
                parts = one_pass()
        took = time.thread_time() - started
        during = {"counts": seen.counts, "s": round(seen.seconds, 3)}
        froze = None
        if mode == "freeze":
            started = time.thread_time()
            gc.collect(1)  # what the leader did after its moves in 8738970-0efbe64 (removed: fcb4bdb)
            gc.freeze()
            froze = round(time.thread_time() - started, 3)
        kept.append(parts)
        seen.reset()
        after = [[i] for i in range(200_000)]
        del after
        out.append({"mode": mode, "pass_cpu_s": round(took, 3), "collections_during": during,
                    "freeze_s": froze, "collector_after_s": round(seen.seconds, 3),
                    "tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()})
    return out


def drive_modes(module: str, doc: str, modes: tuple[str, ...], one_mode: Callable[[str, int, int], Any],
                argv: list[str] | None, *, queues: int, passes: int) -> int:
    """The driver of the collector benches: each mode in a child process of its own per round (a heap
    and collector state of its own), one JSON line per result row."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--queues", type=int, default=queues)
    ap.add_argument("--passes", type=int, default=passes)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mode", choices=modes, help="one mode in this process (the driver's child)")
    args = ap.parse_args(argv)
    if args.mode:
        print(json.dumps(one_mode(args.mode, args.queues, args.passes)))
        return 0
    for r in range(args.rounds):
        for mode in modes:
            child = subprocess.run([sys.executable, "-m", module, "--mode", mode, "--queues",
                                    str(args.queues), "--passes", str(args.passes)],
                                   capture_output=True, text=True, check=True)
            rows = json.loads(child.stdout)
            for row in rows if isinstance(rows, list) else [rows]:
                print(json.dumps({"round": r + 1, **row}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return drive_modes("bench.bench_moves_gc", __doc__ or "", MODES, one_mode, argv, queues=100_001, passes=3)


if __name__ == "__main__":
    raise SystemExit(main())
