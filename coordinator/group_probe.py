"""The coordinator's own probe of an absent group's processes (issue 43; the policy is the pure
``coordinator/away.py``): a Health call to the last address each process registered, sent on
a small pool so a hung process's timeout never holds a duty round.

Rules: I/O only, no policy. One call in flight per process, at most one every ``interval_s``;
every answer (and when it was asked) goes to ``on_answer``, which the daemon records.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable

from ordq.common.errors import BrokerUnavailable, OrdqError
from ordq.common.security import Credentials
from ordq.coordinator.away import Probe

log = logging.getLogger("ordq.coordinator")

# (address, gid, role) -> what the process there said
Pinger = Callable[[str, str, str], Probe]
# A probe waits this long for an answer: a process on a loaded box answers late, not never.
PING_TIMEOUT_S = 2.0
PING_INTERVAL_S = 1.0
PING_WORKERS = 2


def classify(exc: BaseException) -> Probe:
    """What a failed Health call says of the process: refused (or an address nobody serves) is
    GONE; a timeout is SILENT; an error our broker sent (typed) means it runs: ANSWERED."""
    if not isinstance(exc, BrokerUnavailable):
        return Probe.ANSWERED if isinstance(exc, OrdqError) else Probe.SILENT
    cause = exc.__cause__
    code = cause.code() if cause is not None and hasattr(cause, "code") else None
    details = (cause.details() if cause is not None and hasattr(cause, "details") else str(exc)) or ""
    name = getattr(code, "name", "")
    if name == "UNAVAILABLE" and "timeout" not in details.lower() and "deadline" not in details.lower():
        return Probe.GONE
    return Probe.SILENT


def make_pinger(credentials: Credentials | None = None, *, timeout_s: float = PING_TIMEOUT_S) -> Pinger | None:
    """A Health prober of broker processes, or None when the broker client is unavailable."""
    try:
        from ordq.wire.client import GrpcTransport
    except ImportError:
        return None
    transport = GrpcTransport(rpc_timeout_s=timeout_s, credentials=credentials or Credentials())

    def ping(address: str, gid: str, role: str) -> Probe:
        try:
            answer = transport.health(address)
        except OrdqError as exc:
            return classify(exc)
        if answer.gid == gid and answer.role == role:
            return Probe.ANSWERED
        return Probe.GONE  # another process serves that address now

    return ping


class GroupProber:
    """Sends the pings the daemon asks for (``ask``) on its pool; ``close()`` ends it."""

    def __init__(self, ping: Pinger, on_answer: Callable[[str, str, Probe, float], None], *,
                 interval_s: float = PING_INTERVAL_S, workers: int = PING_WORKERS) -> None:
        self._ping = ping
        self._on_answer = on_answer
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._in_flight: set[tuple[str, str]] = set()
        self._last: dict[tuple[str, str], float] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ordq-ping")
        self.sent = 0

    def ask(self, gid: str, role: str, address: str) -> None:
        """Ping ``gid``'s ``role`` at ``address`` unless one is in flight or was sent lately."""
        key = (gid, role)
        now = time.monotonic()
        with self._lock:
            if key in self._in_flight or now - self._last.get(key, float("-inf")) < self.interval_s:
                return
            self._in_flight.add(key)
            self._last[key] = now
            self.sent += 1
        try:
            self._pool.submit(self._run, gid, role, address, now)
        except RuntimeError:  # closed: stopping
            with self._lock:
                self._in_flight.discard(key)

    def _run(self, gid: str, role: str, address: str, sent: float) -> None:
        try:
            answer = self._ping(address, gid, role)
        except Exception:  # noqa: BLE001 - a bug in a probe must not end the pool's thread
            log.exception("probing %s %s at %s", gid, role, address)
            answer = Probe.SILENT
        finally:
            with self._lock:
                self._in_flight.discard((gid, role))
        log.debug("group %s %s at %s: %s", gid, role, address, answer.value)
        self._on_answer(gid, role, answer, sent)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
