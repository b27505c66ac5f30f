"""An asyncio event loop on a daemon thread, for a process's or a client's gRPC I/O (grpc.aio):
one per broker process (broker_group/service.py), one per Producer (sdk/producer.py). Or, for
an AsyncProducer (sdk/aio.py), the caller's own running loop (``HostedLoop``), with the same
interface (``LoopHost``).

Rules:
- Owns the loop, its thread and a pool of worker threads (``workers``, made as needed) for
  the blocking steps (ZooKeeper, the Seal protocol, disk: ``run_blocking``); nothing else.
  What runs on the loop is its owner's.
- ``call_soon`` is the only way in from another thread that does not wait: it wakes the loop
  once per call, so callers batch their reasons to wake it (one wake-up per batch, not per
  message).
- ``stop`` cancels what is still scheduled, lets it finish, closes the loop and joins the
  thread: nothing is left running and no coroutine is left un-awaited. (A ``HostedLoop``'s
  owner cancels its own tasks; the loop is not its to stop.)

The loop is uvloop's (``ORDQ_LOOP=asyncio``: the standard library's). Why: the data path's lean
links are asyncio streams with TLS, and the standard loop runs its TLS layer (sslproto) and
its scheduling in Python on every frame; uvloop runs both in Cython. At a steady 2,000 msgs/s
it cut the CPU per batch of every process (docs/BENCHMARKS.md, issue 39, fast39n).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("ordq.loop")

# Completions of grpc.aio calls handed to a loop already closed (``_drop_stale_grpc_handoff``),
# in this process so far.
stale_grpc_handoffs = 0


def _drop_stale_grpc_handoff(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loops' exception handler. grpc.aio's poller thread (one per process) wakes every loop
    that made grpc.aio objects, and whichever reads the wake-up hands each completion to the
    loop its call was made on (grpc/grpc#25364). A completion for a loop already closed (a
    Producer closed while another of the process runs on: a TopicProducer's partitions) raised
    RuntimeError in that hand-off, printed as an "Exception in callback
    PollerCompletionQueue._handle_events" traceback on the user's terminal (docs/SDK.md's
    TopicProducer example, 1 run in ~5). Nothing waits for that completion (its owner closed),
    and no other is lost: each completion writes its own wake-up, so those queued behind it are
    handled at the next. Two loops woken for one wake-up: the other's BlockingIOError, the same.
    Counted, logged at debug; anything else goes to asyncio's default handler."""
    global stale_grpc_handoffs
    exc = context.get("exception")
    if "PollerCompletionQueue._handle_events" in repr(context.get("handle")) and (
            isinstance(exc, BlockingIOError) or (isinstance(exc, RuntimeError) and "closed" in str(exc))):
        stale_grpc_handoffs += 1
        log.debug("grpc.aio: a completion for a closed loop dropped (%r)", exc)
        return
    loop.default_exception_handler(context)


# The switch: ``ORDQ_LOOP=asyncio`` in a process's environment gives its loops the standard
# library's event loop instead of uvloop's (to compare, or where uvloop misbehaves).
ENV = "ORDQ_LOOP"


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's, unless ``ORDQ_LOOP=asyncio`` or uvloop cannot be imported."""
    if os.environ.get(ENV, "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:  # pragma: no cover - a platform without uvloop (it is a dependency)
            log.info("uvloop cannot be imported: the standard library's event loop")
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class LoopHost:
    """An event loop a client's I/O runs on, and how other threads reach it: ``LoopThread``
    (a loop on a thread of its own) or ``HostedLoop`` (the caller's running loop)."""

    name: str
    loop: asyncio.AbstractEventLoop
    _thread: threading.Thread  # the loop's
    _worker: concurrent.futures.ThreadPoolExecutor

    @property
    def in_loop(self) -> bool:
        """Is the caller on the loop's thread?"""
        return threading.current_thread() is self._thread

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = 5.0) -> None:
        raise NotImplementedError

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread (never waits). Dropped once the loop
        is closed: nothing runs there any more, and a thread finishing late (a producer's roll
        answered after ``close``) must not die of it. From the loop's own thread it is a plain
        ``call_soon``: no wake-up to write."""
        try:
            if self.in_loop:
                self.loop.call_soon(fn, *args)
            else:
                self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread only)."""
        assert not self.in_loop, f"{type(self).__name__}.run() from the loop itself would deadlock"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """On the loop: run a blocking ``fn(*args)`` on the worker thread and await it."""
        return await self.loop.run_in_executor(self._worker, fn, *args)


