"""The verdict of lab drills from the lab's own Spark cluster (issue 44): ``ordq drill part-*
--spark-cluster``.

``LabSparkVerifier`` has the interface of ``drills.verdict.Verifier`` (``verifier(audit_dirs,
report_path=None) -> Report``), but verifies on a Spark standalone cluster started in the
drill's lab (``ordq.lab.spark.LabSpark``: a master on h1, workers on h2 and h3): the driver is
``ordq verify AUDIT_DIR... --master spark://... --json`` run inside a client host of the lab,
the audits are read by the executors from the filesystem every host of the lab shares, and
ordq's code reaches them as a zip with the job. The report comes back as the JSON the command
printed (``Report.from_dict``), with the stage lines Spark's progress gave.

Guarantees: the verdict is the verifier's, as on ``local[*]`` (tests/test_lab_spark.py compares
the two); a driver that fails (exit 2: Spark or an option failed) raises OrdqError with its
last line, never a verdict made up; ``close()`` stops the Spark cluster.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ordq.common.errors import ExternalProcessError
from ordq.common.proc import load_stretched
from ordq.lab.cluster import LabCluster, ordq_command
from ordq.lab.netns import in_namespace
from ordq.lab.spark import LabSpark

VERIFY_TIMEOUT_S = 1200.0  # stretched by the load: JVMs on four hosts of a 2-core machine
# The driver's and each executor's heap: the workers offer 1g each, the lab holds a whole cluster.
SPARK_CONF = ("spark.driver.memory=768m", "spark.executor.memory=768m")


class LabSparkVerifier:
    """Verifies audit folders on ``spark`` (a cluster in ``cluster``'s lab) from the driver
    host ``host`` (default: the cluster's consumer host)."""

    def __init__(self, cluster: LabCluster, spark: LabSpark, *, host: str | None = None,
                 out: TextIO | None = None) -> None:
        self.cluster, self.spark = cluster, spark
        self.host = host or cluster.layout.consumer_host
        self.out = out
        self.stage_lines: list[str] = []

    @classmethod
    def start(cls, cluster: LabCluster, *, out: TextIO | None = None) -> LabSparkVerifier:
        """Start the Spark cluster in ``cluster``'s lab (ExternalProcessError when it does not
        come up; nothing of it is left then)."""
        spark = LabSpark.start(cluster.lab)
        if out is not None:
            out.write(f"Spark cluster {spark.master_url} up in the lab (workers on "
                      f"{', '.join(spark.layout.workers)}): the verdict comes from it\n")
            out.flush()
        return cls(cluster, spark, out=out)

    def argv(self, audit_dirs: Sequence[Path], report_path: Path | None) -> list[str]:
        argv = [ordq_command(), "verify", *(str(d) for d in audit_dirs), "--master", self.spark.master_url, "--json",
                "--progress"]
        for item in SPARK_CONF:
            argv += ["--conf", item]
        if report_path is not None:
            argv += ["--report", str(report_path)]
        return argv

    def __call__(self, audit_dirs: Sequence[Path], *, report_path: Path | None = None) -> Any:
        from ordq.spark_order_check.report import Report

        timeout_s = load_stretched(VERIFY_TIMEOUT_S, most=3.0)
        try:
            argv = in_namespace(self.cluster.lab.namespace(self.host), self.argv(audit_dirs, report_path))
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ExternalProcessError(f"ordq verify on the lab's Spark cluster outlasted {timeout_s:.0f}s") from None
        lines = [line for line in done.stderr.splitlines() if line.startswith("stage ")]
        self.stage_lines += lines
        if self.out is not None:
            for line in lines:
                self.out.write(f"    spark {line}\n")
            self.out.flush()
        if done.returncode not in (0, 1):  # 0 clean, 1 violations: a verdict; anything else is none
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise ExternalProcessError(f"ordq verify on the lab's Spark cluster failed: {last}")
        return Report.from_dict(json.loads(done.stdout))

    def close(self) -> None:
        self.spark.stop()

    def __enter__(self) -> LabSparkVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
