"""``pad_heap`` (ordq/common/heap.py): glibc takes the pad and the one arena: the pad stays at the
heap's top after large buffers go, and a second thread's buffers come from the same heap (no
second pad kept); without a C library to ask it does nothing and says so."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from ordq.common import heap

# In a process of its own (the settings are process-wide): 40 MiB of 64 KiB buffers (below glibc's
# mmap threshold: from the heap) made and dropped in the main thread, then in a new thread; the RSS
# over the start after each. With an arena per thread the thread's heap keeps a pad of its own.
_PROBE = r"""
import threading
from pathlib import Path
from ordq.common import heap

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def churn():
    blocks = [bytearray(64 << 10) for _ in range(640)]
    del blocks

assert heap.pad_heap()
before = rss_mib()
churn()
after_main = rss_mib() - before
t = threading.Thread(target=churn)
t.start()
t.join()
print(f"{after_main:.1f} {rss_mib() - before:.1f}")
"""


def test_the_pad_stays_at_the_top_once_for_every_thread() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
    after_main, after_thread = (float(x) for x in out.stdout.split())
    pad_mib = heap.HEAP_PAD_BYTES / (1 << 20)
    assert after_main >= pad_mib - 2, f"the pad was not kept at the heap's top: +{after_main} MiB"
    assert after_thread <= after_main + 4, f"the thread's buffers kept a second pad: +{after_thread} MiB"


def test_without_a_c_library_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda _name: None)
    assert heap.pad_heap() is False
