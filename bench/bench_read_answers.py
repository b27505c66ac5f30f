"""A Read stream's cost per answer on a broker's event loop (issue 39), in one process: a real
read path (broker_group/read_path.py) over a segment log on disk, the stream served by
dataplane.read_stream, as the master serves a caught-up consumer at a steady rate: one batch
made readable at a time, the stream waiting for each. Not a test: prints numbers for
docs/BENCHMARKS.md (tests/test_read_account.py drives the same stream).

    .venv/bin/python -m bench.bench_read_answers [--answers 5000] [--rate 500] [--messages 4] [--size 1024]

The stream's call is a stand-in that takes every answer at once (no gRPC, no TLS: what is
measured is the stream's own bookkeeping, its read and its encoding). The stream shows a
token, as an application's consumer does; it is the only token (not contended), as in
``bench_e2e --token``. Streams are opened again as the SDK's reader does (1 s each,
``--wait-ms`` long polls). ``--wakes N``: another queue's LAC moves N times before each batch
is readable (a neighbour producer's acks; until issue 39's per-segment signal each move woke
every waiting reader of the broker: 0 by default).

Prints, per answer: the loop thread's CPU less the feeder's own (µs: the stream's steps and
what they cost the loop, its wake-ups and timers), the feeder's (the same on every tree: a
batch encoded, appended and fdatasync'ed), timers made on the loop (the stream's and the
feeder's pacing), budget grants and request-time charges.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ordq.broker_group import log as seglog
from ordq.broker_group.budget import BudgetConfig
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.dataplane import read_stream
from ordq.broker_group.read_path import ReadPath
from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.request_time import RequestTime, broker_request_time
from ordq.broker_group.shared import Segment, Shared
from ordq.common import loop as loop_module
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import Message, encode_batch, stamp_offset

QUEUE = "bench"


class _Call:
    """Stands in for a Read call's context (or the lean link's): a token, a peer, and a
    ``write`` that takes the answer at once."""

    def __init__(self, token: str) -> None:
        self.answers = 0
        self.answered = asyncio.Event()
        self._md = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def write(self, _wire: bytes) -> None:
        self.answers += 1
        self.answered.set()


class StreamBench:
    """A master's read path in this process over one segment, its loop on a thread of its own
    (the standard library's loop, whose timers can be counted: ``timers``)."""

    def __init__(self, folder: Path, budget: BudgetConfig | None = None) -> None:
        os.environ[loop_module.ENV] = "asyncio"  # a loop whose call_at can be wrapped
        try:
            self.shared = Shared(BrokerConfig(gid="g1", role=Role.MASTER, data_dir=folder, zk_hosts="zk:1",
                                              budget=budget or BudgetConfig()))
        finally:
            del os.environ[loop_module.ENV]
        self.rt = RequestTime(broker_request_time())
        self.read = ReadPath(self.shared, None, threading.Event(), self.rt)  # type: ignore[arg-type] # no absent segment
        self.log = seglog.SegmentLog.open(folder, QUEUE, 0, create=True)
        self.segment = Segment(replica=SegmentReplica(QUEUE, 0, Role.MASTER), directory=folder, log=self.log)
        self.shared.segments[(QUEUE, 0)] = self.segment
        # Another queue on the same broker, whose LAC moves (``--wakes``); no log: never read
        self.neighbour = Segment(replica=SegmentReplica(QUEUE + "-neighbour", 0, Role.MASTER), directory=folder,
                                 log=None)
        self.shared.segments[self.neighbour.key] = self.neighbour
        self.parts: Any = types.SimpleNamespace(shared=self.shared, read=self.read, request_time=self.rt)
        self.timers = 0
        loop = self.shared.loop.loop
        call_at = loop.call_at

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.timers += 1
            return call_at(*args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign,assignment]
        self.shared.loop.start()
        self._seq = 0

    def add_batch(self, messages: int, size: int) -> None:
        """On the loop: one batch appended, synced and readable (both replicas' ends moved)."""
        replica = self.segment.replica
        first = replica.next_offset
        raw = encode_batch([Message(payload=b"x" * size, timestamp_us=0)] * messages, epoch=1, first_seq=self._seq)
        replica.place(1, self._seq, messages)
        self._seq += messages
        self.log.append(stamp_offset(raw, first), verify_crc=False)
        self.log.sync()
        replica.synced(replica.next_offset)
        replica.peer_progress(replica.next_offset)
        with self.shared.cv:
            self.shared.lac_moved((self.segment,))

    def neighbour_moved(self) -> None:
        """Another queue's LAC moved (its producer was acked)."""
        with self.shared.cv:
            self.shared.lac_moved((self.neighbour,))

    async def serve(self, answers: int, *, rate: float, messages: int, size: int, wakes: int,
                    wait_ms: int, token: str = "bench-token") -> dict[str, float]:
        """On the loop: ``answers`` answers to a caught-up reader, one batch each at ``rate``
        per second (0: as fast as the stream takes them); what they cost (``main``)."""
        call = _Call(token)
        cpu0, timers0 = time.thread_time(), self.timers
        grants0, charges0 = self.read.budget.stats.grants, self.rt.stats.charges
        wakeups0 = self.shared.stats.read_wakeups
        feeder = 0.0  # the feeder's own CPU on the loop (its steps between awaits)

        fed = 0  # batches made readable, and answered

        async def reader() -> None:  # streams one after the other, as the SDK's reader opens them
            while fed < answers:
                req = pb.FetchRequest(queue=QUEUE, seg=0, offset=self.segment.replica.lac, max_bytes=4 << 20,
                                      max_wait_ms=wait_ms, known_end=-1, stream_ms=1000)
                await read_stream(self.parts, req, call)

        task = asyncio.get_running_loop().create_task(reader())
        t0 = time.monotonic()
        for i in range(answers):
            if rate:
                await asyncio.sleep(max(t0 + i / rate - time.monotonic(), 0.0))
            for _ in range(wakes):
                c = time.thread_time()
                self.neighbour_moved()
                feeder += time.thread_time() - c
                await asyncio.sleep(0)
            c = time.thread_time()
            call.answered.clear()
            self.add_batch(messages, size)
            feeder += time.thread_time() - c
            await call.answered.wait()
            fed += 1
        await task  # its last stream ends with an empty answer, after its long poll
        n = max(fed, 1)
        return {"answers": fed, "writes": call.answers, "seconds": time.monotonic() - t0,
                "cpu_us": 1e6 * (time.thread_time() - cpu0 - feeder) / n,
                "feeder_us": 1e6 * feeder / n, "timers": (self.timers - timers0) / n,
                "grants": (self.read.budget.stats.grants - grants0) / n,
                "charges": (self.rt.stats.charges - charges0) / n,
                "wakeups": (self.shared.stats.read_wakeups - wakeups0) / n,
                "held_bytes": self.read.budget.stats.used_bytes}

    def close(self) -> None:
        self.shared.loop.stop()
        self.log.close()


@contextmanager
def stream_bench(budget: BudgetConfig | None = None) -> Iterator[StreamBench]:
    folder = Path(tempfile.mkdtemp(prefix="ordq-read-answers-"))
    bench = StreamBench(folder, budget)
    try:
        yield bench
    finally:
        bench.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=500.0, help="answers per second (0: as fast as taken)")
    ap.add_argument("--messages", type=int, default=4, help="messages per batch (one batch an answer)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--wakes", type=int, default=0, help="another queue's LAC moves before each batch is readable")
    ap.add_argument("--wait-ms", type=int, default=50, help="the reader's long poll (bench_e2e's consumer: 50)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with stream_bench() as bench:
        for run in range(args.runs):
            r = bench.shared.loop.run(bench.serve(args.answers, rate=args.rate, messages=args.messages,
                                                  size=args.size, wakes=args.wakes, wait_ms=args.wait_ms))
            print(f"run {run + 1}: {r['answers']:.0f} answers at {args.rate:g}/s ({args.messages} x {args.size} B "
                  f"each): loop CPU {r['cpu_us']:.1f} µs an answer besides the feeder's {r['feeder_us']:.1f}; per "
                  f"answer {r['timers']:.2f} timers, {r['grants']:.2f} budget grants, {r['charges']:.2f} "
                  f"request-time charges, {r['wakeups']:.2f} reader wake-ups", flush=True)


if __name__ == "__main__":
    main()
