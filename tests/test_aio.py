"""The asyncio API (sdk/aio.py) on real brokers and ZooKeeper: the same guarantees as the sync
API it wraps, through a failover, and ``send`` stays on the loop unless the window is full; the
producer's I/O runs on the caller's loop and leaves nothing there once closed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ordq.sdk import BatchingConfig, CommitConfig, ConsumerConfig, ProducerConfig
from ordq.sdk.aio import AsyncConsumer, AsyncProducer
from tests.cluster import (  # noqa: F401 - cluster_fixture
    CLIENT_SESSION_TIMEOUT_S,
    SEND_TIMEOUT_S,
    Cluster,
    cluster_fixture,
)

pytestmark = pytest.mark.zk

N = 4000


def test_asyncio_producer_and_consumer_through_a_head_master_kill(cluster: Cluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    threads_used = 0
    to_thread = asyncio.to_thread

    async def counting_to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        nonlocal threads_used
        if getattr(fn, "__name__", "") == "send":
            threads_used += 1
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr("ordq.sdk.aio.asyncio.to_thread", counting_to_thread)
    # A window of one batch: sends outrun the acks, so some must wait for room.
    batching = BatchingConfig(max_batch_bytes=64 << 10, max_inflight_bytes=64 << 10)
    pcfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, batching=batching)
    ccfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, commit=CommitConfig(every_ms=50))

    async def produce() -> list[int]:
        async with AsyncProducer(pcfg) as p:
            acks = []
            for i in range(N):
                if i == N // 2:
                    await asyncio.gather(*acks)  # half acked on the first head, then kill it
                    cluster.head().master.kill()
                acks.append(await p.send(str(i).encode() * 100, key=b"k%d" % (i % 7)))
            results = await asyncio.gather(*acks)
            last = await p.last_committed()
            assert last is not None and last.seq == N - 1
            assert last.message is not None and last.message.payload == str(N - 1).encode() * 100
            return [r.seq for r in results]

    async def consume() -> list[int]:
        seen: list[int] = []
        async with AsyncConsumer(ccfg) as c:
            async for m in c:
                assert m.payload == str(m.seq).encode() * 100 and m.key == b"k%d" % (m.seq % 7)
                seen.append(m.seq)
                if m.seq == N - 1:
                    break
        return seen

    async def main() -> tuple[list[int], list[int]]:
        consumer = asyncio.create_task(consume())
        acked = await produce()
        return acked, await asyncio.wait_for(consumer, timeout=120)

    acked, delivered = asyncio.run(main())
    assert acked == list(range(N))
    assert delivered == list(range(N))  # every seq once, in order, across the failover
    assert 0 < threads_used < N // 2, threads_used  # waited for room sometimes, mostly stayed on the loop


def test_the_asyncio_producer_runs_on_the_callers_loop_and_leaves_nothing_behind(cluster: Cluster) -> None:
    """Issue 39: the AsyncProducer's stream, acks and timers run on the caller's own loop, not on
    a loop thread of the producer's (so an awaited send costs no hand-off between threads). Once
    closed, no task of it is left on that loop. ``io_thread=True`` gives it its own thread, as
    before; both number the same stream on."""
    cluster.add_groups("g1")
    cluster.create_queue()
    pcfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)

    async def produce(io_thread: bool) -> tuple[set[str], list[int]]:
        before = {t.name for t in threading.enumerate()}
        async with AsyncProducer(pcfg, io_thread=io_thread) as p:
            seqs = [(await (await p.send(b"m%d" % i))).seq for i in range(50)]
            started = {t.name for t in threading.enumerate()} - before
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not left, left
        return started, seqs

    started, seqs = asyncio.run(produce(io_thread=False))
    assert "ordq-producer" not in started, started
    assert seqs == list(range(50))
    started, seqs = asyncio.run(produce(io_thread=True))
    assert "ordq-producer" in started, started
    assert seqs == list(range(50, 100))
