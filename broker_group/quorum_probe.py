"""The quorum probe of the session guard (``shared.session_doubt``): a ZooKeeper ``sync``
every eighth of the session, one at a time. A ``sync`` is answered only through the ensemble's
leader, so an answer proves this broker's session was alive when the probe was sent, even when
the server it talks to still answers pings while cut from its ensemble (it does so for up to
syncLimit x tickTime, long after the leader expired the session)."""

from __future__ import annotations

import logging
import threading
import time

from kazoo.client import KazooClient

from ordq.broker_group.shared import Shared

log = logging.getLogger("ordq.broker")


class QuorumProbe:
    """Runs in a thread of its own until ``stop``."""

    def __init__(self, shared: Shared, client: KazooClient) -> None:
        self._shared = shared
        self._client = client
        self._stop = threading.Event()
        self.interval_s = shared.config.zk_session_timeout_s / 8

    def run(self) -> None:
        while not self._stop.is_set():
            asked_at = time.monotonic()
            try:
                answer = self._client.sync_async("/")
                # one probe at a time: a cut server holds it until it drops the connection
                while not answer.wait(self.interval_s) and not self._stop.is_set():
                    pass
                if answer.ready() and answer.successful():
                    self._shared.quorum_heard(asked_at)
            except Exception as exc:  # noqa: BLE001 - a failed probe is a missing answer: doubt grows by itself
                log.debug("quorum probe: %r", exc)
            self._stop.wait(max(0.0, asked_at + self.interval_s - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
