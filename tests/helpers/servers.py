"""The lifecycle of a server a test module starts itself (PostgreSQL, MariaDB): started once,
destroyed (stopped and its folder removed) whatever happens. One helper for every such fixture."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar


class Destroyable(Protocol):
    def destroy(self) -> None: ...


S = TypeVar("S", bound=Destroyable)


@contextlib.contextmanager
def running(start: Callable[[], S]) -> Iterator[S]:
    """``with running(PostgresServer.start) as server:``: the server, destroyed on the way out."""
    server = start()
    try:
        yield server
    finally:
        server.destroy()
