"""The verifier's topic checks (``verify(topics=...)``, ``ordq verify --topic``) on hand-written
audit files of a topic ``t`` with partitions ``t.p0`` and ``t.p1``: a clean run passes, and each
seeded violation fails the verdict with its class: a key in two partitions, a per-key reorder
inside a partition, a message lost in one partition, one partition delivered by two consumers at
once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main as ordq_main
from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
from tests import spark_fixtures

pytestmark = pytest.mark.spark
spark = spark_fixtures.spark

A, B, C, D = "61", "62", "63", "64"  # keys (hex, as the audit files hold them)
KEYS = {"t.p0": [A, B, A, B], "t.p1": [C, D, C]}  # each partition's keys by seq


def ack(q: str, seq: int, key: str) -> str:
    return f"{q}\tprod-{q}\t1\t{seq}\t0\t{seq}\t{key}\t{100 + seq}\t1000\t1500"


def delivery(q: str, seq: int, key: str, consumer: str, at_us: int) -> str:
    return f"{q}\tg\t{consumer}\t{seq}\t0\t{seq}\t{key}\t{100 + seq}\t1000\t{at_us}"


def write_run(d: Path, keys: dict[str, list[str]], deliveries: dict[str, list[str]]) -> Path:
    """Acks of every seq of ``keys``; ``deliveries``: rows by consumer (one file each)."""
    (d / "acks").mkdir(parents=True)
    (d / "deliveries").mkdir()
    for q, ks in keys.items():
        rows = [ack(q, seq, k) for seq, k in enumerate(ks)]
        (d / "acks" / f"prod-{q}-0.tsv").write_text("\n".join(["\t".join(ACK_COLUMNS), *rows]) + "\n")
    for consumer, rows in deliveries.items():
        (d / "deliveries" / f"{consumer}-0.tsv").write_text("\n".join(["\t".join(DELIVERY_COLUMNS), *rows]) + "\n")
    return d


def in_order(q: str, keys: list[str], consumer: str, t0: int = 2000, seqs: list[int] | None = None) -> list[str]:
    return [delivery(q, s, keys[s], consumer, t0 + i) for i, s in enumerate(seqs if seqs is not None else
                                                                              range(len(keys)))]


def test_each_seeded_violation_fails_the_verdict_on_its_topic_alone(
        tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """One run (one Spark job: they are slow on a loaded box) of five topics with partitions p0
    and p1: ``ok`` clean, and one seeded violation in each other one."""
    keys: dict[str, list[str]] = {}
    rows: dict[str, list[str]] = {}
    for topic in ("ok", "two", "reorder", "lost", "both"):
        for q, ks in KEYS.items():
            part = q.replace("t.", f"{topic}.")
            keys[part] = list(ks)
            rows[f"{topic}-{q}"] = in_order(part, ks, f"{topic}-{q}")
    keys["two.p1"].append(A)  # key A, routed to p0, also sent to p1 (seq 3)
    rows["two-t.p1"] = in_order("two.p1", keys["two.p1"], "two-t.p1")
    # key A's seq 2 delivered before its seq 0 (the other keys' relative order is free)
    rows["reorder-t.p0"] = in_order("reorder.p0", keys["reorder.p0"], "reorder-t.p0", seqs=[1, 2, 0, 3])
    rows["lost-t.p1"] = in_order("lost.p1", keys["lost.p1"], "lost-t.p1", seqs=[0, 1])
    # a second consumer starts delivering both.p0 while the first one still does
    rows["both-c3"] = in_order("both.p0", keys["both.p0"], "both-c3", t0=2001, seqs=[2, 3])
    d = write_run(tmp_path, keys, rows)
    report_path = tmp_path / "report.json"
    code = ordq_main(["verify", str(d), *[a for t in ("ok", "two", "reorder", "lost", "both") for a in ("--topic", t)],
                      "--report", str(report_path)])
    assert code == 1, capsys.readouterr()
    report = json.loads(report_path.read_text())
    assert report["ok"] is False and report["topics"] == ["ok", "two", "reorder", "lost", "both"]
    found = {name: {(b["queue"], b["count"]) for b in check["by_subscription"]}
             for name, check in report["checks"].items() if check["violation"] and check["count"]}
    assert found == {"key_partitions": {("two.p0", 1)}, "key_order": {("reorder.p0", 1)}, "lost": {("lost.p1", 1)},
                     "concurrent_consumers": {("both.p0", 2)}}
    assert report["checks"]["key_partitions"]["examples"] == [{
        "topic": "two", "key": A, "partition": "two.p0", "seq": 0, "at": "prod-two.p0-0.tsv:2",
        "other_partition": "two.p1", "other_seq": 3, "other_at": "two-t.p1-0.tsv:5"}]
