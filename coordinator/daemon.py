"""The coordinator daemon: HA (one elected among several), never needed for correctness.

Guarantee: every change it makes is a conditional transition through ``ZkStore.apply`` (or a
Seal run, which ends in one), planned by the pure ``ordq.coordinator.duties.plan``; a daemon that
lost leadership or acted on a stale view only loses a CAS. Producers and consumers fail over,
seal and pop on their own; the daemon makes it faster (it reacts to a liveness node vanishing
within one watch event) and keeps lists tidy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.recipe.election import Election

from ordq.common.errors import CorruptState, IllegalTransition, OrdqError
from ordq.common.metrics import MetricsServer, Page
from ordq.common.metrics import serve as metrics_serve
from ordq.coordinator import state as sm
from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, plan
from ordq.coordinator.metrics import CoordinatorMetrics, DaemonStats
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import QueueConfig, roll_transition

log = logging.getLogger("ordq.coordinator")
# Transient ZooKeeper errors of the election itself: contend again (after this pause) rather
# than let the election thread end.
ELECTION_RETRY_S = 0.5
_ELECTION_TRANSIENT = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError,
                       ConnectionClosedError)

# Seal runner: (queue, seg) -> None; raises OrdqError when no replica answers.
Sealer = Callable[[str, int], None]
# What the head master says of the open segment: (queue, gid, seg) -> its size and age;
# raises OrdqError when it does not answer.
Prober = Callable[[str, str, int], OpenSegment]


class CoordinatorDaemon:
    """Run ``run()`` in a thread or process; ``stop()`` ends it."""

    def __init__(
        self,
        store: ZkStore,
        *,
        sealer: Sealer | None = None,
        prober: Prober | None = None,
        interval_s: float = 0.5,
        identifier: str = "",
    ) -> None:
        self.store = store
        self.sealer = sealer
        self.prober = prober
        self.interval_s = interval_s
        self.identifier = identifier
        self.stats = DaemonStats()
        self.metrics = CoordinatorMetrics(self.stats)
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
        self.stats.is_leader = True
        log.info("coordinator %s elected", self.identifier)
        try:
            while not self._stop.is_set() and not self._session_lost.is_set():
                self.round()
                self._wake.wait(self.interval_s)
                self._wake.clear()
        finally:
            self.stats.is_leader = False

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _watch_liveness(self, gids: list[str]) -> None:
        """Wake the loop as soon as any group's liveness changes (a process died)."""
        for gid in gids:
            try:
                self.store.client.get_children(self.store.paths.live(gid), watch=lambda _e: self._wake.set())
            except Exception:  # noqa: BLE001 - a missing group is planned around next round
                log.debug("cannot watch liveness of %s", gid)

    # -- one round --------------------------------------------------------------------------

    def round(self) -> None:
        self.stats.rounds += 1
        try:
            queues = self.store.list_queues()
            self._watch_liveness(self.store.list_groups())
        except OrdqError:
            self.stats.errors += 1
            return
        for queue in queues:
            # Why: whatever one queue does (corrupt state, a bug), every other queue is served.
            try:
                self._queue_round(queue)
                self.stats.corrupt.pop(queue, None)  # restored
            except CorruptState as exc:
                self.stats.errors += 1
                self.stats.corrupt_seen += 1
                if self.stats.corrupt.get(queue) != exc.detail:
                    log.error("queue %s: %s", queue, exc)  # once per distinct problem, not per round
                self.stats.corrupt[queue] = exc.detail
            except OrdqError as exc:
                self.stats.errors += 1
                log.warning("queue %s: %s", queue, exc)
            except Exception:  # noqa: BLE001 - a bug in one queue's round must not end the leadership
                self.stats.errors += 1
                self.stats.unexpected += 1
                log.exception("queue %s: unexpected error in the duty round", queue)
        for gone in set(self.stats.corrupt) - set(queues):
            del self.stats.corrupt[gone]  # deleted queue

    def _queue_round(self, queue: str) -> None:
        st, _ = self.store.load_state(queue)
        facts, _ = self.store.facts(st)
        cfg = self.store.queue_config(queue)
        before = self.stats.queues.get(queue, {}).get("send")
        if before and before[0] != st.head:
            open_seg = st.open_segment
            self.stats.failovers.append({"at_ms": int(time.time() * 1000), "queue": queue, "from": before[0],
                                         "to": st.head, "seg": open_seg.seg if open_seg else None})
        self.stats.queues[queue] = {
            "send": list(st.send),
            "segments": len(st.consume),
            "epoch": st.producer_epoch,
            "live_groups": sorted(facts.live_groups),
            "sealing": sum(1 for c in st.consume if c.status is sm.SegStatus.SEALING),
            # unconsumed segments whose group has not both processes live: consumers may wait there
            "not_live": sum(1 for c in st.consume if c.gid not in facts.live_groups),
        }
        limits = Limits(retention_segments=cfg.retention_segments, retention_time_s=cfg.retention_time_s,
                        retention_bytes=cfg.retention_bytes, segment_bytes=cfg.segment_bytes,
                        segment_age_s=cfg.segment_age_s)
        open_seg = st.open_segment
        open_info = None
        if open_seg is not None and self.prober is not None and open_seg.gid in facts.live_groups:
            try:
                open_info = self.prober(queue, open_seg.gid, open_seg.seg)
            except OrdqError as exc:
                log.debug("queue %s: open segment %d not probed: %s", queue, open_seg.seg, exc)
        for action in plan(st, facts, limits, now_ms=int(time.time() * 1000), open_info=open_info):
            try:
                self._do(queue, action, cfg)
            except IllegalTransition:
                self.stats.conflicts[action.kind.value] = self.stats.conflicts.get(action.kind.value, 0) + 1
                continue  # someone else acted first: re-planned next round
            self.stats.actions[action.kind.value] = self.stats.actions.get(action.kind.value, 0) + 1

    def _do(self, queue: str, action: Action, cfg: QueueConfig) -> None:
        log.info("queue %s: %s %s seg %s", queue, action.kind.value, action.gid, action.seg)
        if action.kind is Kind.FAIL_OVER:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, lambda s, f: sm.fail_over(s, gid, seg, f))
        elif action.kind is Kind.ADMIT:
            assert action.gid is not None
            gid = action.gid
            self.store.apply(queue, lambda s, f: sm.admit(s, gid, f))
        elif action.kind is Kind.POP:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, later_stored=later))
        elif action.kind is Kind.ROLL:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, roll_transition(cfg, gid, seg))
            self._wake.set()  # seal the rolled segment in the next round, not an interval later
        elif action.kind is Kind.RETAIN:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, retention=True, later_stored=later))
        elif action.kind is Kind.SEAL and self.sealer is not None:
            assert action.seg is not None
            started, outcome = time.monotonic(), "failed"
            try:
                self.sealer(queue, action.seg)
                outcome = "sealed"
            finally:
                self.metrics.seal_seconds.labels(outcome=outcome).observe(time.monotonic() - started)

    # -- metrics ----------------------------------------------------------------------------

    def serve_metrics(self, listen: str, pages: Mapping[str, Page] | None = None) -> MetricsServer:
        """Serve this daemon's metrics (``ordq.coordinator.metrics``) at ``listen`` (port 0 ok),
        and ``pages`` beside them (the status page, which ``ordq coordinator run`` builds above
        this package: it reads replicas through the SDK)."""
        return metrics_serve(self.metrics.registry, listen, pages=pages)
