"""The partition drills as ``ordq drill`` drills (drills/partitions.py, issue 28).

Default run (no root needed, a second or two): each kind cuts what its description says, from
the scene of the moment (pure ``Partition`` values, no lab); every kind is listed by ``ordq drill
list`` and is part of ``drill all``; where no lab can be made each is skipped with one line.
Slow (root, ip netns, iptables; a lab cluster of 8 hosts): two drills through ``ordq drill`` in
process, and ``ordq drill partitions`` for a few rounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main
from ordq.drills import partitions
from ordq.drills.partitions import PARTITIONS, Scene
from ordq.lab.cluster import SPREAD
from ordq.lab.lab import unavailable

HOSTS = tuple(f"h{k}" for k in range(1, SPREAD.hosts + 1))
BROKERS = ("h4", "h5", "h6")
SCENE = Scene(hosts=HOSTS, zk=SPREAD.zk_hosts, head="g1", seg=3, master="h4", slave="h5", producer="h7",
              consumer="h8", coordinator="h5")


def cut(name: str) -> Any:
    make = PARTITIONS[name].make
    assert make is not None
    return make(SCENE)


def test_there_are_at_least_eight_partition_kinds_and_each_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(PARTITIONS) >= 8
    assert main(["drill", "list", "--json"]) == 0
    listed = {row["drill"] for row in json.loads(capsys.readouterr().out)}
    assert set(PARTITIONS) <= listed


def test_a_client_cut_from_zookeeper_only_still_reaches_every_broker() -> None:
    for name, host in (("part-producer-zk", "h7"), ("part-consumer-zk", "h8")):
        p = cut(name)
        assert all(p.blocks(host, z) and p.blocks(z, host) for z in SPREAD.zk_hosts), name
        assert all(p.connects(host, b) for b in BROKERS + ("h7", "h8") if b != host), name
        assert p.hosts() == {host, *SPREAD.zk_hosts}, name


def test_the_head_master_on_the_zookeeper_minority_side_keeps_its_slave_and_clients() -> None:
    p = cut("part-zk-minority-head-master")
    assert p.blocks("h4", "h2") and p.blocks("h4", "h3") and p.blocks("h1", "h2")  # minority: h4 with h1
    assert p.connects("h4", "h1") and p.connects("h4", "h5") and p.connects("h4", "h7")
    assert p.connects("h2", "h3")  # the majority keeps its quorum


def test_one_way_bridge_and_flaky_cut_what_they_say() -> None:
    one = cut("part-one-way")
    assert one.blocks("h5", "h4") and one.delivers("h4", "h5") and not one.connects("h4", "h5")
    br = cut("part-bridge")
    assert br.blocks("h4", "h5") and br.blocks("h1", "h2") and br.blocks("h4", "h2")
    assert all(br.connects("h3", h) for h in ("h1", "h2", "h4", "h5"))  # the shared host reaches both halves
    flaky = cut("part-flaky")
    assert not flaky.delivers("h4", "h5") and not flaky.blocks("h4", "h5")  # some packets, not all
    iso = cut("part-isolate-head-master")
    assert all(iso.blocks("h4", h) and iso.blocks(h, "h4") for h in HOSTS if h != "h4")
    assert cut("part-master-slave").hosts() == {"h4", "h5"}


def test_without_a_lab_each_partition_drill_is_skipped_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(partitions, "unavailable", lambda: "not root")
    results = partitions.run_lab_drills(tmp_path, list(PARTITIONS), verify=lambda *a, **k: None)
    assert [r.name for r in results] == list(PARTITIONS)
    assert all(r.ok and r.skipped and "not root" in r.verdict for r in results)
    # through the command (no local drill named: no cluster, no Spark starts)
    assert main(["drill", "part-flaky", "part-bridge", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert sum("partition drills: SKIP" in line for line in out.splitlines()) == 1, out
    assert "0 passed, 0 failed, 2 skipped" in out, out


def test_the_spark_cluster_drill_is_listed_and_its_option_refused_where_it_does_not_apply(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``ordq drill spark-cluster`` (issue 44): a lab drill verified on the lab's Spark cluster,
    listed by ``drill list``; ``--spark-cluster`` with ``--master``, without a lab drill, or on
    the randomized run: one line, before anything starts."""
    assert main(["drill", "list", "--json"]) == 0
    rows = {row["drill"]: row for row in json.loads(capsys.readouterr().out)}
    assert "spark-cluster" in rows and "Spark standalone cluster" in rows["spark-cluster"]["fault"]
    for argv, message in (
            (["drill", "spark-cluster", "--master", "local[2]"], "give no --master"),
            (["drill", "kill-head-master", "--spark-cluster"], "name one"),
            (["drill", "partitions", "--spark-cluster"], "not the randomized run")):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


