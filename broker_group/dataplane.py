"""The broker's gRPC handlers, all on its event loop (ordq/common/loop.py).

Guarantee: the same as broker_group/service.py's: acks in order, each only when both
replicas synced its batch. What this module adds is where the work runs:
- Produce: one task reads the stream and places each request's batches (on the loop, with
  the slave's forward queued at once); the handler itself answers with acks whenever the
  LAC of the segment it owes acks of moves (the replication reader or the sync thread:
  ``Shared.lac_moved``, which wakes the handlers owed acks before the segment's readers;
  never woken by another queue's, ``WritePath.ack_signals``). No thread
  stands between a request arriving and its ack leaving but the sync thread's fdatasync, and
  none at all for a lone small request (committed on the loop: write_path.LOOP_SYNC_BYTES).
- Replicate (slave): append, fdatasync and answer in the handler (broker_group/replication.py).
- Fetch: long-polls on the loop; reads the log inline when it is free. Read: the same,
  fetch after fetch on one stream (a follower's way: no call per batch).
- Control calls (Fence, Seal, Reconcile, SegmentInfo, OpenSegments, Health) wait on locks, disks and
  peers: they run in the loop's worker threads, as before. Fence, Seal, Reconcile and
  Replicate are taken only from brokers and coordinators (broker_group/auth.py).
Errors become typed gRPC statuses in one place (``_answer``, ``ordq.wire.errors.abort``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

import attrs
import grpc
from google.protobuf.message import DecodeError

from ordq.broker_group.answer import as_is
from ordq.broker_group.auth import ALL_QUEUES, Gate
from ordq.broker_group.budget import holders_of, token_holder
from ordq.broker_group.config import server_options
from ordq.broker_group.control import Control
from ordq.broker_group.disk_room import out_of_space
from ordq.broker_group.finder import Finder
from ordq.broker_group.read_path import ReadPath
from ordq.broker_group.repair import Repairer
from ordq.broker_group.replication import serve_replicate
from ordq.broker_group.request_time import RequestTime, timed
from ordq.broker_group.shared import Shared
from ordq.broker_group.token_calls import OpenCalls
from ordq.broker_group.write_path import ProduceStreamState, WritePath
from ordq.common.errors import BrokerUnavailable, ConfigError, DiskFull, OrdqError
from ordq.common.loop import Alarm, Signal, StepTimeout
from ordq.common.stages import stamp
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import first_seqs
from ordq.wire.errors import ResourceExhausted, abort

log = logging.getLogger("ordq.broker")

try:  # what grpc.aio raises from ``write`` when the call ended under it (the client cancelled)
    from grpc._cython.cygrpc import ExecuteBatchError as _SEND_FAILED
except ImportError:  # pragma: no cover - another grpcio layout
    _SEND_FAILED = grpc.aio.UsageError  # type: ignore[misc,assignment]
T = TypeVar("T")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@attrs.frozen
class Parts:
    """What the handlers call: the broker's parts (broker_group/service.py wires them)."""

    shared: Shared
    gate: Gate
    write: WritePath
    read: ReadPath
    control: Control
    repair: Repairer
    request_time: RequestTime
    health: Callable[[], pb.HealthResponse]
    finder: Finder
    calls: OpenCalls  # each token's calls open at once (token_calls.py)


