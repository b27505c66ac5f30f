"""A producer's resends after failovers are bounded (issue 39): a storm of failovers under a
steady produce does not multiply the bytes the queue stores, on real brokers.
"""

from __future__ import annotations

import pytest

from ordq.coordinator.state import QueueState, SegStatus
from tests.cluster import Cluster, cluster_fixture, finish, wait_acked  # noqa: F401 - fixture
from tests.order_check import check_delivery

pytestmark = pytest.mark.zk

N = 40_000  # 1 KiB each at 4000/s: 10 s of load, stretched by the failovers
SIZE = 1024
STALLS = 3  # heads in a row that store what they get and never ack it


def stored_copies(st: QueueState) -> tuple[int, dict[int, int]]:
    """(messages stored over every sealed segment, {copies: messages stored that many times})."""
    ranges = [(s.first_seq, s.last_seq) for s in st.consume
              if s.status is SegStatus.SEALED and s.end and s.first_seq is not None and s.last_seq is not None]
    stored = sum(b - a + 1 for a, b in ranges)
    edges = sorted([(a, 1) for a, _ in ranges] + [(b + 1, -1) for _, b in ranges])
    hist: dict[int, int] = {}
    depth, at = 0, 0
    for seq, d in edges:
        if depth and seq > at:
            hist[depth] = hist.get(depth, 0) + seq - at
        depth, at = depth + d, seq
    return stored, hist


def test_a_storm_of_failovers_from_heads_that_store_but_never_ack_does_not_multiply_the_stored_bytes(
        cluster: Cluster) -> None:
    """Guard: *resends bounded* (issue 39; ``ProducerCore.take_ready``'s resend gate). The head's
    slave is hung (SIGSTOP) in ``STALLS`` heads in a row, each as soon as it took over: its
    master stores all it gets but acks nothing, the ack deadline fails it over (its segment
    sealed from the master, with everything it stored) and the producer resends its unacked
    window to the next head. Before, each failover resent the whole window at once and every
    such head stored all of it again: 2.6x the acked bytes, the oldest seqs in 4 segments.
    Now a new stream takes resent batches only as far as it has acked bytes (one batch when
    none): summed over all segments the queue stores at most 1.5x the acked messages, no
    batch is stored more than twice but the one resent first to each head that never acked,
    and every acked message is delivered once, in order."""
    cluster.add_groups("g1", "g2", "g3")
    cluster.create_queue()
    producer = cluster.producer(n=N, size=SIZE)
    producer.start()
    wait_acked(producer, N // 10)
    stalled = []
    for _ in range(STALLS):
        head = cluster.state().head
        assert head is not None
        slave = cluster.groups[head].slave
        slave.pause()
        stalled.append(slave)
        cluster.wait_state(lambda s, h=head: s.head not in (None, h), timeout_s=40, what=f"failover from {head}")
        slave.resume()
    finish(producer)
    assert len(producer.acked) == N
    out = cluster.ordq("queue", "roll", "q", "--json")  # seal the last segment: every one counts
    assert out.returncode == 0, out.stderr
    st = cluster.wait_state(lambda s: all(x.status is SegStatus.SEALED for x in s.consume
                                          if s.open_segment is None or x.seg != s.open_segment.seg),
                            what="every segment but the new open one sealed")
    stored, hist = stored_copies(st)
    print(f"resend storm: stored {stored} messages for {N} acked ({stored / N:.2f}x) over {len(st.consume)} "
          f"segments; messages by copies {sorted(hist.items())}; stats {producer.stats}")
    consumer = cluster.consumer(until=N - 1)
    consumer.start()
    consumer.join(90)
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == N
    assert stored <= 1.5 * N, (stored, N)
    max_batch = producer.config.batching.max_batch_messages
    assert sum(n for c, n in hist.items() if c > 2) <= STALLS * max_batch, hist
