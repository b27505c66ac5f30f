"""The broker's memory budget (broker_group/budget.py), as pure accounting: no broker, no gRPC."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.broker_group.budget import BudgetConfig, Lease, MemoryBudget, ReadPace
from ordq.broker_group.read_path import token_read_pace
from ordq.broker_group.request_time import RequestTime, RequestTimeConfig, broker_request_time
from ordq.common.errors import ConfigError
from ordq.wire.errors import ResourceExhausted

MiB = 1 << 20


class _Signal:
    """Stands in for the broker's Signal: waiting is sleeping."""

    async def wait(self, timeout_s: float | None = None) -> None:
        await asyncio.sleep(timeout_s or 0)

    def fire(self) -> None:
        pass


def _lease(budget: MemoryBudget, *holders: str) -> Lease:
    signal: Any = _Signal()
    return Lease(budget, signal, holders, "127.0.0.1:1")


def test_readers_on_many_connections_and_tokens_leave_room_for_a_producer() -> None:
    """Issue 25: eight readers, each on its own connection with its own token, filled the
    256 MiB budget with answers (32 MiB each); a producer then waited 5 s, was refused and
    failed over. Answers now leave a quarter of the budget to produce requests."""
    budget = MemoryBudget(BudgetConfig(wait_ms=200, token_answer_bytes=32 * MiB))
    readers = [_lease(budget, f"peer:r{i}", f"token:t{i}") for i in range(8)]
    got = []

    async def run() -> None:
        for r in readers:
            try:
                got.append(await r.acquire(32 * MiB, wait_s=0.05))
            except ResourceExhausted:
                got.append(0)
        producer = _lease(budget, "peer:p", "token:p")
        await producer.admit(16 * MiB, what="produce request")  # no wait, no refusal
        assert producer.bytes == 16 * MiB
        producer.release()

    asyncio.run(run())
    assert sum(got) == 192 * MiB, got  # 256 MiB less the 64 MiB reserve
    assert budget.stats.used_bytes == 192 * MiB
    for r in readers:
        r.release()
    assert budget.stats.used_bytes == 0


def test_the_write_reserve_is_a_quarter_of_the_budget_unless_set() -> None:
    assert BudgetConfig().reserve_bytes == 64 * MiB
    assert BudgetConfig(total_bytes=32 * MiB, holder_bytes=8 * MiB).reserve_bytes == 8 * MiB
    assert BudgetConfig(write_reserve_bytes=0).reserve_bytes == 0
    with pytest.raises(ConfigError):
        BudgetConfig(total_bytes=32 * MiB, holder_bytes=8 * MiB, write_reserve_bytes=32 * MiB)


def test_an_answer_waiting_on_one_holders_share_wakes_only_when_that_holder_releases() -> None:
    """Answers waiting for room used to poll every 50 ms and all woke at every release: on an
    abused broker, 28 calls waiting on the abuser's share woke at each produce request of a
    neighbour (py-spy: a quarter of the loop's time). Now a waiter sleeps until a release by
    what holds it back."""
    budget = MemoryBudget(BudgetConfig(wait_ms=5_000, token_answer_bytes=32 * MiB))

    async def run() -> None:
        full = _lease(budget, "peer:a1", "token:abuser")
        assert await full.acquire(32 * MiB) == 32 * MiB  # the abuser's token share is full
        waiting = asyncio.ensure_future(_lease(budget, "peer:a2", "token:abuser").acquire(MiB))
        await asyncio.sleep(0.05)
        assert not waiting.done() and list(budget._wakers) == ["token:abuser"]
        neighbour = _lease(budget, "peer:n", "token:n")
        for _ in range(50):  # the neighbour's requests come and go: the waiter sleeps on
            await neighbour.admit(64 << 10)
            neighbour.release()
        await asyncio.sleep(0.01)
        assert not waiting.done() and list(budget._wakers) == ["token:abuser"]
        full.release()
        assert await asyncio.wait_for(waiting, 1.0) == MiB

    asyncio.run(run())


# -- the read rate per token (ReadPace) -------------------------------------------------------------


@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 8 * MiB)), min_size=1, max_size=60))
def test_a_token_is_never_granted_more_than_its_burst_plus_its_rate(steps: list[tuple[float, int]]) -> None:
    """However answers of a token arrive, what it is granted by time t is at most
    burst + rate * t plus the one answer that may overrun (granted while not in debt)."""
    rate, burst = 4 * MiB, 8 * MiB
    pace = ReadPace(rate, burst=burst)
    now, granted, biggest = 0.0, 0, 0
    for dt, n in steps:
        now += dt + pace.wait_s(("token:a",), now + dt)  # an answer waits out the debt, then is granted
        assert pace.wait_s(("token:a",), now) == 0
        pace.debit(("peer:x", "token:a"), n, now)
        granted += n
        biggest = max(biggest, n)
        assert granted <= burst + rate * now + biggest + 1e-6 * rate