def add_servicer(parts: Parts, server: grpc.aio.Server) -> None:
    captured = _Handlers()
    pb_grpc.add_BrokerServicer_to_server(BrokerServicer(parts), captured)
    handlers = dict(captured.handlers)
    # Fetch and Read answers leave the read path encoded (broker_group/answer.py): sent as they are.
    for name in ("Fetch", "Read"):
        handlers[name] = handlers[name]._replace(response_serializer=as_is)
    handlers = {name: _checked_first(parts, name, h) for name, h in handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


SERVICE = "ordq.v1.Broker"
# A produce stream looks at its acks at least this often. Every change that can release one
# wakes it (WritePath.ack_signals); a wait that ends here with acks due is counted
# (``produce_late_acks``): it would be a wake-up missed, and is logged.
PRODUCE_RECHECK_S = 1.0
SMALL_REQUEST_BYTES = 64 << 10  # a request of a call other than Produce and Replicate


async def _metered(b: Parts, context: Context, run: Callable[[], Any]) -> Any:
    """``run()`` (a coroutine function: a whole call) charged to its token's share of the
    broker's request time (broker_group/request_time.py): a token in debt waits first,
    asleep; when the wait would pass ``max_delay_ms`` the call waits that long and is refused
    (typed, counted, retriable; at once past ``max_held`` waiting calls of the token). Decided
    on the headers, before the request is read: an abuser's refused call costs its share,
    not its body. A token holding ``max_calls_per_token`` calls open already is refused at
    once (token_calls.py). Calls without a token (the group's peers) are neither charged
    nor counted."""
    rt = b.request_time
    token = token_holder(context)
    if token is None:
        return await run()
    if not b.calls.enter(token):
        limit = b.calls.limit
        exc = ResourceExhausted(b.shared.address, "calls", limit,
                                f"this token holds {limit} calls open on this broker already (Read streams, "
                                "long polls, produce streams): close some first")
        b.shared.stats.token_calls_refused += 1
        b.shared.count_refused(exc)
        await abort(context, exc)
    try:
        share = rt.config.share
        if share is None:
            return await run()
        now = time.monotonic()
        wait, refuse = rt.admit(token, now)
        rt.charge(token, rt.config.call_cost_us / 1e6, now)
        if wait:
            rt.enter(token)
            try:
                await asyncio.sleep(wait)
            finally:
                rt.leave(token)
        if refuse:
            exc = ResourceExhausted(b.shared.address, "request time", int(share * 1000),
                                    f"this token took more than its share of the broker's request time "
                                    f"({share:g} s per s); retry in "
                                    f"{rt.delay_s(token, time.monotonic()):.1f} s")
            b.shared.count_refused(exc)
            await abort(context, exc)
        return await timed(run(), lambda seconds: rt.charge(token, seconds, time.monotonic()))
    finally:
        b.calls.leave(token)


async def hold_stream(b: Parts, token: str | None) -> None:
    """Before the next step of an open stream (a produce request, a Read answer): wait while
    its token is over its share of the loop (request_time.py)."""
    rt = b.request_time
    while (wait := rt.step(token, time.monotonic())) > 0:
        await asyncio.sleep(wait)


async def check_caller(b: Parts, context: Context, rpc: str, arrived: float) -> None:
    """What can be refused before a call's first request is read (``Gate.check_caller``),
    the call ended with it (typed, counted). Shared by the gRPC handlers and the lean produce
    link (broker_group/lean_produce.py)."""
    try:
        if b.gate.needs_refresh(context, rpc):
            # A token this broker does not know yet (created a moment ago, before the
            # watch fired) or any more: judged on a load made after the call arrived
            # (shared and rate-limited, coordinator/token_book.py), never a stale copy.
            await asyncio.wrap_future(b.gate.book.fresh_after(arrived))
        b.gate.check_caller(context, rpc)
    except OrdqError as exc:
        b.shared.count_refused(exc)
        await abort(context, exc)


async def metered(b: Parts, context: Context, run: Callable[[], Any]) -> Any:
    """``_metered`` for the lean produce link (broker_group/lean_produce.py)."""
    return await _metered(b, context, run)


async def _unattached(call: Coroutine[Any, Any, T]) -> T:
    """A whole call's handler awaited, its refusal (gRPC's AbortError) let go of here: gRPC
    keeps that error in the call's state, and its traceback ran through every frame of the
    handler, each holding the call's context, which holds that state. A cycle, freed only by
    a full collection, with each refused call's coroutines, futures and requests: under the
    noisy-neighbour drill's abuse ~20,000 objects, 20-35 ms pauses of the master's loop
    (docs/BENCHMARKS.md, stop 86). gRPC raises the error again from its own frames, which
    hold nothing of ours (a handler that swallowed its abort still ends aborted:
    ``RPCState.raise_for_termination``), and the client gets the same status, text and
    trailer (tests/test_refusal_garbage.py)."""
    try:
        return await call
    except grpc.aio.AbortError as exc:
        exc.__context__, exc.__traceback__ = None, None
    except _SEND_FAILED as exc:
        # The client went away under an answer (often the refusal's): gRPC's future of that
        # send holds this error, and its traceback the frames awaiting that future. It ends
        # the call as before, without them.
        exc.__context__ = None
        raise exc.with_traceback(None) from None
    return None  # type: ignore[return-value]


def _checked_first(b: Parts, rpc: str, handler: Any) -> Any:
    """``handler`` made to check its caller (``Gate.check_caller``) before it reads a request.

    gRPC reads a unary call's request whole before its handler runs (a 25 MiB body with a bad
    token was received in full, then refused): every handler is served as a request *stream*
    here, which gRPC starts before any message is read. The check runs on the headers; a
    refusal ends the call (typed, counted) with the body unread, past the stream's first
    flow-control window. Clients see no difference: a unary call is a stream of one."""

    async def refused(context: Context, arrived: float) -> None:
        await check_caller(b, context, rpc, arrived)

    def received_whole_limit(context: Context) -> None:
        # No request came (gRPC refused the body itself, past the server's receive limit,
        # having taken it in; or the call ended first): charged as that many bytes received.
        b.request_time.charge(token_holder(context), b.request_time.config.byte_cost_s(receive_limit),
                              time.monotonic())

    async def one(requests: AsyncIterator[Any], context: Context) -> Any:
        try:
            async for request in requests:
                return request
            received_whole_limit(context)
            raise ConfigError(f"bad {rpc} request: none sent")
        except (ConfigError, DecodeError) as exc:
            # A body that is no protobuf of the call's type: typed and counted (gRPC's own
            # answer was an UNKNOWN status, counted nowhere).
            bad = exc if isinstance(exc, ConfigError) else ConfigError(f"bad {rpc} request: {exc}")
            b.shared.count_refused(bad)
            await abort(context, bad)
        except BaseException:
            received_whole_limit(context)
            raise

    if handler.request_streaming:  # Produce, Replicate: their requests are the batches
        behavior = handler.stream_stream or handler.stream_unary

        async def streamed(requests: AsyncIterator[Any], context: Context) -> Any:
            async def run() -> Any:
                await refused(context, b.gate.book.now())
                return await behavior(requests, context)

            return await _unattached(_metered(b, context, run))

        key = "stream_stream" if handler.response_streaming else "stream_unary"
        return handler._replace(**{key: streamed})

    behavior = handler.unary_stream or handler.unary_unary
    parse = handler.request_deserializer
    receive_limit = dict(server_options(b.shared.config))["grpc.max_receive_message_length"]

    def deserialize(raw: bytes) -> Any:
        # gRPC's receive limit is one for the whole server, sized for Produce: the other
        # calls' requests are a few hundred bytes, and one past SMALL_REQUEST_BYTES is refused
        # here, typed and counted (gRPC's own refusal, past the server's limit, is neither).
        if len(raw) > SMALL_REQUEST_BYTES:
            raise ConfigError(f"bad {rpc} request: {len(raw)} bytes, over this call's limit of "
                              f"{SMALL_REQUEST_BYTES}")
        return parse(raw)

    async def unary(requests: AsyncIterator[Any], context: Context) -> Any:
        async def run() -> Any:
            await refused(context, b.gate.book.now())
            return await behavior(await one(requests, context), context)

        return await _unattached(_metered(b, context, run))

    if handler.response_streaming:
        return handler._replace(request_streaming=True, unary_stream=None, stream_stream=unary,
                                request_deserializer=deserialize)
    return handler._replace(request_streaming=True, unary_unary=None, stream_unary=unary,
                            request_deserializer=deserialize)


class _Handlers:
    """Stands in for the server while the generated code registers the handlers, so that two
    of them can be changed before the real server sees them."""

    handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        assert service == SERVICE, service
        self.handlers = handlers


async def produce(b: Parts, requests: AsyncIterator[pb.ProduceRequest], context: Context) -> None:
    """Master: acks for one produce stream, in order, as the LAC covers their batches."""
    stream = ProduceStreamState(wake=Signal(b.shared.loop))
    alarm = Alarm()  # one timer for the stream's waits (PRODUCE_RECHECK_S)
    late = False  # the last wait ended at its recheck, no signal
    with b.shared.cv:
        b.write.streams.add(stream)
    token = token_holder(context)
    rt = b.request_time
    # The reader is a task of its own: its steps are charged to the token as the handler's are.
    reader = asyncio.get_running_loop().create_task(timed(
        _read_produce(b, stream, requests, context, token),
        lambda seconds: rt.charge(token, seconds, time.monotonic())))
    try:
        while True:
            with b.shared.cv:
                ready = b.write.take_ready_acks(stream)
                local = stream.local_acks  # what they mean, told with them (ProduceRequest.local_acks)
                error, finished = stream.error, stream.done and not stream.pending
                if ready:
                    b.shared.stats.ack_writes += 1
                    if late:  # (or the timer rang in the same loop turn as the signal's fire)
                        b.shared.stats.produce_late_acks += 1
                        log.warning("a produce stream's acks were due and it was not woken (found at its %g s "
                                    "recheck)", PRODUCE_RECHECK_S)
                late = False
                signals = b.write.ack_signals(stream)
            if ready:
                await context.write(pb.ProduceResponse(acks=ready, local_acks=local))
                if stream.first_write is not None:  # a new segment's first ack went out: how long it took
                    log.info("%s", stream.first_write.line("master"))
                    stream.first_write = None
                continue
            if error is not None:
                b.shared.count_refused(error)
                await abort(context, error)
            if finished or b.shared.stopping:
                return
            late = not await alarm.wait(time.monotonic() + PRODUCE_RECHECK_S, *signals)
            b.shared.stats.produce_wakeups += 1
    finally:
        alarm.close()
        reader.cancel()
        with b.shared.cv:
            b.write.streams.discard(stream)


async def _read_produce(b: Parts, stream: ProduceStreamState, requests: AsyncIterator[pb.ProduceRequest],
                        context: Context, token: str | None) -> None:
    lease = b.read.lease(holders_of(context))
    rt = b.request_time
    check = b.gate.stream_check(context, "Produce")
    try:
        await hold_stream(b, token)
        async for req in requests:
            stamp("M.request", first_seqs, req.batches)
            size = sum(map(len, req.batches))
            rt.charge(token, rt.config.byte_cost_s(size), time.monotonic())
            # The request is in memory already: charged while it is checked and placed (then
            # it counts in max_inflight_bytes). Over budget, the stream is not read further
            # (gRPC flow control holds the sender back) until there is room, for wait_ms.
            await lease.admit(size, what="produce request")
            # Every request, not only the first: a token revoked mid-stream ends the stream
            # (judged again whenever the token copy changed: Gate.stream_check). A refusal is
            # counted once, where ``produce`` answers with it.
            check(req.queue)
            rt.on_queue(token, req.queue)
            if req.local_acks and not stream.local_acks:
                # The producer watches the slave's synced end now: from here on, acks after this
                # master's own sync (each answer says which kind its acks are).
                with b.shared.cv:
                    stream.local_acks = True
                    if stream.wake is not None:
                        stream.wake.fire()  # its handler waits on the LAC: wait on this copy's sync instead
            if req.batches or not req.local_acks:  # (that request alone carries none)
                await b.write.accept_produce(stream, req)
            b.read.wrote(req.queue, size)
            stamp("M.placed", first_seqs, req.batches)
            lease.release()
            # The next request is not read while the token is over its share of the loop
            # (gRPC flow control then holds its sender back).
            await hold_stream(b, token)
    except OrdqError as exc:
        with b.shared.cv:
            stream.error = stream.error or exc
    except (asyncio.CancelledError, grpc.aio.BaseError, grpc.RpcError, ConnectionError):
        pass  # the client went away (or the handler ended): nothing to answer
    except OSError as exc:  # this broker's own disk, not the client's bytes: the producer fails over
        failed = own_disk_failed(b.shared, "Produce", exc)  # the path in exc names the queue
        with b.shared.cv:
            stream.error = stream.error or failed
    except Exception as exc:  # noqa: BLE001 - the client sent garbage
        with b.shared.cv:
            stream.error = stream.error or ConfigError(f"bad produce request: {exc}")
    finally:
        lease.release()
        with b.shared.cv:
            stream.done = True
            b.shared.changed()


async def read_stream(b: Parts, req: pb.FetchRequest, context: Context) -> None:
    """Fetch after fetch on one stream, each from where the last one's batches ended, until an
    empty answer, the answer that reaches the sealed end, or ``stream_ms`` (capped at
    ``max_fetch_wait_ms``): the reader's deadline for the stream bounds every answer.

    Each answer is charged to the memory budget until gRPC took it (``write`` returns once
    the reader's flow-control window has room). A reader that takes nothing is therefore not
    fed past its share; after ``idle_ms`` without room, or without the reader taking an
    answer, the stream is closed (ResourceExhausted, counted)."""
    until = time.monotonic() + min(req.stream_ms, b.shared.config.max_fetch_wait_ms) / 1000.0
    # What the stream holds and owes, kept from answer to answer (read_path.ReadAccount), and
    # one timer for the idle bound of all its writes (issue 39: not one of each per answer).
    account = b.read.account(holders_of(context), req.queue, stream=True)
    idle = StepTimeout(b.read.budget.config.idle_ms / 1000.0)
    token = token_holder(context)
    ask = pb.FetchRequest(queue=req.queue, seg=req.seg, offset=req.offset, max_bytes=req.max_bytes,
                          max_wait_ms=req.max_wait_ms, known_end=req.known_end)
    try:
        while True:
            await hold_stream(b, token)
            res = await b.read.fetch(ask, account, wait_s=idle.limit_s)
            try:
                async with idle:
                    await context.write(res.wire)
            except TimeoutError:
                b.read.budget.stats.idle_closed += 1
                raise ResourceExhausted(b.shared.address, "read idle", b.read.budget.config.idle_ms,
                                        f"the reader took no answer for {idle.limit_s:g} s: stream closed") from None
            except _SEND_FAILED:
                # The reader went away (cancelled, closed): end as a cancelled call, which gRPC
                # does not log (returning normally makes it try to send a status, and log that).
                raise asyncio.CancelledError from None
            account.sent()
            if not res.batches or time.monotonic() >= until:
                return
            ask.offset = res.end_offset
            if res.sealed and ask.offset >= res.readable_end:
                return
    finally:
        account.close()
        idle.close()


async def answer(b: Parts, context: Context, rpc: str, queue: str, call: Callable[[], Any]) -> Any:
    """Check the caller's role on ``queue``, then ``call()`` (a coroutine function, or a
    blocking function run in a worker thread); an OrdqError becomes the call's typed status.
    Shared by the gRPC handlers and the lean link's Read streams (broker_group/lean_produce.py)."""
    try:
        b.gate.check(context, rpc, queue)
        if asyncio.iscoroutinefunction(call):
            return await call()
        return await b.shared.loop.run_blocking(call)
    except OrdqError as exc:
        b.shared.count_refused(exc)
        await abort(context, exc)
    except (ValueError, OverflowError) as exc:
        # A value no check above foresaw (a number out of a protobuf field's range): the
        # caller's mistake, typed and counted, not an uncaught traceback in the broker.
        log.warning("%s refused: %r", rpc, exc)
        refused = ConfigError(f"bad {rpc} request: {exc}")
        b.shared.count_refused(refused)
        await abort(context, refused)
    except ConnectionError as exc:
        # A connection, not the disk: a lean Read stream's reader went away ("Connection lost"
        # was logged as "this broker's disk failed" until stop 97). Nobody may be left to answer.
        log.debug("%s on %s: %r", rpc, queue, exc)
        await abort(context, BrokerUnavailable(b.shared.address, f"{rpc} on {queue}: {exc}"))
    except OSError as exc:
        failed = own_disk_failed(b.shared, f"{rpc} on {queue}", exc)
        b.shared.count_refused(failed)
        await abort(context, failed)


def own_disk_failed(shared: Shared, call: str, exc: OSError) -> DiskFull:
    """This broker's own disk failed a step of ``call`` (a new segment's files, a
    seal's meta file; a full disk): said in its log, and the call's typed, retriable error, on
    which a producer fails over, not the caller's bad request nor an uncaught traceback. Seen: a
    producer whose next segment opened on a full disk was answered "bad produce request: [Errno
    28] ..." and stopped. Out of space: the group takes no writes until it has room (disk_room.py)."""
    failed = DiskFull(f"{call}: this broker's disk failed: {exc}")
    log.warning("%s", failed)
    if out_of_space(exc):
        shared.disk_room.ran_out(call)
    return failed


class BrokerServicer(pb_grpc.BrokerServicer):
    """gRPC entry points: translate requests to calls of the broker's parts and ordq errors to statuses."""

    def __init__(self, parts: Parts) -> None:
        self.b = parts

    async def _answer(self, context: Context, rpc: str, queue: str, call: Callable[[], Any]) -> Any:
        return await answer(self.b, context, rpc, queue, call)

    async def Produce(self, request_iterator: Any, context: Context) -> None:
        await produce(self.b, request_iterator, context)

    async def Replicate(self, request_iterator: Any, context: Context) -> None:
        try:
            # Only the cluster (a broker's or coordinator's certificate) may feed a slave.
            self.b.gate.check(context, "Replicate", ALL_QUEUES)
        except OrdqError as exc:
            self.b.shared.count_refused(exc)
            await abort(context, exc)
        await serve_replicate(self.b.shared, self.b.write, request_iterator, context)

    async def Fetch(self, request: pb.FetchRequest, context: Context) -> bytes:
        async def fetch() -> bytes:
            # Charged to the budget from when it is built until gRPC finished the call: a
            # returned answer still sits in gRPC's send buffer until a slow reader's
            # flow-control window takes it, and releasing it at return let one reader's
            # unread answers pile up past its share (issue 25).
            account = self.b.read.account(holders_of(context), request.queue)
            context.add_done_callback(lambda _ctx: account.close())
            try:
                return (await self.b.read.fetch(request, account)).wire
            except BaseException:
                account.close()
                raise

        return await self._answer(context, "Fetch", request.queue, fetch)  # type: ignore[no-any-return]

    async def Read(self, request: pb.FetchRequest, context: Context) -> None:
        async def read() -> None:
            await read_stream(self.b, request, context)

        await self._answer(context, "Read", request.queue, read)

    async def Fence(self, request: pb.FenceRequest, context: Context) -> pb.SegmentEnd:
        return await self._answer(context, "Fence", request.queue,  # type: ignore[no-any-return]
                                  lambda: self.b.control.fence(request.queue, request.seg, request.epoch))

    async def Seal(self, request: pb.SegmentRef, context: Context) -> pb.SegmentEnd:
        return await self._answer(context, "Seal", request.queue,  # type: ignore[no-any-return]
                                  lambda: self.b.control.seal(request.queue, request.seg))

    async def SealMany(self, request: pb.SealManyRequest, context: Context) -> pb.SealManyResponse:
        return await self._answer(context, "SealMany", ALL_QUEUES,  # type: ignore[no-any-return]
                                  lambda: self.b.control.seal_many(request))

    async def Reconcile(self, request: pb.ReconcileRequest, context: Context) -> pb.SegmentEnd:
        return await self._answer(context, "Reconcile", request.queue,  # type: ignore[no-any-return]
                                  lambda: self.b.repair.reconcile_request(request.queue, request.seg, request.end,
                                                                          request.peer))

    async def SegmentInfo(self, request: pb.SegmentRef, context: Context) -> pb.SegmentEnd:
        return await self._answer(context, "SegmentInfo", request.queue,  # type: ignore[no-any-return]
                                  lambda: self.b.control.segment_info(request.queue, request.seg))

    async def OpenSegments(self, request: pb.OpenSegmentsRequest, context: Context) -> pb.OpenSegmentsResponse:
        return await self._answer(context, "OpenSegments", ALL_QUEUES,  # type: ignore[no-any-return]
                                  lambda: self.b.control.open_segments(request.include))

    async def Health(self, request: pb.HealthRequest, context: Context) -> pb.HealthResponse:
        return await self._answer(context, "Health", ALL_QUEUES, self.b.health)  # type: ignore[no-any-return]

    async def Find(self, request: pb.FindRequest, context: Context) -> pb.FindResponse:
        return await self._answer(context, "Find", request.queue,  # type: ignore[no-any-return]
                                  lambda: self.b.finder.find(request))
