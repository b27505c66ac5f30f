"""The SparkSession the verifier runs in, and the scan settings it needs while it runs."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyspark
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# Above any split size: Spark then never packs two audit files into one partition (_scan.py).
OPEN_COST_BYTES = 1 << 40


def running_session() -> SparkSession | None:
    """The SparkSession this process already runs, if any, from whichever thread made it
    (``getActiveSession`` sees only the current thread's): a caller that finds one uses it and
    never stops it (it belongs to whoever made it: a test session, an in-process demo)."""
    running = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if running is None or running.sparkContext._jsc is None:  # none, or stopped
        return None
    return running


@functools.cache
def worker_python() -> str:
    """The program Spark starts its Python workers with in a local session: this interpreter
    (they must import ordq), importing pyspark and py4j from the installed packages rather than
    from Spark's zipped copies of them.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every worker's
    PYTHONPATH, and Python compiles what it imports from a zip anew at each start: it never
    caches that bytecode. The streaming source's own worker (and a data source's planner) is a
    fresh interpreter per query that Spark waits a fixed 10 s for, no setting changes that in
    Spark 4 (PythonWorkerFactory.createSimpleWorker): its imports took 1.6-1.9 s of CPU from the
    zip against 0.5-0.65 s from the installed package (measured at load 8-10), and beside six
    busy loops it connected back too late (issue 26). When SPARK_HOME is the installed pyspark
    package itself (a pip install), the zips hold the same files as the package, so a small
    launcher drops them from PYTHONPATH and runs this interpreter; with a Spark distribution of
    its own, its zips are kept and this interpreter is started as it is."""
    home = Path(_find_spark_home()).resolve()
    if home != Path(pyspark.__file__).resolve().parent:
        return sys.executable
    folder = Path(tempfile.mkdtemp(prefix="ordq-spark-python-"))
    atexit.register(shutil.rmtree, folder, True)
    launcher = folder / "python"
    # POSIX sh, no other program. The zips are matched by their names under any spelling of
    # SPARK_HOME (a linked venv); every other PYTHONPATH entry is kept, in its order.
    launcher.write_text(
        "#!/bin/sh\n"
        "# ordq (spark_order_check/_session.py): Spark's Python workers import pyspark and py4j\n"
        "# from the installed packages, whose bytecode is cached, not from Spark's zips.\n"
        "set -f\nIFS=:\nkept=\n"
        "for entry in $PYTHONPATH; do\n"
        "    case \"$entry\" in\n"
        "    */python/lib/pyspark.zip|*/python/lib/py4j-*-src.zip) ;;\n"
        "    *) kept=\"${kept:+$kept:}$entry\" ;;\n"
        "    esac\n"
        "done\n"
        "unset IFS\nPYTHONPATH=$kept\nexport PYTHONPATH\n"
        f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    launcher.chmod(0o755)
    return str(launcher) if os.access(launcher, os.X_OK) else sys.executable  # a noexec temp folder


QUIET_LOG4J = """\
# ordq (spark_order_check/_session.py): the driver JVM prints errors only, unless -v.
# The root level stays WARN: a PySpark driver counts as a shell, and a shell whose root level is
# not WARN says "Setting default log level to ..." and how to change it; the appender's
# threshold drops the WARN lines instead.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
appender.stderr.filter.threshold.type = ThresholdFilter
appender.stderr.filter.threshold.level = error
"""


@functools.cache
def quiet_log4j() -> str:
    """A log4j2 configuration file (in a temporary folder removed at exit) for a driver JVM
    that logs errors only."""
    folder = Path(tempfile.mkdtemp(prefix="ordq-spark-log4j-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "log4j2.properties"
    path.write_text(QUIET_LOG4J)
    return str(path)


def make_session(master: str | None = None, *, conf: Mapping[str, str] | None = None,
                 driver_memory: str | None = None, app_name: str = "ordq-verify",
                 small_input: bool = False, quiet: bool | None = None) -> SparkSession:
    """Get or create a session. ``master=None`` keeps what spark-submit chose, else ``local[*]``.

    Local masters bind the driver to 127.0.0.1, run without the web UI and with the parallel
    garbage collector, and for a ``small_input`` (under one partition's worth) with the C1 JIT
    only; ``conf`` entries win over every default here. ``quiet``: the driver JVM logs errors
    only (default: unless INFO is on, the CLI's -v), not Spark's WARN lines at start.
    """
    builder = SparkSession.builder.appName(app_name)
    launched_by_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not launched_by_submit:
        master = DEFAULT_MASTER
    settings: dict[str, str] = {"spark.ui.showConsoleProgress": "false"}
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            settings.update({
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false",
                # The throughput collector: the verification is a batch job with no pause goal.
                # Measured at 10^7 messages on local[2]: 82 s of JVM + driver CPU against 92 s
                # with the default G1 (docs/BENCHMARKS.md). Only the driver JVM runs in local mode.
                # C1 only for small inputs: C2 spent more CPU compiling Spark's generated code
                # than it saved (tests/spark_fixtures.py; ~2x less CPU for a 1 MB verify).
                "spark.driver.extraJavaOptions": "-XX:+UseParallelGC"
                                                 + (" -XX:TieredStopAtLevel=1" if small_input else ""),
                "spark.pyspark.python": worker_python(),
            })
        else:
            settings.update(cluster_settings(master, conf or {}, small_input=small_input))
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    if quiet is None:  # the CLI's -v turns library messages on: the JVM's are library messages too
        quiet = not logging.getLogger().isEnabledFor(logging.INFO)
    if quiet:
        # Spark's JVM logs WARN lines at start (a loopback hostname, no native Hadoop library) and
        # tells how to change its level; an operator's verify printed them (issue 42).
        java = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{java} -Dlog4j2.configurationFile={quiet_log4j()}".strip()
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    if master is None or not master.startswith("local"):
        # The planner of a Python data source (the ordq streaming source) runs on the driver's
        # host in the interpreter the driver JVM finds in PYSPARK_PYTHON (``spark.pyspark.python``
        # is not read for it), and PySpark's own default for the executors' Python functions is
        # that variable too: without it both are ``python3`` from PATH, which lacks ordq's
        # dependencies (measured in the lab: ModuleNotFoundError for prometheus_client). Set
        # meanwhile, as for a local master, to the executors' interpreter.
        python = settings.get("spark.pyspark.python")
        if "PYSPARK_PYTHON" in os.environ or python is None:
            session = builder.getOrCreate()
        else:
            os.environ["PYSPARK_PYTHON"] = python
            try:
                session = builder.getOrCreate()
            finally:
                del os.environ["PYSPARK_PYTHON"]
        ship_code(session)
        return session
    if "PYSPARK_PYTHON" in os.environ:
        return builder.getOrCreate()
    # Python workers (and the planner of a Python data source) run this interpreter: by default
    # Spark starts ``python3`` from PATH, which may lack ordq's dependencies (the ordq streaming
    # source needs them). PySpark reads it from the environment when the session starts (as
    # does the JVM it launches), and only then: it is set meanwhile, so that what this process
    # starts later does not inherit a launcher that goes when this process ends.
    os.environ["PYSPARK_PYTHON"] = worker_python()
    try:
        return builder.getOrCreate()
    finally:
        del os.environ["PYSPARK_PYTHON"]


def cluster_settings(master: str, conf: Mapping[str, str], *, small_input: bool = False) -> dict[str, str]:
    """Defaults for a session on a cluster master (``spark://``, ``yarn``, ``k8s://``): the
    driver's address as executors on other hosts reach it (the route to a ``spark://``
    master's host; ``SPARK_LOCAL_IP`` or a ``spark.driver.host`` given wins), and the
    executors' Python: this interpreter's path unless ``spark.pyspark.python`` (or
    ``PYSPARK_PYTHON``) names theirs. ordq itself is not needed there: ``ship_code`` sends it.
    The JVMs (driver, executors) as in a local session: the parallel collector, and C1 only
    for a ``small_input``."""
    from ordq.spark_order_check._ship import driver_address

    out: dict[str, str] = {}
    address = None if "spark.driver.host" in conf or os.environ.get("SPARK_LOCAL_IP") else driver_address(master)
    if address is not None:
        out.update({"spark.driver.host": address, "spark.driver.bindAddress": address})
    if "PYSPARK_PYTHON" not in os.environ and "spark.pyspark.python" not in conf:
        out["spark.pyspark.python"] = sys.executable
    java = "-XX:+UseParallelGC" + (" -XX:TieredStopAtLevel=1" if small_input else "")
    out.update({"spark.driver.extraJavaOptions": java, "spark.executor.extraJavaOptions": java})
    return out


def ship_code(session: SparkSession) -> None:
    """Send ordq's code to the executors as a zip (``SparkContext.addPyFile``), unless the
    session's ``spark.ordq.shipCode`` is ``false`` (executors with ordq installed) or a session
    already running got it."""
    from ordq.spark_order_check._ship import SHIP_CONF, code_zip

    sc = session.sparkContext
    if sc.getConf().get(SHIP_CONF, "true").lower() == "false" or getattr(sc, "_ordq_shipped", False):
        return
    sc.addPyFile(str(code_zip()))
    sc._ordq_shipped = True  # type: ignore[attr-defined]


PARTITION_INPUT_BYTES = 256 << 20


def default_partitions(spark: SparkSession, input_bytes: int) -> int:
    """Shuffle partitions for the verification: ~256 MiB of audit input each, a multiple of the
    cores (no last wave with idle cores). Every query over the input table runs one task per
    partition: at 10^7 messages on local[2], 8 partitions against 28 (64 MiB each) took
    44.9 s against 65.6 s (71 against 76 CPU seconds; docs/BENCHMARKS.md); a partition's
    per-seq hash aggregation holds ~1.5M seqs."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    wanted = min(4000, -(-input_bytes // PARTITION_INPUT_BYTES))
    return max(cores, -(-wanted // cores) * cores)


@contextmanager
def scan_settings(spark: SparkSession, *, partitions: int) -> Iterator[None]:
    """Set the options the verification relies on; restore the old ones after.

    - the file-scan options the line numbering relies on (_scan.py);
    - a fixed number of shuffle partitions with adaptive execution off: every plan is
      partitioned once, by (queue, bucket), and must keep that partitioning; adaptive execution
      would also split each query into one job per stage, which dominates on small inputs.
    """
    wanted: dict[str, str | None] = {
        "spark.sql.files.openCostInBytes": str(OPEN_COST_BYTES),
        # Text files are splittable: a split size above any file keeps each file whole.
        "spark.sql.files.maxPartitionBytes": str(OPEN_COST_BYTES),
        # When set, Spark may regroup files into fewer partitions: it must be off.
        "spark.sql.files.maxPartitionNum": None,
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": "false",
    }
    def apply(values: Mapping[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)

    saved = {k: spark.conf.get(k, None) for k in wanted}
    try:
        apply(wanted)
        yield
    finally:
        apply(saved)
