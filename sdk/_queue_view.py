"""What a consumer knows of ZooKeeper: the queue's state and the live processes of its
groups, cached so that reading goes on while ZooKeeper is unreachable.

Rules:
- The state is read again only when a watch said it changed (or a reader learnt more, e.g.
  a replica answered "sealed"), and only while ZooKeeper is connected: no read round waits on
  a request that cannot be answered.
- A group's live processes are read again only after one of them failed or was missing
  (``mark_stale``); while ZooKeeper is away the last known addresses serve.
- Reads ZooKeeper, never writes it.
"""

from __future__ import annotations

import threading
import time

from kazoo.client import KazooClient

from ordq.common.errors import CoordinationUnavailable
from ordq.coordinator.state import QueueState
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import LiveInfo


class QueueView:
    def __init__(self, store: ZkStore, client: KazooClient, queue: str) -> None:
        self._store, self._client, self.queue = store, client, queue
        self._state: QueueState | None = None
        self._changed = threading.Event()
        self._replicas: dict[str, dict[str, LiveInfo]] = {}  # gid -> role -> live process
        self._stale: set[str] = set()  # gids whose cached processes failed or were missing

    def connected(self) -> bool:
        """Is the ZooKeeper connection up now?"""
        return bool(self._client.connected)

    # -- the queue's state -------------------------------------------------------------------

    def state(self) -> QueueState:
        """The cached state, read again first if it changed and ZooKeeper answers."""
        if self._state is None or (self._changed.is_set() and self.connected()):
            self.refresh()
        assert self._state is not None
        return self._state

    def cached(self) -> QueueState | None:
        """The state as last read, without reading it again (None before the first read)."""
        return self._state

    def refresh(self) -> None:
        """Read the state now (and set the watch that tells when it changes)."""
        self._changed.clear()
        try:
            self._state, _ = self._store.load_state(self.queue, watch=lambda _event: self._changed.set())
        except CoordinationUnavailable:
            self._changed.set()  # not read (nor the watch set): read it again later
            raise

    def learnt(self, st: QueueState) -> None:
        """A state this consumer wrote itself (e.g. by sealing): newer than the cache."""
        self._state = st

    def mark_changed(self) -> None:
        """Read the state again at the next chance (e.g. once ZooKeeper answers)."""
        self._changed.set()

    def wait_change(self, wait_ms: int) -> None:
        """Up to ``wait_ms`` for the state to change; read it then, if ZooKeeper answers."""
        if not self._changed.wait(wait_ms / 1000.0):
            return
        if self.connected():
            self.refresh()
        else:
            time.sleep(wait_ms / 1000.0)  # it changed, but ZooKeeper is away: read it later

    # -- the groups' live processes --------------------------------------------------------------

    def replicas(self, gid: str) -> dict[str, LiveInfo]:
        """The group's live processes, as last read from ZooKeeper: read again when one of
        them failed or was missing since, and kept as they were while ZooKeeper is
        unreachable (so consuming never needs ZooKeeper between two segments)."""
        known = self._replicas.get(gid)
        if known is None or (gid in self._stale and self.connected()):
            try:
                known = self._store.live_members(gid)
            except CoordinationUnavailable:
                if known is None:
                    raise
                return known
            self._replicas[gid] = known
            self._stale.discard(gid)
        return known

    def mark_stale(self, gid: str) -> None:
        """A process of ``gid`` failed or was missing: look it up again next time."""
        self._stale.add(gid)
