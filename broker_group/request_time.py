"""Each token's share of the broker's request time (issue 25), like Kafka's request-time quota.

Guarantee: the time the broker spends on one token's calls is charged to that token: the
handlers' own steps on the event loop, refused calls included; a fixed price per call for what
gRPC does before a handler runs; a worker's CPU time building its answers (it holds the GIL the
loop needs; one worker at a time per token, service.Broker._read_slot); a price per byte of its
requests received and of its answers sent (TLS, copies). A token that took more
than ``share`` of the loop (seconds per second, over a window of ``burst_s``) is in debt: its
next call (or the next request of its produce stream, the next answer of its Read stream)
waits, asleep, until the debt is paid; a call that would wait longer than ``max_delay_ms`` is
refused after that long (at once past ``max_held`` waiting calls of the token), before its
request is read, with ``ResourceExhausted`` (retriable, counted). Delaying, as Kafka does,
slows a client that calls again as soon as it is answered; a refusal at once did not (one
token's huge fetches, refused at once, came back at ~85 calls/s).
One token's abuse therefore costs its own share, not the loop its neighbours' acks need.
Calls without a token (the group's own peers: replication, repair, the coordinators) are
neither charged nor held.

Work-conserving (issue 39): the share is enforced only while another token that keeps to
its own share (more than half its bucket left) made a call, a stream step or a wait within
the last ``contention_s``. A token alone on the broker is never held, nor are tokens that
are all over their shares (the loop's queue shares it among them), and what a token takes
meanwhile is not kept as debt (its bucket is empty, not overdrawn, when a neighbour comes):
held at share 0.2 while alone, one producer and its consumer got half the pipelined rate
with the loop 78 % idle.

Rules:
- ``RequestTime`` is pure accounting: no gRPC, no clock, no waiting; the caller gives ``now``.
  It is used on the broker's event loop only (not thread-safe).
- ``timed`` measures a coroutine's steps on the loop (the time between its resumptions and
  its next await) and charges them in sums of at least ``CHARGE_QUANTUM_S`` (and what is left
  when the coroutine ends): a token's debt shows at most that much loop time late per open
  call or stream. Why: a charge is the bucket's arithmetic (a few µs with a neighbour token
  active), and a produce stream's steps are tens of µs each; charged one by one they cost
  the master's loop ~5 charges a batch at issue 39's steady rate. A worker's read is
  measured there (``time.thread_time``) and charged by the broker; answer bytes are also
  paced on their own (budget.ReadPace).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

# The accounting is shared with the coordinator service (ordq/common/request_time.py).
from ordq.common.request_time import RequestTime as RequestTime
from ordq.common.request_time import RequestTimeConfig as RequestTimeConfig
from ordq.common.request_time import RequestTimeStatistics as RequestTimeStatistics

T = TypeVar("T")
# ``timed`` charges its steps' time once they add up to this much (module docstring)
CHARGE_QUANTUM_S = 0.001

# A broker's shares are enforced only while its loop is nearly full: all tokens together charged
# this much of it lately (RequestTimeConfig.busy_share). 0.6 (stop 60) was under what the
# noisy-neighbour drill's queue takes alone at 2,000 msgs/s (0.6-0.7 s/s), so a second token
# costing 0.06 s/s had it held 0.1-0.4 s every second (stop 67).
LOOP_BUSY_SHARE = 0.9


def broker_request_time(share: float | None = 0.2, busy_share: float | None = LOOP_BUSY_SHARE) -> RequestTimeConfig:
    """A broker's request-time config: ``share`` per token, held only on a busy loop
    (``busy_share``: None or 0, whenever another token is active)."""
    return RequestTimeConfig(share=share, busy_share=busy_share or None)


class ChargeSum:
    """Charges summed: ``add(seconds)`` calls ``charge`` with the sum once it reaches
    ``quantum_s``; ``flush`` charges what is left (call it when the call or stream ends). A
    token's debt therefore shows at most ``quantum_s`` late per open call or stream, and the
    bucket's arithmetic (``RequestTime.charge``: a few µs with a neighbour token active) runs
    once per quantum instead of once per step or per answer (issue 39)."""

    __slots__ = ("_charge", "_quantum_s", "owed")

    def __init__(self, charge: Callable[[float], None], quantum_s: float = CHARGE_QUANTUM_S) -> None:
        self._charge, self._quantum_s = charge, quantum_s
        self.owed = 0.0  # added, not charged yet

    def add(self, seconds: float) -> None:
        owed = self.owed + seconds
        if owed >= self._quantum_s:
            self._charge(owed)
            owed = 0.0
        self.owed = owed

    def flush(self) -> None:
        owed, self.owed = self.owed, 0.0
        if owed:
            self._charge(owed)


class _Timed:
    """``coro`` driven step by step; the time each step held the loop (from its resumption to
    its next await, or its end) is summed and ``charge(seconds)`` called with the sum once it
    reaches ``quantum_s``, and with what is left when the coroutine ends."""

    def __init__(self, coro: Coroutine[Any, Any, T], charge: Callable[[float], None],
                 quantum_s: float = CHARGE_QUANTUM_S) -> None:
        self._coro, self._charge, self._quantum_s = coro, charge, quantum_s

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, clock = self._coro, time.perf_counter
        owed = ChargeSum(self._charge, self._quantum_s)  # steps' time not charged yet
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                owed.add(clock() - t0)
                owed.flush()
                return done.value
            except BaseException:
                # Not held here as it leaves: its traceback holds this frame (a cycle, freed
                # only by a full collection, with the coroutine and all it refers to).
                error = None
                owed.add(clock() - t0)
                owed.flush()
                raise
            error = None  # (thrown and handled: the coroutine went on)
            owed.add(clock() - t0)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine, as a Task would
                value, error = None, exc


async def timed(coro: Coroutine[Any, Any, T], charge: Callable[[float], None]) -> T:
    """Await ``coro``, calling ``charge(seconds)`` with its steps' time on the loop, in sums of
    at least ``CHARGE_QUANTUM_S`` and the rest at its end (``_Timed``)."""
    result: T = await _Timed(coro, charge)
    return result
