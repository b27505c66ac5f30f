"""Many event loops of one process using grpc.aio, one closed while another runs on, 20 rounds
of two kinds each: a LoopThread stopped after its channel's close, as a TopicProducer's
partitions' Producers close one after another (the late hand-off arises in some processes
only, ~1 in 3 here: CI saw none in 400 rounds), and a plain loop stopped and closed with calls
in flight, whose answers then certainly reach the poller after the close (the same hand-off,
every round). Prints {"rounds": n, "dropped": k}, k counted by
``ordq.common.loop.stale_grpc_handoffs`` (tests/test_loop_thread.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from ordq.common import loop as loop_mod
from ordq.common.loop import LoopThread

ROUNDS = 20


def _echo_after_a_while(request: bytes, _context: Any) -> bytes:
    time.sleep(0.05)
    return request


async def _channel(port: int) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return channel, channel.unary_unary("/t.T/Slow")


async def _call(method: Any) -> bytes:
    return bytes(await method(b"x"))


def _close_with_calls_in_flight(port: int) -> None:
    """A loop stopped and closed while its calls wait on the server (50 ms): their answers come
    after, and the survivor's loop, reading the poller's wake-ups, hands them to a closed loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="abandoned", daemon=True)
    thread.start()
    _, method = asyncio.run_coroutine_threadsafe(_channel(port), loop).result(10)
    for _ in range(5):
        asyncio.run_coroutine_threadsafe(_call(method), loop)
    time.sleep(0.01)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(16))
    handler = grpc.unary_unary_rpc_method_handler(_echo_after_a_while)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"Slow": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    survivor = LoopThread("survivor")
    survivor.start()
    _, on_survivor = survivor.run(_channel(port))
    survivor.run(_call(on_survivor), 10)
    for _ in range(ROUNDS):
        closing = LoopThread("closing")
        closing.start()
        channel, method = closing.run(_channel(port))
        for _ in range(5):  # calls in flight when it closes
            asyncio.run_coroutine_threadsafe(_call(method), closing.loop)
        beside = asyncio.run_coroutine_threadsafe(_call(on_survivor), survivor.loop)
        time.sleep(0.01)
        closing.run(channel.close(), 10)
        closing.stop()
        assert beside.result(10) == b"x"  # the survivor's own call is answered
        beside = asyncio.run_coroutine_threadsafe(_call(on_survivor), survivor.loop)
        _close_with_calls_in_flight(port)
        assert beside.result(10) == b"x"
    assert survivor.run(_call(on_survivor), 10) == b"x"
    survivor.stop()
    server.stop(0)
    print(json.dumps({"rounds": ROUNDS, "dropped": loop_mod.stale_grpc_handoffs}))


if __name__ == "__main__":
    main()
