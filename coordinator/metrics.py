"""The coordinator daemon's Prometheus series, read from its ``DaemonStats`` at scrape time.

Rules: this module only describes and exposes what the daemon counted; it never changes the
daemon's state and never talks to ZooKeeper (a scrape must not cost a ZooKeeper read).
"""

from __future__ import annotations

import collections
import heapq
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ordq.common.version import VERSION

# Seal runs take a few ms (both replicas answer) to a few s (one is down: RPC timeouts).
SEAL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A round with nothing to do takes microseconds; a first load of 10,000 queues some seconds.
ROUND_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 20.0)
# Queues with per-queue series on /metrics (issue 43): at most this many, the ones that need
# looking at first (``top_queues``). Every queue's figures stay in ``ordq top`` and the status
# page (the Admin API); the counts over all queues are unlabelled series.
DEFAULT_PER_QUEUE_SERIES = 100


def _trouble(d: Mapping[str, Any]) -> bool:
    return bool(d.get("not_live") or d.get("sealing"))


def top_queues(queues: Mapping[str, Mapping[str, Any]], written: Mapping[str, float], n: int | None, *,
               trouble: Iterable[str] | None = None, first: Callable[[int], list[str]] | None = None) -> list[str]:
    """The ``n`` queues (all when None) whose per-queue series are exported, in name order:
    first those with segments on a group not fully live or waiting for a seal, then the most
    recently written (``written``: queue -> when a probe last saw it grow), then by name.
    ``trouble``: the troubled queues when the caller keeps them (else a pass over ``queues``);
    ``first(k)``: the first ``k`` names in name order when the caller caches them."""
    if n is None or n >= len(queues):
        return sorted(queues)
    if n <= 0:
        return []
    # Trouble and written queues are few: rank those; fill up with the first names (no sort of
    # every queue at every scrape).
    bad = [q for q, d in queues.items() if _trouble(d)] if trouble is None else [q for q in trouble if q in queues]
    hot = [q for q in written if q in queues]

    def rank(q: str) -> tuple[bool, float, str]:
        return (not _trouble(queues[q]), -written.get(q, float("-inf")), q)

    chosen = heapq.nsmallest(n, set(bad) | set(hot), key=rank)
    if len(chosen) < n:
        taken = set(chosen)
        names = first(n + len(taken)) if first is not None else heapq.nsmallest(n + len(taken), queues)
        chosen += [q for q in names if q not in taken][:n - len(chosen)]
    return sorted(chosen)


