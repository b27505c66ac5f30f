"""A broker's Prometheus series: counters read from ``BrokerStats`` at scrape time, gauges of
its segments, replication and disk computed at scrape time, the fsync latency observed once
per group commit.

Rules: nothing here runs per message or per batch on the produce and fetch paths (those only
bump plain integers in ``BrokerStats``); a scrape takes the broker lock once, briefly, to
copy what it shows, and never waits on I/O under it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, GCCollector, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ordq.broker_group.budget import MemoryBudget
from ordq.broker_group.loop_lag import EVERY_S as LAG_EVERY_S
from ordq.broker_group.loop_lag import LAG_BUCKETS
from ordq.broker_group.request_time import RequestTime
from ordq.broker_group.shared import BrokerStats, Shared
from ordq.common.metrics import one
from ordq.wire import batch as batch_format

# fdatasync of a group commit: ~0.2 ms typical on the development disk, spikes to ~100 ms.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# BrokerStats field -> (series name without _total, help)
_COUNTERS = {
    "batches_in": ("ordq_broker_produce_batches", "Batches stored (master: from producers; slave: replicated)"),
    "messages_in": ("ordq_broker_produce_messages", "Messages stored (master: from producers; slave: replicated)"),
    "bytes_in": ("ordq_broker_produce_bytes", "Batch bytes stored (master: from producers; slave: replicated)"),
    "duplicates": ("ordq_broker_produce_duplicate_batches", "Resent batches acked from what was stored"),
    "acks": ("ordq_broker_acked_batches", "Batches acked to producers (both replicas synced; on a stream that "
             "watches the slave's synced end, this master's sync)"),
    "synced_watches": ("ordq_broker_synced_watches", "Producers' watches of a segment's synced end served (a slave)"),
    "ack_writes": ("ordq_broker_produce_answers", "Produce answers written (each carries the acks one LAC move "
                   "released)"),
    "replication_requests": ("ordq_broker_replication_requests", "Requests written to the slave (batches, LACs)"),
    "replication_answers": ("ordq_broker_replication_answers", "Answers written to the master (one may answer "
                            "every request a group commit synced)"),
    "replication_answered": ("ordq_broker_replication_answered_requests", "Requests with batches the slave "
                             "answered"),
    "fetches": ("ordq_broker_fetch_requests", "Fetch answers served (a Fetch call, or one answer on a Read stream)"),
    "read_link_streams": ("ordq_broker_read_link_streams", "Read streams served on the lean link (each ended by "
                          "its end frame, as a gRPC Read call ends)"),
    "produce_wakeups": ("ordq_broker_produce_wakeups", "Times a produce stream's handler woke to look for acks "
                        "(a LAC move of the segment it owes acks of, its own new batches, another change, or its "
                        "1 s recheck)"),
    "produce_late_acks": ("ordq_broker_produce_late_acks", "Times a produce stream found acks due only at its 1 s "
                          "recheck (a wake-up missed: 0 expected)"),
    "read_wakeups": ("ordq_broker_read_wakeups", "Times a waiting reader woke (a LAC move of its segment, another "
                     "change of the broker's, or its long poll's deadline)"),
    "absent_state_reads": ("ordq_broker_absent_state_reads", "ZooKeeper reads of the state of a segment a reader "
                           "asked for and this replica holds no copy of (one a second at most per segment open "
                           "here and never written)"),
    "token_calls_refused": ("ordq_broker_token_calls_refused", "Calls refused because their token held "
                            "max_calls_per_token calls open on this broker already"),
    "fetch_batches": ("ordq_broker_fetch_batches", "Batches returned to readers"),
    "fetch_messages": ("ordq_broker_fetch_messages", "Messages in the batches returned to readers"),
    "fetch_bytes": ("ordq_broker_fetch_bytes", "Batch bytes returned to readers"),
    "syncs": ("ordq_broker_syncs", "Group commits (one write and fdatasync each)"),
    "loop_commits": ("ordq_broker_loop_commits", "Group commits made on the event loop (a lone small request: no "
                     "hand-off to a sync thread)"),
    "slow_syncs": ("ordq_broker_slow_syncs", "Group commits that took 20 ms or more (the next lone requests "
                   "are committed on a thread for 1 s, not on the loop)"),
    "replication_breaks": ("ordq_broker_replication_breaks", "Times the master's stream to its slave broke"),
    "replication_link_fallbacks": ("ordq_broker_replication_link_fallbacks", "Times the slave's lean link could "
                                   "not be opened and the master replicated over gRPC instead"),
    "torn_bytes_truncated": ("ordq_broker_torn_bytes_truncated", "Bytes of torn log tails cut at start"),
    "reconciled": ("ordq_broker_reconciled_segments", "Segments reconciled with the peer"),
    "corrupt_reads": ("ordq_broker_corrupt_reads", "Sealed copies a read found corrupt (CRC), set aside and "
                      "repaired from the peer"),
    "session_confirmed": ("ordq_broker_session_confirmed_writes", "Produce requests that found ZooKeeper silent "
                          "past a third of the session (or its quorum unheard for half of it) and were taken once "
                          "kazoo resumed the same session (or the quorum answered)"),
    "seal_many_calls": ("ordq_broker_seal_many_calls", "SealMany calls answered (a dead group's seals in batches)"),
    "seal_many_segments": ("ordq_broker_seal_many_segments", "Segments sealed by SealMany calls"),
    "seal_many_syncs": ("ordq_broker_seal_many_syncs", "File system syncs that made SealMany calls' files "
                        "durable (two a call with syncfs)"),
}


def count_fetch(stats: BrokerStats, batches: list[bytes], end_offset: int, batch_bytes: int) -> None:
    """Count one fetch's answer: its batches, their bytes, and its messages from the first
    batch's header (no CRC: the log checked it) to ``end_offset`` (after the last batch)."""
    if not batches:
        return
    stats.fetch_batches += len(batches)
    stats.fetch_messages += end_offset - batch_format.parse_header(batches[0], verify_crc=False).first_offset
    stats.fetch_bytes += batch_bytes


