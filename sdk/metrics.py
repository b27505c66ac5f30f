"""Opt-in Prometheus series of a producer or a consumer (``metrics_listen`` /
``metrics_registry`` in their configs).

Rules: the SDK's hot paths pay nothing per message for this. Counters the clients keep anyway
(``statistics()``) and gauges of their state are read at scrape time by a collector; the
send→ack latency is observed once per acked batch (for its oldest message, i.e. the batch's
worst case), and a consumer notes one position and one timestamp per read round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric

from ordq.common.metrics import ServedCollector, one
from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats
from ordq.sdk._producer_types import ProducerConfig, ProducerStats

if TYPE_CHECKING:
    from ordq.sdk._producer_core import PendingBatch

# send() to ack: a few ms on a quiet loopback cluster, up to seconds through a failover.
ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@attrs.frozen
class ProducerSnapshot:
    """What a producer's collector shows, taken by the producer at scrape time."""

    stats: ProducerStats
    inflight_bytes: int  # sent and not acked yet


@attrs.frozen
class ConsumerSnapshot:
    """What a consumer's collector shows, taken by the consumer at scrape time."""

    stats: ConsumerStats
    # Messages stored and not yet handed out: what is read and not handed out, what is
    # readable in the current segment past the read position, and the messages of the sealed
    # segments after it (a later segment still open or sealing counts 0 here).
    lag_messages: int
    read_ts_us: int  # timestamp of the newest message read (0: none yet)
    handed_seq: int  # the last seq handed to the application
    alarmed: bool  # a message blocked past its failure policy's attempts
    blocked_attempts: int  # failed attempts of the message run() is retrying (0: none)
    stalled_since: float | None  # monotonic: since when no replica of the current segment answers
    # Delayed delivery (sdk/delay.py): when the head of the line is due while it is held for its
    # time (0: not held), and the subscription's delay.
    waiting_due_us: int = 0
    delay_ms: int = 0


class ProducerMetrics(ServedCollector):
    """A producer's series, labelled with its queue; ``snapshot`` is called at each scrape."""

    def __init__(self, cfg: ProducerConfig, snapshot: Callable[[], ProducerSnapshot]) -> None:
        self._snapshot = snapshot
        self.registry = cfg.metrics_registry if cfg.metrics_registry is not None else CollectorRegistry()
        self._labels = {"queue": cfg.queue}
        self._histogram = Histogram(
            "ordq_producer_send_ack_seconds", "From send() of a batch's first message to its ack (both replicas)",
            list(self._labels), buckets=ACK_BUCKETS, registry=self.registry)
        self.send_ack_seconds = self._histogram.labels(**self._labels)
        self.register_and_serve(cfg.metrics_listen)

    def acked(self, batches: list[PendingBatch]) -> None:
        """Observe the send→ack latency of each acked batch (one observation per batch)."""
        now_us = time.time_ns() // 1000
        for b in batches:
            self.send_ack_seconds.observe(max(now_us - b.messages[0].timestamp_us, 0) / 1e6)

    def close(self) -> None:
        self.registry.unregister(self._histogram)
        super().close()

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        st = snap.stats
        labels = self._labels
        yield one("counter", "ordq_producer_sent_messages", "Messages given to send()", labels, st.sent)
        yield one("counter", "ordq_producer_acked_messages", "Messages acked (stored on both replicas)", labels,
                  st.acked)
        yield one("counter", "ordq_producer_acked_batches", "Batches acked", labels, st.batches_acked)
        yield one("counter", "ordq_producer_failovers", "Moves of the head to another group (a failed head, or a "
                  "roll to the next group)", labels, st.failovers)
        yield one("counter", "ordq_producer_rolls", "Segments ended by a roll, writes going on on the same group",
                  labels, st.rolls)
        yield one("counter", "ordq_producer_link_fallbacks", "Produce streams carried by gRPC because the master's "
                  "lean link could not be opened (no failover)", labels, st.link_fallbacks)
        yield one("gauge", "ordq_producer_inflight_bytes",
                  "Bytes sent and not acked yet (send() blocks at max_inflight_bytes)", labels,
                  snap.inflight_bytes)
        yield one("gauge", "ordq_producer_epoch", "The producer epoch this leader writes with", labels, st.epoch)


class ConsumerMetrics(ServedCollector):
    """A consumer's series, labelled with its queue and subscription; ``snapshot`` is called
    at each scrape."""

    def __init__(self, cfg: ConsumerConfig, snapshot: Callable[[], ConsumerSnapshot]) -> None:
        self._snapshot = snapshot
        self.registry = cfg.metrics_registry if cfg.metrics_registry is not None else CollectorRegistry()
        self._labels = {"queue": cfg.queue, "subscription": cfg.subscription}
        self.register_and_serve(cfg.metrics_listen)

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        st = snap.stats
        for name, doc, v in (
            ("ordq_consumer_delivered_messages", "Messages handed to the application", st.delivered),
            ("ordq_consumer_duplicates_dropped", "Resent copies dropped by seq (after a producer failover)",
             st.duplicates_dropped),
            ("ordq_consumer_redeliveries", "Handler attempts repeated by run() after a failure (policy block)",
             st.redeliveries),
            ("ordq_consumer_gaps", "Missing seqs detected (delivery stopped with GapDetected)", st.gaps),
            ("ordq_consumer_parked_messages", "Messages run() moved to the parking queue", st.parked),
            ("ordq_consumer_commits", "Cursor commits", st.commits),
            ("ordq_consumer_rejoins", "Times the lease was lost to another consumer and granted back "
             "(delivery went on from the committed cursor)", st.rejoins),
            ("ordq_consumer_time_waits", "Times the head of the line was held for its due time (delayed delivery)",
             st.time_waits),
            ("ordq_consumer_read_link_fallbacks", "Times a master's lean link could not be opened and the consumer "
             "read over gRPC instead", st.read_link_fallbacks),
        ):
            yield one("counter", name, doc, self._labels, v)
        now = time.monotonic()
        lag, ts_us, stalled = snap.lag_messages, snap.read_ts_us, snap.stalled_since
        for name, doc, value in (
            ("ordq_consumer_lag_messages", "Messages stored and not yet handed to the application", lag),
            ("ordq_consumer_lag_seconds", "Age of the newest message read, while messages wait (else 0)",
             max(time.time() - ts_us / 1e6, 0.0) if lag and ts_us else 0.0),
            ("ordq_consumer_last_seq", "The last seq handed to the application", snap.handed_seq),
            ("ordq_consumer_blocked", "1 while run() retries a message past its failure policy's attempts",
             int(snap.alarmed)),
            ("ordq_consumer_blocked_attempts", "Failed attempts of the message run() is retrying (0: none)",
             snap.blocked_attempts),
            ("ordq_consumer_stalled_seconds", "Seconds no replica of the current segment's group has answered",
             now - stalled if stalled is not None else 0.0),
            ("ordq_consumer_waiting_on_time", "1 while the head of the line is held for its due time (delayed "
             "delivery: waiting on time, not stuck)", int(snap.waiting_due_us > 0)),
            ("ordq_consumer_waiting_seconds", "Seconds until the held head of the line is due (0: none held)",
             max(snap.waiting_due_us / 1e6 - time.time(), 0.0) if snap.waiting_due_us else 0.0),
            ("ordq_consumer_delay_seconds", "The subscription's delay (ordq sub create|alter --delay)",
             snap.delay_ms / 1000.0),
        ):
            yield one("gauge", name, doc, self._labels, value)
