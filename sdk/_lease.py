"""How long a leader may act on its ZooKeeper lease, judged by its own clock.

Guarantee: ``SessionLease.valid()`` is True only while this process can be sure that its lock
node (an ephemeral node of its ZooKeeper session) still exists, so that no successor can have
been elected: a leader that checks it before every delivery never delivers alongside its
successor, even after being frozen (SIGSTOP, a long GC or swap pause) past its session.

Why it holds: ZooKeeper expires a session only after it has heard nothing from the client for
the session timeout; a successor can be elected only after that. A reply to a request sent at
``t`` (our monotonic clock) proves the server heard from us at or after ``t``, so the lock is
ours at least until ``t + timeout``. We trust it until ``t + timeout * TRUST`` (the margin
covers clock-rate differences and the successor's own start), and renew well before that.
The monotonic clock keeps counting while the process is stopped, so after a resume the lease
reads expired at once, before the renewal thread has even run.

Assumes the server grants at least the requested session timeout (ZooKeeper clamps it to
2–20 × tickTime; a larger grant only makes us stop sooner than needed).

Rules:
- ``LeaseClock`` is the arithmetic, pure: time comes in as arguments.
- ``SessionLease`` owns one daemon thread that renews with ``exists(lock node)``; readers of
  ``valid()`` never block and never touch ZooKeeper.
- Lost is final: the node is gone (the session expired and kazoo made a new one, or an
  operator deleted it) or the session was reported LOST. An unanswered renewal is not lost,
  only unsure: ``valid()`` turns False when the trusted time runs out, and True again if a
  renewal then succeeds on the same session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, LockTimeout, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

log = logging.getLogger("ordq.lease")

TRUST = 2.0 / 3.0  # of the session timeout, from the send time of the last answered renewal
RENEW_EVERY = 0.25  # of the session timeout
RETRY_S = 0.05  # after an unanswered renewal


@attrs.define
class LeaseClock:
    """The lease arithmetic, without I/O: ``renewed(sent_at)`` after an answered renewal that
    was sent at ``sent_at``; ``valid(now)``; ``lost(reason)`` is final."""

    timeout_s: float
    valid_until: float = float("-inf")
    lost_reason: str | None = None

    def renewed(self, sent_at: float) -> None:
        if self.lost_reason is None:
            self.valid_until = max(self.valid_until, sent_at + self.timeout_s * TRUST)

    def lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self.valid_until = float("-inf")

    def valid(self, now: float) -> bool:
        return now < self.valid_until

    def renew_due(self, now: float, last_sent: float) -> bool:
        return now - last_sent >= self.timeout_s * RENEW_EVERY


class SessionLease:
    """Keeps judging whether ``node`` (our ephemeral lock node) is still ours."""

    def __init__(self, client: KazooClient, node: str, *, session_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._node = node
        self._now = clock
        self._clock = LeaseClock(session_timeout_s)
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        client.add_listener(self._on_state)

    @property
    def node(self) -> str:
        return self._node

    def start(self) -> None:
        """Renew once now (so the lease is valid on return, unless lost), then keep renewing."""
        self._renew_once()
        self._thread = threading.Thread(target=self._run, name="ordq-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        try:
            self._client.remove_listener(self._on_state)
        except Exception:  # noqa: BLE001 - listener already gone with the client
            pass

    def valid(self) -> bool:
        """True while this process may act as leader (cheap: one clock read)."""
        return self._clock.valid(self._now())

    @property
    def valid_until(self) -> float:
        """Monotonic time at which the lease runs out unless renewed first."""
        return self._clock.valid_until

    @property
    def lost_reason(self) -> str | None:
        """Why the lease is gone for good, or None while it may still be ours."""
        return self._clock.lost_reason

    def wait_valid(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lease to be valid (after a pause or while ZooKeeper
        is unreachable, a renewal may restore it). False: still unsure, or lost."""
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

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._clock.lose("ZooKeeper session expired")
        self._wake.set()

    def _renew_once(self) -> float:
        sent = self._now()
        try:
            stat = self._client.exists_async(self._node).get(timeout=self._clock.timeout_s)
        except SessionExpiredError:
            self._clock.lose("ZooKeeper session expired")
            return sent
        except (KazooException, KazooTimeoutError, OSError) as exc:
            # No answer: not lost, only unsure. valid() runs out on its own if this persists.
            log.debug("lease %s: renewal unanswered: %s", self._node, exc)
            return sent
        if stat is None:
            self._clock.lose("lock node gone (the session expired, or an operator removed it)")
        else:
            self._clock.renewed(sent)
        return sent

    def _run(self) -> None:
        last_sent = self._now()
        period = self._clock.timeout_s * RENEW_EVERY
        while not self._stopped and self._clock.lost_reason is None:
            answered_before = self._clock.valid_until
            self._wake.wait(timeout=period)
            self._wake.clear()
            if self._stopped:
                return
            now = self._now()
            if not self._clock.renew_due(now, last_sent) and self._clock.valid(now):
                continue
            last_sent = self._renew_once()
            if self._clock.valid_until == answered_before and self._clock.lost_reason is None:
                time.sleep(RETRY_S)  # unanswered: try again soon, not at the next period


def release_bounded(client: KazooClient, lock: Any, timeout_s: float) -> None:
    """Give up ``lock`` (a kazoo Lock) waiting at most ``timeout_s`` for ZooKeeper.

    kazoo's ``Lock.release`` retries a lost connection for ever, and its delete waits for an
    answer without a timeout: with ZooKeeper gone (stopped, partitioned) a closing client hung
    for good (Ctrl-C on ``ordq consume``, a test's teardown; issue 26). Giving up is safe: the
    caller then stops the client, which ends the session, and the ephemeral lock node with it."""
    if not getattr(lock, "is_acquired", False) or not getattr(lock, "node", None):
        return
    try:
        client.delete_async(f"{lock.path}/{lock.node}").get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - gone already, or ZooKeeper away: the session takes the node
        log.debug("lock node %s/%s not deleted; it goes with the session", lock.path, lock.node)
    lock.is_acquired = False
    lock.node = None


def acquire_within(lock: Any, timeout_s: float | None) -> Callable[[], bool]:
    """A call that joins ``lock``'s election (a kazoo Lock) and waits to lead until ``timeout_s``
    after its first call (None: without limit), True once elected. Repeated by ``retry_zk``
    after a transient ZooKeeper error, it waits only for what is left of ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def acquire() -> bool:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return bool(lock.acquire(blocking=True, timeout=left))
        except LockTimeout:  # kazoo raises (and removes its node) where a False was expected
            return False

    return acquire
