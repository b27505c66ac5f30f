"""A heap that does not go back and forth to the kernel for every large buffer (stop 82), in one
arena, so the pad is kept once (stop 83).

A broker's hot paths make and drop buffers of tens to hundreds of KiB per batch (a produce
request read, the batches split out of it, a Read answer joined, the TLS records). glibc's
malloc grows the heap with ``brk`` as they come and gives its top back (``trim``) as soon as
they go, so the next one faulted fresh, zeroed pages in again: at a pipelined rate the master
and slave spent a third of their CPU so (bench_e2e, pipelined: master 10-12 → 6-7 µs and slave
6 → 3-4 µs a message with the pad below, 63-71k → 89-96k msgs/s end to end; docs/BENCHMARKS.md,
stop 82).

``pad_heap`` asks glibc (``mallopt``) to grow the heap by ``HEAP_PAD_BYTES`` more than it needs
each time and to keep that much free at its top when it trims (as ``MALLOC_TOP_PAD_`` in the
environment, which an application can set for its own process: docs/SDK.md), and to keep one
heap (arena) for all threads. glibc keeps the pad at the top of every arena, and a threaded
process makes up to eight per core: with glibc's arenas a master kept +10 MiB after a reader's
attack on its memory budget (the gRPC threads' arenas, each with its pad; tests/test_protect.py
failed on it in CI); with one it is back under its baseline, which holds the one pad. One arena
costs nothing measurable here (Python's small objects never reach malloc; the pipelined rate was
level: docs/BENCHMARKS.md, stop 83).

Not done: a periodic ``malloc_trim``. It holds the arena's lock while it walks the free chunks
and gives their pages back: 27-30 ms on a heap fragmented by churn, 1.5-2.6 ms with nothing new
to give, a stall of every thread that mallocs meanwhile.

Rules: process-wide, so only for ordq's brokers (``ordq broker run``: the processes that move
the bytes), called once at start before their threads; the SDK never calls it. Off glibc (no
``mallopt``) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

HEAP_PAD_BYTES = 16 << 20
_M_TOP_PAD = -2  # glibc's malloc.h
_M_ARENA_MAX = -8


def pad_heap(pad_bytes: int = HEAP_PAD_BYTES) -> bool:
    """One heap for all threads, with ``pad_bytes`` kept at its top; True when glibc took both."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1)) and bool(mallopt(_M_TOP_PAD, pad_bytes))
