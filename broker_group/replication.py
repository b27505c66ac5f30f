"""Master → slave replication: the same batches at the same offsets, and the master's LAC.

Guarantee: the slave's copy of a segment is always a prefix of the master's (it refuses a
batch that does not continue it exactly), and the master counts a batch as replicated only
when the slave reports it synced. When the stream breaks, every non-empty segment the master
could still write is frozen and its producers are failed at once: the producer fails over to
a new segment instead of us streaming a catch-up. A new stream therefore only ever carries
segments from offset 0, which keeps "the slave holds everything before what it acks" true by
construction (DESIGN §4 asks for a catch-up on reconnect; freezing is the simpler safe
choice, and after a slave failure the producer fails over anyway, DESIGN §6).

The master pushes its LAC for every segment it forwarded on this stream whenever it moved:
on the next batches, or alone at most every ``lac_push_ms``, so the slave can serve reads up
to it (only a reader of the slave, i.e. while the master is down, waits for it).

Both ends run on their broker's event loop (ordq/common/loop.py): the master's sender task
writes what produce streams queued the moment it is woken (within a window of unanswered
bytes), its reader task counts the slave's answers and wakes the produce streams whose acks
that releases (no thread between the slave's answer and the ack); the slave appends, syncs
and answers a lone small request in its handler, and group-commits the rest on its replica
thread while the handler reads on, answering every request in order.

The stream is the slave's lean link (broker_group/lean_link.py: framed protobuf on one TLS
connection, the loops' own sockets) when its liveness node offers one, else the gRPC
``Replicate`` call; both carry the same messages to the same handler (``replicate_requests``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError

from ordq.broker_group import lean_link
from ordq.broker_group.config import server_options
from ordq.broker_group.first_write import FirstWrite
from ordq.broker_group.shared import Segment, Shared
from ordq.broker_group.write_path import WritePath
from ordq.common import security, stages
from ordq.common.errors import ConfigError, OrdqError
from ordq.common.loop import Signal
from ordq.common.stages import stamp
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import first_seqs
from ordq.wire.errors import SegmentNotWritable, abort
from ordq.wire.framing import GRPC_OPTIONS, REQUEST_BYTES, chunks
from ordq.wire.lean_frames import encoded_stream

log = logging.getLogger("ordq.replication")

# Bytes of batches sent to the slave and not answered yet (a window, not a count of requests):
# placed batches go at once while it has room, in requests of at most REPLICATE_STEP_BYTES, so
# the next requests travel while the slave syncs the one before, and its group commit takes what
# arrived meanwhile (replicate_requests). Two requests in flight, the rule this replaces, gave
# the second place to whatever small request came next: a large one then waited for both answers,
# and transfer and sync ran in series (issue 39: on the lean link a 4-8 MB request reached the
# slave 70-400 ms after the master wrote it, then took ~100 ms to sync, while both loops idled).
WINDOW_BYTES = 2 * REQUEST_BYTES
REPLICATE_STEP_BYTES = 1 << 20
# ``answers_many``: this master takes one answer for several requests (ReplicateResponse.answered);
# a slave answers one by one a master whose hello does not say so (an older one).
_HELLO = pb.ReplicateRequest(hello=True, answers_many=True)


class ReplicationLink:
    """The master's one replication stream to its slave (found through ZooKeeper). Its state
    is guarded by the broker lock (metrics read it from other threads); its tasks run on the
    broker's loop."""

    def __init__(self, shared: Shared, write: WritePath) -> None:
        self.shared = shared
        self.write = write
        self._cv = shared.cv  # one lock for all broker state
        self.wake = Signal(shared.loop)  # batches queued, window freed, address changed, stop
        self.connected = False
        self._gen = 0  # bumped on every (re)connect; a stale sender stops
        self._out: list[tuple[Segment, bytes]] = []
        self._announced: list[tuple[str, int]] = []  # new segments the slave is to create now
        self._active: dict[tuple[str, int], Segment] = {}
        self._lac_sent: dict[tuple[str, int], int] = {}
        # (when its oldest batch was forwarded, bytes, its batches while stage stamps are on: the
        # answer's stamp is keyed by them) of each request with batches the slave has not
        # answered, their bytes (the window), and the same of what waits in ``_out``.
        self._unanswered: collections.deque[tuple[float, int, Sequence[bytes]]] = collections.deque()
        self._unanswered_bytes = 0
        self._out_since = 0.0
        self._out_bytes = 0
        self._lean: tuple[lean_link.LeanCall, int] | None = None  # the lean link's call and its gen, once open
        self._pushed_at = 0.0  # when a LAC last went to the slave
        self._asleep_untimed = False  # the sender waits for a wake-up with no timer (nothing active)
        self._address: tuple[str, str] | None = None  # the slave's (gRPC address, lean link or "")
        self._link_down = ""  # the slave's lean link that could not be opened: gRPC until its node changes
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        store = self.shared.require_store()
        path = store.paths.live(self.shared.config.gid, "slave")
        store.client.DataWatch(path)(self._on_slave_node)

        async def spawn() -> asyncio.Task[None]:
            return asyncio.get_running_loop().create_task(self._run())

        self._task = self.shared.loop.run(spawn())

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._gen += 1
        self.wake.fire()

        async def finish() -> None:
            task = self._task
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - cancelled, or ended by an error
                    pass

        try:
            self.shared.loop.run(finish(), timeout_s=5)
        except Exception:  # noqa: BLE001 - the loop is gone already: nothing left to stop
            pass

    def _on_slave_node(self, data: bytes | None, _stat: Any, *_event: Any) -> None:
        node = json.loads(data.decode()) if data else None
        # The lean link when the slave offers one (broker_group/lean_link.py), else gRPC.
        address = (node["address"], node.get("replication") or "") if node else None
        with self._cv:
            if address != self._address:
                self._link_down = ""  # a new slave process (or link): its link is tried again
            self._address = address
        self.wake.fire()

    def forward(self, s: Segment, stamped: bytes) -> None:
        """Caller holds the broker lock, on the loop: queue a stamped batch for the slave
        (the caller wakes the sender once for all it forwards)."""
        if not self._out:
            self._out_since = time.monotonic()
        self._out.append((s, stamped))
        self._out_bytes += len(stamped)
        self._active[s.key] = s

    def announce(self, queue: str, seg: int) -> None:
        """On the loop: a new segment ZooKeeper placed on this group is about to be written.
        The slave is sent a request for it without batches (``serve_replicate`` creates its
        copy on any request, and answers none without batches) ahead of the first ones, so
        it creates its copy (a ZooKeeper read, files synced) while this master creates its
        own, not after: one set-up less on the way from a failover to its first ack."""
        with self._cv:
            self._announced.append((queue, seg))
        self.wake.fire()

    @property
    def forwards_at_once(self) -> bool:
        """Does ``flush`` write forwarded batches to the slave at once (the lean link is up)?
        On gRPC the sender task writes them once the caller yields."""
        return self._lean is not None

    def lag(self, now: float) -> tuple[int, float]:
        """Caller holds the broker lock: (bytes forwarded that the slave has not synced yet,
        seconds since the oldest of them was forwarded)."""
        pending = self._out_bytes + self._unanswered_bytes
        oldest = self._unanswered[0][0] if self._unanswered else self._out_since if self._out else now
        return pending, max(now - oldest, 0.0)

    # -- the stream ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            with self._cv:
                address = self._address
                if self._stopping:
                    return
                if address is not None:
                    self._gen += 1
                    gen = self._gen
                    self._out.clear()
                    self._announced.clear()
                    self._active.clear()
                    self._lac_sent.clear()
                    self._unanswered.clear()
                    self._unanswered_bytes = 0
                    self._out_bytes = 0
            if address is None:
                await self.wake.wait()
                continue
            await self._stream_once(address, gen)
            if self._stopping:
                return
            await self.wake.wait(0.1)  # a short pause before reconnecting (or a new address)

    async def _open_link(self, link: str) -> lean_link.LeanCall | None:
        """The slave's lean link; None when it cannot be opened (a firewalled or NAT'd port):
        counted, logged once, and gRPC carries the stream until the slave's node changes."""
        try:
            return await lean_link.connect(link, self.shared.config.credentials, frame_limit(self.shared))
        except (OSError, TimeoutError, ConfigError) as exc:  # ssl.SSLError is an OSError
            with self._cv:
                self._link_down = link
                self.shared.stats.replication_link_fallbacks += 1
            log.warning("the slave's lean replication link %s cannot be opened (%r): replicating over gRPC "
                        "(docs/OPERATIONS.md, The lean links)", link, exc)
            return None

    async def _stream_once(self, target: tuple[str, str], gen: int) -> None:
        address, link = target
        kind = "lean" if link and link != self._link_down else "grpc"
        channel: grpc.aio.Channel | None = None
        call: Any = None
        sender: asyncio.Task[None] | None = None
        try:
            if kind == "lean":
                call = await self._open_link(link)
                if call is None:
                    kind = "grpc"
                else:
                    address = link
            if call is None:
                channel = security.aio_channel(address, self.shared.config.credentials, GRPC_OPTIONS)
                call = encoded_stream(channel, "Replicate", pb.ReplicateResponse)()  # requests encoded by hand
            sender = self.shared.loop.loop.create_task(self._send(call, gen))
            async for resp in call:
                with self._cv:
                    if not self.connected:
                        self.connected = True
                        log.info("replicating to slave at %s (%s link)", address, kind)
                    if resp.synced:  # the answer to ``answered`` requests with batches (0: one), in order
                        answered = [self._unanswered.popleft()
                                    for _ in range(min(max(resp.answered, 1), len(self._unanswered)))]
                        for _, n, _ in answered:
                            self._unanswered_bytes -= n
                        stamp("M.slave_answer", _answered_keys, answered)
                    moved = []
                    for r in resp.synced:
                        s = self.shared.segments.get((r.queue, r.seg))
                        if s is not None:
                            s.replica.peer_progress(r.synced_end)
                            moved.append(s)
                            if s.first_write is not None and s.first_write.replicated is None:
                                s.first_write.replicated = time.monotonic()
                    # acks released: the produce streams answer now; these segments' readers read on
                    self.shared.lac_moved(moved)
                    waiting = bool(self._out)
                if waiting:
                    self.wake.fire()  # the window has room again for what waits
        except grpc.RpcError as exc:
            log.warning("replication stream to %s broke: %s", address, exc.code() if hasattr(exc, "code") else exc)
        except (TimeoutError, OSError, EOFError, ssl.SSLError, OrdqError, DecodeError) as exc:
            log.warning("replication link to %s broke: %r", address, exc)
        finally:
            self._lean = None
            if sender is not None:
                sender.cancel()
            if call is not None:
                call.cancel()
            if sender is not None:
                try:
                    await sender
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - cancelled, or its write failed with the stream
                    pass
            if channel is not None:
                await channel.close()
            self._broken()

    def _broken(self) -> None:
        with self._cv:
            was = self.connected
            self.connected = False
            self._gen += 1  # stops the sender of this stream
            frozen = self.write.freeze_writable("the replication stream to the slave broke", empty_too=False,
                                                error="the slave is not connected")
            if was:
                self.shared.stats.replication_breaks += 1
        if frozen:
            log.warning("froze %d segments after the slave stream broke", frozen)

    async def _send(self, call: Any, gen: int) -> None:
        """The stream's requests. Batches go out while the slave's unanswered bytes are
        within WINDOW_BYTES; beyond it they gather in ``_out`` and leave as the slave's
        answers free room. A moved LAC rides on the next batches, or goes alone once
        ``lac_push_ms`` passed since the last."""
        self._pushed_at = 0.0
        if isinstance(call, lean_link.LeanCall):
            await call.write(_HELLO)
            self._lean = (call, gen)  # ``flush`` may write on it from now on
        else:
            await call.write(_HELLO.SerializeToString())
        while True:
            with self._cv:
                if gen != self._gen or self._stopping:
                    return
                reqs, timeout = self._take()
            if reqs is None:
                self._asleep_untimed = timeout is None
                await self.wake.wait(timeout)
                self._asleep_untimed = False
                continue
            stamp("M.forward", _request_keys, reqs)
            if isinstance(call, lean_link.LeanCall):
                call.write_now(reqs)  # one transport write for all of them
                await call.drain()
            else:
                for r in reqs:
                    await call.write(r.body())

    def _take(self) -> tuple[list[lean_link.Outgoing] | None, float | None]:
        """Caller holds the lock: the requests that may go now (None: none), counted as sent;
        else how long the sender may sleep before a LAC is due alone (None: until woken)."""
        push_s = self.shared.config.lac_push_ms / 1000
        lacs = {k: s.replica.lac for k, s in self._active.items() if self._lac_sent.get(k) != s.replica.lac}
        sendable = window_share((len(b) for _, b in self._out), self._unanswered_bytes)
        can_send = sendable > 0
        now = time.monotonic()
        # A moved LAC rides on the next batches; alone it waits out lac_push_ms, so a
        # steady flow of small batches does not cost a message per batch.
        if not (can_send or self._announced or (lacs and now >= self._pushed_at + push_s)):
            if lacs:
                return None, self._pushed_at + push_s - now
            # LACs move when syncs finish, which do not wake us: look again soon
            return None, push_s if self._active else None
        announced, self._announced = self._announced, []
        out: list[tuple[Segment, bytes]] = []
        since = self._out_since
        if can_send:
            out, self._out = self._out[:sendable], self._out[sendable:]
            self._out_bytes -= sum(len(b) for _, b in out)
        if lacs:
            self._pushed_at = now
        self._lac_sent.update(lacs)
        # New segments first (no batches, no LAC: the slave creates its copy, no answer)
        reqs = [lean_link.Outgoing(q, n, [], -1) for q, n in announced]
        reqs += _requests_for(out, lacs)
        self.shared.stats.replication_requests += len(reqs)
        for r in reqs:
            if r.batches:
                n = sum(map(len, r.batches))
                self._unanswered.append((since, n, r.batches if stages.on() else ()))
                self._unanswered_bytes += n
        return reqs, None

    def flush(self) -> None:
        """On the loop, after ``forward``: on the lean link, write what may go now at once (a
        transport write does not wait, so no hop to the sender task and no loop turn: the
        slave has the batch while the local sync starts); on gRPC, wake the sender. What
        the window holds back waits in ``_out`` for the sender, woken by the slave's answer."""
        lean = self._lean
        if lean is None:
            self.wake.fire()
            return
        call, gen = lean
        with self._cv:
            if gen != self._gen or self._stopping:
                return
            reqs, _ = self._take()
        if reqs:
            stamp("M.forward", _request_keys, reqs)
            call.write_now(reqs)  # at most WINDOW_BYTES of batches unanswered: bounded
            if self._asleep_untimed:
                # The sender slept with no segment active: it must now push this one's LAC
                # every lac_push_ms (the LAC moves on syncs, which do not wake it).
                self.wake.fire()


