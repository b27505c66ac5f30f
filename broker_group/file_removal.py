"""Removing a segment's files without stalling the disk under everyone's syncs (issue 39).

Unlinking a large file frees all of its blocks at once. On a file system mounted with
``discard`` (ext4 on the development VM) the kernel discards them before the unlink returns,
and the device serves little else meanwhile: a 256 MiB segment's unlink took 156-232 ms there
and held a 1 KiB fdatasync of another thread 134-214 ms (bench/bench_removal.py). In
``bench_e2e`` that was two synchronous sends of 151 and 161 ms, one per replica's removal of the
segment every subscription had read (docs/BENCHMARKS.md, stop 94). Shrinking the file in steps first
spreads that work out: each step frees at most ``STEP_BYTES`` and is followed by a pause at
least as long as the step took, so the device is free for syncs at least half the time and
no sync waits behind more than one step (the same fdatasyncs: at most 5.7-7.0 ms in 6 runs of 7).

Rules: only for a tree nobody needs any more and nobody reads (a folder already renamed aside:
``segments.set_aside``); a crash or a stop in the middle leaves it renamed aside, and the next
start removes it. Runs in the caller's thread, never the event loop's (it sleeps). Symbolic
links are removed, never followed.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

STEP_BYTES = 8 << 20
MIN_PAUSE_S = 0.002


def remove_tree(path: Path, *, stopping: Callable[[], bool] = lambda: False,
                sleep: Callable[[float], None] = time.sleep) -> bool:
    """Remove ``path`` and everything under it, shrinking each file larger than ``STEP_BYTES``
    in steps first. False (``path`` left as it is, partly shrunk) when ``stopping()`` turned
    true on the way."""
    for folder, _dirs, files in os.walk(path):
        for name in files:
            if not shrink(Path(folder) / name, stopping=stopping, sleep=sleep):
                return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def shrink(file: Path, *, stopping: Callable[[], bool], sleep: Callable[[float], None]) -> bool:
    """Truncate ``file`` down to at most ``STEP_BYTES``, one step at a time, each followed by a
    pause at least as long as it took (``MIN_PAUSE_S`` at least); False when ``stopping()``
    turned true on the way. A file that is gone or cannot be opened for writing (a link, a
    folder) is left to ``rmtree``."""
    try:
        fd = os.open(file, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        size = os.fstat(fd).st_size
        while size > STEP_BYTES:
            if stopping():
                return False
            size -= STEP_BYTES
            started = time.monotonic()
            os.ftruncate(fd, size)
            sleep(max(MIN_PAUSE_S, time.monotonic() - started))
    finally:
        os.close(fd)
    return True
