"""The coordinator daemon's Prometheus series, read from its ``DaemonStats`` at scrape time.

Rules: this module only describes and exposes what the daemon counted; it never changes the
daemon's state and never talks to ZooKeeper (a scrape must not cost a ZooKeeper read).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from typing import Any

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Seal runs take a few ms (both replicas answer) to a few s (one is down: RPC timeouts).
SEAL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A round with nothing to do takes microseconds; a first load of 10,000 queues some seconds.
ROUND_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 20.0)


@attrs.define
class DaemonStats:
    """What the daemon counted; its metrics and status page read it."""

    rounds: int = 0
    planned: int = 0  # queue plans made (a round plans only what changed or fell due)
    sweeps: int = 0  # safety-net rounds that read every queue again
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
    queues: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    queues_version: int = 0  # bumped by whoever changes ``queues`` (the per-queue series' cache)
    # the last send-list head changes seen (a failover by anyone), newest last: the status page
    failovers: collections.deque[dict[str, Any]] = attrs.field(factory=lambda: collections.deque(maxlen=20))


class CoordinatorMetrics(Collector):
    """The daemon's registry: counters and gauges from its stats, seal durations observed.

    The per-queue gauges (five series per queue) are not in ``registry``: ``page()`` serves
    them after it, rendered again only when ``DaemonStats.queues`` changed. Why (issue 29): at
    10,000 queues they are 50,000 series (2.4 MiB), ~0.45 s of CPU to collect and format at
    every scrape — the one idle cost of the coordinator that grew with the queue count."""

    def __init__(self, stats: DaemonStats) -> None:
        self.stats = stats
        self._per_queue_lock = threading.Lock()
        self._per_queue: tuple[tuple[int, bool], bytes] | None = None
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
        yield CounterMetricFamily("ordq_coordinator_sweeps", "Safety-net rounds that read every queue again",
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

    def page(self) -> tuple[str, bytes]:
        """The /metrics page: ``registry`` (with whatever else registered there, such as the
        coordinator service's series), then the per-queue series (cached: see the class doc)."""
        return CONTENT_TYPE_LATEST, generate_latest(self.registry) + self.per_queue_text()

    def per_queue_text(self) -> bytes:
        st = self.stats
        key = (st.queues_version, st.is_leader)
        with self._per_queue_lock:  # one render at a time; a scrape meanwhile waits for it
            if self._per_queue is None or self._per_queue[0] != key:
                self._per_queue = (key, generate_latest(_PerQueue(st)))
            return self._per_queue[1]


class _PerQueue:
    """The per-queue gauges of ``DaemonStats.queues`` (a collector for one render)."""

    def __init__(self, stats: DaemonStats) -> None:
        self.stats = stats

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
        queues = sorted(st.queues.items()) if st.is_leader else []  # a standby's view is stale
        for name, (doc, key) in per_queue.items():
            family = GaugeMetricFamily(f"ordq_queue_{name}", doc, labels=["queue"])
            for q, d in queues:
                v = d.get(key, 0)
                family.add_metric([q], len(v) if isinstance(v, list) else float(v))
            yield family
