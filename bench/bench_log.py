"""Micro-benchmark of the segment log: encode, decode, stamp+append+sync, read.

Usage: .venv/bin/python bench/bench_log.py [--messages 200000] [--batch 256] [--payload 1024]
                                           [--repeat 3] [--dir DIR] [--json]

Each figure is the median of ``--repeat`` runs; MB/s counts encoded batch bytes (1 MB = 10^6).
"msgs/s" is wall clock; "msgs/CPU-s" divides by this process's CPU time, which is what a
step costs when the machine is shared (it excludes time spent waiting for the disk or for
other processes). Objects live as long as they would in the system: encoded batches are kept
(the producer holds them until acked), decoded messages are dropped after each batch (the
consumer delivers them and moves on). append+sync writes to a temporary folder under
``--dir`` (default: the system temp folder; use a folder on the disk the broker will use),
with one fdatasync per batch (the worst case of group commit) and one per 8 batches; the
same file is then read back and reopened (the recovery scan checks every batch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ordq.broker_group.log import SegmentLog
from ordq.wire.batch import Message, decode_batch, encode_batch, parse_header, split_batches, stamp_offset


def _median_rate(fn: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """Run fn (returns bytes processed) ``repeat`` times; median wall and CPU seconds, bytes."""
    walls, cpus, size = [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        size = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=256, help="messages per batch")
    ap.add_argument("--payload", type=int, default=1024, help="payload bytes per message")
    ap.add_argument("--key", type=int, default=16, help="key bytes per message (0: no key)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the append+sync log is written")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    n_batches = max(1, args.messages // args.batch)
    n_msgs = n_batches * args.batch
    payload = os.urandom(args.payload)
    batches = [
        [
            Message(
                payload=payload,
                key=(b"%016d" % (b * args.batch + i))[-args.key :] if args.key else None,
                timestamp_us=1_700_000_000_000_000 + i,
            )
            for i in range(args.batch)
        ]
        for b in range(n_batches)
    ]

    def encode() -> int:
        kept = [encode_batch(ms, epoch=1, first_seq=b * args.batch) for b, ms in enumerate(batches)]
        return sum(map(len, kept))

    encoded = [
        stamp_offset(encode_batch(ms, epoch=1, first_seq=b * args.batch), b * args.batch)
        for b, ms in enumerate(batches)
    ]
    total_bytes = sum(map(len, encoded))

    def decode() -> int:
        for raw in encoded:
            decode_batch(raw)
        return total_bytes

    joined = b"".join(encoded)

    def split() -> int:
        split_batches(joined)
        return total_bytes

    def append_sync(per_sync: int) -> Callable[[], int]:
        def run() -> int:
            with tempfile.TemporaryDirectory(prefix="ordq-bench-", dir=args.dir) as d:
                raw0 = encode_batch(batches[0], epoch=1, first_seq=0)
                with SegmentLog.open(Path(d), "bench", 0, create=True) as log:
                    for b in range(n_batches):
                        log.append(stamp_offset(raw0, log.end))
                        if (b + 1) % per_sync == 0:
                            log.sync()
                    log.sync()
                    read_start, read_cpu = time.perf_counter(), time.process_time()
                    offset = 0
                    while offset < log.synced_end:
                        chunk = log.read(offset, max_bytes=1 << 20, upto=log.synced_end)
                        offset += sum(parse_header(raw).count for raw in chunk)
                    reads.append((time.perf_counter() - read_start, time.process_time() - read_cpu))
                open_start, open_cpu = time.perf_counter(), time.process_time()
                with SegmentLog.open(Path(d), "bench", 0) as again:
                    assert again.end == n_msgs and again.recovery.truncated_bytes == 0
                opens.append((time.perf_counter() - open_start, time.process_time() - open_cpu))
            return total_bytes

        return run

    reads: list[tuple[float, float]] = []
    opens: list[tuple[float, float]] = []
    rows = []
    for name, fn in [
        ("encode_batch", encode),
        ("decode_batch", decode),
        ("split_batches (CRC only)", split),
        ("stamp+append+sync, 1 fdatasync per batch", append_sync(1)),
        ("stamp+append+sync, 1 fdatasync per 8 batches", append_sync(8)),
    ]:
        secs, cpu, size = _median_rate(fn, args.repeat)
        rows.append((name, n_msgs / secs, n_msgs / cpu, size / secs / 1e6))
    read_secs = statistics.median(r[0] for r in reads)
    read_cpu = statistics.median(r[1] for r in reads)
    rows.append(
        ("read (1 MiB per call) + parse_header", n_msgs / read_secs, n_msgs / read_cpu, total_bytes / read_secs / 1e6)
    )
    open_secs = statistics.median(r[0] for r in opens)
    open_cpu = statistics.median(r[1] for r in opens)
    rows.append(
        (
            "open: recovery scan (CRC of every batch)",
            n_msgs / open_secs,
            n_msgs / open_cpu,
            total_bytes / open_secs / 1e6,
        )
    )

    if args.json:
        print(
            json.dumps(
                [
                    {"step": r[0], "msgs_per_s": round(r[1]), "msgs_per_cpu_s": round(r[2]), "mb_per_s": round(r[3], 1)}
                    for r in rows
                ]
            )
        )
        return 0
    print(
        f"# {n_msgs} messages, {args.batch} per batch, payload {args.payload} B, key {args.key} B, "
        f"batch {total_bytes // n_batches} B; median of {args.repeat}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print("| step | msgs/s | msgs/CPU-s | MB/s |")
    print("| --- | ---: | ---: | ---: |")
    for name, rate, cpu_rate, mbs in rows:
        print(f"| {name} | {rate:,.0f} | {cpu_rate:,.0f} | {mbs:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
