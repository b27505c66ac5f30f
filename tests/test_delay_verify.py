"""The verifier's ``delivered_early`` class (delayed delivery, issue 41) on hand-written audit
files, in one Spark job (they are slow on a loaded box): a delivery handed out before its
``due_us`` is caught, with where and by how much; a delayed queue on time and in order has no
finding; and the order check holds for delayed deliveries (a reorder among them is
``out_of_order``). Rows without the ``due_us`` column (files written
before it) still read. The reference checker counts the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ordq.cli import main as ordq_main
from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
from ordq.spark_order_check import reference
from tests import spark_fixtures

pytestmark = pytest.mark.spark
spark = spark_fixtures.spark

N = 8
T0 = 1_000_000  # the messages' timestamps: T0 + seq
DELAY = 500_000  # due = timestamp + 0.5 s


def ack(q: str, seq: int) -> str:
    return f"{q}\tprod-{q}\t1\t{seq}\t0\t{seq}\t\t{100 + seq}\t{T0 + seq}\t{T0 + seq + 10}"


def delivery(q: str, seq: int, at_us: int, due: int | None, *, legacy: bool = False) -> str:
    row = f"{q}\ts\tc-{q}\t{seq}\t0\t{seq}\t\t{100 + seq}\t{T0 + seq}\t{at_us}"
    return row if legacy else f"{row}\t{'' if due is None else due}"


def write_run(d: Path, rows: dict[str, list[str]]) -> Path:
    (d / "acks").mkdir(parents=True)
    (d / "deliveries").mkdir()
    for q, delivered in rows.items():
        acks = [ack(q, seq) for seq in range(N)]
        (d / "acks" / f"prod-{q}-0.tsv").write_text("\n".join(["\t".join(ACK_COLUMNS), *acks]) + "\n")
        (d / "deliveries" / f"c-{q}-0.tsv").write_text("\n".join(["\t".join(DELIVERY_COLUMNS), *delivered]) + "\n")
    return d


def on_time(q: str, seqs: list[int]) -> list[str]:
    """Each delivered 1 ms after its due time (timestamp + DELAY), in the order given."""
    return [delivery(q, s, T0 + s + DELAY + 1000 + i, T0 + s + DELAY) for i, s in enumerate(seqs)]


def test_an_early_delivery_is_caught_and_order_is_checked(tmp_path: Path, spark: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = {
        "ok": on_time("ok", list(range(N))),
        "early": on_time("early", list(range(N))),
        "reorder": on_time("reorder", [0, 2, 1, *range(3, N)]),
    }
    # seq 3 of "early" handed out 2 ms before it was due (an injected early delivery)
    rows["early"][3] = delivery("early", 3, T0 + 3 + DELAY - 2000, T0 + 3 + DELAY)
    # "ok" also holds a message with no due time and rows written before the due_us column
    rows["ok"][0] = delivery("ok", 0, T0 + 50, None)
    rows["ok"][1] = delivery("ok", 1, T0 + 60, None, legacy=True)
    d = write_run(tmp_path, rows)

    report_path = tmp_path / "report.json"
    code = ordq_main(["verify", str(d), "--report", str(report_path)])
    assert code == 1, capsys.readouterr()
    report = json.loads(report_path.read_text())
    found = {name: {(b["queue"], b["count"]) for b in check["by_subscription"]}
             for name, check in report["checks"].items() if check["violation"] and check["count"]}
    assert found == {"delivered_early": {("early", 1)}, "out_of_order": {("reorder", 1)}}
    assert report["checks"]["delivered_early"]["examples"] == [{
        "queue": "early", "subscription": "s", "consumer": "c-early", "seq": 3, "at": "c-early-0.tsv:5",
        "early_us": 2000}]

    counts = reference.check(d / "acks", d / "deliveries").counts
    assert counts["delivered_early"] == 1 and counts["out_of_order"] == 1
    assert counts.get("malformed_row", 0) == 0  # the row without due_us read

