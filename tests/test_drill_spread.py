"""The heads-spread-back drill (issue 43, drills/heads_spread.py) on real processes, its verdict
from spark_order_check: idle queues beside the stream, the head master killed (-9) and brought
back; the dead group's idle heads move off it and come back until the heads are even, never the
queue being written; nothing lost or reordered. A file of its own: its ~90 s stream runs beside
the other drills' tests, not after them (``--dist loadgroup``: one group a file)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ordq.cluster_config import ClusterConfig
from ordq.common.proc import load_stretched
from ordq.drills.catalog import DRILLS
from ordq.drills.heads_spread import IDLE, STREAM_S
from ordq.drills.judge import judge_all
from ordq.drills.runner import LoadConfig, execute_drill
from ordq.drills.verdict import Verifier
from ordq.local_cluster import LocalCluster
from tests import spark_fixtures

pytestmark = [pytest.mark.zk, pytest.mark.spark, pytest.mark.timeout(1200)]

spark = spark_fixtures.spark  # the test session's one SparkSession


@pytest.fixture(scope="module")
def verifier(spark: Any) -> Iterator[Verifier]:
    with Verifier(spark=spark) as v:
        yield v


def test_heads_spread_back_drill_passes(tmp_path: Path, verifier: Verifier) -> None:
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=3, coordinators=2))
    try:
        cluster.start()
        run = execute_drill(cluster, DRILLS["heads-spread-back"], seed=43, load=LoadConfig(messages=8_000))
        [res] = judge_all([run], verifier, keep=True)
        with cluster.store() as store:
            left = [q for q in store.list_queues() if "-idle-" in q]
    finally:
        cluster.stop()
    texts = [f"{t:6.2f}s {text}" for t, text in res.events]
    told = "\n".join(texts + [f"{'ok' if ok else 'NOT MET'}: {what}" for what, ok in res.expectations])
    assert res.ok and res.verdict == "PASS", told
    assert res.delivered == 8_000 and res.lost == 0 and res.reordered == 0 and res.duplicates == 0, told
    assert res.failover_s is not None and res.failover_s < load_stretched(30.0), told
    # each step of the story happened, in this order, and was checked
    steps = [f"{IDLE} idle queues created", "FAULT: kill -9 master", "producer acked on segment", "restarted",
             "heads even again", f"{IDLE} idle queues deleted"]
    at = [next((i for i, text in enumerate(texts) if step in text), -1) for step in steps]
    assert -1 not in at and at == sorted(at), told
    mine = [what for what, _ok in res.expectations if any(part in what for part in (
        "headed moved to the other groups", "heads idle queues again after its return",
        "the stream still written while the heads spread back"))]
    assert len(mine) == 3 and all(ok for _what, ok in res.expectations), told
    assert run.ctx.load.duration_s >= STREAM_S  # the stream outlasts the story (drills/heads_spread.py)
    assert left == [], left  # the idle queues go with the drill
