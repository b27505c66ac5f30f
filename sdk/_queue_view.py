"""What a consumer knows of its queue: the state and the live processes of its groups, as the
coordinator describes them (``CoordinatorClient.describe(queue, with_live=True)``), cached so
that reading goes on while no coordinator answers. The consumer holds no ZooKeeper session
(issue 37), so there is no watch: the state is read again when a reader learns it changed.

Rules:
- One Describe answers both the state and every group's live processes; it names the
  subscription too, so a deleted subscription or queue, or a revoked token, is learnt at the
  next one (SubscriptionNotFound, QueueNotFound, PermissionDenied: final, they propagate).
- The state is read again only when marked changed (a replica answered "sealed" or was not
  found, a segment's end reached, a lease change) or, while a reader waits at the end of an
  open segment (``idle``), after ``every_s``, then after twice as long each time, up to
  ``IDLE_MAX_S``, until it reads batches again (``reading``): never one per fetch. What that
  Describe is for, no replica tells: a roll or a failover seals the segment on the replicas
  that answer, and their next answer says "sealed" (marked changed at once).
- An idle reader's lease renewals ask for the state's stamp (``heard``: the zxid of its last
  change, ``ZkStore.state_stamp``; -1 when the queue or the subscription is gone). The same
  stamp as the cached state's vouches for it as of the renewal, as a Describe would: while
  renewals come more often than the idle wait, an idle consumer costs its coordinator no
  Describe, only its heartbeats (each a read of two stats, against a Describe's state, cursor
  and two live nodes a group). A later stamp, or -1, is read again at once. A state learnt
  without its stamp (``learnt``), or a coordinator that does not tell stamps: Describes as above.
- After a Describe that got no answer the cached state and replicas serve, and the next
  Describe waits ``RETRY_S``: no read round stalls on a coordinator that cannot answer.
- Reads only; never writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ordq.common.errors import CoordinationUnavailable
from ordq.coordinator.client import CoordinatorClient, Described
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_values import LiveInfo

DESCRIBE_TIMEOUT_S = 2.0  # one Describe of the view; the cached state serves meanwhile
RETRY_S = 1.0  # after a Describe that got no answer
# The longest an idle reader's Describes back off to (``idle``): the bound on how late it learns
# of a change no replica it reads tells (a segment sealed in ZooKeeper on the other replica only).
IDLE_MAX_S = 1.0


class QueueView:
    def __init__(self, coord: CoordinatorClient, queue: str, subscription: str, *, every_s: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self._coord, self.queue, self.subscription = coord, queue, subscription
        self._every_s = max(every_s, 0.05)
        self._idle_wait_s = self._every_s  # between an idle reader's Describes now (``idle``)
        self._now, self._sleep = clock, sleep
        self._state: QueueState | None = None
        self._replicas: dict[str, dict[str, LiveInfo]] = {}  # gid -> role -> live process
        self._changed = True
        self._read_at = float("-inf")  # monotonic time of the last Describe answered
        self._retry_at = float("-inf")  # no Describe before this (the last got no answer)
        self._answered = True  # did the last Describe answer?
        self._zxid = 0  # the cached state's stamp (0: not known)
        self._heard = (0, float("-inf"))  # (stamp, sent at) the last renewal that asked read (``heard``)
        self.idling = False  # at the end of an open segment since the last batch read (``idle``)
        self.describes = 0  # Describe calls made (tests: the coordinator's load)

    def connected(self) -> bool:
        """Did the last Describe get an answer?"""
        return self._answered

    # -- the queue's state -------------------------------------------------------------------

    def state(self) -> QueueState:
        """The cached state, read again first if it changed (and a coordinator answers;
        CoordinationUnavailable only while nothing was ever read)."""
        if self._state is None or (self._changed and self._now() >= self._retry_at):
            try:
                self.refresh()
            except CoordinationUnavailable:
                if self._state is None:
                    raise
        assert self._state is not None
        return self._state

    def cached(self) -> QueueState | None:
        """The state as last read, without reading it again (None before the first read)."""
        return self._state

    def refresh(self) -> None:
        """Describe the queue now (state and live processes). CoordinationUnavailable when no
        coordinator answered (it is tried again after ``RETRY_S``)."""
        self.describes += 1
        try:
            got = self._coord.describe(self.queue, subscription=self.subscription, with_live=True,
                                       timeout_s=DESCRIBE_TIMEOUT_S)
        except CoordinationUnavailable:
            self._answered, self._changed = False, True
            self._retry_at = self._now() + RETRY_S
            raise
        self.learn(got)

    def learn(self, got: Described) -> None:
        """What a Describe answered (the consumer's own, e.g. on a rejoin)."""
        self._state, self._zxid = got.state, got.zxid
        if got.live is not None:
            # A group without a live process is known as such (empty): read again when marked stale.
            self._replicas = {gid: dict(got.live.get(gid, {})) for gid in got.state.groups}
        self._answered, self._changed = True, False
        self._read_at = self._now()

    def learnt(self, st: QueueState) -> None:
        """A state the coordinator answered to this consumer (a seal, a pop): newer than the
        cache; its stamp is not known (no renewal vouches for it)."""
        self._state, self._zxid = st, 0

    def heard(self, stamp: int, sent_at: float) -> None:
        """A lease renewal sent at ``sent_at`` (this view's clock) read the state's stamp
        ``stamp`` (the renewal thread: one tuple stored, read by ``idle``)."""
        self._heard = (stamp, sent_at)

    def mark_changed(self) -> None:
        """Read the state again at the next chance."""
        self._changed = True

    def idle(self) -> None:
        """A reader is at the end of an open segment: the state may have moved on (a failover,
        a roll) without any replica saying so. Read it again at once if a renewal read a later
        stamp or found the queue or subscription gone; else if the state is not known to be
        the latest for as long as the idle wait, which then doubles, up to ``IDLE_MAX_S``
        (``every_s`` if longer). Known the latest: as of the last Describe, or as of the last
        renewal that read the cached state's own stamp."""
        self.idling = True
        stamp, sent_at = self._heard
        latest_at = self._read_at
        if self._zxid > 0:
            # zxids only grow: a later stamp is a change since our read; an earlier one, a
            # renewal that read before it (ignored). -1 from a renewal sent before our last
            # Describe answered is not news: that Describe found both.
            if stamp > self._zxid or (stamp == -1 and sent_at >= self._read_at):
                self._changed = True
                return
            if stamp == self._zxid:
                latest_at = max(latest_at, sent_at)
        if self._now() - latest_at >= self._idle_wait_s:
            self._changed = True
            self._idle_wait_s = min(2 * self._idle_wait_s, max(self._every_s, IDLE_MAX_S))

    def reading(self) -> None:
        """A reader got batches: when it waits again, its first Describe comes after ``every_s``."""
        self._idle_wait_s = self._every_s
        self.idling = False

    def wait_change(self, wait_ms: int) -> None:
        """Nothing to read until the state changes (no next segment yet, no replica answers):
        wait ``wait_ms`` (no watch tells sooner), then read the state again if a coordinator answers."""
        self._sleep(max(wait_ms, 50) / 1000.0)
        if self._now() >= self._retry_at:
            try:
                self.refresh()
            except CoordinationUnavailable:
                pass  # the cached state serves; again after RETRY_S

    # -- the groups' live processes --------------------------------------------------------------

    def replicas(self, gid: str) -> dict[str, LiveInfo]:
        """The group's live processes as last described: read again (with the state) once one
        of them failed or was missing, and kept as they were while no coordinator answers
        (so consuming never needs the coordinator between two segments)."""
        known = self._replicas.get(gid)
        if known is None:  # a group the cached state did not name yet
            self._try_refresh()
            known = self._replicas.get(gid, {})
        return known

    def _try_refresh(self) -> None:
        if self._now() < self._retry_at:
            return
        try:
            self.refresh()
        except CoordinationUnavailable:
            pass

    def mark_stale(self, gid: str) -> None:
        """A process of ``gid`` failed or was missing: describe again next time."""
        self._changed = True
