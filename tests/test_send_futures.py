"""Send futures: one outcome per batch, one tiny future per message (sdk/_futures.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ordq.common.errors import FencedError
from ordq.sdk._futures import BatchOutcome, SendFuture, SendResult
from ordq.sdk.aio import _BatchBridge


def test_each_message_gets_its_own_offset_from_the_batch_ack() -> None:
    outcome = BatchOutcome()
    futs = [SendFuture(seq, outcome) for seq in range(10, 14)]
    assert not any(f.done() for f in futs)
    with pytest.raises(TimeoutError):
        futs[0].result(timeout=0.01)
    outcome.acked(seg=3, first_offset=100, first_seq=10)
    assert [f.result() for f in futs] == [SendResult(seq=s, seg=3, offset=100 + s - 10) for s in range(10, 14)]
    assert all(f.done() and f.exception() is None for f in futs)


def test_a_failed_batch_fails_every_message_and_the_first_verdict_stands() -> None:
    outcome = BatchOutcome()
    fut = SendFuture(5, outcome)
    err = FencedError("q", 1, 2)
    outcome.failed(err)
    outcome.acked(seg=0, first_offset=0, first_seq=5)  # too late: ignored
    assert fut.exception() is err
    with pytest.raises(FencedError):
        fut.result()


def test_callbacks_run_once_in_order_and_at_once_when_already_settled() -> None:
    outcome = BatchOutcome()
    calls: list[tuple[str, int]] = []
    a, b = SendFuture(1, outcome), SendFuture(2, outcome)
    a.add_done_callback(lambda f: calls.append(("a", f.seq)))
    b.add_done_callback(lambda f: calls.append(("b", f.seq)))
    threading.Thread(target=lambda: outcome.acked(seg=0, first_offset=0, first_seq=1)).start()
    b.result(timeout=5)
    b.add_done_callback(lambda f: calls.append(("late", f.seq)))
    assert calls == [("a", 1), ("b", 2), ("late", 2)]


def test_the_asyncio_bridge_settles_on_the_loop() -> None:
    async def main() -> tuple[SendResult, BaseException | None]:
        ok, bad = BatchOutcome(), BatchOutcome()
        loop = asyncio.get_running_loop()
        s_ok, s_bad = SendFuture(7, ok), SendFuture(8, bad)
        f_ok, f_bad = _BatchBridge(loop, s_ok).add(s_ok), _BatchBridge(loop, s_bad).add(s_bad)
        threading.Thread(target=lambda: ok.acked(seg=1, first_offset=0, first_seq=7)).start()
        threading.Thread(target=lambda: bad.failed(FencedError("q", 1, 2))).start()
        result = await f_ok
        try:
            await f_bad
        except FencedError as exc:
            return result, exc
        return result, None

    result, error = asyncio.run(main())
    assert result == SendResult(seq=7, seg=1, offset=0)
    assert isinstance(error, FencedError)


def test_one_bridge_settles_every_asyncio_future_of_a_batch() -> None:
    """AsyncProducer wraps a batch's futures with one bridge: those wrapped before the ack are
    settled by its one scheduled call, those wrapped after (the outcome known) at once."""
    async def main() -> list[SendResult]:
        outcome = BatchOutcome()
        futs = [SendFuture(seq, outcome) for seq in range(10, 14)]
        bridge = _BatchBridge(asyncio.get_running_loop(), futs[0])
        outs = [bridge.add(futs[0]), bridge.add(futs[1])]
        acker = threading.Thread(target=lambda: outcome.acked(seg=2, first_offset=50, first_seq=10))
        acker.start()
        acker.join()  # acked; the bridge's settling is scheduled on this loop, not run yet
        assert not any(o.done() for o in outs)
        outs += [bridge.add(futs[2]), bridge.add(futs[3])]
        assert all(o.done() for o in outs[2:])
        return list(await asyncio.gather(*outs))

    assert asyncio.run(main()) == [SendResult(seq=s, seg=2, offset=50 + s - 10) for s in range(10, 14)]


def test_a_bridge_settles_at_once_when_the_outcome_comes_on_its_loops_thread() -> None:
    """The AsyncProducer's I/O on the caller's loop settles a batch on that loop's thread: the
    bridge then settles the batch's futures at once (no wake-up scheduled through the loop);
    those wrapped after are settled at once as before."""
    async def main() -> list[SendResult]:
        outcome = BatchOutcome()
        futs = [SendFuture(seq, outcome) for seq in range(20, 23)]
        bridge = _BatchBridge(asyncio.get_running_loop(), futs[0])
        outs = [bridge.add(futs[0]), bridge.add(futs[1])]
        outcome.acked(seg=3, first_offset=7, first_seq=20)  # on this loop's thread, as the hosted I/O does
        assert all(o.done() for o in outs)
        outs.append(bridge.add(futs[2]))
        assert outs[2].done()
        return list(await asyncio.gather(*outs))

    assert asyncio.run(main()) == [SendResult(seq=s, seg=3, offset=7 + s - 20) for s in range(20, 23)]