def _request_keys(reqs: list[lean_link.Outgoing]) -> list[int]:
    """The first seqs of the batches ``reqs`` carry (stage stamps' keys)."""
    return [k for r in reqs for k in first_seqs(r.batches)]


def _answered_keys(answered: list[tuple[float, int, Sequence[bytes]]]) -> list[int]:
    """The first seqs of the batches of the requests the slave answered (``_unanswered``'s)."""
    return [k for _, _, batches in answered for k in first_seqs(batches)]


def window_share(sizes: Iterable[int], unanswered_bytes: int, window_bytes: int = WINDOW_BYTES) -> int:
    """How many of the waiting batches (their ``sizes``, in order) may go to the slave now:
    whole batches while the unanswered bytes stay within ``window_bytes``, and at least one
    when nothing is unanswered (a batch larger than the window still goes, alone)."""
    room = window_bytes - unanswered_bytes
    n = 0
    for size in sizes:
        if size > room and (n or unanswered_bytes):
            break
        room -= size
        n += 1
    return n


def _requests_for(out: list[tuple[Segment, bytes]], lacs: dict[tuple[str, int], int]) -> Iterator[lean_link.Outgoing]:
    """Group batches by segment (keeping their order), split by ``chunks`` at
    REPLICATE_STEP_BYTES, with each segment's LAC on its last request; LAC-only requests for
    the rest."""
    by_seg: dict[tuple[str, int], list[bytes]] = {}
    for s, b in out:
        by_seg.setdefault(s.key, []).append(b)
    for key, batches in by_seg.items():
        parts = list(chunks(batches, REPLICATE_STEP_BYTES))
        for i, chunk in enumerate(parts):
            yield lean_link.Outgoing(key[0], key[1], chunk, lacs.get(key, -1) if i == len(parts) - 1 else -1)
    for key, lac in lacs.items():
        if key not in by_seg:
            yield lean_link.Outgoing(key[0], key[1], [], lac)


