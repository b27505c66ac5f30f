"""ordq.common.loop.Signal: a broadcast wake-up that loses none, from the loop or another
thread, and forgets a waiter that timed out."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from ordq.common.loop import LoopThread, Signal


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread("test-signal")
    lt.start()
    yield lt
    lt.stop()


def test_a_fire_from_another_thread_wakes_every_waiter(loop_thread: LoopThread) -> None:
    signal = Signal(loop_thread)

    async def waiters() -> None:
        await asyncio.gather(signal.wait(), signal.wait(), signal.wait(5.0))

    fut = asyncio.run_coroutine_threadsafe(waiters(), loop_thread.loop)
    loop_thread.run(asyncio.sleep(0.01), 5)  # the waiters wait
    signal.fire()  # from this thread: reaches the loop through call_soon
    fut.result(5)


def test_a_timed_out_waiter_is_forgotten(loop_thread: LoopThread) -> None:
    signal = Signal(loop_thread)
    loop_thread.run(signal.wait(0.01), 5)
    assert not signal._waiters
