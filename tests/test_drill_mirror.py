"""The drill across data centres, ``mirror`` (drills/mirror_lab.py, issue 40).

Default run (no root, no cluster, a second): it is listed by ``ordq drill list`` and part of
``drill all``; where no lab can be made it is skipped with one line. Slow (root, ip netns,
iptables; a lab of two clusters on ten hosts, each with its three-node ZooKeeper ensemble):
the drill through ``ordq drill mirror``, judged by the copy check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ordq.cli import main
from ordq.drills import mirror_lab
from ordq.lab.lab import unavailable


def test_the_mirror_drill_is_listed_and_skipped_with_one_line_without_a_lab(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drill", "list", "--json"]) == 0
    rows = {row["drill"]: row for row in json.loads(capsys.readouterr().out)}
    assert "link between two data centres cut and healed" in rows["mirror"]["fault"]
    assert "ordq verify --copy-of" in rows["mirror"]["must_happen"]
    monkeypatch.setattr(mirror_lab, "unavailable", lambda: "not root")
    res = mirror_lab.run_mirror_drill(tmp_path, seed=1)
    assert res.ok and res.skipped and "not root" in res.verdict
    assert main(["drill", "mirror", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "0 passed, 0 failed, 1 skipped" in out, out


_NO_LAB = unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_LAB is not None, reason=f"the lab needs root, ip netns and iptables: {_NO_LAB}")
def test_the_mirror_drill_in_a_lab_of_two_centres(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["drill", "mirror", "--seed", "11", "--json"])
    doc = json.loads(capsys.readouterr().out)
    [row] = doc["drills"]
    assert code == 0, (row["verdict"], row["expectations"])
    assert row["name"] == "mirror" and row["verdict"].startswith("PASS")
    assert row["lost"] == 0 and row["reordered"] == 0 and row["duplicates"] == 0
    assert row["delivered"] == row["acked"] > 0
