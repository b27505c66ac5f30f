"""A lease held from the coordinator (DESIGN §5 Leases; coordinator/leases.py grants them).

Guarantee: ``valid()`` is True only while the coordinator cannot have granted the lease to
anyone else: the coordinator keeps it until ``ttl`` (plus a margin) after it *received* our last
answered renewal; we trust it until ``CLIENT_TRUST * ttl`` after we *sent* that renewal. The
monotonic clock keeps counting while the process is stopped, so after a pause (SIGSTOP, swap, a
loaded box) the lease reads expired at once, before the renewal thread has even run. A holder that
checks ``valid()`` before each act (a delivery, a commit) never acts beside its successor.

Lost (``lost_reason``) means the coordinator refused a renewal: another generation was granted
after ours expired, or it was released. That is not the end of the client: it rejoins with
``acquire()`` (a new generation, once the successor's lease in turn is free). An unanswered renewal
(no coordinator reachable) is not lost, only unsure: ``valid()`` turns False when the trusted time
runs out and True again if a renewal then succeeds — the coordinator revives a lapsed lease that
nobody took meanwhile.

Rules: ``LeaseClock`` is the arithmetic, pure. ``CoordinatorLease`` owns one daemon thread that
renews with Heartbeat; readers of ``valid()`` never block and never call the coordinator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs

from ordq.common.errors import (
    ClosedError,
    CoordinationUnavailable,
    LeaseLost,
    OrdqError,
    PermissionDenied,
    WaitTimeout,
)
from ordq.coordinator.client import CoordinatorClient, Held, Refusal
from ordq.coordinator.leases import CLIENT_TRUST

log = logging.getLogger("ordq.lease")

RENEW_EVERY = 0.25  # of the ttl
RETRY_S = 0.05  # after an unanswered renewal
STANDBY_POLL_S = 0.5  # a standby asks again at least this often (a release frees it at once)


@attrs.define
class LeaseClock:
    """The lease arithmetic, without I/O: ``renewed(sent_at)`` after an answered renewal that
    was sent at ``sent_at``; ``valid(now)``; ``lose(reason)`` until the next grant."""

    timeout_s: float
    valid_until: float = float("-inf")
    lost_reason: str | None = None
    trust: float = CLIENT_TRUST

    def renewed(self, sent_at: float) -> None:
        if self.lost_reason is None:
            self.valid_until = max(self.valid_until, sent_at + self.timeout_s * self.trust)

    def lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self.valid_until = float("-inf")

    def valid(self, now: float) -> bool:
        return now < self.valid_until

    def renew_due(self, now: float, last_sent: float) -> bool:
        return now - last_sent >= self.timeout_s * RENEW_EVERY


@attrs.define
class LeaseStats:
    acquired: int = 0  # grants (the first, and every rejoin)
    rejoins: int = 0  # grants after a lost lease
    lapses: int = 0  # times the lease ran out unrenewed (then revived or lost)
    lost: int = 0


class CoordinatorLease:
    """One lease (``kind`` producer | consumer | member of ``queue``/``sub``) for ``holder``."""

    def __init__(self, coord: CoordinatorClient, kind: str, queue: str, sub: str, holder: str, *,
                 ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 on_renewed: Callable[[Held], None] | None = None,
                 on_refused: Callable[[Refusal], None] | None = None,
                 proof: Callable[[], Held] | None = None,
                 on_state: Callable[[int, float], None] | None = None,
                 state_wanted: Callable[[], bool] = lambda: True) -> None:
        """``on_renewed``: called on the renewal thread with each answer (a member learns its
        partitions so); ``on_refused``: called in ``acquire`` with each refusal (who holds it);
        ``proof``: a lease shown with each Acquire (a group's partition: its member's lease);
        ``on_state`` (a consumer lease): each renewal sent while ``state_wanted()`` asks for
        the queue state's stamp too, and ``on_state(stamp, sent_at)`` is called on the renewal
        thread with what it read (``Held.state_zxid``; not called when the coordinator did not
        tell it), ``sent_at`` this clock's time the renewal was sent (the stamp was read after)."""
        self._coord = coord
        self.kind, self.queue, self.sub, self.holder = kind, queue, sub, holder
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._now = clock
        self._on_renewed = on_renewed
        self._on_refused = on_refused
        self._proof = proof
        self._on_state, self._state_wanted = on_state, state_wanted
        self._clock = LeaseClock(ttl_s)
        self._held: Held | None = None
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.stats = LeaseStats()

    # -- what holders read ---------------------------------------------------------------------

    @property
    def held(self) -> Held:
        """The lease as granted (generation and key for the requests it guards)."""
        if self._held is None:
            raise OrdqError(f"{self.kind} lease of {self.queue} not acquired")
        return self._held

    @property
    def node(self) -> str:
        return self.holder

    def valid(self) -> bool:
        """True while this process may act as the holder (cheap: one clock read)."""
        return self._clock.valid(self._now())

    @property
    def valid_until(self) -> float:
        return self._clock.valid_until

    @property
    def lost_reason(self) -> str | None:
        """Why the coordinator refused our lease (rejoin with ``acquire``), None while it may be ours."""
        return self._clock.lost_reason

    def wait_valid(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lease to be valid (a renewal may restore it).
        False: still unsure, or lost."""
        deadline = self._now() + timeout_s
        while not self.valid():
            if self._clock.lost_reason is not None:
                return False
            left = deadline - self._now()
            if left <= 0:
                return False
            self._wake.set()  # renew now rather than at the next period
            time.sleep(min(RETRY_S, left))
        return True

    # -- life ------------------------------------------------------------------------------------

    def acquire(self, timeout_s: float | None, *, stopped: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the coordinator grants the lease (a standby waits here), then keep it
        renewed. False when ``timeout_s`` ran out first (None: no limit). Raises a refusal
        that retrying cannot change (PermissionDenied, QueueNotFound, ...)."""
        deadline = None if timeout_s is None else self._now() + timeout_s
        rejoin = self._held is not None
        while not stopped() and not self._stopped:
            sent = self._now()
            left = None if deadline is None else deadline - sent
            if left is not None and left <= 0:
                return False
            try:
                got = self._coord.acquire(self.kind, self.queue, self.sub, self.holder, ttl_ms=self._ttl_ms,
                                          wait_ms=int(STANDBY_POLL_S * 1000),
                                          timeout_s=None if left is None else max(left, 0.5),
                                          member=self._proof() if self._proof is not None else None)
            except (CoordinationUnavailable, WaitTimeout) as exc:
                log.warning("%s lease of %s: no coordinator answered (%s); asking again", self.kind,
                            self._what(), exc)
                time.sleep(min(STANDBY_POLL_S, max(left or STANDBY_POLL_S, 0.0)))
                continue
            if isinstance(got, Held):
                self._granted(got, sent, rejoin)
                return True
            if self._on_refused is not None:
                self._on_refused(got)
            wait = min(max(got.retry_s, RETRY_S), STANDBY_POLL_S)
            time.sleep(wait if left is None else min(wait, max(left, 0.0)))
        return False

    def _granted(self, got: Held, sent: float, rejoin: bool) -> None:
        self._held = got
        self._clock = LeaseClock(got.ttl_ms / 1000.0)
        self._clock.renewed(sent)
        self.stats.acquired += 1
        if rejoin:
            self.stats.rejoins += 1
            log.warning("%s lease of %s: rejoined as %s at generation %d", self.kind, self._what(), self.holder,
                        got.generation)
        if self._on_renewed is not None:
            self._on_renewed(got)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=f"ordq-lease-{self.kind}", daemon=True)
            self._thread.start()
        else:
            self._wake.set()

    def stop(self, *, release: bool = True, timeout_s: float = 2.0) -> None:
        """Stop renewing; give the lease back unless it is lost (a successor may start at once)."""
        self._stopped = True
        self._wake.set()
        held = self._held
        if release and held is not None and self._clock.lost_reason is None:
            self._clock.lose("released")
            try:
                self._coord.release(held, timeout_s=timeout_s)
            except OrdqError as exc:  # unreachable: the lease runs out on its own
                log.debug("%s lease of %s: not released (%s); it expires", self.kind, self._what(), exc)

    def _what(self) -> str:
        return f"{self.queue}/{self.sub}" if self.sub else self.queue

    def _renew_once(self) -> None:
        held = self._held
        if held is None:
            return
        sent = self._now()
        was_valid = self._clock.valid(sent)
        with_state = self._on_state is not None and self._state_wanted()
        try:
            now_held = self._coord.heartbeat(held, with_state=with_state,
                                             timeout_s=self._clock.timeout_s * CLIENT_TRUST)
        except LeaseLost as exc:
            if self._stopped:  # our own release overtook this renewal (docs/SDK.md's run printed
                return         # "lost: it was released" as its consumer closed): nothing was lost
            self.stats.lost += 1
            self._clock.lose(exc.reason)
            log.warning("%s lease of %s lost: %s", self.kind, self._what(), exc.reason)
            return
        except PermissionDenied as exc:
            # A refusal no retry changes (a revoked token): lost; the holder's rejoin (a new
            # Acquire) is refused in turn and ends it, instead of waiting as if unanswered.
            self.stats.lost += 1
            self._clock.lose(f"refused: {exc}")
            log.warning("%s lease of %s refused: %s", self.kind, self._what(), exc)
            return
        except ClosedError as exc:  # the owner closed its coordinator client
            if not self._stopped:  # (else: it stopped us first, while this renewal was under way)
                log.warning("%s lease of %s: its coordinator client was closed under it: %s", self.kind,
                            self._what(), exc)
            return
        except OrdqError as exc:
            log.debug("%s lease of %s: renewal unanswered: %s", self.kind, self._what(), exc)
            return
        if not was_valid:
            self.stats.lapses += 1
            log.warning("%s lease of %s had lapsed; renewed again (no successor was granted)", self.kind,
                        self._what())
        self._held = now_held
        self._clock.renewed(sent)
        if self._on_renewed is not None:
            self._on_renewed(now_held)
        if with_state and now_held.state_zxid != 0 and self._on_state is not None:
            self._on_state(now_held.state_zxid, sent)

    def _run(self) -> None:
        last_sent = self._now()
        while not self._stopped:
            period = self._clock.timeout_s * RENEW_EVERY
            self._wake.wait(timeout=period)
            self._wake.clear()
            if self._stopped:
                return
            if self._clock.lost_reason is not None:
                continue  # lost: the owner rejoins with acquire(), which wakes us
            now = self._now()
            if not self._clock.renew_due(now, last_sent) and self._clock.valid(now):
                continue
            before = self._clock.valid_until
            last_sent = now
            self._renew_once()
            if self._clock.valid_until == before and self._clock.lost_reason is None:
                time.sleep(RETRY_S)  # unanswered: try again soon, not at the next period
