"""What the producer looks up beside its failover: the live processes of its queue's groups,
asked of the coordinator (Describe) on a thread of its own (the producer holds no ZooKeeper
session, issue 37).

Rules: one Describe per lookup, made by the caller's function; nothing here writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ordq.coordinator.store_values import LiveInfo

log = logging.getLogger("ordq.producer")


class LiveLookup:
    """The queue's live processes asked on a thread of its own (``_fail_over`` starts one with
    the FailOver call, so the two round trips overlap); ``master(gid)`` waits for the answer."""

    def __init__(self, lookup: Callable[[], dict[str, dict[str, LiveInfo]]]) -> None:
        self._live: dict[str, dict[str, LiveInfo]] = {}
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(lookup,), name="ordq-producer-lookup", daemon=True).start()

    def _run(self, lookup: Callable[[], dict[str, dict[str, LiveInfo]]]) -> None:
        try:
            self._live = lookup()
        except Exception as exc:  # noqa: BLE001 - unanswered: the caller asks again itself
            log.debug("live processes not read: %r", exc)
        finally:
            self._done.set()

    def master(self, gid: str, timeout_s: float) -> str | None:
        """``gid``'s master address as answered; None: not live then, or no answer in time."""
        if not self._done.wait(timeout_s):
            return None
        info = self._live.get(gid, {}).get("master")
        return info.address if info is not None else None

    def link(self, gid: str, role: str = "master") -> str:
        """The lean link of ``gid``'s ``role`` as answered ("" for none); after ``master``."""
        info = self._live.get(gid, {}).get(role)
        return info.produce if info is not None else ""
