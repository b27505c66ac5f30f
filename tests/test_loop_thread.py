"""ordq.common.loop.LoopThread beside grpc.aio: a loop closed while another of the process runs
on prints nothing and loses none of the survivor's calls (the heavy tier's docs/SDK.md
TopicProducer example printed "Exception in callback PollerCompletionQueue._handle_events ...
RuntimeError: Event loop is closed" twice; reproduced by tests/helpers/grpc_loops.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cluster import REPO


def test_a_closed_loops_late_grpc_completions_print_nothing_and_the_survivor_is_answered() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-m", "tests.helpers.grpc_loops"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "Exception in callback" not in run.stderr, run.stderr
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    # the situation arose (else the test would prove nothing): completions for a closed loop
    # were handed off, and dropped quietly (every round closes a loop with calls in flight)
    assert counts["dropped"] >= 1, counts


def test_a_loop_thread_runs_uvloop_unless_told_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 (fast39n): the data path's loops are uvloop's (its TLS layer and scheduling in
    Cython, not Python); ``ORDQ_LOOP=asyncio`` gives the standard library's loop. Either runs
    a coroutine and a blocking step."""
    import asyncio
    import time

    import uvloop

    from ordq.common.loop import ENV, LoopThread

    async def work(lt: LoopThread) -> float:
        await asyncio.sleep(0.001)
        return await lt.run_blocking(time.monotonic)

    for setting, kind in ((None, uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)):
        if setting is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, setting)
        lt = LoopThread("test-loop")
        lt.start()
        try:
            assert isinstance(lt.loop, kind), type(lt.loop)
            assert setting is None or not isinstance(lt.loop, uvloop.Loop)
            assert lt.run(work(lt), 10) > 0
        finally:
            lt.stop()


def test_a_hosted_loop_is_the_callers_and_stop_leaves_it_running() -> None:
    """HostedLoop (an AsyncProducer's I/O on the caller's loop): ``call_soon`` from the loop's
    own thread is a plain call_soon, from another thread a thread-safe one; ``run`` comes from
    another thread (from the loop it would deadlock); a blocking step runs off the loop; ``stop``
    ends only the worker threads: the caller's loop and its tasks go on."""
    import asyncio
    import threading

    import pytest

    from ordq.common.loop import HostedLoop

    async def main() -> list[str]:
        host = HostedLoop("test-hosted")
        assert host.in_loop and host.loop is asyncio.get_running_loop()
        ran: list[str] = []
        host.call_soon(ran.append, "from the loop")
        other = threading.Thread(target=lambda: host.call_soon(ran.append, "from a thread"))
        other.start()
        other.join()

        async def answer() -> str:
            return "run from a thread"

        ran.append(await asyncio.to_thread(host.run, answer(), 10))
        ran.append(await host.run_blocking(lambda: threading.current_thread().name.split("_")[0]))
        with pytest.raises(AssertionError, match="deadlock"):
            coro = answer()
            try:
                host.run(coro)
            finally:
                coro.close()
        host.stop()
        await asyncio.sleep(0)  # the loop is still the caller's and still runs
        ran.append("after stop")
        return ran

    assert asyncio.run(main()) == ["from the loop", "from a thread", "run from a thread", "test-hosted-blocking",
                                   "after stop"]
