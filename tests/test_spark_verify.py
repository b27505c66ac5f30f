"""The Spark ordering verifier on generated audit and segment data with known anomalies.

Verifications of a clean run through the CLI, all audit anomalies, the same with tiny seq
buckets, broker segments, unreadable lines and out-of-order acks written by hand, all on one shared
SparkSession.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main as ordq_main
from ordq.spark_order_check.generate import (
    Expected,
    Injections,
    Scenario,
    SegmentInjections,
    generate,
    generate_segments,
)
from ordq.spark_order_check.report import AUDIT_CLASS_NAMES, CLASSES, SEGMENT_CLASS_NAMES, Report
from tests import spark_fixtures

pytestmark = pytest.mark.spark
spark = spark_fixtures.spark

SCENARIO = Scenario(keyed=("s2",))
AUDIT_CLASSES = list(AUDIT_CLASS_NAMES)
SEGMENT_CLASSES = list(SEGMENT_CLASS_NAMES)


@pytest.fixture(scope="module")
def anomalies(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> tuple[Path, Expected, Report]:
    from ordq.spark_order_check import verify

    d = tmp_path_factory.mktemp("anomalies")
    expected = generate(d, SCENARIO, Injections.every(3))
    report = verify(acks=d / "acks", deliveries=d / "deliveries", skips=d / "skips", keyed=["s2"], spark=spark)
    return d, expected, report


def test_the_plain_python_checker_counts_what_spark_counts(anomalies: tuple[Path, Expected, Report]) -> None:
    """The reference the verifier's speed is measured against (ordq.spark_order_check.reference)
    reads the same files to the same count in every audit class, 3 injections of each."""
    from ordq.spark_order_check.reference import check

    d, _expected, report = anomalies
    result = check(d / "acks", d / "deliveries", keyed=["s2"], skips=d / "skips")
    assert {n: result.counts.get(n, 0) for n in AUDIT_CLASSES} == {n: report[n].count for n in AUDIT_CLASSES}
    assert (result.ack_rows, result.delivery_rows) == (report.inputs.ack_rows, report.inputs.delivery_rows)


def test_clean_run_passes_through_the_cli(tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    expected = generate(tmp_path / "run", SCENARIO)
    code = ordq_main(["verify", str(tmp_path / "run"), "--keyed", "s2", "--json",
                      "--report", str(tmp_path / "report.json"), "--plot", str(tmp_path / "latency.png")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["ok"] is True and out["violations"] == {}
    assert {name: c["count"] for name, c in out["checks"].items()} == expected.counts
    for name in ("unacked_in_flight", "redelivered_after_takeover"):
        assert out["checks"][name]["examples"][0] == expected.first[name]
    # Per subscription: latency percentiles are exact at this size (nearest rank).
    subs = {(s["queue"], s["subscription"]): s for s in out["subscriptions"]}
    assert set(subs) == set(expected.latency)
    for key, (p50, p95, p99, mx) in expected.latency.items():
        lat = subs[key]["latency"]
        assert (lat["p50_us"], lat["p95_us"], lat["p99_us"], lat["max_us"]) == (p50, p95, p99, mx)
    assert out["inputs"]["ack_rows"] == expected.ack_rows
    assert out["inputs"]["delivery_rows"] == expected.delivery_rows
    assert json.loads((tmp_path / "report.json").read_text())["checks"] == out["checks"]
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# delivered_early needs due times the generator does not write: tests/test_delay_verify.py
# injects it (and a reorder among delayed deliveries) into hand-written audit files.
GENERATED_CLASSES = [n for n in AUDIT_CLASSES if n != "delivered_early"]


@pytest.mark.parametrize("name", GENERATED_CLASSES)
def test_each_anomaly_is_counted_exactly_with_its_first_example(
        anomalies: tuple[Path, Expected, Report], name: str) -> None:
    _, expected, report = anomalies
    result = report[name]
    assert result.count == expected.counts[name]
    if name in expected.first:
        assert result.examples[0] == expected.first[name]
    if result.violation:
        assert report.violations[name] == expected.counts[name] > 0  # the check fails on its anomaly


def test_anomalies_fail_the_run_and_nothing_else_fires(anomalies: tuple[Path, Expected, Report]) -> None:
    _, expected, report = anomalies
    assert report.ok is False
    assert report.violations == {n: c for n, c in expected.counts.items()
                                 if c and next(k for k in CLASSES if k.name == n).violation}
    assert report["lost"].by_subscription == (("orders", "s1", 3),)
    assert report["unacked"].by_subscription == (("orders", "s1", 3), ("orders", "s2", 3))
    assert "FAIL" in report.summary().splitlines()[0]


@pytest.mark.slow
def test_results_do_not_depend_on_the_seq_bucket_width(anomalies: tuple[Path, Expected, Report], spark: Any) -> None:
    """2000 seqs in buckets of 8: nearly every pair of neighbours straddles a bucket edge, so
    the boundary stitching must find exactly what the one-bucket run found. Slow (a second
    verification, ~24 s): in the default run bucket edges are crossed by
    test_unacked_neighbours_in_out_of_order_acks (buckets of 2 against one bucket, and the
    plain-Python reference) and test_segment_checks (buckets of 16)."""
    from ordq.spark_order_check import verify

    d, _, report = anomalies
    small = verify(acks=d / "acks", deliveries=d / "deliveries", skips=d / "skips", keyed=["s2"], spark=spark,
                   bucket_bits=3)
    for name in AUDIT_CLASSES:
        assert (small[name].count, small[name].examples) == (report[name].count, report[name].examples), name


def test_segment_checks(tmp_path: Path, spark: Any) -> None:
    from ordq.spark_order_check import verify

    generate(tmp_path, SCENARIO)
    expected = generate_segments(tmp_path, SCENARIO, SegmentInjections(
        crc_conflict_replicas=2, crc_mismatch_stored=2, stored_order=2, acked_not_stored=2, stored_gap=True,
        unreadable_segment=True))
    report = verify(acks=tmp_path / "acks", deliveries=tmp_path / "deliveries", segments=tmp_path / "brokers",
                    keyed=["s2"], spark=spark, bucket_bits=4)
    assert set(report.violations) == set(SEGMENT_CLASSES)
    for name in SEGMENT_CLASSES:
        assert report[name].count == expected.counts[name], name
        example = dict(report[name].examples[0])
        if name == "unreadable_segment":
            assert "CRC mismatch" in example.pop("error")
        assert example == expected.first[name], name
    assert report.inputs.segment_files == 12


def _write(path: Path, columns: tuple[str, ...], lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["\t".join(columns), *lines]) + "\n")


def _ack(queue: str, producer: str, seq: int) -> str:
    return f"{queue}\t{producer}\t1\t{seq}\t0\t{seq}\t\t{100 + seq}\t1000\t1500"


def _delivery(queue: str, consumer: str, seq: int | str) -> str:
    crc = 100 + seq if isinstance(seq, int) else 1
    return f"{queue}\ts\t{consumer}\t{seq}\t0\t{seq}\t\t{crc}\t1000\t2000"


@pytest.fixture(scope="module")
def hand_written(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> tuple[Path, dict[int, Report]]:
    """Two hand-written runs in folders of their own, on queues of their own, verified together
    (one verification per bucket width instead of one per test; a finding belongs to its queue,
    an unreadable row to no queue):

    - ``blank/``, queue ``m``: a blank and a non-numeric delivery line among good ones;
    - ``neighbours/``, queue ``q``: a never-acked seq among out-of-order acks (below).

    Returns the folder and the reports for buckets of 2**16 (one bucket) and of 2 seqs."""
    from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
    from ordq.spark_order_check import verify

    d = tmp_path_factory.mktemp("hand_written")
    _write(d / "blank" / "acks" / "pm-0.tsv", ACK_COLUMNS, [_ack("m", "pm", x) for x in range(3)])
    _write(d / "blank" / "deliveries" / "cm-0.tsv", DELIVERY_COLUMNS,
           [_delivery("m", "cm", 0), "", _delivery("m", "cm", "x1"), _delivery("m", "cm", 1), _delivery("m", "cm", 2)])
    _write(d / "neighbours" / "acks" / "p1-0.tsv", ACK_COLUMNS, [_ack("q", "p1", x) for x in (0, 1, 2, 5, 4, 6)])
    _write(d / "neighbours" / "acks" / "p2-0.tsv", ACK_COLUMNS, [_ack("q", "p2", x) for x in (8, 9)])
    _write(d / "neighbours" / "deliveries" / "c1-0.tsv", DELIVERY_COLUMNS, [_delivery("q", "c1", x) for x in range(10)])
    runs = ("blank", "neighbours")
    reports = {bits: verify(acks=[d / r / "acks" for r in runs], deliveries=[d / r / "deliveries" for r in runs],
                            spark=spark, bucket_bits=bits) for bits in (16, 1)}
    return d, reports


def _counts(report: Report) -> dict[str, int]:
    return {c.name: c.count for c in report.classes if c.count}


def test_blank_and_non_numeric_lines_are_malformed_at_their_line(hand_written: tuple[Path, dict[int, Report]]) -> None:
    _d, reports = hand_written
    for report in reports.values():
        by_name = {c.name: c for c in report.classes}
        assert by_name["malformed_row"].count == 2
        assert [e["at"] for e in by_name["malformed_row"].examples] == ["cm-0.tsv:3", "cm-0.tsv:4"]
        assert by_name["malformed_row"].examples[1]["text"] == _delivery("m", "cm", "x1")
        # nothing else is found on queue m: its good rows are read, whole and in order
        assert not [(c.name, k) for c in report.classes for q, _s, k in c.by_subscription if q == "m" and k]
        assert report.inputs.unreadable_rows == 2
        assert [(q.ack_rows, q.min_seq, q.max_seq) for q in report.queues if q.queue == "m"] == [(3, 0, 2)]
        assert [(s.deliveries, s.min_seq, s.max_seq) for s in report.subscriptions if s.queue == "m"] == [(3, 0, 2)]


def test_unacked_neighbours_in_out_of_order_acks(hand_written: tuple[Path, dict[int, Report]]) -> None:
    """Who acked the seqs around a never-acked one is read from the runs of acks in seq order
    the statistics keep; around seq 3 the acks are out of order (p1 acks 5 before 4), so the
    run holding 4 is unsure and the verifier reads the ack rows instead. Seq 3 sits inside
    p1's stream (a violation), seq 7 between p1 and p2 (in flight). The same in one bucket and
    in buckets of 2 (every neighbour across an edge). The reference agrees."""
    from ordq.spark_order_check.reference import check

    d, reports = hand_written
    for report in reports.values():
        assert _counts(report) == {"unacked": 1, "unacked_in_flight": 1, "malformed_row": 2}  # the latter: queue m's
        assert report["unacked"].by_subscription == (("q", "s", 1),)
        assert report["unacked"].examples[0] == {
            "queue": "q", "subscription": "s", "first_seq": 3, "last_seq": 3, "count": 1,
            "acked_before_by": "p1", "acked_after_by": "p1"}
        assert report["unacked_in_flight"].examples[0]["acked_after_by"] == "p2"
    assert {n: c for n, c in check(d / "neighbours" / "acks", d / "neighbours" / "deliveries").counts.items() if c} == {
        "unacked": 1, "unacked_in_flight": 1}


def test_a_subscription_is_judged_from_its_first_start_record(tmp_path: Path, spark: Any,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """An AUDIT_DIR's starts/ (docs/AUDIT_FORMAT.md, "starts") is read with it: an acked seq at
    or before where a subscription's first consumer began is ``before_subscribed`` (allowed),
    one after it that never came is lost, and a subscription without a start record is judged
    from seq 0, as the plain checker counts them (tests/test_audit_starts.py)."""
    from ordq.spark_order_check.reference import check
    from tests.test_audit_starts import written_run

    d = written_run(tmp_path / "run")
    code = ordq_main(["verify", str(d), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    got = {name: c["count"] for name, c in out["checks"].items() if c["count"]}
    assert got == {"lost": 1 + 8, "before_subscribed": 5}
    assert out["checks"]["before_subscribed"]["examples"] == [
        {"queue": "q", "subscription": "late", "first_seq": 0, "last_seq": 4, "count": 5}]
    plain = check(d / "acks", d / "deliveries", starts=d / "starts").counts
    assert {n: plain.get(n, 0) for n in AUDIT_CLASSES} == {n: out["checks"][n]["count"] for n in AUDIT_CLASSES}