@attrs.define
class DaemonStats:
    """What the daemon counted; its metrics and status page read it."""

    rounds: int = 0
    planned: int = 0  # queue plans made (a round plans only what changed or fell due)
    sweeps: int = 0  # safety-net passes that read every queue again (a share each round)
    zk_reads: int = 0  # ZooKeeper reads the daemon's view sent (not counting its writes' own)
    probes: int = 0  # OpenSegments calls to head masters (one per live group and probe)
    actions: dict[str, int] = attrs.field(factory=dict)
    conflicts: dict[str, int] = attrs.field(factory=dict)  # actions someone else did first
    errors: int = 0
    is_leader: bool = False
    term: int = 0  # bumped each time this process starts leading (the service's leases follow it)
    # queues whose state does not parse, with why (CorruptState), and how often it was met
    corrupt: dict[str, str] = attrs.field(factory=dict)
    corrupt_seen: int = 0
    unexpected: int = 0  # queue rounds that raised something not an OrdqError (a bug): logged
    # a dead group's heads moved in batched transactions (coordinator/group_moves.py): the
    # transactions written and the queues they moved (also counted in actions["fail_over"])
    move_batches: int = 0
    batched_moves: int = 0
    # idle queues' seals done in batches (one SealMany per replica, one transaction each)
    seal_batches: int = 0
    batched_seals: int = 0
    # idle queues' heads spread back over the live groups (coordinator/head_spread.py): queues
    # moved, and the transactions that moved them
    spread_moves: int = 0
    spread_batches: int = 0
    # the daemon's spread passes run, and those not run: nothing they read changed since a pass
    # that found the heads even
    spread_passes: int = 0
    spread_skipped: int = 0
    # absent groups (coordinator/away.py): idle queues' moves put off while their group may
    # come back (each queue once per absence), those that kept their head (the group came
    # back), absences that ended within the grace, groups away now, and the probes' answers
    deferred_moves: int = 0
    kept_heads: int = 0
    groups_back: int = 0
    away_groups: int = 0
    held_groups: int = 0  # of those, past the grace but answering the probe: their idle heads stay
    away_probes: dict[str, int] = attrs.field(factory=dict)
    queues: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    queues_version: int = 0  # bumped by whoever changes ``queues`` (the per-queue series' cache)
    # the last send-list head changes seen (a failover by anyone), newest last: the status page
    failovers: collections.deque[dict[str, Any]] = attrs.field(factory=lambda: collections.deque(maxlen=20))
    # the queues of ``queues`` with segments on a group not fully live, and with seals waiting
    # (kept by ``set_queue``/``drop_queue``: a scrape counts them without a pass over every queue)
    not_live: set[str] = attrs.field(factory=set)
    sealing: set[str] = attrs.field(factory=set)

    def set_queue(self, queue: str, seen: dict[str, Any]) -> None:
        """``queues[queue] = seen``, with the sets above and ``queues_version`` kept."""
        self.queues[queue] = seen
        for marks, key in ((self.not_live, "not_live"), (self.sealing, "sealing")):
            if seen.get(key):
                marks.add(queue)
            else:
                marks.discard(queue)
        self.queues_version += 1

    def drop_queue(self, queue: str) -> None:
        self.queues.pop(queue, None)
        self.not_live.discard(queue)
        self.sealing.discard(queue)
        self.queues_version += 1


