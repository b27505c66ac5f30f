"""The consumer's lease checks: whether it may hand out a message now (``sdk/_lease_client``'s
``CoordinatorLease`` keeps the subscription's consumer lease; this says what the consumer does
with it).

Guarantee: nothing is handed out unless ``lease.valid()`` by the consumer's own clock at that
moment; a check made before a blocking call (a commit, a read) proves nothing after it, so
``before_hand_out`` confirms last, after starting the periodic commit. When the coordinator
refused the lease (``lost_reason``: granted to another after ours lapsed) the checks raise
``LeaseGone``, which the consumer answers by rejoining (never seen by the application); while
no coordinator confirms the lease it hands out nothing, and after ``coordinator_outage_s`` of
that raises ``CoordinationUnavailable``.

Rules: owns the outage clock (since when no coordinator confirmed) and the time of the next
check; never reads, commits or touches the buffer itself (the periodic commit is a callable).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ordq.common.errors import CoordinationUnavailable
from ordq.sdk._consumer_types import ConsumerConfig
from ordq.sdk._lease_client import CoordinatorLease

log = logging.getLogger("ordq.consumer")


class LeaseGone(Exception):  # noqa: N818 - a signal inside the consumer, not an error the application sees
    """The coordinator gave the subscription's lease to another consumer (``reason``): drop
    what was read and not handed out, and rejoin (``Consumer._rejoin``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LeaseChecks:
    """The checks a consumer runs before handing out, over its ``CoordinatorLease``."""

    def __init__(self, lease: CoordinatorLease, config: ConsumerConfig) -> None:
        self.lease = lease
        self.config = config
        self.next_check = float("-inf")  # monotonic time of the next lease/commit check
        self._down_since: float | None = None

    def before_hand_out(self, now: float, start_commit: Callable[[float], None]) -> bool:
        """Before handing out: ``start_commit(now)`` of what is finished if one is due (it hands
        the write to the commit thread), then the lease, last (LeaseGone when it is someone
        else's; False when not sure now, after waiting a little)."""
        start_commit(now)
        # Last, right before the hand-out: a check made before anything that may block (or a
        # freeze of the process) proves nothing after it. A consumer frozen inside a blocking
        # commit past its lease handed out one more message beside its successor (issue 26).
        if not self.confirmed():
            return False
        # Next look: when a timed commit is due, or the lease runs out if sooner (a renewal
        # meanwhile only makes that look early and cheap).
        self.next_check = min(now + self.config.commit.every_ms / 1000.0, self.lease.valid_until)
        return True

    def confirmed(self) -> bool:
        """The lease holds by our clock (waiting a little for a renewal when it is about to
        run out); False when not sure now; LeaseGone when it is someone else's."""
        lease = self.lease
        if not lease.valid() and not lease.wait_valid(self.config.fetch_wait_ms / 1000.0):
            if lease.lost_reason is not None:
                raise LeaseGone(lease.lost_reason)
            self._unsure()
            return False
        self._down_since = None
        return True

    def _unsure(self) -> None:
        """No lease renewal answered for a while: hand out nothing; after ``coordinator_outage_s``
        of this, raise CoordinationUnavailable."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if now - self._down_since > self.config.coordinator_outage_s:
            raise CoordinationUnavailable(
                f"queue {self.config.queue}/{self.config.subscription}: no coordinator renewed the lease for "
                f"{now - self._down_since:.1f}s; cannot be sure this consumer still holds it")
        log.warning("queue %s/%s: lease not confirmed by the coordinator; delivering nothing until it is",
                    self.config.queue, self.config.subscription)

    def coordinator_unavailable(self, exc: CoordinationUnavailable) -> None:
        """A read round met a coordinator outage: ``exc`` is raised once it lasted past
        ``coordinator_outage_s``, else logged (the round is tried again)."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if now - self._down_since > self.config.coordinator_outage_s:
            raise exc
        log.warning("queue %s/%s: coordinator unavailable for %.1fs, retrying: %s", self.config.queue,
                    self.config.subscription, now - self._down_since, exc)

    def coordinator_answered(self) -> None:
        self._down_since = None

    def rejoined(self) -> None:
        """A new grant: look again before the next hand-out."""
        self.next_check = float("-inf")
        self._down_since = None

    def wait_sure(self) -> None:
        """``run``: before each attempt, until the lease is sure (LeaseGone if it is someone else's)."""
        while not self.confirmed():
            pass  # not sure of the lease: no new attempt until it is

    def worker_may_start(self) -> None:
        """Called by a keyed worker before each handler call: returns when the lease is sure,
        raises LeaseGone when it is someone else's (CoordinationUnavailable after
        ``coordinator_outage_s``)."""
        lease = self.lease
        if lease.valid():
            return
        if lease.wait_valid(self.config.coordinator_outage_s):
            return
        if lease.lost_reason is not None:
            raise LeaseGone(lease.lost_reason)
        raise CoordinationUnavailable(f"queue {self.config.queue}/{self.config.subscription}: lease not "
                                      f"confirmed by the coordinator for {self.config.coordinator_outage_s}s")