def test_one_tokens_reads_wait_for_its_rate_while_another_token_and_the_groups_peers_do_not() -> None:
    """Issue 25's noisy neighbour: one token's huge fetches took ~400 MB/s of answers; now at
    64 MiB/s with a 32 MiB bucket, the third 32 MiB answer of a token comes >= 0.5 s after the
    first (the bucket's 32 MiB, then one answer granted while not yet in debt)."""
    budget = MemoryBudget(BudgetConfig(token_answer_bytes=32 * MiB))
    pace = ReadPace(64 * MiB, burst=32 * MiB)
    signal: Any = _Signal()

    def lease(*holders: str) -> Lease:
        return Lease(budget, signal, holders, "127.0.0.1:1", pace)

    async def answer(le: Lease) -> float:
        await le.acquire(32 * MiB)
        le.settle(32 * MiB)
        le.release()
        return time.monotonic()

    async def run() -> None:
        t0 = time.monotonic()
        await answer(lease("peer:a1", "token:a"))
        await answer(lease("peer:a2", "token:a"))  # another connection, same token
        assert budget.stats.paced == 0
        t1 = await answer(lease("peer:a3", "token:a"))
        assert t1 - t0 >= 0.45
        assert budget.stats.paced == 1 and budget.stats.paced_ms >= 450
        await answer(lease("peer:b", "token:b"))  # a neighbour's token: its own bucket
        await answer(lease("peer:slave"))  # the group's own peer (no token): never paced
        await answer(lease("peer:slave"))
        assert budget.stats.paced == 1

    asyncio.run(run())


def test_a_token_alone_is_not_paced_and_is_paced_from_an_empty_bucket_once_another_is_active() -> None:
    """Issue 39: the read rate is work-conserving. A token alone on the broker takes answers
    past its rate and owes nothing for them; once another token is active (a call within the
    request-time contention window) its rate holds, from an empty bucket."""
    rt = RequestTime(RequestTimeConfig(contention_s=0.5))
    pace = ReadPace(4 * MiB, burst=8 * MiB, contended=lambda token, now, _queue: rt.contended(token, now))
    now = 100.0
    for _ in range(100):  # 400 MiB in 1 s, alone: 100x its rate
        rt.seen("token:a", now)
        assert pace.wait_s(("peer:a", "token:a"), now) == 0
        pace.debit(("peer:a", "token:a"), 4 * MiB, now)
        now += 0.01
    rt.seen("token:b", now)  # a neighbour comes
    assert pace.wait_s(("peer:a", "token:a"), now) == 0  # an empty bucket, no debt
    pace.debit(("peer:a", "token:a"), 4 * MiB, now)
    assert pace.wait_s(("peer:a", "token:a"), now) == pytest.approx(1.0, rel=0.05)  # 4 MiB at 4 MiB/s
    assert pace.wait_s(("peer:b", "token:b"), now) == 0  # the neighbour has its own bucket
    assert pace.wait_s(("peer:a", "token:a"), now + 0.6) == 0  # the neighbour quiet: alone again


def test_a_tokens_read_rate_holds_beside_another_token_however_idle_the_loop() -> None:
    """The noisy-neighbour drill, stop 67: the read rate asked ``RequestTime.contended``, which
    also needs the loop busy (the broker's busy share) and the other token within its own
    share. The drill queue's token was over its share and the abuser's answers are built in
    workers, so 4 loops of huge fetches were never paced: 106 MB/s of answers, the master +0.3
    core, the neighbour's ack p99 3 -> 40-70 ms. The rate now asks only whether another token
    is active (``others_active``)."""
    rt = RequestTime(broker_request_time())
    now = 100.0
    rt.charge("token:n", 0.5, now)  # the neighbour: busy, over its 0.2 share; the loop under its busy share
    assert not rt.contended("token:a", now)  # what the rate asked: never paced
    pace = token_read_pace(BudgetConfig(read_rate_bytes=4 * MiB, token_answer_bytes=4 * MiB), rt)
    assert pace is not None
    pace.debit(("peer:a", "token:a"), pace.burst + 4 * MiB, now)  # its bucket (two answers) and 4 MiB more
    assert pace.wait_s(("peer:a", "token:a"), now) == pytest.approx(1.0, rel=0.05)  # 4 MiB owed at 4 MiB/s
    assert not rt.others_active("token:a", now + 0.6)  # the neighbour gone quiet: alone again


