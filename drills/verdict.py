"""The one place a drill's verdict comes from: ``spark_order_check.verify`` over its audit files.

``Verifier`` keeps one SparkSession for a whole series of drills (a session costs 6–12 s to
start; a verification of a drill then takes a few seconds) and stops it on ``close()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


class Verifier:
    """``verifier(audit_dirs, report_path=None) -> spark_order_check.Report``.

    ``master``: as for spark-submit (default ``local[*]``); ``spark``: an existing session to
    use instead (e.g. the tests' one); ``log_path``: where the JVM's own output goes."""

    def __init__(self, *, master: str | None = None, log_path: Path | None = None, spark: Any = None) -> None:
        self.master = master
        self.log_path = log_path  # where Spark's own output goes (None: this process's stdout/stderr)
        self._session: Any = spark  # a session given here is used, never stopped
        self._own = spark is None

    def __call__(self, audit_dirs: Sequence[Path], *, report_path: Path | None = None) -> Any:
        """Verify the runs whose audit folders (``acks/``, ``deliveries/``, ``skips/`` when a
        consumer parked, ``starts/`` where consumers began) are given, in one job."""
        from ordq import spark_order_check
        from ordq.spark_order_check.cli import side_dirs

        skips, starts = (side_dirs([str(d) for d in audit_dirs], kind) for kind in ("skips", "starts"))
        # A keyed-topic run names its topic in ``topics`` (one per line): checked per key too.
        topics = [t for d in audit_dirs if (d / "topics").is_file()
                  for t in (d / "topics").read_text(encoding="ascii").split()]
        return spark_order_check.verify(acks=[d / "acks" for d in audit_dirs],
                                        deliveries=[d / "deliveries" for d in audit_dirs], skips=skips or None,
                                        starts=starts or None,
                                        topics=topics, spark=self._spark(), report_path=report_path)

    def _spark(self) -> Any:
        if self._session is None:
            from ordq.spark_order_check._session import make_session, running_session

            # A session already running in this process (an in-process ``ordq demo`` in the
            # tests) is used and never stopped: getOrCreate would hand it over all the same.
            self._session = running_session()
            self._own = self._session is None
        if self._session is None:

            # Drill inputs are small: few shuffle partitions, and the C1 JIT only (C2 spent more
            # CPU compiling Spark's generated code than it saved; tests/spark_fixtures.py).
            conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
            with _output_to(self.log_path):  # the JVM inherits stdout/stderr when it starts
                self._session = make_session(self.master, conf=conf, app_name="ordq-drills")
                self._session.sparkContext.setLogLevel("ERROR")
        return self._session

    def close(self) -> None:
        if self._session is not None and self._own:
            with contextlib.suppress(Exception):
                self._session.stop()
            self._session = None

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` meanwhile (for child processes started now)."""
    if path is None:
        yield
        return
    import os
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
