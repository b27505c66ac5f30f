"""What the drill queue's own path did in each window of the ``security-control-plane`` drill
(drills/control_plane.py), told beside its latency judgement: the head group's writes that the
session guard held (``ordq_broker_session_confirmed_writes``: ZooKeeper silent, or its quorum
unheard for half a session, before the write was taken), its slow fsyncs
(``ordq_broker_fsync_seconds``), and how far the drill queue's consumer was behind its producer
when each window began.

Why (stop m): the quiet windows' produce ack p99 swung from ~35 ms to ~1.1 s within a round,
the first quiet window of a round nearly always the slowest (852-1,165 ms in 8 of 10 rounds of
stop l), and the freezes of the disk (``device_stalls``, at least 100 ms) did not explain them.
An ack of ~1 s is one stall of ~1 s on the path: with the brokers' 1 s ZooKeeper sessions a
quorum probe unanswered for 0.5 s holds every write until it is (DESIGN §6), an fsync slower
than 100 ms that is no freeze delays its group commit, and a consumer catching up on what it
fell behind before the drill's CPU isolation reads from the same master. These are read, not
judged: they tell which one a slow window had.

Rules: ``between`` is pure; ``read_broker`` is the one read (a scrape of a broker's metrics).
"""

from __future__ import annotations

import http.client

import attrs

from ordq.common.metrics import Sample, scrape, value

HELD = "ordq_broker_session_confirmed_writes_total"
FSYNC = "ordq_broker_fsync_seconds"
SLOW_S = ("0.1", "0.25", "1.0")  # fsync histogram bounds (broker_group/metrics.py FSYNC_BUCKETS) told


@attrs.frozen
class BrokerReading:
    held: float  # writes the session guard held, so far
    fsyncs: float  # group commits synced, so far
    within: tuple[float, ...]  # of them, those that took at most each of SLOW_S


def reading(samples: list[Sample]) -> BrokerReading | None:
    """The counters of one broker's scrape (None: not a broker's, or not exposed)."""
    held, fsyncs = value(samples, HELD), value(samples, FSYNC + "_count")
    if held is None or fsyncs is None:
        return None
    return BrokerReading(held, fsyncs, tuple(value(samples, FSYNC + "_bucket", le=le) or 0.0 for le in SLOW_S))


def read_broker(url: str | None) -> BrokerReading | None:
    """A broker's counters now (None: it did not answer)."""
    if url is None:
        return None
    try:
        return reading(scrape(url, timeout_s=1.0))
    except (OSError, ValueError, http.client.HTTPException):
        return None


def between(a: BrokerReading | None, b: BrokerReading | None) -> str:
    """What the broker did from reading ``a`` to ``b``, told: writes held, slow fsyncs."""
    if a is None or b is None:
        return "not read"
    slow = [f"{(b.fsyncs - a.fsyncs) - (y - x):.0f} > {le} s" for le, x, y in zip(SLOW_S, a.within, b.within,
                                                                                  strict=True)]
    return f"{b.held - a.held:.0f} writes held, {b.fsyncs - a.fsyncs:.0f} fsyncs ({', '.join(slow)})"


def lag(producer_status: dict[str, object], consumer_status: dict[str, object]) -> int:
    """How many acked messages the consumer had not delivered yet (by their status files)."""
    acked, delivered = producer_status.get("acked"), consumer_status.get("delivered")
    return int(acked) - int(delivered) if isinstance(acked, int) and isinstance(delivered, int) else -1