class BrokerMetrics(Collector):
    """The broker's registry (``registry``) and the histogram its sync path observes."""

    def __init__(self, shared: Shared, budget: MemoryBudget, request_time: RequestTime,
                 link: Callable[[], Any]) -> None:
        """``link()``: the master's replication link, None before it starts and on a slave."""
        self.shared = shared
        self.budget = budget
        self.request_time = request_time
        self.link = link
        self.registry = CollectorRegistry(auto_describe=True)
        cfg = shared.config
        self._labels = {"group": cfg.gid, "role": cfg.role.value}
        self.fsync_seconds = Histogram("ordq_broker_fsync_seconds", "Write+fdatasync of one group commit",
                                       list(self._labels), buckets=FSYNC_BUCKETS,
                                       registry=self.registry).labels(**self._labels)
        self.loop_lag_seconds = Histogram("ordq_broker_loop_lag_seconds", "How late the event loop ran a callback "
                                          f"due every {LAG_EVERY_S * 1000:g} ms (loop_lag.py)", list(self._labels),
                                          buckets=LAG_BUCKETS, registry=self.registry).labels(**self._labels)
        # The process's garbage collections by generation (prometheus_client's, read at scrape):
        # a full one holds the loop for its length (the noisy-neighbour drill counts them per window).
        GCCollector(registry=self.registry)
        self.registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected only at scrape time

    def collect(self) -> Iterator[Metric]:
        b = self.shared
        names, values = list(self._labels), list(self._labels.values())
        with b.cv:
            stats = attrs.asdict(b.stats)
            per_queue: dict[str, list[int]] = {}  # queue -> [open segments, segments, bytes]
            corrupt = 0
            for (queue, _seg), s in b.segments.items():
                row = per_queue.setdefault(queue, [0, 0, 0])
                row[0] += int(not s.replica.sealed)
                row[1] += 1
                row[2] += s.log.synced_bytes if s.log is not None else 0
                corrupt += s.corrupt is not None
            link = self.link()
            connected = bool(link is not None and link.connected)
            lag_bytes, lag_s = link.lag(time.monotonic()) if link is not None else (0, 0.0)
        lb = self._labels
        for field, (name, doc) in _COUNTERS.items():
            yield one("counter", name, doc, lb, stats.get(field, 0))
        refused = CounterMetricFamily("ordq_broker_refused_requests", "Requests refused, by reason (error kind)",
                                      labels=[*names, "reason"])
        for reason, n in sorted(stats["refused"].items()):
            refused.add_metric([*values, reason], n)
        yield refused
        yield one("gauge", "ordq_broker_corrupt_segments", "Segments not served: corrupt log", lb, corrupt)
        budget = self.budget.stats  # plain integers the loop updates; a scrape reads a moment's view
        yield one("gauge", "ordq_broker_budget_used_bytes", "Bytes held for clients now (memory budget)", lb,
                  budget.used_bytes)
        yield one("gauge", "ordq_broker_budget_peak_bytes", "Most bytes held for clients at once since start", lb,
                  budget.peak_bytes)
        yield one("counter", "ordq_broker_budget_waits", "Calls that waited for room in the memory budget", lb,
                  budget.waited)
        yield one("counter", "ordq_broker_budget_refused", "Calls refused for lack of room (ResourceExhausted)", lb,
                  budget.refused)
        yield one("counter", "ordq_broker_budget_shortened", "Fetch/Read answers made shorter for lack of room", lb,
                  budget.shortened)
        yield one("counter", "ordq_broker_read_idle_closed", "Read streams closed: the reader took nothing for "
                  "idle_ms", lb, budget.idle_closed)
        yield one("counter", "ordq_broker_read_paced", "Fetch/Read answers that waited for their token's read "
                  "rate (--read-rate)", lb, budget.paced)
        yield one("counter", "ordq_broker_read_paced_seconds", "Time answers waited for their token's read rate",
                  lb, budget.paced_ms / 1000.0)
        rt = self.request_time.stats  # each token's share of the loop (request_time.py)
        yield one("counter", "ordq_broker_request_time_charged_seconds", "Loop time charged to tokens' calls "
                  "(--request-share)", lb, rt.charged_ms / 1000.0)
        yield one("counter", "ordq_broker_request_time_charges", "Times a token was charged loop time (a "
                  "call's steps, bytes, a worker's read)", lb, rt.charges)
        yield one("counter", "ordq_broker_request_time_throttled", "Calls and stream steps held for their token's "
                  "request-time share", lb, rt.throttled)
        yield one("counter", "ordq_broker_request_time_throttled_seconds", "Time calls and stream steps were held "
                  "for their token's request-time share", lb, rt.throttled_ms / 1000.0)
        yield one("counter", "ordq_broker_request_time_refused", "Calls refused at once: their token's wait for "
                  "its request-time share would pass max_delay_ms (ResourceExhausted)", lb, rt.refused)
        if link is not None:  # the master: its stream to the slave
            yield one("gauge", "ordq_broker_replication_connected", "1 while the slave stream is up", lb,
                      int(connected))
            yield one("gauge", "ordq_broker_replication_lag_bytes", "Bytes forwarded to the slave, not yet synced "
                      "there", lb, lag_bytes)
            yield one("gauge", "ordq_broker_replication_lag_seconds", "Age of the oldest batch the slave has not "
                      "synced yet", lb, lag_s)
        gauges = {
            "ordq_broker_open_segments": ("Segments of the queue not sealed on this replica", 0),
            "ordq_broker_segments": ("Segments of the queue held by this replica", 1),
            "ordq_broker_segment_bytes": ("Synced bytes of the queue's segments held by this replica", 2),
        }
        for name, (doc, column) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=[*names, "queue"])
            for queue, row in sorted(per_queue.items()):
                family.add_metric([*values, queue], row[column])
            yield family
        try:
            disk = shutil.disk_usage(b.config.data_dir)
        except OSError:
            return
        yield one("gauge", "ordq_broker_disk_free_bytes", "Free bytes on the data folder's disk", lb, disk.free)
        yield one("gauge", "ordq_broker_disk_size_bytes", "Size of the data folder's disk", lb, disk.total)

