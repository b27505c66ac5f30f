"""The plain Python checker (ordq.spark_order_check.reference) counts every audit-file class
exactly as the generator expects, as the Spark verifier does on the same data
(tests/test_spark_verify.py): the reference the verifier's speed is measured against is a
correct one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ordq.spark_order_check.generate import Injections, Scenario, generate
from ordq.spark_order_check.reference import check
from ordq.spark_order_check.report import AUDIT_CLASS_NAMES as AUDIT_CLASSES


def skips(d: Path) -> list[Path]:
    """The skip records, when the generator wrote some."""
    return [d / "skips"] if (d / "skips").exists() else []


@pytest.mark.parametrize("inject", [Injections(), Injections.every(3), Injections.every(10)],
                         ids=["clean", "every-3", "every-10"])
def test_counts_match_the_generator(tmp_path: Path, inject: Injections) -> None:
    scenario = Scenario(keyed=("s2",))
    expected = generate(tmp_path, scenario, inject)
    result = check(tmp_path / "acks", tmp_path / "deliveries", keyed=["s2"], skips=skips(tmp_path))
    got = {name: result.counts.get(name, 0) for name in AUDIT_CLASSES}
    want = {name: expected.counts[name] for name in AUDIT_CLASSES}
    assert got == want
    assert (result.ack_rows, result.delivery_rows) == (expected.ack_rows, expected.delivery_rows)


def test_unkeyed_scenario(tmp_path: Path) -> None:
    scenario = Scenario(messages=2000)
    expected = generate(tmp_path, scenario, Injections.every(2, keyed=False))
    result = check(tmp_path / "acks", tmp_path / "deliveries", skips=skips(tmp_path))
    assert {n: result.counts.get(n, 0) for n in AUDIT_CLASSES} == {n: expected.counts[n] for n in AUDIT_CLASSES}
