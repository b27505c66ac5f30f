"""Many event loops of one process using grpc.aio, one closed while another runs on (as a
TopicProducer's partitions' Producers close one after another): until a completion of a
closed loop's call has been handed off at least once (``ordq.common.loop.stale_grpc_handoffs``),
at least 20 rounds, at most 400. Prints {"rounds": n, "dropped": k} (tests/test_loop_thread.py)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent import futures
from typing import Any

import grpc

from ordq.common import loop as loop_mod
from ordq.common.loop import LoopThread


def _echo_after_a_while(request: bytes, _context: Any) -> bytes:
    time.sleep(0.05)
    return request


async def _channel(port: int) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return channel, channel.unary_unary("/t.T/Slow")


async def _call(method: Any) -> bytes:
    return bytes(await method(b"x"))


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
    rounds = 0
    while rounds < 400 and (rounds < 20 or loop_mod.stale_grpc_handoffs == 0):
        rounds += 1
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
    assert survivor.run(_call(on_survivor), 10) == b"x"
    survivor.stop()
    server.stop(0)
    print(json.dumps({"rounds": rounds, "dropped": loop_mod.stale_grpc_handoffs}))


if __name__ == "__main__":
    main()
