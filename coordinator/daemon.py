"""The coordinator daemon: HA (one elected among several), never needed for correctness.

Guarantee: every change it makes is a conditional transition through ``ZkStore.apply`` (or a
Seal run, which ends in one), planned by the pure ``ordq.coordinator.duties.plan``; a daemon that
lost leadership or acted on a stale view only loses a CAS. Producers and consumers fail over,
seal and pop on their own; the daemon makes it faster (it reacts to a liveness node vanishing
within one watch event) and keeps lists tidy.

Cost (issue 29): a round plans only the queues that changed or have a duty due, never every
queue. ``DaemonView`` (coordinator/daemon_view.py) keeps copies of queue and group records
current through ZooKeeper watches and marks what changed; the head masters are asked of all
their open segments in one call each (``OpenSegments``) and a queue whose answer changed is
marked; a duty that falls due by the clock (segment age, retention time: ``duties.next_due_ms``)
or a round that failed (a seal no replica answered) sets a timer for its queue. Every
``sweep_interval_s`` every queue is read again and planned: the safety net, should a watch ever
be missed (none is expected: ZooKeeper delivers them within a session and kazoo re-arms them
after a reconnection; a new session is a new leadership term, which reads everything anyway).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.recipe.election import Election

from ordq.common.errors import CoordinationUnavailable, CorruptState, IllegalTransition, OrdqError
from ordq.common.metrics import MetricsServer, Page
from ordq.common.metrics import serve as metrics_serve
from ordq.coordinator import state as sm
from ordq.coordinator.daemon_view import STATE, SUBS, DaemonView
from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, next_due_ms, plan
from ordq.coordinator.group_moves import batches, plan_moves
from ordq.coordinator.head_spread import SpreadResult, spread_heads
from ordq.coordinator.metrics import DEFAULT_PER_QUEUE_SERIES, CoordinatorMetrics, DaemonStats
from ordq.coordinator.pacing import RequestsFirst, in_slices
from ordq.coordinator.store import Known, ZkStore
from ordq.coordinator.store_values import LiveInfo, QueueConfig, roll_transition

log = logging.getLogger("ordq.coordinator")
# Transient ZooKeeper errors of the election itself: contend again (after this pause) rather
# than let the election thread end.
ELECTION_RETRY_S = 0.5
_ELECTION_TRANSIENT = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError,
                       ConnectionClosedError)

# Seal runner: (queue, seg, known=(state, version) | None, members={role: LiveInfo} | None)
# -> None (``seal.run_seal``); raises OrdqError when no replica answers.
Sealer = Callable[..., None]
# Batched seal runner: (gid, [(queue, seg, state, version)], {role: LiveInfo}) -> queues it left
# to ``Sealer`` (``seal.seal_batch``); raises OrdqError when no replica answers.
BatchSealer = Callable[..., list[str]]
# What a head master says of every open segment it holds: its address -> {(queue, seg): size
# and age}; raises OrdqError when it does not answer.
Prober = Callable[[str], Mapping[tuple[str, int], OpenSegment]]
# Every queue read again and planned this often although no watch fired (see the module doc).
# Why 5 min: a sweep of 10,000 queues is ~20,000 pipelined reads, ~1-2 s of this process's
# CPU; every 5 min that is under 1 % of a core, and it only repairs what is not expected to
# break (correctness never rests on the daemon: producers and consumers act on their own).
SWEEP_INTERVAL_S = 300.0
# A queue whose round failed (a seal no replica answered, ZooKeeper unavailable) is planned
# again after this; after an unexpected error (a bug, logged each time) after the longer one.
RETRY_S = 1.0
BUG_RETRY_S = 10.0
# Queues planned (and acted on) at once when a round has several. Few: the duties are never
# urgent for correctness (producers and consumers fail over and seal on their own, through
# the coordinator service in this same process), and every thread more takes the GIL from
# the service's answer to a producer (10,000 queues: bench/bench_queues.py).
ROUND_WORKERS = 4
# Queues handed to the round pool at once; between two slices the daemon waits while the
# service answers a producer's FailOver (``coordinator/pacing.py``).
ROUND_SLICE = 250
# Seals run at once, beside the rounds (``_seal_later``).
SEAL_WORKERS = 3
# Idle queues' seals of one group sealed together (``seal.seal_batch``; issue 43): this many a
# SealMany call, and this many such calls of one group at once (while the broker syncs one
# call's files, the next call's segments are created and sealed in memory). Each call is one
# job of the seal pool: it seals one batch and queues itself again, so a written queue's seal
# (first in the queue of jobs) never waits behind a whole group's batches.
SEAL_BATCH = 500
SEAL_CALLS_IN_FLIGHT = 2
# A queue whose open segment a probe saw grow within this long is "written": after a head
# master dies its failover and seal come before those of the idle queues it also headed
# (``urgent_first``): a producer or consumer may wait on it; 10,000 idle ones wait on nobody.
WRITTEN_S = 60.0
# Heads spread back (issue 43, ``coordinator/head_spread.py``): a pass every this often moves at
# most ``rebalance_moves_per_s`` times it idle queues' heads towards an even spread; a group
# gives or receives only once both its processes have been live this long (a group that just
# came back may go again: no churn for a flapping one), and no pass runs while a dead group's
# seals wait for their batches.
REBALANCE_INTERVAL_S = 2.0
REBALANCE_GRACE_S = 10.0
REBALANCE_MOVES_PER_S = 50.0


def is_written(queue: str, written: Mapping[str, float], now: float) -> bool:
    """Whether a probe saw ``queue``'s open segment grow within ``WRITTEN_S`` of ``now``
    (``written``: queue -> when it last did)."""
    at = written.get(queue)
    return at is not None and now - at <= WRITTEN_S


def urgent_first(queues: list[str], written: Mapping[str, float], now: float) -> list[str]:
    """``queues`` with the written ones (``is_written``) first, each part in its given order."""
    hot = [q for q in queues if is_written(q, written, now)]
    if not hot:
        return queues
    return hot + [q for q in queues if not is_written(q, written, now)]


class CoordinatorDaemon:
    """Run ``run()`` in a thread or process; ``stop()`` ends it."""

    def __init__(
        self,
        store: ZkStore,
        *,
        sealer: Sealer | None = None,
        prober: Prober | None = None,
        batch_sealer: BatchSealer | None = None,
        interval_s: float = 0.5,
        identifier: str = "",
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        requests_first: RequestsFirst | None = None,
        per_queue_series: int | None = DEFAULT_PER_QUEUE_SERIES,
        rebalance_moves_per_s: float = REBALANCE_MOVES_PER_S,
    ) -> None:
        """``interval_s``: the longest wait between two rounds (a round is sooner when a watch
        fires) and how often head masters are probed; ``sweep_interval_s``: see the module doc;
        ``requests_first``: shared with this process's coordinator service, whose urgent
        requests an idle queue's round or seal waits for (``coordinator/pacing.py``);
        ``per_queue_series``: how many queues get per-queue series on /metrics (None: all;
        ``coordinator/metrics.py`` ``top_queues``)."""
        self.store = store
        self.sealer = sealer
        self.prober = prober
        self.batch_sealer = batch_sealer
        self.rebalance_moves_per_s = rebalance_moves_per_s  # 0: heads are spread only by ``rebalance``
        self._live_since: dict[str, float] = {}  # gid -> when this term first saw both its processes live
        self._next_spread = 0.0
        self.interval_s = interval_s
        self.sweep_interval_s = sweep_interval_s
        self.identifier = identifier
        self.requests_first = requests_first
        self.view: DaemonView | None = None  # this leadership term's copies (made by the first round)
        self._open: dict[str, tuple[int, OpenSegment]] = {}  # queue -> (seg, what its master said)
        self._written: dict[str, float] = {}  # queue -> when a probe last saw its open segment grow
        self._next_sweep = 0.0
        self._next_probe = 0.0
        self._lock = threading.Lock()  # the stats, when queues are planned in parallel
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._seal_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._sealing_now: set[tuple[str, int]] = set()
        # seals waiting for a worker, written queues' first: (0 written / 1 idle, order, job)
        self._seals: list[tuple[int, int, Callable[[], None]]] = []
        self._seal_order = itertools.count()
        # idle queues' seals waiting for a batch (``batch_sealer``): gid -> queue -> (seg, state, version)
        self._seal_batches: dict[str, dict[str, tuple[int, sm.QueueState, int]]] = {}
        self._seal_batch_jobs: dict[str, int] = {}  # gid -> its batch jobs queued or running
        self._list_seen = -1
        self.stats = DaemonStats()
        self.metrics = CoordinatorMetrics(self.stats, per_queue_series=per_queue_series,
                                          written=lambda: self._written)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._session_lost = threading.Event()
        # Why the election thread ended while not asked to stop (the process then exits non-zero)
        self.failure: BaseException | None = None

    # -- leadership ------------------------------------------------------------------------

    def run(self) -> None:
        """Contend, lead (duties) while elected, contend again after a lost session or a
        transient ZooKeeper error, until stopped. Anything else is a bug: it is logged and kept
        in ``failure``, run returns, and the caller must end the process non-zero (issue 23: an
        election thread that died silently left a standby that never led again)."""
        client: KazooClient = self.store.client
        client.add_listener(self._on_zk_state)
        try:
            while not self._stop.is_set():
                self._session_lost.clear()
                election = Election(client, self.store.paths.coordinator_leader, self.identifier)
                try:
                    election.run(self._lead)
                except _ELECTION_TRANSIENT as exc:
                    if self._stop.is_set():
                        break  # kazoo raises ConnectionClosedError here when stopped while leading
                    log.warning("coordinator %s: election interrupted (%s); contending again",
                                self.identifier, type(exc).__name__)
                    self._stop.wait(ELECTION_RETRY_S)
        except Exception as exc:  # noqa: BLE001 - kept for the caller, which exits non-zero
            if self._stop.is_set():  # the client closed under it while stopping: not a failure
                log.debug("coordinator %s: election ended while stopping: %r", self.identifier, exc)
                return
            self.failure = exc
            log.critical("coordinator %s: election thread failed", self.identifier, exc_info=True)
        finally:
            client.remove_listener(self._on_zk_state)

    def _on_zk_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            # the session (and with it our election node) is gone: stop leading, contend again
            self._session_lost.set()
            self._wake.set()

    def _lead(self) -> None:
        self.stats.term += 1
        self.stats.is_leader = True
        log.info("coordinator %s elected", self.identifier)
        self._new_term()
        try:
            while not self._stop.is_set() and not self._session_lost.is_set():
                self._wake.clear()  # before the round: a watch firing during it wakes the next
                self.round()
                self._wake.wait(self._until_next())
        finally:
            self.stats.is_leader = False
            if self.view is not None:
                self.view.close()
            self.view = None

    def _new_term(self) -> DaemonView:
        """Fresh copies for a leadership term: everything is read (and watched) in its first round."""
        if self.view is not None:
            self.view.close()
        self.view = DaemonView(self.store, self._wake.set)
        self._open = {}
        self._written = {}
        self._next_sweep = time.monotonic() + self.sweep_interval_s
        self._next_probe = 0.0
        self._live_since = {}
        self._next_spread = time.monotonic() + REBALANCE_GRACE_S
        return self.view

    def _until_next(self) -> float:
        """Seconds to the next timer (a due duty, the probe, the sweep), at most ``interval_s``."""
        now = time.monotonic()
        due = self.view.next_due() if self.view is not None else None
        nearest = min(x for x in (due, self._next_probe, self._next_sweep, now + self.interval_s) if x is not None)
        return max(0.0, min(self.interval_s, nearest - now))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for executor in (self._executor, self._seal_executor):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)

    # -- one round --------------------------------------------------------------------------

    def round(self) -> None:
        """Plan (and act on) every queue that changed or has a duty due; see the module doc."""
        started = time.monotonic()
        self.stats.rounds += 1
        view = self.view or self._new_term()
        if started >= self._next_sweep:
            self._next_sweep = started + self.sweep_interval_s
            self.stats.sweeps += 1
            view.mark_all()
        if self.prober is not None and started >= self._next_probe:
            self._next_probe = started + self.interval_s
            self._probe(view)
        try:
            queues = view.refresh(started, pause=self._wait_turn)
        except OrdqError as exc:
            self.stats.errors += 1
            log.warning("coordinator round: %s", exc)
            return
        finally:
            self.stats.zk_reads = view.reads
        if len(queues) > 1:
            queues = urgent_first(queues, self._written, started)
            queues = self._move_dead_heads(queues, view, started)
            # Why a pool: after a head master dies every queue it headed fails over, each a
            # ZooKeeper write waiting for its commit; in parallel they share the server's syncs.
            # Why slices: handing 10,000 queues to the pool at once holds the GIL for ~0.5 s
            # on a loaded box (a future each); between slices a producer's FailOver goes first.
            pool = self._pool()
            for part in in_slices(queues, ROUND_SLICE, self._wait_turn):
                if self._stop.is_set():
                    break  # stop() shut the pool down
                list(pool.map(self._guarded_round, part))
        else:
            for queue in queues:
                self._guarded_round(queue)
        self.stats.planned += len(queues)
        self.stats.zk_reads = view.reads
        self._spread_pass(view, started)
        if view.list_changes != self._list_seen:  # queues deleted: forget them (not every round: O(queues))
            self._list_seen = view.list_changes
            for gone in set(self.stats.corrupt) - set(view.entries):
                del self.stats.corrupt[gone]
            for gone in set(self.stats.queues) - set(view.entries):
                with self._lock:
                    self.stats.drop_queue(gone)
        self.metrics.round_seconds.observe(time.monotonic() - started)

    def _move_dead_heads(self, queues: list[str], view: DaemonView, now: float) -> list[str]:
        """Fail over, in batched transactions, every queue of ``queues`` whose head group is
        dead (``group_moves``), written queues first; return the queues left for the per-queue
        round (those not moved here). A moved queue's write fires its watch: its seal is planned
        in the next round. One queue alone goes the per-queue way (no batch to gain)."""
        entries = view.entries
        rows = []
        for q in queues:
            entry = entries.get(q)
            if entry is None or entry.state is None or entry.problem is not None:
                continue
            rows.append((q, entry.state, entry.version, view.facts(entry)))
        busy = {q for q, *_ in rows if is_written(q, self._written, now)}
        moves = plan_moves(rows, busy)
        if len(moves) < 2:
            return queues
        moved: set[str] = set()
        for part in batches(moves):
            if self._stop.is_set():
                break
            if not part[0].busy:
                self._wait_turn()  # a producer's FailOver first (pacing.py)
            try:
                done, _left = self.store.apply_batch([(m.queue, m.version, m.after) for m in part],
                                                     view.group_versions)
            except OrdqError as exc:  # left to the per-queue rounds
                with self._lock:
                    self.stats.errors += 1
                log.warning("moving %d heads off a dead group: %s", len(part), exc)
                continue
            moved.update(done)
            with self._lock:
                if done:
                    self.stats.move_batches += 1
                    self.stats.batched_moves += len(done)
                    self.stats.actions[Kind.FAIL_OVER.value] = self.stats.actions.get(Kind.FAIL_OVER.value, 0) \
                        + len(done)
        if moved:
            log.info("moved %d heads off dead groups in batches (%d busy)", len(moved), len(busy & moved))
        return [q for q in queues if q not in moved]

    def _guarded_round(self, queue: str) -> None:
        """One queue's round; whatever it raises is counted and logged, and the queue planned
        again later (a corrupt state: when it is written again, which fires its watch)."""
        # Why: whatever one queue does (corrupt state, a bug), every other queue is served.
        retry_s: float | None = None
        self._idle_waits_turn(queue)
        try:
            self._queue_round(queue)
            with self._lock:
                self.stats.corrupt.pop(queue, None)  # restored
        except CorruptState as exc:
            with self._lock:
                self.stats.errors += 1
                self.stats.corrupt_seen += 1
                if self.stats.corrupt.get(queue) != exc.detail:
                    log.error("queue %s: %s", queue, exc)  # once per distinct problem, not per round
                self.stats.corrupt[queue] = exc.detail
        except OrdqError as exc:
            with self._lock:
                self.stats.errors += 1
            retry_s = RETRY_S
            log.warning("queue %s: %s", queue, exc)
        except Exception:  # noqa: BLE001 - a bug in one queue's round must not end the leadership
            with self._lock:
                self.stats.errors += 1
                self.stats.unexpected += 1
            retry_s = BUG_RETRY_S
            log.exception("queue %s: unexpected error in the duty round", queue)
        if retry_s is not None and self.view is not None:
            self.view.schedule(queue, time.monotonic() + retry_s)

    def _seal_later(self, queue: str, action: Action, known: tuple[sm.QueueState, int] | None = None) -> None:
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
                self._seal_batches.setdefault(gid, {})[queue] = (action.seg, known[0], known[1])
                if self._seal_batch_jobs.get(gid, 0) >= SEAL_CALLS_IN_FLIGHT:
                    return  # the group's batch jobs, queued already, take it
                self._seal_batch_jobs[gid] = self._seal_batch_jobs.get(gid, 0) + 1
            self._queue_seal_job(1, lambda: self._seal_group_batch(gid, view), executor)
            return
        if not self._queue_seal_job(0 if urgent else 1, run, executor):
            with self._lock:
                self._sealing_now.discard(key)

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
            part = dict(itertools.islice(waiting.items(), SEAL_BATCH))
            for q in part:
                del waiting[q]
            if not part:
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

    def _seal_one_batch(self, gid: str, view: DaemonView, part: dict[str, tuple[int, sm.QueueState, int]]) -> None:
        assert self.batch_sealer is not None
        items = [(q, seg, st, v) for q, (seg, st, v) in part.items()]
        started = time.monotonic()
        try:
            left = set(self.batch_sealer(gid, items, view.members.get(gid, {})))
        except Exception as exc:  # noqa: BLE001 - tried again later, like a failed seal
            with self._lock:
                self.stats.errors += 1
            log.warning("group %s: batch of %d seals deferred: %s", gid, len(items), exc)
            with self._lock:
                for q, (seg, _st, _v) in part.items():
                    self._sealing_now.discard((q, seg))
            for q in part:  # planned again by the timer
                view.schedule(q, time.monotonic() + RETRY_S)
            return
        sealed = len(items) - len(left)
        self.metrics.seal_seconds.labels(outcome="sealed").observe(time.monotonic() - started)
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

    def _idle_waits_turn(self, queue: str) -> None:
        """An idle queue's job (not ``is_written``) starts once the service's urgent requests
        in flight are answered (``coordinator/pacing.py``); a written one at once."""
        if not is_written(queue, self._written, time.monotonic()):
            self._wait_turn()

    def _wait_turn(self) -> None:
        """Wait while this process's service answers an urgent request (bounded; pacing.py)."""
        if self.requests_first is not None:
            self.requests_first.wait_turn()

    def _next_seal(self) -> None:
        with self._lock:
            if not self._seals:
                return
            _, _, job = heapq.heappop(self._seals)
        job()

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(ROUND_WORKERS, thread_name_prefix="ordq-duty")
        return self._executor

    def _probe(self, view: DaemonView) -> None:
        """Ask every live head master of all its open segments (one call each); mark the
        queues whose answer changed. A master that does not answer keeps its queues' last answer."""
        assert self.prober is not None
        heard: dict[str, tuple[int, OpenSegment]] = {}
        silent: set[str] = set()
        for gid, address in sorted(view.masters.items()):
            self.stats.probes += 1
            try:
                answer = self.prober(address)
            except OrdqError as exc:
                silent.add(gid)
                log.debug("group %s: open segments not probed: %s", gid, exc)
                continue
            for (queue, seg), info in answer.items():
                entry = view.entries.get(queue)
                open_seg = entry.state.open_segment if entry is not None and entry.state is not None else None
                if open_seg is not None and open_seg.seg == seg and open_seg.gid == gid:
                    heard[queue] = (seg, info)
        for queue, (seg, info) in self._open.items():
            entry = view.entries.get(queue)
            open_seg = entry.state.open_segment if entry is not None and entry.state is not None else None
            if open_seg is not None and open_seg.seg == seg and open_seg.gid in silent:
                heard.setdefault(queue, (seg, info))
        changed = {q for q in set(heard) | set(self._open) if heard.get(q) != self._open.get(q)}
        now = time.monotonic()
        for q in changed:
            seg_info = heard.get(q)
            before = self._open.get(q)
            if seg_info is not None and seg_info[1].bytes > (before[1].bytes if before and before[0] == seg_info[0]
                                                              else 0):
                self._written[q] = now
        if len(self._written) > 2 * len(heard) + 1000:  # forget the long quiet ones (bounded memory)
            self._written = {q: t for q, t in self._written.items() if now - t <= WRITTEN_S}
        self._open = heard
        view.mark(changed)

    def _queue_round(self, queue: str) -> None:
        view = self.view
        assert view is not None
        entry = view.entries.get(queue)
        if entry is None:
            return  # deleted
        if entry.problem is not None:
            raise entry.problem
        if entry.state is None or entry.config is None:
            return  # not read yet: marked again when it is
        st, cfg = entry.state, entry.config
        facts = view.facts(entry)
        before = self.stats.queues.get(queue, {}).get("send")
        if before and before[0] != st.head:
            open_seg = st.open_segment
            self.stats.failovers.append({"at_ms": int(time.time() * 1000), "queue": queue, "from": before[0],
                                         "to": st.head, "seg": open_seg.seg if open_seg else None})
        seen = {
            "send": list(st.send),
            "segments": len(st.consume),
            "epoch": st.producer_epoch,
            "live_groups": sorted(facts.live_groups),
            "sealing": sum(1 for c in st.consume if c.status is sm.SegStatus.SEALING),
            # unconsumed segments whose group has not both processes live: consumers may wait there
            "not_live": sum(1 for c in st.consume if c.gid not in facts.live_groups),
        }
        if self.stats.queues.get(queue) != seen:
            with self._lock:
                self.stats.set_queue(queue, seen)  # the per-queue series are rendered again
        limits = Limits(retention_segments=cfg.retention_segments, retention_time_s=cfg.retention_time_s,
                        retention_bytes=cfg.retention_bytes, segment_bytes=cfg.segment_bytes,
                        segment_age_s=cfg.segment_age_s)
        open_seg = st.open_segment
        probed = self._open.get(queue)
        open_info = None
        if open_seg is not None and open_seg.gid in facts.live_groups and self.prober is not None:
            # what its master said of this very segment; holding none of it: nothing written yet
            open_info = probed[1] if probed is not None and probed[0] == open_seg.seg else OpenSegment(0, None)
        now_ms = int(time.time() * 1000)
        due = next_due_ms(st, limits, open_info=open_info)
        if due is not None:
            view.schedule(queue, time.monotonic() + max(0.0, (due - now_ms) / 1000))
        # the first write of this round goes against these copies (no re-read; versions checked)
        known: Known | None = Known(state=st, version=entry.version, facts=facts,
                                    group_versions=view.group_versions)
        for action in plan(st, facts, limits, now_ms=now_ms, open_info=open_info):
            if action.kind is Kind.SEAL:
                self._seal_later(queue, action, known=(st, entry.version))
                continue
            try:
                self._do(queue, action, cfg, known)
            except IllegalTransition:
                with self._lock:
                    self.stats.conflicts[action.kind.value] = self.stats.conflicts.get(action.kind.value, 0) + 1
                continue  # someone else acted first: its write fires our watch, planned again
            finally:
                known = None  # the state moved on: later actions read it afresh
            with self._lock:
                self.stats.actions[action.kind.value] = self.stats.actions.get(action.kind.value, 0) + 1

    def _do(self, queue: str, action: Action, cfg: QueueConfig, known: Known | None = None,
            seal_known: tuple[tuple[sm.QueueState, int] | None, Mapping[str, LiveInfo] | None] = (None, None)) -> None:
        """``known``: the copies the action was planned on, for transitions that read no cursors;
        ``seal_known``: a seal's (state, version) and the segment group's members, the same."""
        log.info("queue %s: %s %s seg %s", queue, action.kind.value, action.gid, action.seg)
        if action.kind is Kind.FAIL_OVER:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, lambda s, f: sm.fail_over(s, gid, seg, f), known=known)
        elif action.kind is Kind.ADMIT:
            assert action.gid is not None
            gid = action.gid
            self.store.apply(queue, lambda s, f: sm.admit(s, gid, f), known=known)
        elif action.kind is Kind.POP:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, later_stored=later))
        elif action.kind is Kind.ROLL:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, roll_transition(cfg, gid, seg), known=known)
            # its state write fires our watch: the rolled segment is sealed in the next round
        elif action.kind is Kind.RETAIN:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, retention=True, later_stored=later))
        elif action.kind is Kind.SEAL and self.sealer is not None:
            assert action.seg is not None
            started, outcome = time.monotonic(), "failed"
            try:
                state_known, members = seal_known
                self.sealer(queue, action.seg, known=state_known, members=members)
                outcome = "sealed"
            finally:
                self.metrics.seal_seconds.labels(outcome=outcome).observe(time.monotonic() - started)

    # -- heads spread back (issue 43) --------------------------------------------------------

    def _settled_live(self, view: DaemonView, now: float) -> frozenset[str]:
        """Groups live (both processes) and not drained for ``REBALANCE_GRACE_S`` at least."""
        live = view.live - view.drained
        for g in set(self._live_since) - live:
            del self._live_since[g]
        for g in live:
            self._live_since.setdefault(g, now)
        return frozenset(g for g in live if now - self._live_since[g] >= REBALANCE_GRACE_S)

    def _spread_pass(self, view: DaemonView, now: float) -> None:
        settled = self._settled_live(view, now)
        if self.rebalance_moves_per_s <= 0 or now < self._next_spread:
            return
        self._next_spread = now + REBALANCE_INTERVAL_S
        with self._lock:
            if self._seal_batches:
                return  # a dead group's seals first
        try:
            result = self._spread(view, settled, now, max_moves=int(self.rebalance_moves_per_s * REBALANCE_INTERVAL_S),
                                  dry_run=False)
        except OrdqError as exc:
            log.warning("spreading heads: %s", exc)
            return
        if result.moves:
            log.info("spread %d idle queues' heads back: %s -> %s", len(result.moves), result.before, result.after)

    def _spread(self, view: DaemonView, live: frozenset[str], now: float, *, max_moves: int,
                dry_run: bool) -> SpreadResult:
        rows = [(q, e.state, e.version) for q, e in list(view.entries.items())
                if e.state is not None and e.problem is None and STATE not in e.stale]
        busy = {q for q, _st, _v in rows if is_written(q, self._written, now)}
        result = spread_heads(self.store, rows, live, busy, view.group_versions, max_moves=max_moves,
                              dry_run=dry_run, wait_turn=self._wait_turn)
        if result.moves and not dry_run:
            with self._lock:
                self.stats.spread_moves += len(result.moves)
                self.stats.spread_batches += result.transactions
        return result

    def rebalance(self, *, max_moves: int, dry_run: bool) -> SpreadResult:
        """``ordq group rebalance``: spread idle queues' heads over the live groups now (every
        live, undrained group, without the grace period), at most ``max_moves``; with
        ``dry_run`` only the plan. CoordinationUnavailable when this coordinator does not lead."""
        view = self.view
        if view is None or not self.stats.is_leader:
            raise CoordinationUnavailable("this coordinator does not lead (or has not read the queues yet)")
        return self._spread(view, frozenset(view.live - view.drained), time.monotonic(), max_moves=max_moves,
                            dry_run=dry_run)

    # -- what the admin API reads of this daemon's copies -----------------------------------

    def known_queues(self, queues: Iterable[str]) -> dict[str, tuple[sm.QueueState, int, list[str] | None]]:
        """Of ``queues``, those this daemon's copies hold (it leads and has read them): state,
        its version and the subscriptions' names when it keeps their cursors (else None). Kept
        current by watches (``DaemonView``), so ``queue list`` of 10^5 queues reads no
        ZooKeeper node for them (issue 43). Nothing when not leading."""
        view = self.view
        if view is None or not self.stats.is_leader:
            return {}
        out: dict[str, tuple[sm.QueueState, int, list[str] | None]] = {}
        entries = view.entries
        for q in queues:
            entry = entries.get(q)
            stale = set(entry.stale) if entry is not None else set()
            if entry is None or entry.state is None or entry.problem is not None or STATE in stale:
                continue  # not read yet, or changed and not read again: the caller reads it
            cursors = entry.cursors if SUBS not in stale else None
            out[q] = (entry.state, entry.version, sorted(cursors) if cursors is not None else None)
        return out

    # -- metrics ----------------------------------------------------------------------------

    def serve_metrics(self, listen: str, pages: Mapping[str, Page] | None = None) -> MetricsServer:
        """Serve this daemon's metrics (``ordq.coordinator.metrics``) at ``listen`` (port 0 ok),
        and ``pages`` beside them (the status page, which ``ordq coordinator run`` builds above
        this package: it reads replicas through the SDK)."""
        own = {"/metrics": self.metrics.page, "/health": self.metrics.health}
        return metrics_serve(self.metrics.registry, listen, pages={**own, **(pages or {})})
