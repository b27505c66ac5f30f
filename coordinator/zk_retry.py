"""Bounded retries of transient ZooKeeper errors, wherever a process starts or serves (issue 26).

Guarantee: ``retry_zk(call, what)`` returns what ``call()`` returns, calling it again while
ZooKeeper gives a *transient* answer — connection loss, session moved or expired, operation
timeout, no answer in time (a paused or restarting server, a process of ours starved past a
ping) — for at most ``bound_s``; then it raises one CoordinationUnavailable that names the step
(``what``), the bound and the last error. A *definite* answer stops it at once: NoAuth becomes
ZkAccessDenied (kazoo errors are translated by ``ordq.coordinator.store_base.zk_errors``, the one place
they enter); anything else (NoNode, BadVersion, ordq's own errors, a closed client) propagates
unchanged, so callers keep their meaning.

Rules: one way to retry ZooKeeper at start (broker registration and token load, the
coordinator's start, ``ordq up``'s steps, the SDK's start). The call must be safe to repeat: a
write that may have landed before its connection dropped must recognise its own result (see
``ZkStore.register_live``). Time and sleep are injected for tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import RetryFailedError

from ordq.common.errors import CoordinationUnavailable
from ordq.coordinator.store_base import zk_errors

log = logging.getLogger("ordq.zk")

T = TypeVar("T")

# How long a start rides out transient ZooKeeper errors: a restarted standalone server serves
# again within 1-3 s, an ensemble elects a leader in ~0.4 s (STACK-NOTES); 30 s also covers a
# machine so busy that this process misses its pings for a while.
START_BOUND_S = 30.0
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0


# ZooKeeper did not answer (as opposed to answering no); but not ConnectionClosedError, a
# client we closed ourselves. RetryFailedError: a read's own retry (ZkStore) gave up.
TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionExpiredError, SessionMovedError, KazooTimeoutError,
             RetryFailedError)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (after ``zk_errors``) is worth another try: a CoordinationUnavailable
    that a transient ZooKeeper error caused. Not one from the coordinator service (it bounds
    its own retries), nor a client closed under us."""
    cause = exc.__cause__
    return (isinstance(exc, CoordinationUnavailable) and isinstance(cause, TRANSIENT)
            and not isinstance(cause, ConnectionClosedError))  # kazoo derives it from SessionExpiredError


def retry_zk(call: Callable[[], T], what: str, *, bound_s: float = START_BOUND_S, hosts: str = "",
             stopped: Callable[[], bool] | None = None, sleep: Callable[[float], object] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried with back-off (50 ms doubling to 1 s) while ZooKeeper's answer is
    transient, for at most ``bound_s`` seconds.

    ``what``: the step, for the one line an exhausted bound gives ("register liveness of g1/master").
    ``stopped``: when it returns True the retrying ends early (the process is stopping).
    Raises CoordinationUnavailable when the bound runs out; ZkAccessDenied on NoAuth; any other
    error of ``call`` as is."""
    deadline = clock() + bound_s
    delay = FIRST_DELAY_S
    tries = 0
    while True:
        tries += 1
        try:
            with zk_errors(hosts):
                return call()
        except CoordinationUnavailable as exc:
            if not transient(exc):
                raise
            left = deadline - clock()
            if left <= 0 or (stopped is not None and stopped()):
                raise CoordinationUnavailable(
                    f"{what}: ZooKeeper did not answer for {bound_s:g}s ({tries} tries; last: {exc})"
                ) from exc
            if tries == 1:
                log.warning("%s: %s; retrying for up to %gs", what, exc, bound_s)
            sleep(min(delay, left))
            delay = min(delay * 2, MAX_DELAY_S)

