"""A broker that protects itself (issue 25), on real broker processes and real ZooKeeper.

- Bytes checked on the way out: a byte flipped in a sealed segment of a running master is
  never delivered; the master sets its copy aside (counted, logged), readers go to the slave,
  and the master's copy is rebuilt from the slave.
- One memory budget per broker: huge fetches and unread Read streams are bounded, memory
  comes back when they end, and a producer of another queue on the same broker keeps being
  acked without failing over.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import pytest

from broker_group import log as seglog
from ordq.admin.groups import roll_queue
from ordq.admin.read import ReplicaReader
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk


def _copy(data_dir: Path, queue: str, seg: int) -> list[tuple[int, int]]:
    """(seq, payload crc) of every message of one replica's copy, read from its file."""
    path = seglog.segment_dir(data_dir, queue, seg) / seglog.SEGMENT_FILE
    out = []
    for header, messages in seglog.iter_file_batches(path):
        out.extend((header.first_seq + i, zlib.crc32(m.payload)) for i, m in enumerate(messages))
    return out


def _stats(cluster: Cluster, address: str) -> dict:
    return dict(json.loads(cluster.transport.health(address).stats_json))


def test_a_byte_flipped_in_a_sealed_segment_of_a_running_master_is_never_delivered_and_repaired(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    n = 3000
    cluster.add_groups("g1")
    cluster.create_queue()
    producer = cluster.producer(n=n, rate=None)
    producer.start()
    producer.join(60)
    with ReplicaReader(cluster.store) as reader:
        roll_queue(cluster.store, reader, "q")  # segment 0 sealed, writes go on in segment 1
    cluster.wait_state(lambda st: st.consume[0].seg == 0 and st.consume[0].end == n, what="segment 0 sealed")
    subs = [f"s{i}" for i in range(6)]
    for sub in subs:  # all subscribed before anyone reads: nobody pops segment 0 early
        cluster.store.create_subscription("q", sub)
    group = cluster.groups["g1"]
    master = cluster.store.live_members("g1")["master"].address
    path = seglog.segment_dir(group.master.data_dir, "q", 0) / seglog.SEGMENT_FILE
    good = _copy(group.slave.data_dir, "q", 0)
    with open(path, "r+b") as f:  # the running master's file: its page cache sees the change
        size = f.seek(0, 2)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x40]))

    caplog.set_level(logging.WARNING, logger="ordq.consumer")
    consumers = [cluster.consumer(until=n - 1, sub=sub) for sub in subs]
    for c in consumers:
        c.start()
    for c in consumers:
        c.join(90)
    for c in consumers:
        summary = check_delivery(producer.acked, [c.delivered])
        assert summary.acked == summary.delivered == n

    # The master found it on the way out, counted it, said which segment, and rebuilt it.
    assert "segment q/0: a served read found corrupt bytes" in group.master.log_tail(200)
    assert any("seg 0" in r.getMessage() and master in r.getMessage() for r in caplog.records), \
        "the consumer names the broker and segment it fell back from"
    wait_until(lambda: (s := _stats(cluster, master))["corrupt"] == [] and s["reconciled"] >= 1,
               timeout_s=30, what="the master's copy repaired")
    stats = _stats(cluster, master)
    assert stats["corrupt_reads"] == 1
    assert _copy(group.master.data_dir, "q", 0) == good
    assert list(path.parent.glob("segment.log.corrupt-*")), "the corrupt copy is kept as evidence"
    res = cluster.transport.fetch(master, "q", 0, 0, max_bytes=64 << 20, max_wait_ms=0, known_end=n)
    assert sum(seglog.parse_header(b).count for b in res.batches) == n  # served (and checked) again
