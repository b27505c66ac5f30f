"""ordq.common.loop.Signal: a broadcast wake-up that loses none, and wakes the waiters that
asked to go first before the others (issue 39: the master's produce acks before its Read
answers, which cost the loop far more, when one LAC move wakes both)."""

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


@pytest.mark.parametrize("urgent_at", [0, 3, 7])
def test_a_fire_wakes_the_first_waiters_before_the_others(loop_thread: LoopThread, urgent_at: int) -> None:
    """Eight waiters, one of them urgent (registered at ``urgent_at``): after one fire it runs
    before every other one, wherever it queued; all eight wake."""
    signal = Signal(loop_thread)

    async def scenario() -> list[str]:
        woke: list[str] = []

        async def waiter(name: str, first: bool) -> None:
            await signal.wait(first=first)
            woke.append(name)

        tasks = [asyncio.create_task(waiter("urgent" if i == urgent_at else f"w{i}", i == urgent_at))
                 for i in range(8)]
        await asyncio.sleep(0.01)  # every waiter is waiting
        signal.fire()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return woke

    woke = loop_thread.run(scenario(), 10)
    assert woke[0] == "urgent" and sorted(woke[1:]) == sorted(f"w{i}" for i in range(8) if i != urgent_at), woke


def test_a_fire_from_another_thread_wakes_both_kinds(loop_thread: LoopThread) -> None:
    signal = Signal(loop_thread)

    async def both() -> None:
        await asyncio.gather(signal.wait(first=True), signal.wait(), signal.wait(5.0, first=True))

    fut = asyncio.run_coroutine_threadsafe(both(), loop_thread.loop)
    loop_thread.run(asyncio.sleep(0.01), 5)  # the waiters wait
    signal.fire()  # from this thread: reaches the loop through call_soon
    fut.result(5)


def test_a_timed_out_first_waiter_is_forgotten(loop_thread: LoopThread) -> None:
    signal = Signal(loop_thread)
    loop_thread.run(signal.wait(0.01, first=True), 5)
    assert not signal._first and not signal._waiters
