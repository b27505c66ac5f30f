"""The verifier on a real Spark standalone cluster in the lab of hosts (ordq/lab/spark.py): a
master on h1, workers on h2 and h3 (1 core, 1g each), the driver (``ordq verify --master
spark://...``) on h4. Every process binds a lab address; the audits are on the filesystem all
hosts share, read as ``file://`` paths.

- the verdict on the cluster equals the verdict on ``local[2]`` for the same audits, every
  class counted alike (3 injected anomalies of each audit class), and the progress says one
  line per stage;
- a worker and its executor killed (kill -9) mid-job: the same verdict (Spark reruns the lost
  tasks on the other worker);
- the streaming source on the cluster: ``ordq verify --follow --master spark://...`` from h4
  checks a queue of an ordq cluster deployed in the same lab (ordq/lab/cluster.py), its tasks
  running in the executors on h2/h3, which hold no credentials of their own: the client
  certificate and the token reach them as files of the job (``ship_credentials``); a wrong
  token fails the query with the one-line refusal;
- docs/SPARK.md, "In the lab of hosts": ``ordq lab spark up|down`` start and remove the
  cluster, and a verify on it shows the output the doc shows.

Needs root, namespaces, PySpark and Java: skipped with one line elsewhere. Slow (JVMs on
four hosts): ``-m slow``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ordq.lab.lab import unavailable

_NO_LAB = unavailable()
if _NO_LAB:
    pytest.skip(f"the lab needs root, ip netns and iptables: {_NO_LAB}", allow_module_level=True)
pytest.importorskip("pyspark", reason="the Spark cluster needs PySpark: pip install 'ordq[spark]'")

from ordq.cli import main as ordq_main  # noqa: E402
from ordq.lab import Lab  # noqa: E402
from ordq.lab.cluster import HOSTS, LabCluster  # noqa: E402
from ordq.lab.netns import in_namespace  # noqa: E402
from ordq.lab.spark import LabSpark  # noqa: E402
from ordq.spark_order_check.generate import Expected, Injections, Scenario, generate  # noqa: E402
from ordq.spark_order_check.report import CLASSES  # noqa: E402
from tests.helpers.doc_blocks import check, parse_doc  # noqa: E402
from tests.util import wait_until  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

DRIVER = "h4"
SCENARIO = Scenario(keyed=("s2",))
# Large enough that a job outlasts a worker's death by many tasks, small enough for a loaded box.
BIG = Scenario(keyed=("s2",), messages=20_000, rows_per_file=2_000)
VERIFY_TIMEOUT_S = 2400.0  # at load 30+ on 2 cores one cluster verify of SCENARIO outlasted 20 min
EXECUTOR_CONF = ["--conf", "spark.driver.memory=768m", "--conf", "spark.executor.memory=768m"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    the_lab = Lab.create(tmp_path_factory.mktemp("lab"), hosts=HOSTS)  # an ordq cluster's 5 hosts
    try:
        yield the_lab
    finally:
        the_lab.down()


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[LabSpark]:
    started = time.monotonic()
    spark = LabSpark.start(lab)
    print(f"\nSpark master and 2 workers up in {time.monotonic() - started:.1f}s ({spark.master_url})")
    try:
        yield spark
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def ordq_cluster(lab: Lab) -> Iterator[LabCluster]:
    """An ordq cluster in the same lab (ZooKeeper, brokers and coordinators on h1-h3, beside
    Spark's daemons), for the streaming source; started only by the tests that use it."""
    started = time.monotonic()
    the_cluster = LabCluster.start(lab)
    print(f"\nordq cluster up in {time.monotonic() - started:.1f}s ({the_cluster.bootstrap})")
    try:
        yield the_cluster
    finally:
        the_cluster.stop()


def audits(folder: Path, scenario: Scenario) -> tuple[Path, Expected]:
    expected = generate(folder, scenario, Injections.every(3), latency=False)
    return folder, expected


def verify_args(run: Path, master: str) -> list[str]:
    return ["verify", f"file://{run}", "--keyed", "s2", "--master", master, "--json", *EXECUTOR_CONF]


def local_report(run: Path) -> dict[str, Any]:
    """The verdict of ``ordq verify --master local[2]`` in this machine's own namespace."""
    done = subprocess.run([sys.executable, "-m", "ordq.cli", *verify_args(run, "local[2]")], capture_output=True,
                          text=True, timeout=VERIFY_TIMEOUT_S, check=False)
    assert done.returncode == 1, done.stderr[-3000:]  # violations found: the anomalies
    report: dict[str, Any] = json.loads(done.stdout)
    return report


class Driver:
    """``ordq verify --master spark://...`` as a driver on h4 (a host of the lab); its stdout
    and stderr go to files (a pipe nobody reads would block it)."""

    def __init__(self, lab: Lab, cluster: LabSpark, run: Path) -> None:
        argv = in_namespace(lab.namespace(DRIVER), [sys.executable, "-m", "ordq.cli",
                                                    *verify_args(run, cluster.master_url)])
        self.out, self.err = run.parent / f"{run.name}.out", run.parent / f"{run.name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(argv, stdout=out, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def poll(self) -> int | None:
        return self.process.poll()

    def finish(self) -> tuple[int, str, str]:
        try:
            code = self.process.wait(timeout=VERIFY_TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return code, self.out.read_text(), self.err.read_text()


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on where Spark ran: ok, every class's count, findings, counts per
    subscription and examples, and the inputs' rows."""
    return {"ok": report["ok"], "inputs": report["inputs"],
            "classes": {name: (c["count"], c["findings"], c["by_subscription"], c["examples"])
                        for name, c in report["checks"].items()}}


def stage_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("stage ")]


def test_the_verdict_on_the_cluster_equals_local(lab: Lab, cluster: LabSpark, tmp_path: Path) -> None:
    run, expected = audits(tmp_path / "run", SCENARIO)
    code, out, err = Driver(lab, cluster, run).finish()
    assert code == 1, err[-3000:]
    on_cluster = json.loads(out)
    local = local_report(run)
    assert verdict(on_cluster) == verdict(local)
    assert {name: c["count"] for name, c in on_cluster["checks"].items()} == {c.name: expected.counts[c.name]
                                                                      for c in CLASSES}
    # One progress line per finished stage, the phases named; executors on both workers.
    lines = stage_lines(err)
    assert lines and all(" tasks" in line for line in lines), err[-3000:]
    assert any("[1 read, partition, statistics]" in line for line in lines), lines
    master_log = cluster.processes["master"].log_path.read_text()
    for host in cluster.layout.workers:
        assert f"-{lab.address(host)}-" in master_log.split("Registered app")[-1], f"no executor on {host}"


def test_ordq_reaches_the_executors_as_a_zip(lab: Lab, cluster: LabSpark) -> None:
    """The executors import ordq from the zip the driver shipped (in their work dir), not from
    an install."""
    script = (
        "import sys\n"
        "from ordq.spark_order_check._session import make_session\n"
        "s = make_session(sys.argv[1], conf={'spark.executor.memory': '768m'})\n"
        "def where(_):\n"
        "    import ordq, socket\n"
        "    return ordq.__file__\n"
        "print('\\n'.join(sorted(set(s.sparkContext.parallelize(range(8), 8).map(where).collect()))))\n"
        "s.stop()\n")
    out = lab.call(DRIVER, [sys.executable, "-c", script, cluster.master_url], timeout_s=VERIFY_TIMEOUT_S)
    paths = out.split()
    assert paths, out
    for path in paths:
        assert "/ordq.zip/ordq/__init__.py" in path and path.startswith(str(cluster.folder.resolve())), paths


STREAM_MESSAGES = 3000


def test_the_streaming_source_reads_the_lab_cluster_with_credentials_shipped_with_the_job(
        lab: Lab, cluster: LabSpark, ordq_cluster: LabCluster, tmp_path: Path) -> None:
    """``ordq verify --follow QUEUE --master spark://...`` from h4: the executors on h2/h3 read
    the queue from the brokers with the client certificate and the token the driver shipped
    (``SparkContext.addFile``; their copies are in the executors' work folders), never from a
    credentials file of theirs (the workers' environment names the test's, which knows nothing
    of this cluster). Tokens are enforced: only the shipped token lets them read. A wrong token
    fails in one line, from the CLI and as a query's failure (``failure_reason``)."""
    ordq_cluster.call(DRIVER, ["queue", "create", "ledger"])
    ordq_cluster.call(DRIVER, ["produce", "ledger", "--count", str(STREAM_MESSAGES)], timeout_s=300)
    created = json.loads(ordq_cluster.call(DRIVER, ["--json", "auth", "create", "--role", "consume:ledger"]))
    token_file = tmp_path / "reader.token"
    token_file.write_text(created["token"])
    out = ordq_cluster.call(DRIVER, [
        "--token-file", str(token_file), "--json", "verify", "--follow", "ledger", "--master", cluster.master_url,
        "--until-seq", str(STREAM_MESSAGES - 1), "--max-rows-per-batch", "1000", "--trigger", "2s",
        "--until", "20m", *EXECUTOR_CONF], timeout_s=VERIFY_TIMEOUT_S)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    verdict = events[-1]
    assert verdict["event"] == "verdict" and verdict["verdict"] == "clean", out[-3000:]
    assert verdict["rows"] == STREAM_MESSAGES and verdict["last_seq"] == STREAM_MESSAGES - 1, verdict
    # The tasks ran in the executors (a standalone driver runs none), which got the files there.
    shipped = {host: sorted(p.name for p in (cluster.folder / host / "work").glob("app-*/*/ordq-*"))
               for host in cluster.layout.workers}
    assert any(shipped.values()), shipped
    for names in shipped.values():
        assert not names or {n.rsplit("-", 1)[1] for n in names} == {"ca.pem", "cert.pem", "key.pem", "token"}, names
    # The token is in no log of the Spark daemons, executors and the driver: only in the files.
    logs = [*cluster.folder.rglob("std*"), *(lab.folder / "run").glob("*spark*.log")]
    assert logs and not [p for p in logs if created["token"] in p.read_text(errors="replace")], logs

    # A wrong token: refused in one line by the CLI before Spark starts ...
    wrong = "ordq_00000000_" + "A" * 43
    refused = subprocess.run(in_namespace(lab.namespace(DRIVER), ordq_cluster.client_argv(
        ["--token", wrong, "verify", "--follow", "ledger", "--master", cluster.master_url, "--until", "1m"])),
        capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-3000:]
    assert "permission denied" in refused.stderr, refused.stderr
    # ... and a query given it fails with the refusal as its one-line reason.
    script = (
        "import sys\n"
        "import attrs\n"
        "from ordq.common.security import lookup\n"
        "from ordq.spark_order_check._session import make_session\n"
        "from ordq.spark_source import failure_reason, register, ship_credentials\n"
        "master, zk, bootstrap, wrong = sys.argv[1:5]\n"
        "s = make_session(master, conf={'spark.executor.memory': '768m', 'spark.driver.memory': '768m'})\n"
        "register(s)\n"
        "options = ship_credentials(s, bootstrap=bootstrap, credentials=attrs.evolve(lookup(zk), token=wrong))\n"
        "q = (s.readStream.format('ordq').options(**options).option('queue', 'ledger').load()\n"
        "     .writeStream.format('noop').trigger(availableNow=True).start())\n"
        "try:\n"
        "    q.awaitTermination(600)\n"
        "except Exception:\n"
        "    pass\n"
        "print('REASON', failure_reason(q.exception()) if q.exception() else None)\n"
        "s.stop()\n")
    out = lab.call(DRIVER, ["env", *(f"{k}={v}" for k, v in ordq_cluster.client_env().items()), sys.executable,
                            "-c", script, cluster.master_url, ordq_cluster.zk_hosts, ordq_cluster.bootstrap, wrong],
                   timeout_s=VERIFY_TIMEOUT_S)
    reason = next(line for line in out.splitlines() if line.startswith("REASON "))[len("REASON "):]
    assert reason.startswith("PermissionDenied: permission denied"), out[-3000:]


def test_a_worker_killed_mid_job_changes_nothing(lab: Lab, cluster: LabSpark, tmp_path: Path) -> None:
    """kill -9 of the worker on h2 and its executor once the job has finished a stage: Spark
    reruns what was lost on h3; the verdict is the one local[2] gives. Last in this module: the
    cluster keeps one worker after it."""
    run, expected = audits(tmp_path / "big", BIG)
    driver = Driver(lab, cluster, run)
    try:
        victim = "h2"
        wait_until(lambda: cluster.executors(victim) or driver.poll() is not None, timeout_s=VERIFY_TIMEOUT_S,
                   interval_s=0.2, what="an executor on h2")
        assert driver.poll() is None, "the job ended before an executor started on h2"
        # Mid-job: the first stage has started on both executors (the phases' first job).
        wait_until(lambda: _stages_started(cluster) >= 1 or driver.poll() is not None, timeout_s=VERIFY_TIMEOUT_S,
                   interval_s=0.2, what="a task on h2")
        executors = cluster.executors(victim)
        os.kill(cluster.worker(victim).pid or -1, signal.SIGKILL)
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
        killed_while_running = driver.poll() is None
    finally:
        code, out, err = driver.finish()
    assert killed_while_running, "the job ended before the kill: nothing was tested"
    assert code == 1, err[-3000:]
    on_cluster = json.loads(out)
    assert {name: c["count"] for name, c in on_cluster["checks"].items()} == {c.name: expected.counts[c.name]
                                                                      for c in CLASSES}
    assert verdict(on_cluster) == verdict(local_report(run))
    assert "Lost executor" in err or "lost" in err.lower(), err[-3000:]


def _stages_started(cluster: LabSpark) -> int:
    """Tasks the executor on h2 has begun (its log: "Running task")."""
    logs = sorted((cluster.folder / "h2" / "work").glob("app-*/*/stderr"))
    return sum(p.read_text(errors="replace").count("Running task") for p in logs)


def test_the_cluster_section_of_spark_md_runs(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/SPARK.md, "In the lab of hosts": ``ordq lab up``, ``ordq lab spark up``, a verify
    from h4 on the cluster, ``ordq lab spark down`` (no Spark process left), ``ordq lab down``,
    with the output the doc shows. ``ordq`` runs in-process; what it starts writes to the same
    stdout."""
    path = "docs/SPARK.md"
    text = (ROOT / path).read_text()
    start = text.index("\n### In the lab of hosts\n")
    end = text.find("\n## ", start + 1)
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1 if end > 0 else 10**9
    steps = [s for b in parse_doc(path, text) if first <= b.line <= last for s in b.steps]
    assert [s.source.split()[:3] for s in steps] == [["ordq", "lab", "up"], ["ordq", "lab", "spark"],
                                                     ["ordq", "lab", "exec"], ["ordq", "lab", "spark"],
                                                     ["ordq", "lab", "down"]]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    generate(tmp_path / "run", SCENARIO, Injections.every(3), latency=False)
    spark_pids: list[int] = []
    try:
        for step in steps:
            capfd.readouterr()
            code = ordq_main(shlex.split(step.source)[1:])
            out = capfd.readouterr()
            mismatch = check(path, step, out.out + out.err, code)
            assert mismatch is None, str(mismatch)
            if step.source.startswith("ordq lab spark up"):
                spark = LabSpark.load(Lab.load(tmp_path / "lab"))
                spark_pids = [p for p in (q.pid for q in spark.processes.values()) if p]
                assert len(spark_pids) == 3
            if step.source.startswith("ordq lab spark down"):
                assert not any(_running(pid) for pid in spark_pids)
                assert not (tmp_path / "lab" / "spark").exists()
    finally:
        if (tmp_path / "lab" / "lab.json").exists():
            Lab.load(tmp_path / "lab").down()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
