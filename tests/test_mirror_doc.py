"""docs/OPERATIONS.md, "Replicating to another data centre", run as written (issue 40): two
local clusters on loopback (the doc's DC1 on the session's ZooKeeper port, DC2 on another free
port), two mirror instances, the leader killed mid-stream, the copy checked by the verifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from ordq.zk_server import free_ports
from tests.helpers.doc_blocks import Step, parse_doc
from tests.helpers.doc_session import DocSession, run_doc
from tests.test_docs import doc_section

SECTION = "## Replicating to another data centre"
CDC_SUBSECTION = "### Database to database across centres"


@pytest.mark.slow
@pytest.mark.zk
def test_replicating_to_another_data_centre_runs_as_written(tmp_path: Path) -> None:
    text = doc_section("docs/OPERATIONS.md", SECTION)
    # Its subsection "Database to database across centres" is tests/test_cdc_mirror.py's.
    text = text[:text.index(CDC_SUBSECTION)] + "\n"
    assert [b for b in parse_doc("docs/OPERATIONS.md", text) if b.runs]
    with DocSession(tmp_path / "run", doc="docs/OPERATIONS.md") as session:
        [port] = free_ports(1)
        out, code = session.run(Step("run", f"export DC2=127.0.0.1:{port}", 0, None), timeout_s=10)
        assert code == 0, out
        for run in run_doc(session, text):
            assert run.mismatch is None, run.mismatch.render()