def test_an_answer_shorter_than_granted_gives_its_token_the_rest_back() -> None:
    pace = ReadPace(1 * MiB, burst=32 * MiB)
    budget = MemoryBudget(BudgetConfig(token_answer_bytes=32 * MiB))
    le = Lease(budget, _Signal(), ("peer:a", "token:a"), "127.0.0.1:1", pace)  # type: ignore[arg-type]

    async def run() -> None:
        for _ in range(10):  # ten 32 MiB grants that each came out 1 KiB: never in debt
            await le.acquire(32 * MiB)
            le.settle(1024)
            le.release()
        assert pace.wait_s(("token:a",), time.monotonic()) == 0
        assert budget.stats.paced == 0

    asyncio.run(run())


def test_a_tokens_answer_is_at_most_token_answer_bytes_a_peers_up_to_its_share() -> None:
    """A 32 MiB answer held the broker's loop for tens of ms while it was built and handed to
    gRPC, and a neighbour's acks waited behind it: a token's answers are 4 MiB at most (what
    the SDK asks), the group's own peers' (replication, repair) up to their share."""
    budget = MemoryBudget(BudgetConfig())

    async def run() -> None:
        client, peer = _lease(budget, "peer:c", "token:c"), _lease(budget, "peer:slave")
        assert await client.acquire(32 * MiB) == 4 * MiB
        assert await peer.acquire(32 * MiB) == 32 * MiB

    asyncio.run(run())


def test_a_tokens_answer_is_cut_to_contended_answer_bytes_while_another_token_is_active() -> None:
    """The noisy-neighbour drill, stop 68: gRPC takes an answer in one piece on the broker's
    loop (its copy and encryption), and each 4 MiB answer to the abuser held the loop 5-17 ms,
    the neighbour's acks with it. While another token is active a token's answers are
    ``contended_answer_bytes`` (256 KiB) at most; alone, ``token_answer_bytes`` (4 MiB), and
    the group's own peers are never cut."""
    rt = RequestTime(broker_request_time())
    budget = MemoryBudget(BudgetConfig())
    signal: Any = _Signal()

    def lease(*holders: str) -> Lease:
        return Lease(budget, signal, holders, "127.0.0.1:1", None, rt.others_active)

    async def run() -> None:
        client, peer = lease("peer:c", "token:c"), lease("peer:slave")
        rt.seen("token:c", time.monotonic())
        assert await client.acquire(32 * MiB) == 4 * MiB  # alone: whole answers
        client.release()
        rt.seen("token:n", time.monotonic())  # a neighbour's token active
        assert client.answer_bytes() == 256 << 10
        assert await client.acquire(32 * MiB) == 256 << 10
        assert await peer.acquire(32 * MiB) == 32 * MiB  # replication and repair: never cut
        off = MemoryBudget(BudgetConfig(contended_answer_bytes=None))
        assert Lease(off, signal, ("peer:c", "token:c"), "127.0.0.1:1", None, rt.others_active).answer_bytes() \
            == 4 * MiB

    asyncio.run(run())


def test_read_rate_flag_sets_the_rate_and_zero_turns_it_off() -> None:
    import argparse

    from ordq.commands.broker import budget_config

    flags = dict(memory_budget=None, connection_budget=None, write_reserve=None, read_idle=None)
    assert BudgetConfig().read_rate_bytes == 16 * MiB
    assert budget_config(argparse.Namespace(**flags, read_rate=64, tail_read_factor=None)).read_rate_bytes == 64 * MiB
    assert budget_config(argparse.Namespace(**flags, read_rate=0, tail_read_factor=None)).read_rate_bytes is None
    off = budget_config(argparse.Namespace(**flags, read_rate=None, tail_read_factor=0.0))
    assert off.tail_read_factor == 0 and BudgetConfig().tail_read_factor == 2.0
    with pytest.raises(ConfigError, match="tail_read_factor"):
        budget_config(argparse.Namespace(**flags, read_rate=None, tail_read_factor=-1.0))


# -- fresh bytes: a reader keeping up with its queue (ReadPace.fresh, stop 70) ----------------------


@given(st.lists(st.tuples(st.floats(0, 0.2), st.integers(0, 512 << 10), st.integers(1, 4 * MiB),
                          st.sampled_from(["q", "r"])), min_size=1, max_size=80))
