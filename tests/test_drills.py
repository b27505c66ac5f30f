"""Failover drills on real processes, verdicts from spark_order_check.

Default run: a CI-sized subset (``ordq.drills.catalog.CI_DRILLS``) plus copies of two of those
runs made to lose and to reorder one delivery (the test hook on a copy: no second run of the
drill), all verified in one Spark job; the hooked copies must fail. ``-m slow`` (tox -e slow):
every drill on a cluster with a 3-node ZooKeeper, and the CLI's exit code for a failing drill.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main
from ordq.cluster_config import ClusterConfig
from ordq.common.proc import load_stretched
from ordq.drills.catalog import CI_DRILLS, DRILLS
from ordq.drills.judge import DrillResult, judge_all, run_series
from ordq.drills.runner import LoadConfig, execute_drill, tampered_copy
from ordq.drills.verdict import Verifier
from ordq.local_cluster import LocalCluster
from tests import spark_fixtures

pytestmark = [pytest.mark.zk, pytest.mark.spark, pytest.mark.timeout(1800)]

CI_LOAD = LoadConfig(messages=8_000, rate=4_000.0)
# The hooked runs check the verdict, not a fault: each is a copy of one CI run's audit, altered
# (a failover with resends and duplicates for the loss; a refusal drill for the reorder).
HOOKED = {"lose": "kill-head-master", "reorder": "security-intruders"}


spark = spark_fixtures.spark  # the test session's one SparkSession


@pytest.fixture(scope="module")
def verifier(spark: Any) -> Iterator[Verifier]:
    with Verifier(spark=spark) as v:
        yield v


@pytest.fixture(scope="module")
def ci_results(tmp_path_factory: pytest.TempPathFactory, verifier: Verifier) -> Iterator[dict[str, DrillResult]]:
    """The CI drills and the two hooked runs on one cluster, judged in one verification."""
    cluster = LocalCluster(tmp_path_factory.mktemp("drills") / "c", ClusterConfig(groups=3, coordinators=2))
    try:
        cluster.start()
        runs = {name: execute_drill(cluster, DRILLS[name], seed=7, load=CI_LOAD) for name in CI_DRILLS}
        for how, name in HOOKED.items():  # a copy of the run, altered: no second run of the drill
            runs[how] = tampered_copy(runs[name], how, seed=7)
        print("drill runs: " + ", ".join(f"{name} {run.seconds:.1f}s" for name, run in runs.items()))
        results = judge_all(list(runs.values()), verifier, keep=True)
        yield dict(zip(runs, results, strict=True))
    finally:
        cluster.stop()


def _explain(res: DrillResult) -> str:
    lines = [f"{res.name}: {res.verdict}; files in {res.run_dir}"]
    lines += [f"  {t:6.2f}s {text}" for t, text in res.events]
    lines += [f"  {'ok' if ok else 'NOT MET'}: {what}" for what, ok in res.expectations]
    if res.report is not None and not res.report.ok:
        lines.append(res.report.summary())
    return "\n".join(lines)


@pytest.mark.parametrize("name", CI_DRILLS)
def test_ci_drill_passes(ci_results: dict[str, DrillResult], name: str) -> None:
    res = ci_results[name]
    assert res.ok, _explain(res)
    assert res.verdict == "PASS"
    # a producer fault may leave messages stored but never acked (delivered all the same)
    assert res.delivered == CI_LOAD.messages and 0 < res.acked <= res.delivered
    assert res.lost == 0 and res.reordered == 0 and res.duplicates == 0
    if not DRILLS[name].failover:  # a hostile client is refused: nothing fails over
        assert res.failover_s is None and res.expectations and all(ok for _, ok in res.expectations)
    else:
        # 30 s on an idle box; a loaded one fails over slower, not never (issue 26)
        assert res.failover_s is not None and res.failover_s < load_stretched(30.0)


def test_a_run_made_to_lose_one_message_fails(ci_results: dict[str, DrillResult]) -> None:
    res = ci_results["lose"]
    assert not res.ok, _explain(res)
    assert res.lost == 1, _explain(res)
    assert res.verdict.startswith("FAIL (") and "lost 1" in res.verdict
    assert any("TEST HOOK: removed the delivery of seq" in text for _, text in res.events)


def test_a_run_made_to_reorder_one_message_fails(ci_results: dict[str, DrillResult]) -> None:
    res = ci_results["reorder"]
    assert not res.ok, _explain(res)
    assert res.reordered and res.reordered >= 1, _explain(res)
    assert "out_of_order" in res.verdict
    assert res.lost == 0  # reordered, not lost


def test_cdc_drill_passes_and_the_demo_prints_its_summary(tmp_path: Path, spark: Any,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The cdc drill (MariaDB -> ordq cdc mysql -> queue -> ordq cdc apply -> PostgreSQL; the
    shipper, the applier and a head master killed) through ``ordq demo --cdc``, what `make
    demo-cdc` runs: in-process and small; one run covers both (the Spark session is the tests'
    one, which the demo uses and leaves running)."""
    code = main(["demo", "--cdc", "--dir", str(tmp_path / "demo"), "--messages", "200", "--rate", "200",
                 "--seed", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line.split() for line in out.splitlines() if line.startswith("cdc "))
    assert row[-1] == "PASS" and row[4:7] == ["0", "0", "0"], out  # lost, reordered, dups
    assert "ok: target tables equal the source row for row" in out, out
    faults = " ".join(line for line in out.splitlines() if "FAULT: kill -9" in line)
    assert "shipper" in faults and "applier" in faults and "master" in faults, out
    assert "\nPASS: the target's tables equal the source's row for row" in out, out
    assert "nothing left running" in out
    assert spark.range(3).count() == 3  # still usable


def test_cdc_drill_without_database_servers_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import ordq.drills.cdc

    monkeypatch.setattr(ordq.drills.cdc, "MARIADBD", Path("/nonexistent/mariadbd"))
    assert main(["drill", "cdc"]) == 1
    assert capsys.readouterr().err == ("ordq: error: the cdc drill needs the database servers mariadb-server "
                                       "installed (make test-deps, or: apt-get install mariadb-server)\n")


def test_drill_list_names_every_fault(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "list"]) == 0
    out = capsys.readouterr().out
    for name in DRILLS:
        assert name in out
    assert main(["drill", "no-such-drill"]) == 1
    assert "unknown drill" in capsys.readouterr().err


