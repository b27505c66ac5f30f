"""``zk_answer`` (coordinator/zk_answer.py): a kazoo request's failure raised without the reference
cycle kazoo's own ``AsyncResult.get`` makes, which kept every caller's frame (a gRPC handler's
too, and with it its call's stream slot) until a full garbage collection. Pure: kazoo's own
``AsyncResult``, answered by hand, no ZooKeeper."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import AsyncResult

from ordq.coordinator.zk_answer import AnswerResult, zk_answer
from ordq.coordinator.zk_tls import PollHandler


class _Held:
    """What a handler's frame holds (a gRPC call, in the coordinator): freed or not."""


def _result() -> AsyncResult:
    return AsyncResult(SequentialThreadingHandler(), threading.Condition, KazooTimeoutError)


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees anything meanwhile: what a cycle keeps stays kept."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _handler(read: Callable[[AsyncResult], Any], failure: BaseException) -> weakref.ref[_Held]:
    """A handler that holds an object in its frame and reads a record that is not there (the
    failure caught, as ``store_subs._get_json`` catches NoNodeError); a weak reference to what
    its frame held."""
    held = _Held()
    request = _result()
    request.set_exception(failure)
    try:
        read(request)
    except type(failure):
        pass
    return weakref.ref(held)


@pytest.mark.parametrize("failure", [NoNodeError(), ConnectionLoss("connection lost")])
def test_a_failure_raised_keeps_no_frame(no_collector: None, failure: BaseException) -> None:
    """Failing first with kazoo's ``get`` in ``zk_answer``: the handler's object stayed alive."""
    assert _handler(lambda r: zk_answer(r, 1.0), failure)() is None


def test_kazoos_own_get_is_the_cycle(no_collector: None) -> None:
    """Why ``zk_answer`` exists: with ``AsyncResult.get`` the same handler's object outlives it
    (freed only by a collection). If a kazoo upgrade ends this, zk_answer may go."""
    ref = _handler(lambda r: r.get(timeout=1.0), NoNodeError())
    assert ref() is not None
    gc.collect()
    assert ref() is None


def test_the_handlers_results_answer_so_for_kazoos_blocking_calls(no_collector: None) -> None:
    """kazoo's blocking calls (``client.get``, ``exists``, ...) wait through the result's ``get``:
    ordq's handler makes every result an ``AnswerResult``, whose ``get`` is ``zk_answer``'s. Failing
    first: the handler's object stayed alive."""
    handler = PollHandler()
    assert isinstance(handler.async_result(), AnswerResult)

    def read(r: AsyncResult) -> Any:
        answer = handler.async_result()
        answer.set_exception(r.exception)
        return answer.get()

    assert _handler(read, NoNodeError())() is None
    pending = handler.async_result()
    with pytest.raises(KazooTimeoutError):
        pending.get(block=False)  # not answered: at once
    with pytest.raises(KazooTimeoutError):
        pending.get(timeout=0.01)
    pending.set("value")
    assert pending.get() == "value"


def test_the_answer_the_failure_and_the_wait() -> None:
    ok = _result()
    ok.set(("data", "stat"))
    assert zk_answer(ok, 1.0) == ("data", "stat")
    failed = _result()
    failed.set_exception(ConnectionLoss("connection lost"))
    with pytest.raises(ConnectionLoss, match="connection lost"):
        zk_answer(failed, 1.0)
    with pytest.raises(KazooTimeoutError):
        zk_answer(_result(), 0.01)  # no answer: bounded
