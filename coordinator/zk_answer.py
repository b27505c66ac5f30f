"""One kazoo request's answer, waited for without the reference cycle kazoo's own ``get`` makes.

kazoo's ``AsyncResult.get`` raises the exception the result keeps, from a frame that holds the
result: result -> exception -> its traceback -> that frame -> result. The cycle holds every frame
the exception passed through and, through theirs, every caller's frame up the stack, until a full
garbage collection. Under a gRPC handler those frames hold the call, and gRPC counts a call
against its connection's ``max_concurrent_streams`` until the call is freed, not until it
is answered. A consumer reads its subscription's settings every few seconds; where none were set
that read is a NoNodeError, caught, and each one kept a stream of the consumer's connection to
the coordinator. The 101st call on it was refused (RST_STREAM, REFUSED_STREAM) ~8 minutes into an
idle consumer's life, and every later one: its heartbeats, its commits (stop 98).

``zk_answer`` raises a copy instead: the result keeps the exception kazoo set, which was never
raised and has no traceback, and nothing the raised copy's traceback holds leads back to it.
``AnswerResult`` is kazoo's result with that ``get``; ordq's kazoo handler (``PollHandler``,
coordinator/zk_tls.py) makes every result one, so kazoo's blocking calls (``client.get``,
``exists``, ``get_children``, ``create``, ...), which wait through ``get``, raise copies too:
an admin call that ZooKeeper refused (``auth revoke`` of a token that is not there, ``auth
list --all`` with none revoked) kept a stream of the admin client's connection the same way
(stop 99).
"""

from __future__ import annotations

import copy
from typing import Any

from kazoo.handlers.threading import AsyncResult, KazooTimeoutError


def zk_answer(request: Any, timeout_s: float | None) -> Any:
    """The value of ``request`` (a kazoo ``*_async`` result) once it is answered, waited for at
    most ``timeout_s`` (KazooTimeoutError then); the exception it was answered with, raised."""
    if not request.wait(timeout_s):
        raise KazooTimeoutError()
    failure = request.exception
    if failure is None:
        return request.value
    raise copy.copy(failure)


class AnswerResult(AsyncResult):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading ``AsyncResult`` whose ``get`` answers as ``zk_answer`` does."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return zk_answer(self, timeout if block else 0)