@pytest.mark.slow
def test_every_drill_passes(tmp_path: Path, verifier: Verifier) -> None:
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=3, zk_nodes=3, coordinators=2))
    try:
        cluster.start()
        results = run_series(cluster, list(DRILLS.values()), verify=verifier, seed=11, load=CI_LOAD, out=None,
                             keep=True)
    finally:
        cluster.stop()
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(_explain(r) for r in failed)
    assert not any(r.skipped for r in results)


@pytest.mark.slow
def test_cli_exits_non_zero_when_a_drill_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["drill", "kill-head-master", "--dir", str(tmp_path / "c"), "--messages", "6000", "--seed", "3",
                 "--test-hook", "lose", "--master", "local[2]"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAIL (lost 1" in out  # (a consumer's missing seq is also a gap)
    assert "0 passed, 1 failed" in out
    assert not LocalCluster(tmp_path / "c").running()  # its own cluster is stopped (files kept)


@pytest.mark.slow
def test_keyed_topic_drill_passes(tmp_path: Path, verifier: Verifier) -> None:
    """The keyed-topic drill alone (issue 29): real member processes joining, hung past their
    session (SIGSTOP) and leaving, and head masters killed, under a TopicProducer process; the
    verifier finds nothing lost, reordered or delivered by two consumers of a partition at once.
    Two rounds judged in one verification, as ``drill all --rounds 2`` does: both rounds'
    members once wrote audit files of the same names, which the verifier refused."""
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=3, coordinators=2))
    try:
        cluster.start()
        runs = [execute_drill(cluster, DRILLS["keyed-topic"], seed=3, round_=r) for r in (1, 2)]
        results = judge_all(runs, verifier, keep=True)
    finally:
        cluster.stop()
    for res in results:
        assert res.ok, _explain(res)
    res = results[0]
    found = {c.name: c.count for c in res.report.classes}
    assert found["concurrent_consumers"] == found["lost"] == found["key_partitions"] == 0, found
    texts = " ".join(text for _t, text in res.events)
    assert "SIGSTOP member m1" in texts and "member m1 joined again" in texts and "member m2 left" in texts


@pytest.mark.slow
def test_security_control_plane_drill_passes(tmp_path: Path, verifier: Verifier) -> None:
    """The security-control-plane drill alone (issue 38): hand-made clients attack the leading
    coordinator in windows between quiet ones (a 200 MiB-named Pop without a token, a 64-thread
    flood of one consume token, Subscribe past the bound, EnsureParkingQueue for made-up names,
    undecodable bytes, a name with a new line) while the drill queue is written and another token
    commits on it. ~3 min of load (the windows start at 5-15 % of a 150 s stream), then Spark.
    Its whole verdict is asserted, the latency ratios included; no longer a strict xfail (stop h):
    with the attacker weighted as a host of its own and the disk's freezes left out of both sides
    of the ratios, every latency rule held beside six busy loops (docs/BENCHMARKS.md, stop h), so
    an xfail would fail as an XPASS, or, not strict, never fail. The windows now end on time
    (every attacker call's deadline is its window's end, its drain bounded: stop i), so a round
    whose windows outlasted the stream (stop h: 1 round of 6) fails before its first window
    instead, saying so; an attacker that does not stop within its bound fails it too."""
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=3, coordinators=2))
    try:
        cluster.start()
        run = execute_drill(cluster, DRILLS["security-control-plane"], seed=38)
        res = judge_all([run], verifier, keep=True)[0]
    finally:
        cluster.stop()
    assert res.ok, _explain(res)
    met = " ".join(what for what, ok in res.expectations if ok)
    for what in ("huge: refused denied", "flood:Subscribe: refused bad_request", "parking: refused sub_not_found",
                 "undecodable: refused bad_request", "newline:token: refused bad_request",
                 "the leader counted PermissionDenied", "the leader counted Undecodable", "kept leading",
                 "the attacker stopped within",
                 "no subscription created or removed", "produce ack p99", "commit p99"):
        assert what in met, _explain(res)
