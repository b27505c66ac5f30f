"""Opt-in Prometheus series of a producer or a consumer (``metrics_listen`` /
``metrics_registry`` in their configs).

Rules: the SDK's hot paths pay nothing per message for this. Counters the clients keep anyway
(``statistics()``) and gauges of their state are read at scrape time by a collector; the
send→ack latency is observed once per acked batch (for its oldest message, i.e. the batch's
worst case), and a consumer notes one position and one timestamp per read round.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ordq.common.metrics import MetricsServer, one, serve
from ordq.coordinator.state import SegStatus

if TYPE_CHECKING:
    from ordq.sdk._producer_core import PendingBatch
    from ordq.sdk.consumer import Consumer
    from ordq.sdk.producer import Producer

# send() to ack: a few ms on a quiet loopback cluster, up to seconds through a failover.
ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ProducerMetrics(Collector):
    """A producer's series, labelled with its queue."""

    def __init__(self, producer: Producer) -> None:
        cfg = producer.config
        self.producer = producer
        self.registry = cfg.metrics_registry if cfg.metrics_registry is not None else CollectorRegistry()
        self._labels = {"queue": cfg.queue}
        self._histogram = Histogram(
            "ordq_producer_send_ack_seconds", "From send() of a batch's first message to its ack (both replicas)",
            list(self._labels), buckets=ACK_BUCKETS, registry=self.registry)
        self.send_ack_seconds = self._histogram.labels(**self._labels)
        self.registry.register(self)
        self.server: MetricsServer | None = serve(self.registry, cfg.metrics_listen) if cfg.metrics_listen else None

    def acked(self, batches: list[PendingBatch]) -> None:
        """Observe the send→ack latency of each acked batch (one observation per batch)."""
        now_us = time.time_ns() // 1000
        for b in batches:
            self.send_ack_seconds.observe(max(now_us - b.messages[0].timestamp_us, 0) / 1e6)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.registry.unregister(self._histogram)
        self.registry.unregister(self)

    def describe(self) -> Iterator[Metric]:
        # The names, so a registry refuses a second client of the same kind (ValueError at
        # start) instead of exposing its series twice.
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        p = self.producer
        st = p.statistics()
        core = p._core
        labels = self._labels
        yield one("counter", "ordq_producer_sent_messages", "Messages given to send()", labels, st.sent)
        yield one("counter", "ordq_producer_acked_messages", "Messages acked (stored on both replicas)", labels,
                  st.acked)
        yield one("counter", "ordq_producer_acked_batches", "Batches acked", labels, st.batches_acked)
        yield one("counter", "ordq_producer_failovers", "Failovers to a new segment after a failed head", labels,
                  st.failovers)
        yield one("gauge", "ordq_producer_inflight_bytes",
                  "Bytes sent and not acked yet (send() blocks at max_inflight_bytes)", labels,
                  core.inflight_bytes if core is not None else 0)
        yield one("gauge", "ordq_producer_epoch", "The producer epoch this leader writes with", labels, st.epoch)


class ConsumerMetrics(Collector):
    """A consumer's series, labelled with its queue and subscription."""

    def __init__(self, consumer: Consumer) -> None:
        cfg = consumer.config
        self.consumer = consumer
        self.registry = cfg.metrics_registry if cfg.metrics_registry is not None else CollectorRegistry()
        self._labels = {"queue": cfg.queue, "subscription": cfg.subscription}
        self.registry.register(self)
        self.server: MetricsServer | None = serve(self.registry, cfg.metrics_listen) if cfg.metrics_listen else None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.registry.unregister(self)

    def describe(self) -> Iterator[Metric]:
        # The names, so a registry refuses a second client of the same kind (ValueError at
        # start) instead of exposing its series twice.
        return self.collect()

    def lag(self) -> int:
        """Messages stored and not yet handed out: what is read and not handed out, what is
        readable in the current segment past the read position, and the messages of the
        sealed segments after it (a later segment still open or sealing counts 0 here)."""
        c = self.consumer
        cur = c._cursor
        lag = len(c._buffer)
        seg, end = c._read_end
        if seg == cur.seg:
            lag += max(end - cur.offset, 0)
        st = c._view.cached() if c._view is not None else None
        if st is not None:
            lag += sum(x.end or 0 for x in st.consume if x.seg > cur.seg and x.status is SegStatus.SEALED)
        return lag

    def collect(self) -> Iterator[Metric]:
        c = self.consumer
        st = c.statistics()
        for name, doc, v in (
            ("ordq_consumer_delivered_messages", "Messages handed to the application", st.delivered),
            ("ordq_consumer_duplicates_dropped", "Resent copies dropped by seq (after a producer failover)",
             st.duplicates_dropped),
            ("ordq_consumer_redeliveries", "Handler attempts repeated by run() after a failure (policy block)",
             st.redeliveries),
            ("ordq_consumer_gaps", "Missing seqs detected (delivery stopped with GapDetected)", st.gaps),
            ("ordq_consumer_parked_messages", "Messages run() moved to the parking queue", st.parked),
            ("ordq_consumer_commits", "Cursor commits", st.commits),
        ):
            yield one("counter", name, doc, self._labels, v)
        now = time.monotonic()
        lag = self.lag()
        ts_us = c._read_ts_us
        blocked = c.blocked
        stalled = c._stalled_since
        buffered = c._buffer
        try:  # the buffer holds the next seqs, contiguous: what was handed out ends before it
            handed = buffered[0].seq - 1 if buffered else st.last_seq
        except IndexError:  # emptied meanwhile by the consumer's thread
            handed = st.last_seq
        for name, doc, value in (
            ("ordq_consumer_lag_messages", "Messages stored and not yet handed to the application", lag),
            ("ordq_consumer_lag_seconds", "Age of the newest message read, while messages wait (else 0)",
             max(time.time() - ts_us / 1e6, 0.0) if lag and ts_us else 0.0),
            ("ordq_consumer_last_seq", "The last seq handed to the application", handed),
            ("ordq_consumer_blocked", "1 while run() retries a message past its failure policy's attempts",
             int(c.alarmed)),
            ("ordq_consumer_blocked_attempts", "Failed attempts of the message run() is retrying (0: none)",
             blocked.attempts if blocked is not None else 0),
            ("ordq_consumer_stalled_seconds", "Seconds no replica of the current segment's group has answered",
             now - stalled if stalled is not None else 0.0),
        ):
            yield one("gauge", name, doc, self._labels, value)
