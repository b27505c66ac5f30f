"""The consumer's side of delayed delivery that talks to the coordinator: the subscription's
delay (read before the first message and again every ``SETTINGS_REFRESH_S``, so ``ordq sub
alter --delay`` reaches a running consumer) and the report of what it waits on (shown by
``ordq sub list`` as *waiting on time*, not stuck).

Guarantee: no message is handed out before its due time under the delay the consumer knows.
The delay is read before the first hand-out of every lease (``read_delay_ms`` at start and
after a rejoin); a change made by ``sub alter`` applies within ``SETTINGS_REFRESH_S``.

Rules: the report is best effort and never on the delivering thread: a thread of its own
writes at most one record a second (when what is held changed), and only while the lease is
ours; a coordinator that does not answer costs a log line, never a delay in delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ordq.common.errors import ConfigError, OrdqError
from ordq.coordinator.client import CoordinatorClient
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk.delay import TimeGate

log = logging.getLogger("ordq.consumer")

REPORT_EVERY_S = 1.0
SETTINGS_REFRESH_S = 5.0
_CALL_TIMEOUT_S = 3.0


def read_delay_ms(coord: CoordinatorClient, lease: CoordinatorLease, *, timeout_s: float | None = None) -> int:
    """The subscription's delay (0: none), asked of the coordinator with the lease."""
    try:
        settings = coord.record(lease.held, "settings", timeout_s=timeout_s)
    except ConfigError:  # a coordinator from before delayed delivery: it knows no settings
        return 0
    return int((settings or {}).get("delay_ms", 0))


class DelayReporter:
    """A thread: refresh ``gate.delay_us`` from the subscription's settings, and report what
    the gate holds (``set_waiting``) when it changed, at most once per ``REPORT_EVERY_S``."""

    def __init__(self, coord: CoordinatorClient, lease: CoordinatorLease, gate: TimeGate, *,
                 name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._coord = coord
        self._lease = lease
        self._gate = gate
        self._clock = clock
        self._stop = threading.Event()
        self._reported: tuple[int, int] | None = None  # what the coordinator shows now
        self._next_settings = clock() + SETTINGS_REFRESH_S
        self.reports = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_CALL_TIMEOUT_S + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            if not self._lease.valid():
                continue  # not ours now: the holder (ours again, or another) reports
            try:
                self._tick()
            except OrdqError as exc:
                log.debug("delayed delivery: report or settings not exchanged with the coordinator: %s", exc)

    def _tick(self) -> None:
        held = self._gate.held
        if held != self._reported:
            body = None if held is None else {"seq": held[0], "due_us": held[1], "at_us": time.time_ns() // 1000}
            self._coord.record(self._lease.held, "set_waiting", body, timeout_s=_CALL_TIMEOUT_S)
            self._reported = held
            self.reports += 1
        now = self._clock()
        if now >= self._next_settings:
            self._next_settings = now + SETTINGS_REFRESH_S
            delay_us = read_delay_ms(self._coord, self._lease, timeout_s=_CALL_TIMEOUT_S) * 1000
            if delay_us != self._gate.delay_us:
                log.info("subscription delay changed: %d ms -> %d ms", self._gate.delay_us // 1000, delay_us // 1000)
                self._gate.delay_us = delay_us