# -- in a lab (slow) -------------------------------------------------------------------------------

_NO_LAB = unavailable()
needs_lab = pytest.mark.skipif(_NO_LAB is not None, reason=f"the lab needs root, ip netns and iptables: {_NO_LAB}")


@pytest.mark.slow
@needs_lab
def test_partition_drills_through_ordq_drill(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["drill", "part-master-slave", "part-producer-zk", "--seed", "7", "--json"])
    doc = json.loads(capsys.readouterr().out)
    rows = {d["name"]: d for d in doc["drills"]}
    assert code == 0, {n: (d["verdict"], d["expectations"]) for n, d in rows.items()}
    assert set(rows) == {"part-master-slave", "part-producer-zk"}
    assert all(d["lost"] == 0 and d["reordered"] == 0 and d["delivered"] == d["acked"] for d in rows.values())


@pytest.mark.slow
@needs_lab
def test_a_lab_drill_verified_on_the_labs_spark_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """``ordq drill spark-cluster``: part-isolate-head-master in a lab, its audits verified by a
    driver in a client host of the lab on a Spark standalone cluster started there (workers on
    h2 and h3): the verdict PASS, one progress line per stage, and no Spark process left."""
    pytest.importorskip("pyspark", reason="the Spark cluster needs PySpark: pip install 'ordq[spark]'")
    code = main(["drill", "spark-cluster", "--seed", "5", "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    rows = {d["name"]: d for d in doc["drills"]}
    assert code == 0, {n: (d["verdict"], d["expectations"]) for n, d in rows.items()}
    assert set(rows) == {"part-isolate-head-master"}
    assert all(d["lost"] == 0 and d["reordered"] == 0 and d["delivered"] == d["acked"] for d in rows.values())
    assert "Spark cluster spark://" in captured.err, captured.err[-3000:]
    assert any(line.strip().startswith("spark stage ") for line in captured.err.splitlines()), captured.err[-3000:]


@pytest.mark.slow
@needs_lab
def test_randomized_partitions_report_the_next_ack_per_kind(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["drill", "partitions", "--rounds", "4", "--seed", "3", "--rate", "100", "--dir", str(tmp_path / "p"),
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert sum(k["faults"] for k in doc["per_kind"]) == 4
    assert all(k["next_ack_p50_s"] is not None for k in doc["per_kind"]), doc["per_kind"]
    assert all(s["lost"] == 0 and s["reordered"] == 0 for s in doc["streams"])


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_set_up_is_tried_again_within_its_budget_then_fails_naming_the_attempts() -> None:
    """Issue 42: the partition drills' set-up had no retry (2 of 3 runs failed at load 25).
    ``within_budget`` makes a failed set-up again, from scratch, while its budget lasts."""
    from ordq.common.errors import OrdqError
    from ordq.drills.partitions import LabDrillError, within_budget

    clock = _Clock()
    retried: list[int] = []

    def flaky(n: int) -> str:
        clock.now += 50.0
        if n < 3:
            raise OrdqError(f"slow start {n}")
        return f"made by attempt {n}"

    assert within_budget(flaky, budget_s=240, what="set-up", clock=clock,
                         on_retry=lambda n, exc: retried.append(n)) == "made by attempt 3"
    assert retried == [1, 2]

    clock.now = 0.0

    def never(n: int) -> str:
        clock.now += 100.0
        raise OrdqError(f"timed out {n}")

    with pytest.raises(LabDrillError, match=r"set-up: 3 attempts in 240s failed; the last: OrdqError: timed out 3"):
        within_budget(never, budget_s=240, what="set-up", clock=clock)

    def broken(n: int) -> str:
        raise ValueError("a bug is not retried")

    with pytest.raises(ValueError):
        within_budget(broken, budget_s=240, what="set-up", clock=clock)
