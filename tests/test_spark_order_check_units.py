"""spark_order_check without Spark: inputs, errors, generator, report rendering."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import ordq.spark_order_check.generate
from ordq.cli import main as ordq_main
from ordq.common.errors import ConfigError
from ordq.spark_order_check import cli
from ordq.spark_order_check._files import list_local
from ordq.spark_order_check._verify import LineOrderUnavailable, _check_row_numbering
from ordq.spark_order_check.generate import Injections, Scenario, generate
from ordq.spark_order_check.report import CLASSES, ClassResult, Inputs, Latency, Report, SubscriptionStats


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_missing_path_is_one_error_line_before_spark_starts(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert ordq_main(["verify", str(tmp_path / "nope")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ordq verify: error: acks audit path does not exist: {tmp_path / 'nope' / 'acks'}"]


def test_directory_without_audit_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "acks").mkdir()
    (tmp_path / "deliveries").mkdir()
    _write(tmp_path / "acks" / "notes.txt", "not an audit file\n")
    assert cli.main([str(tmp_path)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no acks audit files (*.tsv, *.tsv.part) in" in err[0]


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == cli.EXIT_ERROR
    assert "give an AUDIT_DIR, or both --acks and --deliveries" in capsys.readouterr().err
    generate(tmp_path, Scenario(messages=100))
    assert cli.main([str(tmp_path), "--conf", "novalue"]) == cli.EXIT_ERROR
    assert "--conf wants KEY=VALUE" in capsys.readouterr().err


def test_python_m_entry_point_help() -> None:
    out = subprocess.run([sys.executable, "-m", "ordq.spark_order_check", "--help"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    out = " ".join(out.split())
    assert "--segments" in out and "--keyed" in out and "Exit 0 only when clean" in out


def test_listing_orders_files_and_finds_a_torn_tail(tmp_path: Path) -> None:
    header = "queue\tsubscription\tconsumer\tseq\tseg\toffset\tkey\tcrc32\tmsg_us\tdeliver_us\n"
    row = "q\ts\tw\t{}\t0\t0\t\t1\t10\t20\n"
    _write(tmp_path / "w-10.tsv", header + row.format(1))
    _write(tmp_path / "w-2.tsv", header + row.format(2))
    _write(tmp_path / "w-11.tsv.part", header + row.format(3) + row.format(4)[:-3])  # cut mid-field
    _write(tmp_path / "w-12.tsv.part", header + row.format(5))  # complete: crashed between rows
    _write(tmp_path / "other.csv", "x\n")
    files = list_local([str(tmp_path)], "deliveries")
    assert [(f.name, f.n, f.torn_row) for f in files] == [
        ("w-2.tsv", 2, None), ("w-10.tsv", 10, None), ("w-11.tsv.part", 11, 1), ("w-12.tsv.part", 12, None)]
    assert [f.name for f in list_local([str(tmp_path / "w-1*.tsv")], "deliveries")] == ["w-10.tsv"]


def test_the_same_file_name_twice_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "a" / "w-0.tsv", "h\n")
    _write(tmp_path / "b" / "w-0.tsv", "h\n")
    with pytest.raises(ConfigError, match="share the name w-0.tsv"):
        list_local([str(tmp_path / "a"), str(tmp_path / "b")], "acks")


def test_row_numbering_guard() -> None:
    class R:
        def __init__(self, fid: int, rows: int, lo: int, hi: int) -> None:
            self.fid, self.rows, self.min_row, self.max_row = fid, rows, lo, hi

    _check_row_numbering([R(0, 3, 0, 1), R(0, 2, 2, 4)], [])  # one file, split over two groups: fine
    with pytest.raises(LineOrderUnavailable):
        _check_row_numbering([R(0, 5, 3, 7)], [_FakeFile()])  # numbered from 3: packed after another file


class _FakeFile:
    path = "/x/w-0.tsv"


def test_generator_counts_and_layout(tmp_path: Path) -> None:
    sc = Scenario(keyed=("s2",))
    exp = generate(tmp_path, sc, Injections.every(2))
    assert exp.counts["duplicate"] == 2 and exp.counts["unacked"] == 4  # unacked: per subscription
    assert exp.counts["redelivered_after_takeover"] == 200 * 4 - 2 + 2  # - gaps + the zombie tail
    assert exp.counts["concurrent_consumers"] == 2
    parts = sorted(p.name for p in (tmp_path / "deliveries").glob("*.part"))
    assert parts == ["orders-s2-c2-1.tsv.part"]
    lines = (tmp_path / "deliveries" / parts[0]).read_text().split("\n")
    assert lines[-1].endswith("\t17") and len(lines[-1].split("\t")) == 10  # cut in its last field
    with pytest.raises(ValueError, match="keyed"):
        generate(tmp_path / "x", Scenario(), Injections(key_order=1))


def _generator_peak_bytes(directory: Path, messages: int) -> int:
    sc = Scenario(queues=("orders",), keyed=("s2",), messages=messages, rows_per_file=50_000)
    tracemalloc.start()
    try:
        exp = generate(directory, sc, Injections.every(3), latency=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exp.delivery_rows > 2 * messages  # every row was written
    return peak


def test_generator_memory_does_not_grow_with_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.5x the messages (~19k against ~13k rows), the writers' line buffers made small
    # (FLUSH_LINES) so that both runs fill them. Measured peaks under tracemalloc: 96 KB at 4k,
    # 6k and 8k messages (within 400 bytes); with a record kept per row, as the generator kept
    # before, 1.41 MB at 4k and 2.18 MB at 6k (3x the margin). With the 8192-line buffers it
    # took 20k against 30k messages to fill them: 34 s of CPU under tracemalloc; this, ~5 s.
    monkeypatch.setattr(ordq.spark_order_check.generate, "FLUSH_LINES", 256)
    small = _generator_peak_bytes(tmp_path / "small", 4_000)
    large = _generator_peak_bytes(tmp_path / "large", 6_000)
    assert large < small + 256 * 1024, (small, large)


def test_report_renders_summary_and_json() -> None:
    lat = Latency(count=3, p50_us=1000, p95_us=2000, p99_us=2500, max_us=3000, min_us=900, negative=0)
    classes = tuple(ClassResult(c.name, c.violation, 0, 0, (), ()) for c in CLASSES)
    classes = tuple(
        ClassResult("lost", True, 2, 1, (("q", "s", 2),), ({"queue": "q", "first_seq": 5},)) if c.name == "lost"
        else c for c in classes)
    report = Report(ok=False, classes=classes, inputs=Inputs(1, 1, 10, 8, 0), queues=(),
                    subscriptions=(SubscriptionStats("q", "s", 8, ("c1",), 0, 9, lat),), instances=(),
                    latency_method="exact", seconds=1.0, histogram=(("q", "s", 60, 8),))
    text = report.summary()
    assert text.splitlines()[0] == "ordq verify: FAIL (lost)"
    assert "queue=q first_seq=5" in text
    data = json.loads(report.to_json())
    assert data["violations"] == {"lost": 2}
    assert data["checks"]["lost"]["by_subscription"] == [{"queue": "q", "subscription": "s", "count": 2}]
    assert data["latency_histogram"] == [{"queue": "q", "subscription": "s", "low_us": 1000.0,
                                          "high_us": 1122.018, "count": 8}]
