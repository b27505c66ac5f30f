"""Modules a short command never uses, imported only if something does use them (issue 42:
``ordq queue list`` ≤ 1 s beside six busy loops, where its time is its CPU three times over).

``import grpc`` ends with ``from grpc import aio``, and grpc's Cython core imports ``asyncio``,
``inspect`` and ``socket``: those and what they load (ssl, subprocess, dis, selectors, ...) were
a third of such a command's instructions, for a process that makes one synchronous call.
``defer`` puts a stand-in in ``sys.modules`` for each: ``import asyncio`` gives the stand-in,
and the first attribute anyone asks of it (``asyncio.run``, ``__path__`` for a submodule)
imports the real module and answers from it, so code that does use them works as before, only
later.

Guarantee: a stand-in answers every attribute as the real module does (importing it first);
a module already imported is left as it is. Not for long-running processes: code that keeps the
stand-in (``from grpc import aio``) reaches the real module through one more lookup per
attribute, and setting an attribute on a stand-in does not reach the real module.

Why not the standard library's ``importlib.util.LazyLoader``: on this Python (3.11) an
``import asyncio`` of a lazy module already in ``sys.modules`` reads its ``__spec__`` (to see
whether it is still initialising), which runs it: tried, every module was loaded at once.

Rules: standard library only; no I/O.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

# What an admin command (ordq/cli.py ``_QUICK_EXIT_MODULES``) loads and never uses: grpc's
# Cython core imports asyncio, inspect and socket, ``import grpc`` imports grpc.aio. Measured
# (``ordq queue list``, instructions of the whole process): 379 M with all four imported, 283 M
# without asyncio and grpc.aio, 31 M less again without inspect (18 M) and socket (14 M).
UNUSED_BY_SYNC_GRPC = ("asyncio", "grpc.aio", "inspect", "socket")

_LOCK = threading.RLock()


class Deferred(types.ModuleType):
    """Stands for the module ``name`` until an attribute is asked of it."""

    def __getattr__(self, attribute: str) -> Any:  # only what the stand-in itself lacks
        return getattr(self.real(), attribute)

    def real(self) -> types.ModuleType:
        """The real module, imported now if it was not yet."""
        name = self.__name__
        with _LOCK:
            found = sys.modules.get(name)
            if found is None or found is self:
                sys.modules.pop(name, None)
                try:
                    found = importlib.import_module(name)
                except BaseException:
                    sys.modules.setdefault(name, self)  # as before: the next use tries again
                    raise
        return found


def defer(names: Iterable[str] = UNUSED_BY_SYNC_GRPC) -> list[str]:
    """A stand-in (``Deferred``) in ``sys.modules`` for each of ``names`` not imported yet;
    the names it put one for."""
    put = []
    with _LOCK:
        for name in names:
            if name not in sys.modules:
                sys.modules[name] = Deferred(name)
                put.append(name)
    return put


def is_deferred(name: str) -> bool:
    """Whether ``name`` is still a stand-in (never used since ``defer``)."""
    return isinstance(sys.modules.get(name), Deferred)
