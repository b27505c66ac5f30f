"""A heap that does not go back and forth to the kernel for every large buffer (stop 82).

A broker's hot paths make and drop buffers of tens to hundreds of KiB per batch (a produce
request read, the batches split out of it, a Read answer joined, the TLS records). glibc's
malloc grows the heap with ``brk`` as they come and gives its top back (``trim``) as soon as
they go, so the next one faulted fresh, zeroed pages in again: at a pipelined rate the master
and slave spent a third of their CPU so (bench_e2e, pipelined: master 10-12 → 6-7 µs and slave
6 → 3-4 µs a message with the pad below, 63-71k → 89-96k msgs/s end to end; docs/BENCHMARKS.md,
stop 82).

``pad_heap`` asks glibc (``mallopt(M_TOP_PAD)``) to grow the heap by ``HEAP_PAD_BYTES`` more
than it needs each time and to keep that much free at its top when it trims: the same as
``MALLOC_TOP_PAD_`` in the environment, which an application can set for its own process
(docs/SDK.md). A process keeps up to that much more memory than it uses. Nothing else changes:
no allocation fails that would not have.

Rules: process-wide, so only for ordq's brokers (``ordq broker run``: the processes that move
the bytes), called once at start; the SDK never calls it. Off glibc (no ``mallopt``) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

HEAP_PAD_BYTES = 16 << 20
_M_TOP_PAD = -2  # glibc's malloc.h


def pad_heap(pad_bytes: int = HEAP_PAD_BYTES) -> bool:
    """Ask the C library to keep ``pad_bytes`` at the heap's top; True when it took it."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_TOP_PAD, pad_bytes))