def test_a_token_is_granted_at_most_its_rate_plus_its_factor_of_what_was_written(
        steps: list[tuple[float, int, int, str]]) -> None:
    """However writes and answers interleave over two queues, what a contended token is
    granted by time t is at most burst + rate * t, plus per queue tail_burst + factor * its
    writes, plus the one answer that may overrun (granted while not in debt): fresh bytes
    cannot be spent twice, nor minted by reading another queue."""
    rate, burst, factor, tail_burst = 1 * MiB, 512 << 10, 2.0, 1 * MiB
    pace = ReadPace(rate, burst=burst, tail_factor=factor, tail_burst=tail_burst)
    holders = ("peer:a", "token:a")
    now, granted, biggest = 0.0, 0, 0
    written, read = {"q": 0, "r": 0}, set()
    for dt, wrote, n, queue in steps:
        pace.wrote(queue, wrote)
        written[queue] += wrote
        now += dt + pace.wait_s(holders, now + dt, queue)  # the answer waits out the debt
        pace.debit(holders, n, now, queue)  # granted (Lease.acquire) ...
        pace.debit(holders, -pace.fresh("token:a", queue, n, now), now, queue)  # ... settled (Lease.settle)
        granted += n
        biggest = max(biggest, n)
        read.add(queue)
        allowance = sum(tail_burst + factor * written[q] for q in read)
        assert granted <= burst + rate * now + allowance + biggest + 1e-6 * rate


def test_a_reader_keeping_up_with_its_queue_is_not_paced_one_reading_old_data_is() -> None:
    """A consumer of a queue written at 40 MiB/s, beside another tenant, with a read rate of
    16 MiB/s: it reads what was written as it comes and never waits; a second token's first
    read of the same queue's old bytes finds nothing fresh and is paced."""
    pace = ReadPace(16 * MiB, burst=512 << 10, tail_factor=2.0, tail_burst=4 * MiB)
    tail, old = ("peer:c", "token:c"), ("peer:x", "token:x")
    now = 0.0
    assert pace.fresh("token:c", "q", 0, now) == 0  # its first read (an empty answer): from now on
    for _ in range(100):  # 1 s: 400 KiB written every 10 ms, read at once
        now += 0.01
        pace.wrote("q", 400 << 10)
        assert pace.wait_s(tail, now, "q") == 0
        pace.debit(tail, 400 << 10, now, "q")
        pace.debit(tail, -pace.fresh("token:c", "q", 400 << 10, now), now, "q")
    assert pace.wait_s(tail, now, "q") == 0
    for _ in range(3):  # the other token reads 3 MiB of what q held, in 1 MiB answers
        pace.debit(old, 1 * MiB, now, "q")
        pace.debit(old, -pace.fresh("token:x", "q", 1 * MiB, now), now, "q")
    assert pace.wait_s(old, now, "q") == pytest.approx((3 * MiB - (512 << 10)) / (16 * MiB), rel=0.01)
    off = ReadPace(16 * MiB, burst=512 << 10)  # tail_factor 0: nothing is fresh
    off.wrote("q", 8 * MiB)
    assert off.fresh("token:c", "q", 1 * MiB, now) == 0


def test_fresh_bytes_left_unread_are_kept_only_up_to_the_tail_burst() -> None:
    pace = ReadPace(1 * MiB, burst=512 << 10, tail_factor=2.0, tail_burst=4 * MiB)
    assert pace.fresh("token:c", "q", 0, 0.0) == 0
    pace.wrote("q", 100 * MiB)  # the reader paused while 100 MiB were written
    assert pace.fresh("token:c", "q", 64 * MiB, 5.0) == 4 * MiB  # not 200 MiB of unpaced reading
    assert pace.fresh("token:c", "q", 1 * MiB, 5.0) == 0  # taken: not spent twice