def _workers(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-blocking")


class HostedLoop(LoopHost):
    """The caller's running loop lent to a client (``AsyncProducer``): its I/O runs there, so a
    send awaited on that loop is written and settled with no hop between threads (issue 39: the
    hand-off to a producer's own loop thread and back cost ~100-150 µs of a synchronous send).
    Make it on the loop's thread. Its owner stops its own tasks and connections; ``stop`` only
    ends the worker threads (the loop is the caller's, and goes on)."""

    def __init__(self, name: str, *, workers: int = 1) -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self._thread = threading.current_thread()
        self._worker = _workers(name, workers)

    def start(self) -> None:
        pass  # it runs already

    def stop(self, timeout_s: float = 5.0) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


class LoopThread(LoopHost):
    """``start()`` runs a new event loop on a daemon thread named ``name``; ``stop()`` ends it."""

    def __init__(self, name: str, *, workers: int = 1) -> None:
        self.name = name
        self.loop = new_loop()
        self.loop.set_exception_handler(_drop_stale_grpc_handoff)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker = _workers(name, workers)
        self.loop.set_default_executor(self._worker)
        self._started = False
        self._stopped = False

    def start(self) -> None:
        ready = threading.Event()
        self.loop.call_soon(ready.set)
        self._started = True
        self._thread.start()
        ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel the tasks still running, let them finish (bounded), close the loop. The
        worker thread is not waited for: a blocking step in progress ends on its own (its
        result is dropped)."""
        if self._stopped:
            return
        self._stopped = True
        if self._started and self._thread.is_alive():
            try:
                self.run(self._cancel_all(), timeout_s)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # a task that ignores cancellation: the loop is stopped anyway
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def _cancel_all(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.loop.shutdown_asyncgens()
        abort_connections(self.loop)


# Connections a loop's tasks opened (``track_connection``), aborted when the loop stops. Why:
# uvloop's close of a loop runs it until every handle is closed, so one connection left open
# keeps ``stop`` waiting for ever (a producer's close hung so). Cancelling the tasks is not
# enough: a task that was connecting may swallow the cancellation (Python 3.11's
# ``asyncio.wait_for`` returns a result that came at the moment it was cancelled) and finish
# opening after the others were cancelled.
# Keyed weakly: a loop lent by its caller (HostedLoop) is not stopped by us, and must not be kept
# alive by its entry here once its owner closed it.
_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[asyncio.BaseTransport]] = (
    weakref.WeakKeyDictionary())


def track_connection(transport: asyncio.BaseTransport) -> None:
    """On the loop: ``transport`` ends with the loop at the latest (``LoopThread.stop``)."""
    _connections.setdefault(asyncio.get_running_loop(), weakref.WeakSet()).add(transport)


def abort_connections(loop: asyncio.AbstractEventLoop) -> None:
    """Abort every tracked connection of ``loop`` still open (the loop is stopping)."""
    for transport in list(_connections.pop(loop, ())):
        if not transport.is_closing():
            transport.abort()  # type: ignore[attr-defined]


class Signal:
    """A broadcast wake-up for a loop's waiters: ``await wait()`` until the next ``fire()``.

    How a waiter loses no wake-up: state changes happen (under their owner's lock) before the
    signal fires, and a waiter checks its condition and starts waiting without an ``await``
    in between; another thread's ``fire`` reaches the loop through ``call_soon_threadsafe``.
    """

    def __init__(self, loop_thread: LoopHost) -> None:
        self._lt = loop_thread
        self._waiters: set[asyncio.Future[None]] = set()

    async def wait(self, timeout_s: float | None = None) -> None:
        """Until the next fire (or ``timeout_s``). Check the condition just before, with no
        ``await`` in between."""
        fut: asyncio.Future[None] = self._lt.loop.create_future()
        self._waiters.add(fut)
        timer = None if timeout_s is None else self._lt.loop.call_later(max(timeout_s, 0.0), _settle, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.discard(fut)  # timed out or cancelled: forget it

    def fire(self) -> None:
        """Wake every waiter; from any thread."""
        if self._lt.in_loop:
            self._fire()
        else:
            self._lt.call_soon(self._fire)  # dropped when the loop is closed: nobody waits any more

    def _fire(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            _settle(fut)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


EARLY_RING_S = 0.002  # a timer rung this close before its deadline is armed this far ahead (_OneTimer._ring)


class _OneTimer:
    """One timer for a series of deadlines that come one after the other and mostly move
    forward: armed when none is, left armed from one to the next, armed again when it rings
    before the deadline under way (``_pending``) is due, left unarmed when none is under way
    (the next one arms it); ``_expire`` when it is due. So a series makes about one timer per
    deadline's length of time, not one per deadline (issue 39: a Read stream's long polls and
    writes each made and cancelled one, hundreds a second). On the loop only; ``close`` when
    the series ends."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0.0  # when it rings (time.monotonic)
        self.timers = 0  # timers made (a statistic: what this saves)

    def _pending(self) -> float | None:
        raise NotImplementedError

    def _expire(self) -> None:
        raise NotImplementedError

    def _ring_by(self, due: float) -> None:
        """Have the timer ring at ``due`` at the latest."""
        if self._timer is not None and self._armed_for <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self.timers += 1
        self._armed_for = due
        self._timer = asyncio.get_running_loop().call_later(max(due - time.monotonic(), 0.0), self._ring)

    def _ring(self) -> None:
        self._timer = None
        due = self._pending()
        if due is None:
            return
        now = time.monotonic()
        if now >= due:
            self._expire()
        else:
            # Rung for an earlier deadline: armed again for this one, but at least EARLY_RING_S
            # ahead. A ring early by the loop clock's rounding (uvloop reads its clock in whole
            # ms at an iteration's start) re-armed for the sub-ms rest rang early again, once per
            # iteration while the thread was starved (6 timers for one deadline beside six busy
            # loops); the wait ends at most EARLY_RING_S late.
            self._ring_by(max(due, now + EARLY_RING_S))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Alarm(_OneTimer):
    """Waits on ``Signal``s, one wait after the other, each until the next fire of any of
    its signals or its own deadline, as ``Signal.wait`` does, on one timer (``_OneTimer``)
    where ``Signal.wait`` makes and cancels one per wait: a caught-up reader's stream waits
    once or more per answer. One waiter at a time."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: asyncio.Future[None] | None = None
        self._due = 0.0  # the deadline of the wait under way
        self._expired = False  # the wait under way was ended by its deadline, not a signal

    async def wait(self, due: float, *signals: Signal) -> bool:
        """Until the next fire of one of ``signals``, or ``due`` (``time.monotonic()``); True
        when a signal ended it. As ``Signal.wait``: check the condition just before, with no
        ``await`` in between."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for signal in signals:
            signal._waiters.add(fut)
        self._waiting, self._due, self._expired = fut, due, False
        self._ring_by(due)
        try:
            await fut
            return not self._expired
        finally:
            self._waiting = None
            for signal in signals:
                signal._waiters.discard(fut)  # fired by another, timed out or cancelled: forget it

    def _pending(self) -> float | None:
        return None if self._waiting is None else self._due

    def _expire(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._expired = True
            self._waiting.set_result(None)


class StepTimeout(_OneTimer):
    """``async with step:`` bounds one step of the task by ``limit_s`` as ``asyncio.timeout``
    does (the task is cancelled and the block raises TimeoutError), for a task that takes
    many such steps (a Read stream's writes), on one timer (``_OneTimer``) where
    ``asyncio.timeout`` makes and cancels one per step. One task at a time."""

    def __init__(self, limit_s: float) -> None:
        super().__init__()
        self.limit_s = limit_s
        self._task: asyncio.Task[Any] | None = None
        self._since: float | None = None  # when the step under way began (time.monotonic)
        self._cancelling = 0  # the task's cancel requests when the step began
        self._expired = False

    async def __aenter__(self) -> StepTimeout:
        task = self._task = asyncio.current_task()
        assert task is not None, "StepTimeout outside a task"
        self._since = time.monotonic()
        self._cancelling = task.cancelling()
        self._expired = False
        self._ring_by(self._since + self.limit_s)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        _tb: Any) -> None:
        self._since = None
        if self._expired and self._task is not None:
            self._expired = False
            # as asyncio.timeout: our cancellation, and no other request for it, is a timeout
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _pending(self) -> float | None:
        return None if self._since is None else self._since + self.limit_s

    def _expire(self) -> None:
        if self._task is not None:
            self._expired = True
            self._task.cancel()


class KeyedLocks:
    """One ``asyncio.Lock`` per key, made when first wanted and dropped when nobody holds or waits
    for it (so keys that come and go, such as client tokens, leave nothing behind). On the loop
    only. ``hold(key)``: ``async with`` it; its waiters go in turn (asyncio's lock is FIFO)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # key -> (lock, [holders and waiters])

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]
