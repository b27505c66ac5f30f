"""The ``queue list`` handler's own CPU at 10^5 queues (issue 43), without a cluster: the rows
(``ordq.admin.queue_list.list_rows``) and their JSON text (``ordq.output.json_text``, what
``queue list --json`` prints) of synthetic queues, as the elected coordinator builds them from
its copy. Not a test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_list_rows [--queues 100000] [--repeat 3]

The queues: 3 groups, heads spread as ``ordq queue create`` spreads them; g1's are failed over
(a sealing segment on g1 and an open one on the next group), as 15 s after g1's master was
killed; 1 % of the open segments hold messages (named in their group's ``OpenSegments``
answer). Every state is known (the copy holds it), no subscription's; ZooKeeper and the
brokers are stand-ins that answer at once, so what is timed is the handler's Python work only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any

from ordq.admin.api import queue_row, row_texts
from ordq.admin.queue_list import KnownQueue, list_rows
from ordq.coordinator import state as sm
from ordq.coordinator.store_values import LiveInfo, StateVersion
from ordq.output import LONG_LIST, json_items_text, json_text

GROUPS = ("g1", "g2", "g3")


def synthetic_states(n: int) -> dict[str, KnownQueue]:
    """``n`` queues as described in the module doc, by name."""
    live = sm.Facts(live_groups=frozenset(GROUPS))
    without_g1 = sm.Facts(live_groups=frozenset(GROUPS[1:]))
    out: dict[str, KnownQueue] = {}
    for i in range(n):
        q = f"q-{i:06d}"
        st = sm.admit_all(sm.create(q, sm.spread(GROUPS, i), incarnation="0123456789ab"), live)
        head = st.open_segment
        if head is not None and head.gid == "g1":
            st = sm.fail_over(st, "g1", head.seg, without_g1)
        out[q] = (st, StateVersion(3, 0), None)
    return out


class _Store:
    """ZooKeeper's part: the live members of each group, and the subscriptions the copy lacks
    (read only below ``SUBS_READ_LIMIT`` queues: none)."""

    def __init__(self, states: dict[str, KnownQueue]) -> None:
        self.states = states

    def load_states(self, queues: Any, with_subs: bool = False) -> dict[str, Any]:
        return {q: (*self.states[q][:2], [] if with_subs else None) for q in queues}

    def live_members(self, gid: str) -> dict[str, LiveInfo]:
        return {"master": LiveInfo(address=gid, incarnation="x", pid=1)}


class _Reader:
    """The brokers' part: each group's ``OpenSegments`` answer names 1 % of its open segments."""

    def __init__(self, states: dict[str, KnownQueue]) -> None:
        self.named: dict[str, list[Any]] = {g: [] for g in GROUPS}
        for i, (q, (st, _, _)) in enumerate(sorted(states.items())):
            open_seg = st.open_segment
            if open_seg is not None and i % 100 == 0:
                end = SimpleNamespace(end=10, first_seq=0, last_seq=9)
                self.named[open_seg.gid].append(SimpleNamespace(queue=q, seg=open_seg.seg, end=end))
        self.transport = self

    def open_segments(self, address: str, include: Any = ()) -> Any:
        return SimpleNamespace(segments=self.named[address], included=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    states = synthetic_states(args.queues)
    names = sorted(states)
    reader = _Reader(states)
    rows_s, text_s, direct_s = [], [], []
    size = 0
    for _ in range(args.repeat):
        started = time.process_time()
        rows, corrupt = list_rows(_Store(states), reader, names, lambda qs: {q: states[q] for q in qs},  # type: ignore[arg-type]
                                  queue_row)
        built = time.process_time()
        text = json_text(rows)
        rows_s.append(built - started)
        text_s.append(time.process_time() - built)
        assert len(rows) == args.queues and not corrupt
        # what the coordinator does for ``queue list --json`` of more than LONG_LIST queues
        started = time.process_time()
        texts, _ = list_rows(_Store(states), reader, names, lambda qs: {q: states[q] for q in qs},  # type: ignore[arg-type]
                             row_texts())
        direct = json_items_text(texts)
        direct_s.append(time.process_time() - started)
        # (a short list's JSON is indented: the texts at once are a long list's layout only)
        assert direct == text or len(rows) <= LONG_LIST, "the texts made at once differ from the rows' JSON"
        size = len(text)
    print(f"{args.queues} queues, {size / 1e6:.1f} MB of JSON text, {args.repeat} runs (CPU seconds of this process)")
    for what, took in (("rows", rows_s), ("JSON text", text_s),
                       ("handler (rows as dicts, then their JSON)",
                        [r + t for r, t in zip(rows_s, text_s, strict=True)]),
                       ("handler (each row's text at once, row_texts)", direct_s)):
        print(f"{what}: median {statistics.median(took):.3f} s (min {min(took):.3f}, max {max(took):.3f}), "
              f"{args.queues / statistics.median(took):,.0f} rows/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
