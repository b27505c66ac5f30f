"""The coordinator daemon's seals (a part of ``CoordinatorDaemon``, coordinator/daemon.py): a
pool that runs them beside the rounds, a written queue's first, and idle queues' seals of one
group in batches (``seal.seal_batch``: one SealMany per replica, few ZooKeeper transactions).

Guarantee: one seal of a queue's segment at a time; a seal that fails is planned again by the
queue's timer; a batch no replica answered is tried again by the pool itself until a replica
answers (``SEAL_RETRY_MAX_S`` apart at most); a batch's leftovers are sealed one by one, reading
afresh.
"""

from __future__ import annotations

import concurrent.futures
import functools
import heapq
import threading
import time
from collections.abc import Callable

from ordq.common.errors import IllegalTransition
from ordq.coordinator import state as sm
from ordq.coordinator.daemon_parts import RETRY_S, DaemonParts, is_written, log
from ordq.coordinator.daemon_view import DaemonView
from ordq.coordinator.duties import Action, Kind
from ordq.coordinator.store_values import QueueConfig, StateVersion
from ordq.wire.transport import MAX_SEAL_MANY

# Seals run at once, beside the rounds (``_seal_later``).
SEAL_WORKERS = 3
# Idle queues' seals of one group sealed together (``seal.seal_batch``; issue 43): this many a
# SealMany call, and this many such calls of one group at once (while the broker syncs one
# call's files, the next call's segments are created and sealed in memory). Each call is one
# job of the seal pool: it seals one batch and queues itself again, so a written queue's seal
# (first in the queue of jobs) never waits behind a whole group's batches. 1,000 (the most a
# broker takes, ordq/wire/transport.py MAX_SEAL_MANY): at 10^5 queues a dead group's 33,333
# seals, after its moves, took 54.7 / 52.5 s in calls of 1,000, 69.1 s in calls of 500 (scale43i).
SEAL_BATCH = MAX_SEAL_MANY
SEAL_CALLS_IN_FLIGHT = 2
# ... and while a dead group's heads are being moved, this many a group: the moves first, but
# the surviving replica not idle meanwhile. Why (issue 43): with none during the moves, a dead
# group's 33,333 seals at 10^5 all came after them, 63.3 / 63.5 s after it was judged dead
# (the goal is 60 s, scale43i); with two, the moves took 17.3 / 29.7 s (scale43h).
SEAL_CALLS_WHILE_MOVING = 1
# A batch no replica answered is kept and tried again by the seal pool after ``RETRY_S``, the
# wait doubled at each such failure of the group in a row, up to this. Why not the queues'
# timers, as until 2026-12-01: a timer only plans the queue again in the next round, and after
# a group's failure at 10^5 queues that round is 2 min long (planning ~67,000 queues): a batch
# of 2,000 whose slave had just lost its ZooKeeper connection for 0.26 s was not sealed within
# the 3 min the run lasted (scale43n, run 2). Why a bound: both replicas may be gone for long.
SEAL_RETRY_MAX_S = 8.0


def seal_calls_allowed(moving: bool) -> int:
    """How many batch calls of one group may be in flight now."""
    return SEAL_CALLS_WHILE_MOVING if moving else SEAL_CALLS_IN_FLIGHT


