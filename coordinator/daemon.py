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
or a round that failed (a seal no replica answered) sets a timer for its queue. Once per
``sweep_interval_s`` (a share each round, at most ``daemon_round.SWEEP_MAX_PER_S`` queues a
second) every queue is read again and planned: the safety net, should a watch ever
be missed (none is expected: ZooKeeper delivers them within a session; a dropped connection
loses them, and kazoo does not set them again but fires each once with no path, upon which
the view reads every queue again (``DaemonView._on_queue_node``); a new session is a new
leadership term, which reads everything anyway).

The daemon is one object in five modules (``coordinator/daemon_parts.py`` says which part does
what): this one holds its leadership and its terms.
"""

from __future__ import annotations

import concurrent.futures
import itertools
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

from ordq.common.metrics import MetricsServer, Page
from ordq.common.metrics import serve as metrics_serve
from ordq.coordinator import state as sm
from ordq.coordinator.away import GRACE_S, MAX_HELD_S, AwayPolicy, AwayTracker, Verdict
from ordq.coordinator.daemon_away import AbsentGroups
from ordq.coordinator.daemon_gc import install_long_collection_log, young_collections_spaced
from ordq.coordinator.daemon_parts import (  # noqa: F401 - the daemon's names, as before the split
    BUG_RETRY_S,
    RETRY_S,
    WRITTEN_S,
    BatchSealer,
    Prober,
    Sealer,
    is_written,
    log,
    urgent_first,
)
from ordq.coordinator.daemon_round import ROUND_SLICE, ROUND_WORKERS, DutyRound  # noqa: F401
from ordq.coordinator.daemon_seals import SEAL_BATCH, SEAL_CALLS_IN_FLIGHT, SEAL_WORKERS, SealBatches  # noqa: F401
from ordq.coordinator.daemon_spread import (  # noqa: F401
    REBALANCE_GRACE_S,
    REBALANCE_INTERVAL_S,
    REBALANCE_MOVES_PER_S,
    SpreadBack,
)
from ordq.coordinator.daemon_view import SUBS, DaemonView, QueueEntry, known_state
from ordq.coordinator.duties import Kind, OpenSegment
from ordq.coordinator.group_probe import GroupProber, Pinger
from ordq.coordinator.metrics import DEFAULT_PER_QUEUE_SERIES, CoordinatorMetrics, DaemonStats
from ordq.coordinator.pacing import RequestsFirst
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import WrittenStates
from ordq.coordinator.store_values import StateVersion

# Transient ZooKeeper errors of the election itself: contend again (after this pause) rather
# than let the election thread end.
ELECTION_RETRY_S = 0.5
_ELECTION_TRANSIENT = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError,
                       ConnectionClosedError)
# Every queue read again and planned this often although no watch fired (see the module doc).
# Why 5 min: a sweep of 10,000 queues is ~20,000 pipelined reads, ~1-2 s of this process's
# CPU; every 5 min that is under 1 % of a core, and it only repairs what is not expected to
# break (correctness never rests on the daemon: producers and consumers act on their own).
SWEEP_INTERVAL_S = 300.0
# A listing whose queues the copy lacks this many of says why in the log (``known_queues``).
LACKED_LOGGED = 100


def why_lacked(entries: Mapping[str, QueueEntry], written: WrittenStates, lacked: Iterable[str]) -> str:
    """Why ``known_queues`` lacks each of ``lacked``, counted (issue 43: at 10^5 queues a listing
    15 s after a group's failure read 2.4 s of states its copy lacked, and nothing said why)."""
    reasons: dict[str, int] = {}
    for q in lacked:
        entry = entries.get(q)
        mine = written.get(q)
        if entry is None:
            why = "not listed in the copy"
        elif entry.problem is not None:
            why = "unusable"
        elif entry.state is None:
            why = "never read" + (" (created here, kept unread)" if mine is not None else "")
        elif mine is None:
            why = "changed, not read again, no write of this process kept"
        else:
            why = "changed, not read again, this process's write not newer than the copy"
        reasons[why] = reasons.get(why, 0) + 1
    return ", ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


class CoordinatorDaemon(DutyRound, SealBatches, SpreadBack, AbsentGroups):
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
        pinger: Pinger | None = None,
        away_grace_s: float = GRACE_S,
        watch_store: ZkStore | None = None,
    ) -> None:
        """``interval_s``: the longest wait between two rounds (a round is sooner when a watch
        fires) and how often head masters are probed; ``sweep_interval_s``: see the module doc;
        ``requests_first``: shared with this process's coordinator service, whose urgent
        requests an idle queue's round or seal waits for (``coordinator/pacing.py``);
        ``per_queue_series``: how many queues get per-queue series on /metrics (None: all;
        ``coordinator/metrics.py`` ``top_queues``); ``pinger``: the Health probe of an absent
        group's processes and ``away_grace_s`` how long an idle queue's head waits for its
        absent group (``coordinator/away.py``; without a pinger the grace alone decides);
        ``watch_store``: the session the view's reads and watches go on (None: ``store``'s).

        Why the view's watches on a session of their own (issue 43): they are a data watch on
        each queue's settings and state, ~200,000 at 10^5 queues; when a connection drops,
        kazoo hands each of its watches an event, one by one, in the connection's thread,
        before it reconnects (307 ms for 33,334, scale43k), so on ``store``'s session, the one
        that holds this daemon's leadership, a blip could cost the leadership. That session
        may read behind ``store``'s writes (another ZooKeeper server): the view takes this
        process's own later writes (``known_state``), and a plan on a stale copy loses a CAS."""
        self.store = store
        self.watch_store = watch_store if watch_store is not None else store
        self.sealer = sealer
        self.prober = prober
        self.batch_sealer = batch_sealer
        self.rebalance_moves_per_s = rebalance_moves_per_s  # 0: heads are spread only by ``rebalance``
        self.pinger = pinger
        self.away_policy = AwayPolicy(grace_s=away_grace_s, max_held_s=max(MAX_HELD_S, away_grace_s))
        self._away = AwayTracker(self.away_policy)  # absent groups of this term (issue 43)
        self._verdicts: dict[str, Verdict] = {}  # away gid -> its verdict at the last round
        self._addresses: dict[tuple[str, str], str] = {}  # (gid, role) -> the address it last registered
        self._dead_unread: set[str] = set()  # judged dead: their queues the copy lacks are read next
        self._prober: GroupProber | None = None
        self._live_since: dict[str, float] = {}  # gid -> when this term first saw both its processes live
        self._next_spread = 0.0
        self._spread_waited = False
        self._spread_unread = False
        self._spread_even_at: tuple[int, int, frozenset[str]] | None = None
        self._spread_told: tuple[float, int, int] | None = None
        self.interval_s = interval_s
        self.sweep_interval_s = sweep_interval_s
        self.identifier = identifier
        self.requests_first = requests_first
        self.view: DaemonView | None = None  # this leadership term's copies (made by the first round)
        self._open: dict[str, tuple[int, OpenSegment]] = {}  # queue -> (seg, what its master said)
        self._written: dict[str, float] = {}  # queue -> when a probe last saw its open segment grow
        self._next_probe = 0.0
        self._lock = threading.Lock()  # the stats, when queues are planned in parallel
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._seal_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._sealing_now: set[tuple[str, int]] = set()
        # seals waiting for a worker, written queues' first: (0 written / 1 idle, order, job)
        self._seals: list[tuple[int, int, Callable[[], None]]] = []
        self._seal_order = itertools.count()
        # idle queues' seals waiting for a batch (``batch_sealer``): gid -> queue -> (seg, state, version)
        self._seal_batches: dict[str, dict[tuple[str, int], tuple[sm.QueueState, StateVersion]]] = {}
        self._seal_batch_jobs: dict[str, int] = {}  # gid -> its batch jobs queued or running
        # batches no replica answered, tried again later (daemon_seals ``_defer_batch``): gid ->
        # (queue, seg) -> (state, version); the group's wait now; its pending timer
        self._seal_deferred: dict[str, dict[tuple[str, int], tuple[sm.QueueState, StateVersion]]] = {}
        self._seal_retry_s: dict[str, float] = {}
        self._seal_retry_timers: dict[str, threading.Timer] = {}
        self._moving = 0  # a dead group's heads being moved: idle seal batches wait (daemon_seals)
        self._list_seen = -1
        self._tidy: list[tuple[str, StateVersion, sm.QueueState, Kind]] | None = None
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
        install_long_collection_log()  # the leader holds a copy of every queue: say a long collection
        self._new_term()
        self.store.written.leading(True)  # the queues this process creates: their first state kept
        try:
            # a pass over every queue's copy must not end in a full collection (daemon_gc.py)
            with young_collections_spaced():
                while not self._stop.is_set() and not self._session_lost.is_set():
                    self._wake.clear()  # before the round: a watch firing during it wakes the next
                    self.round()
                    self._wake.wait(self._until_next())
        finally:
            self.stats.is_leader = False
            self.store.written.leading(False)
            if self.view is not None:
                self.view.close()
            self.view = None

    def _new_term(self) -> DaemonView:
        """Fresh copies for a leadership term: everything is read (and watched) in its first round."""
        if self.view is not None:
            self.view.close()
        self.view = DaemonView(self.watch_store, self._wake.set, written=self.store.written)
        self._open = {}
        self._written = {}
        self._next_probe = 0.0
        self._live_since = {}
        self._next_spread = time.monotonic() + REBALANCE_GRACE_S
        self._spread_even_at = None  # (the counters are the new view's)
        with self._lock:
            self._away = AwayTracker(self.away_policy)
            self._verdicts = {}
            self._dead_unread = set()
        self._addresses = {}
        return self.view

    def _until_next(self) -> float:
        """Seconds to the next timer (a due duty, the probe, an away group's verdict), at most
        ``interval_s``. The sweep has no timer: a share of it is taken each round, and a round
        comes at least every ``interval_s``. (A sweep time here, never moved on once the sweep
        went to shares, spun the leader at ~18,600 rounds a second from 5 min after its election;
        the probe's time, never moved on without a prober, spun a daemon without one at once.)"""
        now = time.monotonic()
        due = self.view.next_due() if self.view is not None else None
        with self._lock:
            judged = self._away.next_change(now)
        probe = self._next_probe if self.prober is not None else None  # never moved on without a prober
        nearest = min(x for x in (due, probe, judged, now + self.interval_s) if x is not None)
        return max(0.0, min(self.interval_s, nearest - now))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._cancel_seal_retries()
        for executor in (self._executor, self._seal_executor):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        if self._prober is not None:
            self._prober.close()

    # -- what the admin API reads of this daemon's copies -----------------------------------

    def known_queues(self, queues: Iterable[str]) -> dict[str, tuple[sm.QueueState, StateVersion, list[str] | None]]:
        """Of ``queues``, those this daemon's copies hold (it leads and has read them): state,
        its version and the subscriptions' names when it keeps their cursors (else None). Kept
        current by watches (``DaemonView``), so ``queue list`` of 10^5 queues reads no
        ZooKeeper node for them (issue 43). Nothing when not leading."""
        view = self.view
        if view is None or not self.stats.is_leader:
            return {}
        out: dict[str, tuple[sm.QueueState, StateVersion, list[str] | None]] = {}
        entries = view.entries
        written = self.store.written
        mine = written.snapshot()
        lacked: list[str] = []
        for q in queues:
            entry = entries.get(q)
            known = None if entry is None else known_state(entry, mine.get(q))
            if entry is None or known is None:
                lacked.append(q)  # not read yet, or changed and not read again: the caller reads it
                continue
            cursors = entry.cursors if SUBS not in entry.stale else None
            out[q] = (*known, sorted(cursors) if cursors is not None else None)
        if len(lacked) >= LACKED_LOGGED:
            log.info("the copy lacks %d of the %d queues asked: %s", len(lacked), len(out) + len(lacked),
                     why_lacked(entries, written, lacked))
        return out

    # -- metrics ----------------------------------------------------------------------------

    def serve_metrics(self, listen: str, pages: Mapping[str, Page] | None = None) -> MetricsServer:
        """Serve this daemon's metrics (``ordq.coordinator.metrics``) at ``listen`` (port 0 ok),
        and ``pages`` beside them (the status page, which ``ordq coordinator run`` builds above
        this package: it reads replicas through the SDK)."""
        own = {"/metrics": self.metrics.page, "/health": self.metrics.health}
        return metrics_serve(self.metrics.registry, listen, pages={**own, **(pages or {})})