def test_a_token_reading_a_queue_is_not_contended_by_a_token_seen_only_on_that_same_queue() -> None:
    """Stop 68's two-token bench: a consumer with a consume-only token of its own, beside its
    own producer's token, was paced and cut as if the producer were another tenant, and drained
    ~10 % slower than with one token. A queue's writer and reader are one application's two ends:
    a token last let use the queue read (``RequestTime.on_queue``) is not another's; a token on
    another queue, or whose queue is not known yet (a call refused at the gate, a call naming
    none), is."""
    rt = RequestTime(broker_request_time())
    now = time.monotonic()  # the lease asks the clock itself
    pace = token_read_pace(BudgetConfig(read_rate_bytes=4 * MiB, token_answer_bytes=4 * MiB), rt)
    assert pace is not None
    reader = ("peer:c", "token:c")
    rt.seen("token:c", now)
    rt.on_queue("token:c", "q")
    rt.seen("token:p", now)  # the producer: active, its queue not known yet
    assert rt.others_active("token:c", now, "q")
    rt.on_queue("token:p", "q")  # its produce requests passed the gate for q
    assert not rt.others_active("token:c", now, "q")  # its own writer: alone
    pace.debit(reader, pace.burst + 4 * MiB, now, "q")
    assert pace.wait_s(reader, now, "q") == 0  # not paced, and no debt made
    budget = MemoryBudget(BudgetConfig())
    lease = Lease(budget, _Signal(), reader, "127.0.0.1:1", None, rt.others_active, "q")  # type: ignore[arg-type]
    assert lease.answer_bytes() == 4 * MiB  # whole answers
    rt.seen("token:n", now)
    rt.on_queue("token:n", "other")  # a neighbour queue's token: another tenant
    assert rt.others_active("token:c", now, "q") and lease.answer_bytes() == 256 << 10
    pace.debit(reader, 4 * MiB, now, "q")
    assert pace.wait_s(reader, now, "q") == pytest.approx(1.0, rel=0.05)  # paced at 4 MiB/s again
    assert rt.others_active("token:c", now)  # a read of no known queue: every other token counts


def test_a_tokens_share_of_request_time_is_not_held_for_a_token_on_its_own_queue() -> None:
    """The request-time share protects other tenants: a producer over its share on a busy loop
    is held while another queue's token keeping to its share is active, not while only its own
    queue's consumer (a token of its own) is."""
    rt = RequestTime(broker_request_time())
    now = 100.0
    rt.seen("token:c", now)
    rt.on_queue("token:c", "q")  # the consumer: keeping to its share
    rt.on_queue("token:p", "q")
    rt.charge("token:p", 0.95, now)  # its producer: the loop busy, over its 0.2 share
    assert not rt.contended("token:p", now) and rt.delay_s("token:p", now) == 0  # no debt made
    rt.seen("token:n", now)
    rt.on_queue("token:n", "other")  # another queue's token
    rt.charge("token:p", 0.5, now)
    assert rt.contended("token:p", now) and rt.delay_s("token:p", now) > 0


def test_a_tokens_paced_answers_wait_in_turn_not_all_woken_at_each_grant() -> None:
    """Stop 70: each of a token's waiting answers slept until the same end of its debt, so
    every grant woke all of them (24 Read streams: ~35 rate checks per answer, each a wake-up
    on the broker's loop). In turn (``Lease.turns``) the first sleeps and the rest wait
    behind it; the rate holds as before."""
    from ordq.common.loop import KeyedLocks

    class Counted(ReadPace):
        checks = 0

        def wait_s(self, holders: Any, now: float, queue: str | None = None) -> float:
            Counted.checks += 1
            return super().wait_s(holders, now, queue)

    def run(turns: KeyedLocks | None) -> tuple[int, int, float]:
        Counted.checks = 0
        budget = MemoryBudget(BudgetConfig())
        pace = Counted(16 * MiB, burst=512 << 10)

        async def stream(i: int) -> int:
            le = Lease(budget, _Signal(), (f"peer:{i}", "token:a"), "127.0.0.1:1", pace,  # type: ignore[arg-type]
                       turns=turns)
            n, end = 0, time.monotonic() + 1.0
            while time.monotonic() < end:
                n += await le.acquire(256 << 10)
                le.settle(256 << 10)
                le.release()
            return n

        async def all_streams() -> tuple[int, float]:
            started = time.monotonic()
            granted = sum(await asyncio.gather(*(stream(i) for i in range(24))))
            return granted, time.monotonic() - started

        granted, took = asyncio.run(all_streams())
        assert turns is None or len(turns) == 0  # nothing left behind
        return Counted.checks, granted, took

    alone_checks, alone_granted, _ = run(None)
    checks, granted, took = run(KeyedLocks())
    answers = granted // (256 << 10)
    assert granted <= (512 << 10) + 16 * MiB * took + 24 * (256 << 10)  # the rate holds
    assert checks <= answers * 15, (checks, answers)
    assert checks * 2 < alone_checks * granted // alone_granted, (checks, alone_checks)


def test_keyed_locks_go_in_turn_and_leave_no_key_behind() -> None:
    from ordq.common.loop import KeyedLocks

    locks, order = KeyedLocks(), []

    async def user(key: str, i: int) -> None:
        async with locks.hold(key):
            order.append((key, i))
            await asyncio.sleep(0.001)

    async def run() -> None:
        await asyncio.gather(*(user("a", i) for i in range(5)), user("b", 0))
        assert len(locks) == 0

    asyncio.run(run())
    assert [i for k, i in order if k == "a"] == [0, 1, 2, 3, 4]
