"""The CDC path across two data centres (issue 40): MariaDB in centre 1 -> ``ordq cdc mysql`` ->
queue -> ``ordq mirror`` -> queue in centre 2 -> ``ordq cdc apply`` -> PostgreSQL in centre 2,
through kills on both sides and a link cut (drills/cdc_mirror.py), as docs/OPERATIONS.md's
"Database to database across centres" shows it with ``ordq demo --mirror`` (`make demo-mirror`).

Heavy (Spark, database servers, two clusters): ``make test-heavy``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ordq.cli import main
from tests.helpers.doc_blocks import parse_doc
from tests.helpers.doc_session import DocSession, run_doc, step_timeout_s
from tests.test_docs import ROOT, doc_section

SECTION = "### Database to database across centres"


def _why_not() -> str | None:
    from ordq.common.errors import ConfigError
    from ordq.drills.cdc_mirror import require_all

    try:
        require_all()
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.zk
@pytest.mark.spark
@pytest.mark.timeout(2400)
@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_database_to_database_across_centres_runs_as_written(tmp_path: Path) -> None:
    """The doc's `ordq demo --mirror`: the tables equal at the end, every acked row change once,
    in order, in centre 2, through the shipper, mirror, applier and both head masters killed
    and the link cut (its console block checks each of those lines)."""
    assert "\t$(VENV)/bin/ordq demo --mirror\n" in (ROOT / "Makefile").read_text()  # what make demo-mirror runs
    text = doc_section("docs/OPERATIONS.md", SECTION)
    assert [b for b in parse_doc("docs/OPERATIONS.md", text) if b.runs]
    with DocSession(tmp_path / "run", doc="docs/OPERATIONS.md") as session:
        # Two clusters, two database servers, the run and a Spark verdict in one step: minutes
        # (11 at load 32), so a longer step limit than a doc's usual one.
        for run in run_doc(session, text, timeout_s=step_timeout_s(480)):
            assert run.mismatch is None, run.mismatch.render() + f"\n(files: {session.folder})"


def test_the_drill_without_root_or_iptables_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import ordq.drills.cdc_mirror

    monkeypatch.setattr(ordq.drills.cdc_mirror, "require_servers", lambda: None)
    which = shutil.which
    monkeypatch.setattr(ordq.drills.cdc_mirror.shutil, "which",
                        lambda name: None if name == "iptables" else which(name))
    assert main(["demo", "--mirror", "--dir", "unused"]) == 1
    assert capsys.readouterr().err == ("ordq: error: the cdc-mirror drill cuts the link between the centres with "
                                       "iptables: it needs root, iptables and setpriv (make test-deps; run as "
                                       "root)\n")
