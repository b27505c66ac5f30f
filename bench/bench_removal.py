"""What removing a segment's file costs the syncs of everyone else on the disk: the file unlinked
at once against shrunk in steps first (broker_group/file_removal.py, as brokers remove the
segments every subscription has read).

Usage: .venv/bin/python -m bench.bench_removal [--mib 256] [--rounds 2] [--dir DIR]

Each round writes a file of ``--mib`` MiB (synced, then 1 s of quiet), then appends 1 KiB and
fdatasyncs it every ``--gap-ms`` in this thread, as a broker's commits at a synchronous send's
cadence, while another thread removes the file: ``unlink`` (what brokers did before stop 94)
or ``steps`` (``remove_tree``). It prints how long the removal took and the fdatasyncs that
overlapped it (p50, p99, max), beside those of the quiet second before. On a file system
mounted with ``discard`` the unlink discards every block before it returns, and the device
serves the syncs late meanwhile; without it both ways are quick.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from bench._cluster import percentile
from ordq.broker_group.file_removal import STEP_BYTES, remove_tree


def one(folder: Path, mode: str, mib: int, gap_s: float) -> str:
    doomed = folder / f"{mode}~removing"
    doomed.mkdir()
    chunk = os.urandom(1 << 20)
    with open(doomed / "segment.log", "wb") as f:
        for _ in range(mib):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    wal = os.open(folder / "wal.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    record = b"x" * 1024
    spans: list[tuple[float, float]] = []

    def sync_until(t_end: float) -> None:
        while time.monotonic() < t_end:
            started = time.monotonic()
            os.write(wal, record)
            os.fdatasync(wal)
            spans.append((started, time.monotonic()))
            time.sleep(gap_s)

    removal: list[float] = []

    def remove() -> None:
        started = time.monotonic()
        if mode == "unlink":
            os.unlink(doomed / "segment.log")
            doomed.rmdir()
        else:
            remove_tree(doomed)
        removal.extend((started, time.monotonic()))

    try:
        sync_until(time.monotonic() + 1.0)  # the quiet second
        quiet = [(e - s) * 1000 for s, e in spans]
        spans.clear()
        remover = threading.Thread(target=remove)
        remover.start()
        while remover.is_alive():
            sync_until(time.monotonic() + 0.05)
        remover.join()
        sync_until(time.monotonic() + 0.2)
    finally:
        os.close(wal)
    r0, r1 = removal
    during = [(e - s) * 1000 for s, e in spans if s < r1 and e > r0]
    return (f"{mode:6s} {mib} MiB: removal {(r1 - r0) * 1000:.0f} ms; fdatasyncs during it {len(during)}: "
            f"p50 {percentile(during, 50):.2f} ms, p99 {percentile(during, 99):.2f}, "
            f"max {percentile(during, 100):.2f} (quiet before: p50 {percentile(quiet, 50):.2f}, "
            f"max {percentile(quiet, 100):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="the removed file's size, MiB (a segment's default)")
    ap.add_argument("--rounds", type=int, default=2, help="unlink and steps, alternated, this many times")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="between one fdatasync's end and the next append")
    ap.add_argument("--dir", default=None, help="where the files go: the disk under test (default: $TMPDIR)")
    args = ap.parse_args()
    print(f"steps of {STEP_BYTES >> 20} MiB, each followed by a pause at least as long as it took")
    with tempfile.TemporaryDirectory(prefix="ordq-bench-removal-", dir=args.dir) as tmp:
        for _ in range(args.rounds):
            for mode in ("unlink", "steps"):
                print(one(Path(tmp), mode, args.mib, args.gap_ms / 1000))


if __name__ == "__main__":
    main()
