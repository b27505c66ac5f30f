"""``ordq verify`` prints its verdict, not Spark's WARN lines (issue 42: a loopback hostname, no
native Hadoop library, how to change the log level); ``-v`` shows them. Two real verify
processes on a hand-written run of four messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parent.parent


def write_run(d: Path, n: int = 4) -> Path:
    (d / "acks").mkdir(parents=True)
    (d / "deliveries").mkdir()
    acks = [f"q\tp\t1\t{s}\t0\t{s}\t\t{100 + s}\t{1000 + s}\t{1010 + s}" for s in range(n)]
    got = [f"q\ts\tc\t{s}\t0\t{s}\t\t{100 + s}\t{1000 + s}\t{2000 + s}" for s in range(n)]
    (d / "acks" / "p-0.tsv").write_text("\n".join(["\t".join(ACK_COLUMNS), *acks]) + "\n")
    (d / "deliveries" / "c-0.tsv").write_text("\n".join(["\t".join(DELIVERY_COLUMNS), *got]) + "\n")
    return d


def verify(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True, timeout=1200,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_verify_hides_sparks_warn_lines_unless_verbose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run")
    monkeypatch.setenv("ORDQ_PROGRESS", "1")  # as on a terminal: Spark's start (seconds) is said
    done = verify("verify", str(run), "--master", "local[1]")
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout
    assert " WARN " not in done.stderr and "log4j" not in done.stderr and "setLogLevel" not in done.stderr, done.stderr
    assert done.stderr.count("ordq: verifying with Spark (local[1]): starting it and reading the audit files ...\n") \
        == 1, done.stderr
    loud = verify("-v", "verify", str(run), "--master", "local[1]")
    assert loud.returncode == 0, loud.stderr
    assert "Using Spark's default log4j profile" in loud.stderr
