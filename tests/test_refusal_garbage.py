"""A refused or cancelled call, or one whose answer failed under a gone client, leaves nothing
of the broker's handler to the cycle collector (stop 86): its frames, coroutines and requests
are freed when the call ends, by reference counting, not by the next full collection (which,
under the noisy-neighbour drill's abuse, walked ~20,000 such objects and held the master's loop
20-35 ms, the drill's ack spikes).

Real parts: a ``grpc.aio`` server and channel in this process (no broker: what is checked is
how a handler's refusal leaves gRPC), and ``request_time.timed`` driving a cancelled
coroutine. Each case counts, with the collector off, the unreachable frames of ordq's code the
collector finds after the calls (``gc.DEBUG_SAVEALL``). Failing first: on the code before,
every refused call left ~8 of its frames in a cycle through gRPC's AbortError, and a
cancelled ``timed`` kept its own frame through the CancelledError it had thrown in."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError

from ordq.broker_group.dataplane import _SEND_FAILED, _unattached
from ordq.broker_group.request_time import timed
from ordq.common.errors import ConfigError
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import abort

OURS = ("/broker_group/", "/ordq/wire/", __file__)


@contextmanager
def collector_off() -> Iterator[list[str]]:
    """The collector off while the block runs; then one collection saving what it found
    unreachable; yields the code names of those frames that are ordq's (filled at exit)."""
    found: list[str] = []
    was = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(f"{o.f_code.co_filename}:{o.f_code.co_name}" for o in gc.garbage
                     if type(o).__name__ == "frame" and any(part in o.f_code.co_filename for part in OURS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


async def _refuse(requests: Any, context: Any) -> None:
    """As the broker's handlers refuse a request that is no protobuf of its type (gRPC's
    deserializer raising in the request iterator): caught, typed and sent from frames a few
    coroutines deep, one of them driven by ``timed``."""

    async def first() -> Any:
        try:
            async for request in requests:
                return request
        except DecodeError as exc:
            bad = ConfigError(f"bad request: {exc}")
            await abort(context, bad)

    async def run() -> None:
        await first()

    await timed(run(), lambda _s: None)


def test_a_refused_grpc_call_leaves_none_of_its_handlers_frames_to_the_collector() -> None:
    async def handler(requests: Any, context: Any) -> None:
        await _unattached(_refuse(requests, context))

    async def main() -> list[str]:
        with collector_off() as found:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {
                "Refuse": grpc.stream_unary_rpc_method_handler(handler, pb.FetchRequest.FromString,
                                                               pb.SegmentEnd.SerializeToString)}),))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    call = channel.stream_unary("/t.T/Refuse", None, pb.SegmentEnd.FromString)  # bytes as they are
                    for _ in range(20):
                        with pytest.raises(grpc.aio.AioRpcError) as refused:
                            await call(iter([b"\xff\xff\xff\xff"]))
                        # refused as before: its status, text and typed trailer
                        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                        assert "bad request: Error parsing message" in (refused.value.details() or "")
                        assert "bad_request" in dict(refused.value.trailing_metadata() or ())["ordq-error"]
                        del refused
            finally:
                await server.stop(None)  # every call's state let go: what is left is garbage or nothing
                del server
        return found

    found = asyncio.run(main())
    assert found == [], f"{len(found)} frames of 20 refused calls left to the collector: {sorted(set(found))}"


def test_a_cancelled_timed_coroutine_leaves_no_frame_to_the_collector() -> None:
    async def waits() -> None:
        await asyncio.Event().wait()

    async def main() -> list[str]:
        with collector_off() as found:
            for _ in range(20):
                task = asyncio.get_running_loop().create_task(timed(waits(), lambda _s: None))
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                del task
        return found

    found = asyncio.run(main())
    assert found == [], f"{len(found)} frames of 20 cancelled calls left to the collector: {sorted(set(found))}"


def test_a_send_that_failed_under_a_gone_client_leaves_no_frame_to_the_collector() -> None:
    """``_unattached``'s other branch: gRPC's ``write`` raises its send's error (ExecuteBatchError)
    when the client went away under an answer, from a future that holds that error while its
    traceback holds the frames awaiting the future: a cycle. The error still ends the call, as
    it is; its traceback and context no longer hold the handler's frames."""

    async def answer() -> None:
        sent = asyncio.get_running_loop().create_future()  # as gRPC's future of the send
        sent.set_exception(_SEND_FAILED("the call ended under the write"))
        await sent

    async def handler() -> None:  # a frame between: the traceback runs through it
        await answer()

    async def main() -> list[str]:
        with collector_off() as found:
            for _ in range(20):
                with pytest.raises(_SEND_FAILED, match="the call ended under the write") as failed:
                    await _unattached(timed(handler(), lambda _s: None))
                assert failed.value.__context__ is None
                del failed
        return found

    found = asyncio.run(main())
    assert found == [], f"{len(found)} frames of 20 failed sends left to the collector: {sorted(set(found))}"
