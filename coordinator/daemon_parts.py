"""What the coordinator daemon's parts share: its state (declared here, set by
``CoordinatorDaemon.__init__`` in coordinator/daemon.py), the calls one part makes of another,
and the small helpers every part uses.

The daemon is one object in five modules, each a part of its job (issue 43: daemon.py had
grown past 800 lines): ``daemon`` (leadership, terms, the admin API's reads, metrics),
``daemon_round`` (a duty round: plan and act on each queue that changed, the probe of head
masters, a dead group's heads moved in batches), ``daemon_seals`` (the seal pool and the
batched seals of idle queues), ``daemon_spread`` (heads spread back, ``ordq group rebalance``)
and ``daemon_away`` (when an absent group's idle queues move, coordinator/away.py).

Rules: no part imports another; they call each other through the methods declared here
(import-linter keeps it so: pyproject.toml, "the coordinator daemon's parts").
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping

from ordq.coordinator import state as sm
from ordq.coordinator.away import AwayPolicy, AwayTracker, Verdict
from ordq.coordinator.daemon_view import DaemonView
from ordq.coordinator.duties import Action, Kind, OpenSegment
from ordq.coordinator.group_probe import GroupProber, Pinger
from ordq.coordinator.metrics import CoordinatorMetrics, DaemonStats
from ordq.coordinator.pacing import RequestsFirst
from ordq.coordinator.store import Known, ZkStore
from ordq.coordinator.store_values import LiveInfo, QueueConfig, StateVersion

log = logging.getLogger("ordq.coordinator")

# Seal runner: (queue, seg, known=(state, version) | None, members={role: LiveInfo} | None)
# -> None (``seal.run_seal``); raises OrdqError when no replica answers.
Sealer = Callable[..., None]
# Batched seal runner: (gid, [(queue, seg, state, version)], {role: LiveInfo}) -> queues it left
# to ``Sealer`` (``seal.seal_batch``); raises OrdqError when no replica answers.
BatchSealer = Callable[..., list[str]]
# What a head master says of every open segment it holds: its address -> {(queue, seg): size
# and age}; raises OrdqError when it does not answer.
Prober = Callable[[str], Mapping[tuple[str, int], OpenSegment]]
# A queue whose round failed (a seal no replica answered, ZooKeeper unavailable) is planned
# again after this; after an unexpected error (a bug, logged each time) after the longer one.
RETRY_S = 1.0
BUG_RETRY_S = 10.0
# A queue whose open segment a probe saw grow within this long is "written": after a head
# master dies its failover and seal come before those of the idle queues it also headed
# (``urgent_first``): a producer or consumer may wait on it; 10,000 idle ones wait on nobody.
WRITTEN_S = 60.0


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


class DaemonParts:
    """The daemon's state and the calls between its parts (see the module doc)."""

    store: ZkStore
    sealer: Sealer | None
    prober: Prober | None
    batch_sealer: BatchSealer | None
    pinger: Pinger | None
    rebalance_moves_per_s: float
    interval_s: float
    sweep_interval_s: float
    identifier: str
    requests_first: RequestsFirst | None
    view: DaemonView | None  # this leadership term's copies (made by the first round)
    stats: DaemonStats
    metrics: CoordinatorMetrics
    _lock: threading.Lock  # the stats and the parts' shared records, when queues are planned in parallel
    _stop: threading.Event
    _wake: threading.Event
    # the duty round (daemon_round)
    _open: dict[str, tuple[int, OpenSegment]]  # queue -> (seg, what its master said)
    _written: dict[str, float]  # queue -> when a probe last saw its open segment grow
    _next_probe: float
    _executor: concurrent.futures.ThreadPoolExecutor | None
    _list_seen: int
    # a round's idle pops and admits, kept for batched writes (None: not collecting): (queue,
    # version planned on, new state, kind)
    _tidy: list[tuple[str, StateVersion, sm.QueueState, Kind]] | None
    # the seals (daemon_seals)
    _seal_executor: concurrent.futures.ThreadPoolExecutor | None
    _sealing_now: set[tuple[str, int]]
    _seals: list[tuple[int, int, Callable[[], None]]]  # (0 written / 1 idle, order, job)
    _seal_order: itertools.count[int]
    # gid -> (queue, seg) -> (state, version)
    _seal_batches: dict[str, dict[tuple[str, int], tuple[sm.QueueState, StateVersion]]]
    _seal_batch_jobs: dict[str, int]  # gid -> its batch jobs queued or running
    # batches no replica answered: gid -> (queue, seg) -> (state, version); its wait; its timer
    _seal_deferred: dict[str, dict[tuple[str, int], tuple[sm.QueueState, StateVersion]]]
    _seal_retry_s: dict[str, float]
    _seal_retry_timers: dict[str, threading.Timer]
    _moving: int  # a dead group's heads being moved (``_move_dead_heads``): idle seal batches wait
    # heads spread back (daemon_spread)
    _live_since: dict[str, float]  # gid -> when this term first saw both its processes live
    _next_spread: float
    _spread_waited: bool  # the last pass waited for seals (logged when it changes)
    _spread_unread: bool  # the last pass waited for a queue's state to be read (logged when it changes)
    # (copy changes, written changes, settled groups) when a pass last found the heads even, or None
    _spread_even_at: tuple[int, int, frozenset[str]] | None
    _spread_told: tuple[float, int, int] | None  # (when, passes, not run) at the last counts' line
    # absent groups (daemon_away)
    away_policy: AwayPolicy
    _away: AwayTracker
    _verdicts: dict[str, Verdict]  # away gid -> its verdict at the last round
    _addresses: dict[tuple[str, str], str]  # (gid, role) -> the address it last registered
    _dead_unread: set[str]  # groups judged dead whose queues the copy lacks are not read yet
    _prober: GroupProber | None

    # -- pacing (every part) -------------------------------------------------------------------

    def _idle_waits_turn(self, queue: str) -> None:
        """An idle queue's job (not ``is_written``) starts once the service's urgent requests
        in flight are answered (``coordinator/pacing.py``); a written one at once."""
        if not is_written(queue, self._written, time.monotonic()):
            self._wait_turn()

    def _wait_turn(self) -> None:
        """Wait while this process's service answers an urgent request (bounded; pacing.py)."""
        if self.requests_first is not None:
            self.requests_first.wait_turn()

    # -- what one part asks of another ---------------------------------------------------------

    def _new_term(self) -> DaemonView:
        """Fresh copies for a leadership term (daemon)."""
        raise NotImplementedError

    def _do(self, queue: str, action: Action, cfg: QueueConfig, known: Known | None = None,
            seal_known: tuple[tuple[sm.QueueState, StateVersion] | None, Mapping[str, LiveInfo] | None] = (None, None),
            ) -> None:
        """Carry out one planned action (daemon_round)."""
        raise NotImplementedError

    def _seal_later(self, queue: str, action: Action, known: tuple[sm.QueueState, StateVersion] | None = None) -> None:
        """Queue a seal on the seal pool (daemon_seals)."""
        raise NotImplementedError

    def _start_seal_batches(self) -> None:
        """Start the batch jobs of the idle seals that waited for a dead group's moves (daemon_seals)."""
        raise NotImplementedError

    def _cancel_seal_retries(self) -> None:
        """Stopping: no deferred seal batch is tried again (daemon_seals)."""
        raise NotImplementedError

    def _spread_pass(self, view: DaemonView, now: float) -> None:
        """The round's pass of heads spread back (daemon_spread)."""
        raise NotImplementedError

    def _judge_groups(self, view: DaemonView, queues: list[str], now: float) -> list[str]:
        """Judge the absent groups; the queues to plan this round (daemon_away)."""
        raise NotImplementedError

    def _may_move(self, queue: str, gid: str, busy: bool) -> bool:
        """Whether ``queue``'s head moves off absent ``gid`` now (daemon_away)."""
        raise NotImplementedError

    def _unread_of_dead(self, view: DaemonView) -> list[str]:
        """The queues of groups just judged dead that the copy lacked, read now (daemon_away)."""
        raise NotImplementedError
