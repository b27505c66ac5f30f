"""The slave's group commit of replicated requests (issue 39).

Guarantee: the slave's commits never overlap and keep their order (one thread, FIFO: nothing
is appended between another commit's ``begin_sync`` and ``end_sync``), and every request
queued while a commit runs goes into the next one: one commit, so one write and one
fdatasync, per segment for all of them. ``add`` returns the future of the commit that holds
the request's batches; the slave answers the request only once that future is done.

Why: the slave's handler (replication.py ``replicate_requests``) goes on reading the master's
next requests while this thread syncs, instead of awaiting each request's sync before it
reads the next; so what the master sends travels (and on the lean link is decrypted) while the
disk works, and what arrived meanwhile is synced at once, not one request per sync.

Rules: no I/O of its own: ``commit(segment, batches)`` (write_path.py ``WritePath.commit``) is
given; it counts each request queued in ``segment.syncing`` (as the caller did when it placed
the request) and is called once per segment per group.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from ordq.broker_group.shared import Segment


class ReplicaCommits:
    """One thread that commits, in order, what the slave's loop queued (``add``)."""

    def __init__(self, commit: Callable[[Segment, list[bytes]], None], counted: Callable[[Segment, int], None]
                 ) -> None:
        self._commit = commit
        self._counted = counted  # (segment, n): n of its requests' ``syncing`` counts are now one commit's
        self._lock = threading.Lock()
        self._queued: list[tuple[Segment, list[bytes]]] = []
        self._next: concurrent.futures.Future[None] | None = None  # the commit that will take ``_queued``
        self._last: concurrent.futures.Future[None] | None = None  # the latest commit handed to the thread
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.commits = 0  # groups committed (for tests and statistics)

    def idle(self) -> bool:
        """No commit queued or running: a request may be committed by its caller at once."""
        last = self._last
        return last is None or last.done()

    def add(self, s: Segment, batches: list[bytes]) -> concurrent.futures.Future[None]:
        """Queue ``batches`` of ``s`` (placed, counted in ``s.syncing``) for the next commit;
        the future of that commit."""
        with self._lock:
            self._queued.append((s, batches))
            if self._next is None:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ordq-replica-sync")
                self._next = self._last = self._pool.submit(self._run)
            return self._next

    def _run(self) -> None:
        with self._lock:
            work, self._queued, self._next = self._queued, [], None
        by_segment: dict[tuple[str, int], list[tuple[Segment, list[bytes]]]] = {}
        for s, batches in work:
            by_segment.setdefault(s.key, []).append((s, batches))
        for parts in by_segment.values():
            s = parts[0][0]
            if len(parts) > 1:
                self._counted(s, len(parts))
            self._commit(s, [b for _, batches in parts for b in batches])
        self.commits += 1
