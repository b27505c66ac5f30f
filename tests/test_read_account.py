"""A Read stream's bookkeeping kept from one answer to the next (issue 39): its room in the
memory budget (read_path.ReadAccount), one timer for its long polls (loop.Alarm) and one for
its writes' idle bound (loop.StepTimeout), its request-time charges in sums (ChargeSum). The
stream itself runs on a real read path over a segment log on disk, in this process
(bench/bench_read_answers.py); the rest is pure."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from bench.bench_read_answers import QUEUE, stream_bench
from ordq.broker_group.answer import Answer
from ordq.broker_group.budget import BudgetConfig, Lease, MemoryBudget, ReadPace
from ordq.broker_group.dataplane import read_stream
from ordq.broker_group.read_path import ReadAccount
from ordq.broker_group.request_time import ChargeSum
from ordq.common.loop import Alarm, LoopThread, Signal, StepTimeout
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import ResourceExhausted

KiB, MiB = 1 << 10, 1 << 20


def test_a_caught_up_streams_answers_take_no_grant_no_timer_and_no_charge_each() -> None:
    """At 2,000 msgs/s each answer of a consumer's stream took a budget grant (and gave it back
    twice), a timer per long-poll wait, an asyncio.timeout and a request-time charge: the
    largest block of the master's loop after its TLS writes (py-spy, fast39p). A caught-up
    stream now reads each answer within the room it kept, on one timer per stream."""
    with stream_bench() as bench:
        # 200 answers of one 4 KiB batch, each woken once more before its batch is readable
        # (another queue's LAC moved: the signal is the broker's); 1 s long polls, as 1 s streams
        r = bench.shared.loop.run(bench.serve(200, rate=0, messages=4, size=1024, wakes=1, wait_ms=1000), 60)
    assert r["answers"] == 200
    # What a stream (1 s each: one, unless the box starves this test) costs once: a grant, a
    # timer for its writes, one for its long polls (and one more when it rings before the
    # poll under way is due), a charge at its end. Before: each answer 1 grant, 3 timers, 1 charge.
    streams = int(r["seconds"]) + 2
    assert r["grants"] * 200 <= streams, r
    assert r["timers"] * 200 <= 3 * streams, r
    assert r["charges"] * 200 <= streams, r
    assert r["held_bytes"] == 0, "the stream ended: its room is given back"


class _Reader:
    """A Read stream's reader that records each answer's size and takes ``takes`` of them, then
    none (its flow-control window full, as an unread stream's)."""

    def __init__(self, takes: int) -> None:
        self.sizes: list[int] = []
        self._takes = takes

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer t"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:2"

    async def write(self, wire: bytes) -> None:
        self.sizes.append(len(wire))
        if len(self.sizes) > self._takes:
            await asyncio.Event().wait()  # never taken


def test_a_stream_whose_reader_takes_nothing_is_closed_after_idle_ms() -> None:
    """The idle bound on a stream's writes (one timer for all of them now): the reader's
    window never takes the answer, and the stream ends with ResourceExhausted, counted, its
    room given back."""

    with stream_bench(BudgetConfig(idle_ms=300)) as bench:
        bench.shared.loop.run(_on_loop(bench.add_batch, 4, 1024))
        req = pb.FetchRequest(queue=QUEUE, seg=0, offset=0, max_bytes=MiB, max_wait_ms=50, known_end=-1,
                              stream_ms=10_000)
        t0 = time.monotonic()
        with pytest.raises(ResourceExhausted, match="took no answer"):
            bench.shared.loop.run(read_stream(bench.parts, req, _Reader(takes=0)), 10)
        took = time.monotonic() - t0
        assert 0.25 <= took < 5, took
        assert bench.read.budget.stats.idle_closed == 1
        assert bench.read.budget.stats.used_bytes == 0


async def _on_loop(fn: Any, *args: Any) -> None:
    fn(*args)


# -- the stream's room in the memory budget (pure) ----------------------------------------------


class _Signal:
    def fire(self) -> None:
        pass


class _NoAlarm:
    def close(self) -> None:
        pass


def _answer(nbytes: int, end_offset: int) -> Answer:
    return Answer(wire=b"", batches=1, batch_bytes=nbytes, end_offset=end_offset, readable_end=end_offset,
                  sealed=False)


def test_a_stream_keeps_64_kib_between_answers_and_the_budget_still_bounds_what_it_holds() -> None:
    cfg = BudgetConfig(total_bytes=8 * MiB, holder_bytes=MiB, write_reserve_bytes=0, token_answer_bytes=512 * KiB)
    budget = MemoryBudget(cfg)
    pace = ReadPace(4 * MiB, burst=MiB)  # always paced (no contention rule): 4 MiB/s, a 1 MiB bucket
    charged: list[float] = []

    def account(peer: str) -> ReadAccount:
        lease = Lease(budget, _Signal(), (peer, "token:a"), "127.0.0.1:1", pace)  # type: ignore[arg-type]
        return ReadAccount(lease, _NoAlarm(), ChargeSum(charged.append), cfg.min_grant_bytes)  # type: ignore[arg-type]

    async def run() -> None:
        a = account("peer:a")
        # the first answer is granted (up to the token's 512 KiB), then keeps 64 KiB
        assert await a.room(4 * MiB, None) == 512 * KiB
        a.answered(_answer(4 * KiB, 1), 1, 4e-6)
        a.sent()
        assert (budget.stats.grants, budget.stats.used_bytes) == (1, 64 * KiB)
        # caught up: each answer read within the room kept, no grant, the read rate charged
        # every answer's bytes (17 of 60 KiB empty the 1 MiB bucket: the next ones wait)
        for i in range(20):
            assert await a.room(4 * MiB, None) == 64 * KiB
            a.answered(_answer(60 * KiB, 2 + i), 2 + i, 60e-6)
            a.sent()
        assert (budget.stats.grants, budget.stats.used_bytes) == (1, 64 * KiB)
        assert budget.stats.paced >= 1, "the read rate is asked before every answer"
        # behind (the last answer stopped short of the readable end): granted again, and one
        # batch past the grant is charged, then given back down to the room kept once sent
        a.answered(_answer(60 * KiB, 30), 40, 60e-6)
        assert await a.room(4 * MiB, None) == 512 * KiB
        assert budget.stats.grants == 2
        a.answered(_answer(600 * KiB, 35), 40, 600e-6)
        assert budget.stats.used_bytes == 600 * KiB
        a.sent()
        assert budget.stats.used_bytes == 64 * KiB
        # another connection of the same token: the token's share (1 MiB) still bounds both
        b = account("peer:b")
        assert await b.room(4 * MiB, None) == 512 * KiB
        c = account("peer:c")
        assert await c.room(4 * MiB, None) == MiB - 64 * KiB - 512 * KiB
        assert budget.held("token:a") == MiB
        for x in (a, b, c):
            x.close()
        assert budget.stats.used_bytes == 0
        # every answer's bytes charged to request time, in sums of 1 ms at least
        assert sum(charged) == pytest.approx(4e-6 + 20 * 60e-6 + 60e-6 + 600e-6)
        assert len(charged) <= 3

    asyncio.run(run())


def test_charges_are_summed_to_the_quantum_and_the_rest_charged_at_the_end() -> None:
    charged: list[float] = []
    owed = ChargeSum(charged.append, quantum_s=0.001)
    for _ in range(1000):
        owed.add(4e-6)  # a 4 KiB answer's bytes
    assert len(charged) == 3 and all(c >= 0.001 for c in charged)
    owed.flush()
    owed.flush()
    assert sum(charged) == pytest.approx(0.004) and len(charged) == 4
    owed.add(0.005)  # one step past the quantum alone: charged at once
    assert charged[-1] == pytest.approx(0.005)


# -- one timer for many waits (loop.Alarm, loop.StepTimeout) ------------------------------------


def test_an_alarm_ends_each_wait_at_its_signal_or_its_own_deadline_with_one_timer() -> None:
    lt = LoopThread("test-alarm")
    lt.start()
    signal = Signal(lt)
    alarm = Alarm()

    async def run() -> None:
        t0 = time.monotonic()
        # a wait ended by the signal, long before its deadline
        lt.loop.call_later(0.01, signal.fire)
        await alarm.wait(t0 + 0.1, signal)
        assert time.monotonic() - t0 < 0.09
        # the next waits come at once, each with a later deadline: the one timer serves them
        for _ in range(50):
            lt.loop.call_soon(signal.fire)
            await alarm.wait(time.monotonic() + 0.1, signal)
        assert alarm.timers <= 2  # (2: the box stalled 0.1 s meanwhile)
        # a wait nobody signals ends at its own deadline, not the earlier one the timer rang for
        t1 = time.monotonic()
        await alarm.wait(t1 + 0.2, signal)
        assert 0.19 <= time.monotonic() - t1 < 1.0
        assert alarm.timers <= 4  # armed again for it (and once more if uvloop's ms timer rang early)
        # an earlier deadline than the timer's: armed again for it
        t2 = time.monotonic()
        lt.loop.call_later(0.01, signal.fire)
        await alarm.wait(t2 + 5.0, signal)
        await alarm.wait(time.monotonic() + 0.05, signal)
        assert time.monotonic() - t2 < 1.0
        alarm.close()

    try:
        lt.run(run(), 10)
    finally:
        lt.stop()


def test_a_step_timeout_bounds_each_step_with_one_timer_and_passes_other_cancellations_on() -> None:
    async def run() -> None:
        step = StepTimeout(0.1)
        for _ in range(100):  # quick steps: one timer
            async with step:
                await asyncio.sleep(0)
        assert step.timers <= 2  # (2: the box stalled 0.1 s meanwhile)
        await asyncio.sleep(0.15)  # it rang between steps: left unarmed
        async with step:  # armed again here, for 0.1 s from now
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # it rings 0.05 s into this step: armed for the step's own end
            async with step:
                await asyncio.sleep(5)
        assert 0.09 <= time.monotonic() - t0 < 1.0
        async with step:  # usable again after a timeout
            await asyncio.sleep(0)
        # a cancellation that is not the timeout's stays a cancellation
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.01, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            async with step:
                await asyncio.sleep(5)
        task.uncancel()
        step.close()
        assert step.timers <= 6

    asyncio.run(run())


def _stream_sizes(takes: int) -> list[int]:
    """The answers' sizes of one token's Read stream from the start of a 12 MiB log, its reader
    taking ``takes`` of them, the stream then cut by its idle bound."""
    with stream_bench(BudgetConfig(idle_ms=300)) as bench:
        for _ in range(96):  # 128 KiB batches
            bench.shared.loop.run(_on_loop(bench.add_batch, 128, 1000))
        req = pb.FetchRequest(queue=QUEUE, seg=0, offset=0, max_bytes=(1 << 32) - 1, max_wait_ms=50,
                              known_end=-1, stream_ms=10_000)
        reader = _Reader(takes)
        with pytest.raises(ResourceExhausted, match="took no answer"):
            bench.shared.loop.run(read_stream(bench.parts, req, reader), 20)
        assert bench.read.budget.stats.used_bytes == 0
    return reader.sizes


def test_a_read_streams_answers_start_small_and_grow_as_its_reader_takes_them() -> None:
    """One token's 24 Read streams opened at once and never read (the noisy-neighbour drill's
    abuser), alone on their broker, were each built a first answer of 4 MiB
    (token_answer_bytes): ~100 MiB read and copied at once for nobody, on cores a neighbour
    queue on another broker of the machine shared (bench_neighbour_burst's ``other``;
    docs/BENCHMARKS.md, stop 76). A stream's answers now start at FIRST_STREAM_ANSWER_BYTES and
    double with each one its reader takes, up to the token's limit: an unread stream costs
    256 KiB, a reader that keeps taking reaches 4 MiB answers by its fifth."""
    from ordq.broker_group.read_path import FIRST_STREAM_ANSWER_BYTES

    batch = 192 * KiB  # an answer may pass its bound by the one batch that crosses it
    unread = _stream_sizes(takes=0)
    assert unread and max(unread) <= FIRST_STREAM_ANSWER_BYTES + batch, unread
    reading = _stream_sizes(takes=5)  # 0.25 + 0.5 + 1 + 2 + 4 MiB taken, a 4 MiB answer left
    limit = BudgetConfig().token_answer_bytes
    assert len(reading) == 6, reading
    assert reading[0] <= FIRST_STREAM_ANSWER_BYTES + batch, reading
    assert all(b > a for a, b in itertools.pairwise(reading[:5])), reading
    assert all(limit - batch <= n <= limit + batch for n in reading[4:]), reading
