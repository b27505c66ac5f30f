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
