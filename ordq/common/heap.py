"""A heap that does not go back and forth to the kernel for every large buffer (stop 82), and
still gives its free memory back (stop 83).

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
process makes up to eight per core; ``malloc_trim`` gives back only the main arena's top. With
glibc's many arenas a broker kept +10 MiB after a reader's attack on its memory budget (the
test in tests/test_protect.py); with one, +2-4 MiB, as without the pad. One arena costs nothing
measurable here: Python's small objects never reach malloc, and the pipelined rate was level
(docs/BENCHMARKS.md, stop 83).

``trim_heap_every`` gives the heap's free memory, the pad included, back to the kernel every
``TRIM_INTERVAL_S`` from a thread of its own: a busy broker faults the pad in again (a few ms
every interval), an idle one holds what it uses.

Rules: process-wide, so only for ordq's brokers (``ordq broker run``: the processes that move
the bytes), called once at start before their threads; the SDK never calls them. Off glibc
(no ``mallopt``) they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

HEAP_PAD_BYTES = 16 << 20
TRIM_INTERVAL_S = 2.0
_M_TOP_PAD = -2  # glibc's malloc.h
_M_ARENA_MAX = -8


def _libc_function(name: str, argtypes: tuple[Any, ...]) -> Any:
    """The C library's ``name`` returning an int, or None where there is none (not glibc)."""
    lib = ctypes.util.find_library("c")
    if lib is None:
        return None
    try:
        function = getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


def pad_heap(pad_bytes: int = HEAP_PAD_BYTES) -> bool:
    """One heap for all threads, with ``pad_bytes`` kept at its top; True when glibc took both."""
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    return bool(mallopt(_M_ARENA_MAX, 1)) and bool(mallopt(_M_TOP_PAD, pad_bytes))


def trim_heap_every(interval_s: float = TRIM_INTERVAL_S) -> threading.Thread | None:
    """A daemon thread giving the heap's free memory back every ``interval_s``; None off glibc."""
    malloc_trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    if malloc_trim is None:
        return None
    never = threading.Event()

    def trim() -> None:
        while not never.wait(interval_s):
            malloc_trim(0)  # ctypes lets the GIL go for the call

    thread = threading.Thread(target=trim, name="heap-trim", daemon=True)
    thread.start()
    return thread