def frame_limit(shared: Shared) -> int:
    """The longest replication message either end reads (the broker's gRPC receive limit)."""
    return int(dict(server_options(shared.config))["grpc.max_receive_message_length"])


async def serve_replicate(shared: Shared, write: WritePath, requests: AsyncIterator[pb.ReplicateRequest],
                          context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Slave side of the gRPC ``Replicate`` stream (``replicate_requests``; the lean link,
    broker_group/lean_link.py, serves the same)."""
    if shared.config.role.value != "slave":
        await abort(context, SegmentNotWritable(shared.address, "*", -1,
                                                "replication goes to the slave, this is the master"))
    try:
        await replicate_requests(shared, write, requests, context.write)
    except OrdqError as exc:
        await abort(context, exc)


async def replicate_requests(shared: Shared, write: WritePath, requests: AsyncIterator[pb.ReplicateRequest],
                             send: Callable[[pb.ReplicateResponse], Awaitable[None]]) -> None:
    """Slave side: append and sync what the master sends, then answer each request with the
    synced end, in order. A lone small request (a synchronous send's) is synced and answered
    right here, on the loop (the fdatasync blocks it: nothing else of the slave's is as urgent
    as the ack it holds up); every other goes to the replica thread's group commit
    (replica_commits.py) and is answered by ``_Answers`` once that commit is done, while this
    handler reads the next requests (at most WINDOW_BYTES of them ahead of the answers).
    Every request that carries batches is answered, in order (the master counts them): one
    answer each, or, when the master's hello says ``answers_many``, one answer for all those
    whose commits are done when it is sent (``ReplicateResponse.answered`` says how many);
    none for a LAC-only request, an empty one for hello. A refusal is logged, counted and raised (the
    caller ends the stream with it)."""
    answers = _Answers(shared, send)
    try:
        async for req in requests:
            if req.hello:
                answers.many = req.answers_many
                await send(pb.ReplicateResponse())
                continue
            stamp("S.request", first_seqs, req.batches)
            s, accepted = await write.place_replica(req.queue, req.seg, list(req.batches), req.lac)
            if not req.batches:
                continue
            alone = answers.owed == 0
            commit = write.commit_replica(s, accepted, alone=alone) if accepted else None
            keys = first_seqs(req.batches) if stages.on() else ()  # of the answer's stage stamp
            if alone and commit is None:
                await _answer(shared, [s], send, keys)
                continue
            answers.owe(s, commit, sum(map(len, req.batches)), keys)
            await answers.room(WINDOW_BYTES)
    except OrdqError as exc:
        log.error("refused replicated data: %s", exc)
        shared.count_refused(exc)
        raise
    finally:
        await answers.close()


class Owed(NamedTuple):
    """An answer the slave owes: for a request with batches of ``s``, once ``commit`` is done
    (None: nothing to wait for), ``size`` bytes of batches, their first seqs ``keys``."""

    s: Segment
    commit: concurrent.futures.Future[None] | None
    size: int
    keys: Iterable[int]


def ready_to_answer(owed: Sequence[Owed], many: bool) -> int:
    """How many of the answers ``owed`` (in request order; the first's commit is done) one
    answer covers now: the first, and with ``many`` every next one whose commit is done too (the
    same group commit, or one that ended meanwhile). Never one whose commit is still running:
    no answer waits for another."""
    n = 1
    while many and n < len(owed):
        commit = owed[n].commit
        if commit is not None and not commit.done():
            break
        n += 1
    return n


class _Answers:
    """The slave's answers owed on one replication stream, sent in request order by a task of
    their own, each once the commit that holds its batches is done; with ``many`` (the
    master's hello said so) one answer covers every request whose commit is done by then, so a
    group commit of N requests costs one stream write, not N. If sending fails, the stream's
    handler is cancelled and raises that error."""

    def __init__(self, shared: Shared, send: Callable[[pb.ReplicateResponse], Awaitable[None]]) -> None:
        self._shared, self._send = shared, send
        self.many = False
        self._owed: collections.deque[Owed] = collections.deque()
        self._added = asyncio.Event()
        self.owed = 0  # answers queued or being sent
        self._owed_bytes = 0
        self._freed = asyncio.Event()
        self._handler = asyncio.current_task()
        self._task: asyncio.Task[None] | None = None

    def owe(self, s: Segment, commit: concurrent.futures.Future[None] | None, size: int,
            keys: Iterable[int] = ()) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(self._ended)
        self.owed += 1
        self._owed_bytes += size
        self._owed.append(Owed(s, commit, size, keys))
        self._added.set()

    async def room(self, limit: int) -> None:
        """Until the answers owed hold at most ``limit`` bytes of batches."""
        while self._owed_bytes > limit:
            self._freed.clear()
            await self._freed.wait()

    async def _run(self) -> None:
        while True:
            while not self._owed:
                self._added.clear()
                await self._added.wait()
            commit = self._owed[0].commit
            if commit is not None:
                await asyncio.wrap_future(commit)
            n = ready_to_answer(self._owed, self.many)
            taken = [self._owed.popleft() for _ in range(n)]
            await _answer(self._shared, [o.s for o in taken], self._send, [k for o in taken for k in o.keys])
            self.owed -= n
            self._owed_bytes -= sum(o.size for o in taken)
            self._freed.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._handler is not None:
            self._handler.cancel()  # the handler raises the error (close)

    async def close(self) -> None:
        task = self._task
        if task is None:
            return
        task.remove_done_callback(self._ended)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def _answer(shared: Shared, segments: Sequence[Segment],
                  send: Callable[[pb.ReplicateResponse], Awaitable[None]], keys: Iterable[int] = ()) -> None:
    """The answer to ``len(segments)`` requests with batches, one of ``segments`` each, in
    order (their first seqs ``keys``, for the stage stamp): each copy's synced end now."""
    firsts: list[FirstWrite] = []
    ends: dict[tuple[str, int], int] = {}  # (queue, seg) -> synced end, read under the lock
    with shared.cv:
        for s in segments:
            ends[s.key] = s.replica.local_synced
            fw = s.first_write
            if fw is not None and fw.done is None:
                fw.done = time.monotonic()
                firsts.append(fw)
        shared.stats.replication_answers += 1
        shared.stats.replication_answered += len(segments)
    stamp("S.answer", keys)
    shared.synced_watches.push(ends)  # the producers watching these segments first: their acks wait on it
    synced = [pb.ReplicaSegment(queue=q, seg=n, synced_end=end) for (q, n), end in ends.items()]
    await send(pb.ReplicateResponse(synced=synced, answered=len(segments) if len(segments) > 1 else 0))
    for fw in firsts:  # a new segment's first answer went out: how long it took
        log.info("%s", fw.line("slave"))