class CoordinatorMetrics(Collector):
    """The daemon's registry: counters and gauges from its stats, seal durations observed.

    The per-queue gauges (five series per queue) are not in ``registry``: ``page()`` serves
    them after it, rendered again only when ``DaemonStats.queues`` or the queues chosen changed.
    Why (issue 29): at 10,000 queues they are 50,000 series (2.4 MiB), ~0.45 s of CPU to collect
    and format at every scrape. And only for ``per_queue_series`` queues (issue 43: the page
    stays small at 10^5 queues; a health check read it whole): those ``top_queues`` picks."""

    def __init__(self, stats: DaemonStats, *, per_queue_series: int | None = DEFAULT_PER_QUEUE_SERIES,
                 written: Callable[[], Mapping[str, float]] = dict) -> None:
        """``per_queue_series``: how many queues get per-queue series (``top_queues``; None:
        every queue, 0: none). ``written``: queue -> when a probe last saw it written."""
        self.stats = stats
        self.per_queue_series = per_queue_series
        self.written = written
        self._per_queue_lock = threading.Lock()
        self._per_queue: tuple[tuple[int, tuple[str, ...]], bytes] | None = None
        self._first: tuple[int, list[str]] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.seal_seconds = Histogram("ordq_coordinator_seal_seconds", "Seal protocol runs by this daemon",
                                      ["outcome"], buckets=SEAL_BUCKETS, registry=self.registry)
        self.round_seconds = Histogram("ordq_coordinator_round_seconds", "Duty rounds of this daemon, by duration",
                                       buckets=ROUND_BUCKETS, registry=self.registry)
        self.registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected only at scrape time: nothing to check names against up front

    def collect(self) -> Iterator[Metric]:
        st = self.stats
        yield GaugeMetricFamily("ordq_coordinator_leader", "1 while this daemon is the elected one",
                                value=int(st.is_leader))
        yield CounterMetricFamily("ordq_coordinator_rounds", "Duty rounds run", value=st.rounds)
        yield CounterMetricFamily("ordq_coordinator_planned", "Queues planned (changed or due) over all rounds",
                                  value=st.planned)
        yield CounterMetricFamily("ordq_coordinator_sweeps", "Safety-net passes that read every queue again",
                                  value=st.sweeps)
        yield CounterMetricFamily("ordq_coordinator_zk_reads", "ZooKeeper reads sent by the duty rounds",
                                  value=st.zk_reads)
        yield CounterMetricFamily("ordq_coordinator_probes", "OpenSegments calls to head masters",
                                  value=st.probes)
        yield CounterMetricFamily("ordq_coordinator_errors", "Duty rounds or queues that failed (ZooKeeper, RPC)",
                                  value=st.errors)
        yield CounterMetricFamily("ordq_coordinator_corrupt_state",
                                  "Duty rounds that met a queue whose state does not parse (CorruptState)",
                                  value=st.corrupt_seen)
        yield CounterMetricFamily("ordq_coordinator_unexpected_errors",
                                  "Queue duty rounds that raised an unexpected error (a bug; logged)",
                                  value=st.unexpected)
        yield CounterMetricFamily("ordq_coordinator_move_batches",
                                  "Transactions that moved heads off a dead group, several queues each",
                                  value=st.move_batches)
        yield CounterMetricFamily("ordq_coordinator_batched_moves",
                                  "Queues whose head moved off a dead group in a batched transaction",
                                  value=st.batched_moves)
        yield CounterMetricFamily("ordq_coordinator_seal_batches",
                                  "Batches of idle queues' seals (one SealMany per replica, one transaction)",
                                  value=st.seal_batches)
        yield CounterMetricFamily("ordq_coordinator_batched_seals", "Segments sealed in those batches",
                                  value=st.batched_seals)
        yield CounterMetricFamily("ordq_coordinator_spread_moves",
                                  "Idle queues whose head moved to another live group to even the spread",
                                  value=st.spread_moves)
        yield CounterMetricFamily("ordq_coordinator_spread_batches",
                                  "Transactions that moved those heads", value=st.spread_batches)
        yield CounterMetricFamily("ordq_coordinator_deferred_moves",
                                  "Idle queues whose move off an absent group was put off (its processes may "
                                  "be alive: a lost session), each once per absence", value=st.deferred_moves)
        yield CounterMetricFamily("ordq_coordinator_kept_heads",
                                  "Idle queues put off that kept their head: the group came back in time",
                                  value=st.kept_heads)
        yield CounterMetricFamily("ordq_coordinator_groups_back",
                                  "Absences of a group that ended before it was judged dead", value=st.groups_back)
        yield GaugeMetricFamily("ordq_coordinator_away_groups",
                                "Groups not both live in ZooKeeper now, as this daemon judges them",
                                value=st.away_groups)
        yield GaugeMetricFamily("ordq_coordinator_held_groups",
                                "Absent groups past the grace whose processes answer this daemon's probe: their "
                                "idle queues keep their heads", value=st.held_groups)
        probes = CounterMetricFamily("ordq_coordinator_away_probes",
                                     "Health probes of an absent group's processes, by answer", labels=["answer"])
        for answer, n in sorted(st.away_probes.items()):
            probes.add_metric([answer], n)
        yield probes
        corrupt = GaugeMetricFamily("ordq_queue_state_corrupt", "1 for each queue whose state does not parse",
                                    labels=["queue"])
        for q in sorted(st.corrupt):
            corrupt.add_metric([q], 1)
        yield corrupt
        actions = CounterMetricFamily("ordq_coordinator_actions", "Transitions and seals done, by kind",
                                      labels=["kind"])
        for kind, n in sorted(st.actions.items()):
            actions.add_metric([kind], n)
        yield actions
        conflicts = CounterMetricFamily("ordq_coordinator_conflicts",
                                        "Planned transitions someone else made first, by kind", labels=["kind"])
        for kind, n in sorted(st.conflicts.items()):
            conflicts.add_metric([kind], n)
        yield conflicts
        lead = st.is_leader  # a standby's view is stale
        count = len(st.queues) if lead else 0
        yield GaugeMetricFamily("ordq_coordinator_queues", "Queues the elected daemon knows", value=count)
        yield GaugeMetricFamily("ordq_coordinator_queues_not_live",
                                "Queues with consume-list segments on a group not fully live (master and slave)",
                                value=len(st.not_live) if lead else 0)
        yield GaugeMetricFamily("ordq_coordinator_queues_sealing", "Queues with segments waiting for a seal",
                                value=len(st.sealing) if lead else 0)
        shown = count if self.per_queue_series is None else min(count, max(self.per_queue_series, 0))
        yield GaugeMetricFamily("ordq_coordinator_queues_with_series",
                                "Queues with per-queue series on this page (--per-queue-series)", value=shown)

    def _first_names(self, k: int) -> list[str]:
        """The first ``k`` queue names, kept until the queues change."""
        st = self.stats
        cached = self._first
        if cached is None or cached[0] != st.queues_version or len(cached[1]) < k:
            cached = self._first = (st.queues_version, heapq.nsmallest(k, list(st.queues)))
        return cached[1][:k]

    def health(self) -> tuple[str, bytes]:
        """The /health page: a few hundred bytes of JSON whatever the queue count (issue 43: at
        10,000 queues ``ordq up`` read the 2.3 MB /metrics page to learn one flag). Never waits
        for the per-queue render's lock."""
        st = self.stats
        doc = {"leader": st.is_leader, "term": st.term, "rounds": st.rounds, "errors": st.errors,
               "queues": len(st.queues), "unexpected": st.unexpected, "version": VERSION}
        return "application/json", json.dumps(doc).encode()

    def page(self) -> tuple[str, bytes]:
        """The /metrics page: ``registry`` (with whatever else registered there, such as the
        coordinator service's series), then the per-queue series (cached: see the class doc)."""
        return CONTENT_TYPE_LATEST, generate_latest(self.registry) + self.per_queue_text()

    def per_queue_text(self) -> bytes:
        st = self.stats
        with self._per_queue_lock:  # one render at a time; a scrape meanwhile waits for it
            with_series = tuple(top_queues(st.queues, dict(self.written()), self.per_queue_series,
                                           trouble=list(st.not_live | st.sealing), first=self._first_names)) \
                if st.is_leader else ()  # a standby's view is stale
            key = (st.queues_version, with_series)
            if self._per_queue is None or self._per_queue[0] != key:
                self._per_queue = (key, generate_latest(_PerQueue(st, with_series)))
            return self._per_queue[1]


class _PerQueue:
    """The per-queue gauges of ``queues`` in ``DaemonStats.queues`` (a collector for one render)."""

    def __init__(self, stats: DaemonStats, queues: tuple[str, ...]) -> None:
        self.stats = stats
        self.queues = queues

    def collect(self) -> Iterator[Metric]:
        st = self.stats
        # series name -> (help, key in DaemonStats.queues[q]; "send" is a list: its length)
        per_queue = {
            "send_groups": ("Groups in the queue's send list", "send"),
            "segments": ("Segments in the queue's consume list", "segments"),
            "producer_epoch": ("The queue's producer epoch", "epoch"),
            "sealing_segments": ("Segments waiting for the Seal protocol", "sealing"),
            "segments_not_live": ("Consume-list segments whose group is not fully live (master and slave)",
                                  "not_live"),
        }
        for name, (doc, key) in per_queue.items():
            family = GaugeMetricFamily(f"ordq_queue_{name}", doc, labels=["queue"])
            for q in self.queues:
                d = st.queues.get(q)
                if d is None:
                    continue  # deleted meanwhile
                v = d.get(key, 0)
                family.add_metric([q], len(v) if isinstance(v, list) else float(v))
            yield family
