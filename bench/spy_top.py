"""Sum a ``py-spy record --format raw`` file (collapsed stacks: ``frame;frame;... count``) into
where the samples went: per thread, the top self frames and the top inclusive frames.

    .venv/bin/python -m bench.spy_top FILE [--top 15] [--active]

``--active``: leave out samples whose innermost frame is a known wait (select, wait,
acquire, sleep, poll): with ``--idle`` py-spy also records threads that wait."""

from __future__ import annotations

import argparse
import collections
import sys

WAITS = ("wait (threading", "select (", "poll (", "acquire", "sleep", "_worker (concurrent", "epoll", "accept (")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--active", action="store_true")
    args = ap.parse_args(argv)
    total = 0
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    with open(args.file) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            if args.active and any(w in frames[-1] for w in WAITS):
                continue
            count = int(n)
            total += count
            threads[frames[0]] += count
            own[frames[-1]] += count
            for frame in set(frames[1:]):
                inclusive[frame] += count
    print(f"{total} samples")
    for title, counter in (("threads", threads), ("self", own), ("inclusive", inclusive)):
        print(f"-- {title}")
        for frame, count in counter.most_common(args.top):
            print(f"{count:7d} {100 * count / max(total, 1):5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
