"""``pad_heap`` and ``trim_heap_every`` (ordq/common/heap.py): glibc takes the pad and the one
arena, keeps the pad at the heap's top after large buffers go, and the trim thread gives it back;
without a C library to ask they do nothing and say so."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from ordq.common import heap

# In a process of its own (the settings are process-wide): 40 MiB of 64 KiB buffers (below glibc's
# mmap threshold: from the heap) made and dropped in the main thread; the RSS after they go with
# the pad kept, then after the trim thread ran.
_PROBE = r"""
import sys, time
from pathlib import Path
from ordq.common import heap

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

assert heap.pad_heap()
before = rss_mib()
blocks = [bytearray(64 << 10) for _ in range(640)]
del blocks
kept = rss_mib() - before
assert heap.trim_heap_every(0.05) is not None
deadline = time.monotonic() + 10
while rss_mib() - before > 4 and time.monotonic() < deadline:
    time.sleep(0.02)
print(f"{kept:.1f} {rss_mib() - before:.1f}")
"""


def test_the_pad_stays_at_the_top_until_the_trim_thread_gives_it_back() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
    kept, after_trim = (float(x) for x in out.stdout.split())
    assert kept >= heap.HEAP_PAD_BYTES / (1 << 20) - 2, f"the pad was not kept at the heap's top: +{kept} MiB"
    assert after_trim <= 4, f"the trim thread did not give the pad back: +{after_trim} MiB"


def test_without_a_c_library_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda _name: None)
    assert heap.pad_heap() is False
    assert heap.trim_heap_every() is None
