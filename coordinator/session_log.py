"""One log line per change of a coordinator's ZooKeeper connection, named by the session's role
(issue 43): a coordinator holds three sessions (its service's, its leadership's and duties',
its view's watches: ``ordq coordinator run``), and until 2026-12-01 none of their suspensions,
reconnections or expiries was logged, so a 71 s silence of the leader at 10^5 queues (scale43l,
run 2) could not be told from a re-read of every queue after a dropped connection.

Rules: kazoo calls the listener on its connection thread: log and return, nothing blocking.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState

log = logging.getLogger("ordq.coordinator")


class SessionLog:
    """A kazoo state listener that logs each change of one client's connection: suspended,
    back on the same session (after how long), lost (expired), a new session."""

    def __init__(self, client: KazooClient, role: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.role = role
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the connection was last suspended or lost
        self._session = self._session_id()

    def attach(self) -> SessionLog:
        self._client.add_listener(self)
        return self

    def detach(self) -> None:
        """Before the client is closed: its close is no lost session to report."""
        self._client.remove_listener(self)

    def _session_id(self) -> int | None:
        client_id = self._client.client_id  # (session id, password) once a session was made
        return client_id[0] if client_id else None

    def __call__(self, state: KazooState) -> None:
        now = self._clock()
        with self._lock:
            if state == KazooState.CONNECTED:
                since, self._since = self._since, None
                before, self._session = self._session, self._session_id()
                away = f" after {now - since:.2f} s" if since is not None else ""
                how = "connection back" if before is not None and before == self._session else "connected, new session"
                log.warning("ZooKeeper session of the %s: %s%s (session %s)", self.role, how, away,
                            _hex(self._session))
                return
            if self._since is None:
                self._since = now
            what = "lost (expired or closed)" if state == KazooState.LOST else f"connection {state.lower()}"
            log.warning("ZooKeeper session of the %s: %s (session %s)", self.role, what, _hex(self._session))


def _hex(session: int | None) -> str:
    return "?" if session is None else f"0x{session:x}"
