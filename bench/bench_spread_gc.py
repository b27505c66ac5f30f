"""The heads' spread pass over a leader-like heap, with CPython's garbage collector thresholds
or the leader's (``daemon_gc.young_collections_spaced``, scale43q, issue 43), each with the
collector on during the passes or held (``daemon_gc.collections_held``, as the daemon's pass
runs since scale43r). In process, no I/O: not a test; prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_spread_gc [--queues 100000] [--passes 10] [--rounds 2]

The heap: ``bench_moves_gc.leader_heap`` (a ``QueueEntry`` a queue, its state parsed from JSON),
built under the mode's thresholds, with the state this process created of each kept as the
leader keeps it (``WrittenStates``). A pass: what the leader runs every 2 s at most
(``REBALANCE_INTERVAL_S``) once heads may spread back: ``spread_rows`` over every queue's copy
and ``spread_heads`` planning (a dry run: the heads are even, nothing moves; the rows are made
all the same). Each mode runs in a process of its own, the modes alternated ``--rounds`` times.
Modes: ``default`` and ``spaced`` (the thresholds, the collector on), ``held`` and
``held_spaced`` (the same, each pass with the collector held). Printed per mode: the heap's
build and the passes, each with its thread CPU and the collections during it (count, thread
CPU and the longest, by generation).
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from bench.bench_moves_gc import GROUPS, Collections, drive_modes, leader_heap

MODES = ("default", "spaced", "held", "held_spaced")


def one_mode(mode: str, queues: int, passes: int) -> dict[str, Any]:
    from ordq.coordinator.daemon_gc import collections_held, young_collections_spaced
    from ordq.coordinator.daemon_spread import spread_rows
    from ordq.coordinator.head_spread import spread_heads
    from ordq.coordinator.store_base import WrittenStates

    gc.set_threshold(700, 10, 10)  # CPython's defaults
    seen = Collections()
    gc.callbacks.append(seen)
    held = collections_held if mode.startswith("held") else contextlib.nullcontext
    with young_collections_spaced() if mode.endswith("spaced") else contextlib.nullcontext():
        started = time.thread_time()
        entries = leader_heap(queues)
        written = WrittenStates()
        written.leading(True)
        for q, entry in entries.items():
            written.created(q, entry.state, 0)
        build = {"cpu_s": round(time.thread_time() - started, 2), **seen.figures()}
        seen.reset()
        started = time.thread_time()
        for _ in range(passes):
            with held():
                rows = spread_rows(entries, written.get)
                spread_heads(None, rows or [], frozenset(GROUPS), set(), {}, max_moves=100, dry_run=True)
                del rows
        done = {"cpu_s": round(time.thread_time() - started, 2), **seen.figures()}
    return {"mode": mode, "queues": queues, "passes": passes, "tracked": len(gc.get_objects()), "build": build,
            "passes_took": done}


def main(argv: list[str] | None = None) -> int:
    return drive_modes("bench.bench_spread_gc", __doc__ or "", MODES, one_mode, argv, queues=100_000, passes=10)


if __name__ == "__main__":
    raise SystemExit(main())
