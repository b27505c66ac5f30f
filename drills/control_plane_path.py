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

Also ZooKeeper's side (stop p): the requests it received and its read, update and fsync times
(``mntr``) per window, to tell whether an attack on the leader reaches the brokers through it.

Rules: ``between``, ``zk_reading`` and ``zk_between`` are pure; ``read_broker`` and ``read_zk``
are the reads (a scrape of a broker's metrics, a ``mntr`` of ZooKeeper).
"""

from __future__ import annotations

import attrs

from ordq.common.metrics import Sample, scrape_or_none, value
from ordq.common.security import Credentials
from ordq.zk_server import four_letter_word

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
    samples = scrape_or_none(url, timeout_s=1.0)
    return None if samples is None else reading(samples)


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


ZK_TIMES = ("readlatency", "updatelatency", "fsynctime")  # mntr summaries (ms): zk_sum_X, zk_cnt_X


@attrs.frozen
class ZkReading:
    received: int  # requests received so far (zk_packets_received)
    times: tuple[tuple[float, int], ...]  # per ZK_TIMES: (ms summed, how many) so far


def zk_reading(mntr: str) -> ZkReading | None:
    """The counters of one ``mntr`` answer (None: no ``zk_packets_received`` in it)."""
    fields = dict(line.split("\t", 1) for line in mntr.splitlines() if "\t" in line)
    if "zk_packets_received" not in fields:
        return None

    def num(key: str) -> float:
        try:
            return float(fields.get(key, "0"))
        except ValueError:
            return 0.0

    return ZkReading(int(num("zk_packets_received")),
                     tuple((num(f"zk_sum_{t}"), int(num(f"zk_cnt_{t}"))) for t in ZK_TIMES))


def read_zk(port: int, tls: Credentials | None) -> ZkReading | None:
    """ZooKeeper's counters now (None: it did not answer)."""
    try:
        return zk_reading(four_letter_word(port, "mntr", timeout_s=1.0, tls=tls))
    except OSError:
        return None


def zk_between(a: ZkReading | None, b: ZkReading | None, seconds: float) -> str:
    """What ZooKeeper did from reading ``a`` to ``b`` (``seconds`` apart), told: requests per s,
    then each of ``ZK_TIMES``' mean and count."""
    if a is None or b is None or seconds <= 0:
        return "not read"
    times = []
    for name, (s0, n0), (s1, n1) in zip(ZK_TIMES, a.times, b.times, strict=True):
        n = n1 - n0
        times.append(f"{name} {(s1 - s0) / n:.2f} ms x{n}" if n > 0 else f"{name} x0")
    return f"{(b.received - a.received) / seconds:.0f} requests/s, {', '.join(times)}"
