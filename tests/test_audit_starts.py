"""Where a subscription began, in its audit (docs/AUDIT_FORMAT.md, "starts").

Stop 94's drive: a subscription made at ``earliest`` after another had read and freed segments
0-4 began at segment 5, and ``ordq verify`` over the run reported every seq before it as
``lost`` (82,010 of them, a FAIL): the verifier could not know where the subscription began.
Each consumer instance now writes a start record (after which seq it began); the verifier
judges a subscription from its first audited start: what is at or before it is
``before_subscribed`` (allowed, reported apart), a seq after it that never came is still lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk.audit import START_COLUMNS
from ordq.spark_order_check.reference import check
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture

pytestmark = pytest.mark.zk


def _produce(cluster: Cluster, audit: Path, first: int, n: int) -> None:
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=30.0, audit_dir=audit)
    with Producer(cfg) as p:
        futures = [p.send(b"m%06d" % i) for i in range(first, first + n)]
        futures[-1].result(60)


def _consume(cluster: Cluster, audit: Path, sub: str, n: int) -> list[int]:
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription=sub, start="earliest",
                         audit_dir=audit)
    seqs: list[int] = []
    with Consumer(cfg) as c:
        while len(seqs) < n:
            seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
        c.commit()
    return seqs


def test_a_subscription_made_after_segments_were_freed_is_judged_from_where_it_began(
        cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    audit = tmp_path / "audit"
    _produce(cluster, audit, 0, 5)
    assert cluster.ordq("queue", "roll", "q").returncode == 0
    _produce(cluster, audit, 5, 5)
    assert _consume(cluster, audit, "early", 10) == list(range(10))
    # Read by its only subscription, segment 0 is freed: 'earliest' is now segment 1, after seq 4.
    cluster.wait_state(lambda st: st.consume[0].seg == 1 and st.trimmed_seq == 4, what="segment 0 popped")
    assert _consume(cluster, audit, "late", 5) == list(range(5, 10))

    rows = [line.split("\t") for f in sorted((audit / "starts").glob("*.tsv")) for line in f.read_text().splitlines()]
    header, starts = rows[0], [dict(zip(START_COLUMNS, r, strict=True)) for r in rows if r != rows[0]]
    assert tuple(header) == START_COLUMNS
    assert {(r["subscription"], r["after_seq"], r["seg"], r["offset"]) for r in starts} == {
        ("early", "-1", "0", "0"), ("late", "4", "1", "0")}

    judged = check(audit / "acks", audit / "deliveries", starts=audit / "starts").counts
    assert (judged.get("lost", 0), judged.get("before_subscribed", 0)) == (0, 5), judged
    # Without the start records (the verifier before them) the late subscription's 5 read as lost.
    assert check(audit / "acks", audit / "deliveries").counts.get("lost", 0) == 5


def _write(path: Path, columns: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(map(str, r)) for r in [columns, *rows]) + "\n")


def written_run(d: Path) -> Path:
    """10 acked seqs; ``early`` delivered all of them; ``late`` began after seq 4 and delivered
    6-9 (seq 5, after its start, never came: lost); ``none`` has no start record and delivered
    8-9 (judged from seq 0, as before start records: 8 lost)."""
    from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS

    _write(d / "acks" / "p-0.tsv", ACK_COLUMNS, [("q", "p", 1, s, 0, s, "", 100 + s, 1000 + s, 2000 + s)
                                                 for s in range(10)])
    deliveries = [("q", sub, f"{sub}-c", s, 0, s, "", 100 + s, 1000 + s, 3000 + s, "")
                  for sub, first in (("early", 0), ("late", 6), ("none", 8)) for s in range(first, 10)]
    _write(d / "deliveries" / "c-0.tsv", DELIVERY_COLUMNS, deliveries)
    _write(d / "starts" / "c-0.tsv", START_COLUMNS, [("q", "early", "early-c", -1, 0, 0, 1),
                                                      ("q", "late", "late-c", 4, 0, 5, 2),
                                                      ("q", "late", "late-c#1", 7, 0, 8, 3)])
    return d


def test_the_reference_checker_judges_each_subscription_from_its_first_start(tmp_path: Path) -> None:
    d = written_run(tmp_path)
    counts = check(d / "acks", d / "deliveries", starts=d / "starts").counts
    assert (counts.get("lost", 0), counts.get("before_subscribed", 0)) == (1 + 8, 5)
    assert check(d / "acks", d / "deliveries").counts.get("lost", 0) == 6 + 8