class SealBatches(DaemonParts):
    """The seal pool's methods."""

    def _seal_later(self, queue: str, action: Action, known: tuple[sm.QueueState, StateVersion] | None = None) -> None:
        """Run a seal on the sealing pool, the round going on meanwhile: a seal asks both
        replicas (a dead one may take an RPC timeout), and after a head master died there is
        one per queue it headed; a failover of another group must not wait behind them. One
        seal of a queue at a time; its state write (the watch) or a failure (a timer) brings the
        queue back to a round. ``known``: the (state, version) it was planned on; with the
        segment group's members as this view knows them, the seal reads nothing first."""
        if self.sealer is None:
            return
        assert action.seg is not None
        key = (queue, action.seg)
        with self._lock:
            if key in self._sealing_now:
                return
            self._sealing_now.add(key)
            if self._seal_executor is None:
                self._seal_executor = concurrent.futures.ThreadPoolExecutor(SEAL_WORKERS,
                                                                            thread_name_prefix="ordq-seal")
            executor = self._seal_executor
        view = self.view

        def run() -> None:
            self._idle_waits_turn(queue)
            try:
                members = view.members.get(action.gid or "", {}) if view is not None else None
                self._do(queue, action, QueueConfig(), seal_known=(known, members))  # a seal reads no settings
                with self._lock:
                    self.stats.actions[Kind.SEAL.value] = self.stats.actions.get(Kind.SEAL.value, 0) + 1
            except IllegalTransition:
                with self._lock:
                    self.stats.conflicts[Kind.SEAL.value] = self.stats.conflicts.get(Kind.SEAL.value, 0) + 1
            except Exception as exc:  # noqa: BLE001 - tried again later, like a failed round
                with self._lock:
                    self.stats.errors += 1
                log.warning("queue %s: seal of segment %s deferred: %s", queue, action.seg, exc)
                if view is not None:
                    view.schedule(queue, time.monotonic() + RETRY_S)
            finally:
                with self._lock:
                    self._sealing_now.discard(key)

        urgent = is_written(queue, self._written, time.monotonic())
        if (not urgent and self.batch_sealer is not None and known is not None and view is not None
                and action.gid is not None):
            gid = action.gid
            with self._lock:
                # by segment: a queue may have two sealing here (a roll, then the failover);
                # keyed by queue, the later replaced the earlier, which stayed in
                # ``_sealing_now`` unsealed for good
                self._seal_batches.setdefault(gid, {})[key] = (known[0], known[1])
                if self._seal_batch_jobs.get(gid, 0) >= seal_calls_allowed(bool(self._moving)):
                    # the group's batch jobs, queued already, take it; or those started once a
                    # dead group's heads are all moved (``_start_seal_batches``)
                    return
                self._seal_batch_jobs[gid] = self._seal_batch_jobs.get(gid, 0) + 1
            self._queue_seal_job(1, lambda: self._seal_group_batch(gid, view), executor)
            return
        if not self._queue_seal_job(0 if urgent else 1, run, executor):
            with self._lock:
                self._sealing_now.discard(key)

    def _start_seal_batches(self) -> None:
        """Start the batch jobs (up to ``SEAL_CALLS_IN_FLIGHT`` a group) of the idle seals that
        waited in ``_seal_batches`` while a dead group's heads were moved (``_moving``), or were
        deferred (``_retry_deferred``).

        Why (issue 43): the moves queue their seals transaction by transaction (``_seal_moved``); started
        at once, the seal batches ran beside the rest of the moves, in this process and on its
        one ZooKeeper connection, and the 33,333 heads of a dead group at 10^5 queues moved in
        17.3 / 29.7 s instead of 10.1-10.5 s (the goal is 10 s; scale43h). An idle queue's seal
        waits for nobody (a written queue's goes at once, one by one, first in the pool)."""
        view = self.view
        executor = self._seal_executor
        if view is None or executor is None:
            return
        starts: list[str] = []
        with self._lock:
            if self._moving:
                return
            for gid, waiting in self._seal_batches.items():
                running = self._seal_batch_jobs.get(gid, 0)
                more = min(SEAL_CALLS_IN_FLIGHT - running, -(-len(waiting) // SEAL_BATCH))
                if more > 0:
                    self._seal_batch_jobs[gid] = running + more
                    starts += [gid] * more
        for i, gid in enumerate(starts):
            if not self._queue_seal_job(1, functools.partial(self._seal_group_batch, gid, view), executor):
                with self._lock:  # stopping: none of the rest runs either
                    for left in starts[i:]:
                        self._seal_batch_jobs.pop(left, None)
                return

    def _queue_seal_job(self, rank: int, job: Callable[[], None],
                        executor: concurrent.futures.ThreadPoolExecutor) -> bool:
        """Queue ``job`` for the seal pool (rank 0: a written queue's, first); False once stopping."""
        with self._lock:
            heapq.heappush(self._seals, (rank, next(self._seal_order), job))
        try:
            executor.submit(self._next_seal)  # one worker task per job; each runs the most urgent
        except RuntimeError:  # shut down: stopping
            return False
        return True

    def _seal_group_batch(self, gid: str, view: DaemonView) -> None:
        """One batch job of ``gid`` (``SEAL_CALLS_IN_FLIGHT`` of them at most): seal up to
        ``SEAL_BATCH`` of the idle queues' segments waiting in ``_seal_batches`` (``seal.seal_batch``:
        one SealMany per replica, the seals written in few ZooKeeper transactions), then queue
        itself again while more wait; those it leaves go the one-by-one way (``_seal_later``
        without a batch: it reads afresh)."""
        assert self.batch_sealer is not None
        if self._stop.is_set():
            return
        self._wait_turn()
        with self._lock:
            waiting = self._seal_batches.get(gid, {})
            part: dict[str, tuple[int, sm.QueueState, StateVersion]] = {}
            # while a dead group's heads are moved, only the first jobs of a group (the others end
            # here; started again after: ``_start_seal_batches``)
            over = self._seal_batch_jobs.get(gid, 0) > seal_calls_allowed(bool(self._moving))
            for (q, seg), (st, version) in waiting.items() if not over else ():
                if len(part) >= SEAL_BATCH:
                    break
                if q not in part:  # one segment of a queue a batch: one write of its state
                    part[q] = (seg, st, version)
            for q, (seg, _st, _v) in part.items():
                del waiting[(q, seg)]
            if not part:
                if not waiting:
                    self._seal_batches.pop(gid, None)
                self._seal_batch_jobs[gid] = self._seal_batch_jobs.get(gid, 1) - 1
                if self._seal_batch_jobs[gid] <= 0:
                    del self._seal_batch_jobs[gid]
                return
        try:
            self._seal_one_batch(gid, view, part)
        finally:
            executor = self._seal_executor
            if executor is None or not self._queue_seal_job(1, lambda: self._seal_group_batch(gid, view), executor):
                with self._lock:
                    self._seal_batch_jobs.pop(gid, None)

    def _seal_one_batch(self, gid: str, view: DaemonView,
                        part: dict[str, tuple[int, sm.QueueState, StateVersion]]) -> None:
        assert self.batch_sealer is not None
        items = [(q, seg, st, v) for q, (seg, st, v) in part.items()]
        started = time.monotonic()
        try:
            left = set(self.batch_sealer(gid, items, view.members.get(gid, {})))
        except Exception as exc:  # noqa: BLE001 - tried again later (``_defer_batch``)
            self._defer_batch(gid, part, exc)
            return
        sealed = len(items) - len(left)
        took = time.monotonic() - started
        with self._lock:
            self._seal_retry_s.pop(gid, None)  # the group answers: a later deferral waits RETRY_S again
        self.metrics.seal_seconds.labels(outcome="sealed").observe(took)
        # one line a batch: when a dead group's seals were done shows in the log (issue 43)
        log.info("group %s: %d of %d segments sealed in one batch in %.2f s (%d left to seal one by one); "
                 "%d more wait for batches", gid, sealed, len(items), took, len(left), self._seals_waiting(gid))
        with self._lock:
            for q, (seg, _st, _v) in part.items():
                if q not in left:
                    self._sealing_now.discard((q, seg))
            self.stats.actions[Kind.SEAL.value] = self.stats.actions.get(Kind.SEAL.value, 0) + sealed
            self.stats.seal_batches += 1
            self.stats.batched_seals += sealed
        for q in left:  # one by one, reading afresh
            seg = part[q][0]
            with self._lock:
                self._sealing_now.discard((q, seg))
            self._seal_later(q, Action(Kind.SEAL, gid=gid, seg=seg), known=None)

    def _defer_batch(self, gid: str, part: dict[str, tuple[int, sm.QueueState, StateVersion]],
                     exc: BaseException) -> None:
        """Keep a batch no replica answered (its segments stay ``_sealing_now``: no round queues
        them again meanwhile) and try it again after the group's wait (``SEAL_RETRY_MAX_S``):
        nothing was written, so the states it was planned on still hold, or lose their check."""
        with self._lock:
            self.stats.errors += 1
            deferred = self._seal_deferred.setdefault(gid, {})
            for q, (seg, st, version) in part.items():
                deferred[(q, seg)] = (st, version)
            if gid in self._seal_retry_timers:  # the group's other call failed too: one retry for both
                wait = self._seal_retry_s[gid]
            else:
                wait = self._seal_retry_s[gid] = min(SEAL_RETRY_MAX_S, self._seal_retry_s.get(gid, RETRY_S / 2) * 2)
                if not self._stop.is_set():
                    timer = self._seal_retry_timers[gid] = threading.Timer(wait, self._retry_deferred, (gid,))
                    timer.name, timer.daemon = f"ordq-seal-retry-{gid}", True
                    timer.start()
        log.warning("group %s: batch of %d seals deferred, tried again in %.1f s: %s", gid, len(part), wait, exc)

    def _retry_deferred(self, gid: str) -> None:
        """The group's deferred seals back to its batches (``_start_seal_batches`` starts them);
        when no longer leading, let go: the next term plans every queue afresh."""
        with self._lock:
            self._seal_retry_timers.pop(gid, None)
            deferred = self._seal_deferred.pop(gid, {})
            if self._stop.is_set():
                return
            if self.view is None:
                self._sealing_now.difference_update(deferred)
                return
            self._seal_batches.setdefault(gid, {}).update(deferred)
        self._start_seal_batches()

    def _cancel_seal_retries(self) -> None:
        """Stopping: no deferred batch is tried again."""
        with self._lock:
            timers = list(self._seal_retry_timers.values())
            self._seal_retry_timers.clear()
        for timer in timers:
            timer.cancel()

    def _seals_waiting(self, gid: str) -> int:
        with self._lock:
            return len(self._seal_batches.get(gid, {}))

    def _next_seal(self) -> None:
        with self._lock:
            if not self._seals:
                return
            _, _, job = heapq.heappop(self._seals)
        job()
