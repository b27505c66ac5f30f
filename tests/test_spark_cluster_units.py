"""The pure parts of running the verifier on a Spark cluster (issue 44), without a Spark
start: the code zip, the driver's address, the session settings of a cluster master, the
refusal of Spark Connect, the lab cluster's layout checks. The cluster itself:
tests/test_lab_spark.py (slow, in the lab)."""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest

from ordq.cli import main as ordq_main
from ordq.common.errors import ConfigError
from ordq.lab.spark import SparkLayout
from ordq.spark_order_check._ship import code_zip, driver_address
from ordq.spark_order_check.cli import is_cluster


def test_the_code_zip_holds_the_package_through_its_linked_folders() -> None:
    import ordq

    names = set(zipfile.ZipFile(code_zip()).namelist())
    root = Path(ordq.__file__).parent
    assert "ordq/__init__.py" in names
    # ordq/coordinator, ordq/sdk, ordq/spark_order_check are links to top-level folders.
    for linked in ("coordinator", "sdk", "spark_order_check", "broker_group"):
        assert (root / linked).is_symlink() or (root / linked).is_dir()
        assert f"ordq/{linked}/__init__.py" in names
    assert "ordq/spark_source.py" in names and "ordq/lab/spark.py" in names
    assert not any(n.endswith(".pyc") or "__pycache__" in n for n in names)
    assert code_zip() == code_zip()  # built once per process


def test_the_driver_address_is_the_route_to_the_master() -> None:
    assert driver_address("spark://127.0.0.1:7077") == "127.0.0.1"
    assert driver_address("spark://127.0.0.1:7077,127.0.0.2:7077") == "127.0.0.1"
    for master in ("local[2]", "yarn", "k8s://https://api:6443"):
        assert driver_address(master) is None


def test_cluster_settings() -> None:
    from ordq.spark_order_check._session import cluster_settings

    got = cluster_settings("spark://127.0.0.1:7077", {}, small_input=True)
    assert got["spark.driver.host"] == got["spark.driver.bindAddress"] == "127.0.0.1"
    assert got["spark.pyspark.python"] == sys.executable
    assert "-XX:TieredStopAtLevel=1" in got["spark.executor.extraJavaOptions"]
    given = cluster_settings("spark://127.0.0.1:7077", {"spark.driver.host": "10.0.0.9",
                                                         "spark.pyspark.python": "/opt/py"})
    assert "spark.driver.host" not in given and "spark.pyspark.python" not in given
    assert "TieredStopAtLevel" not in given["spark.executor.extraJavaOptions"]
    assert is_cluster("spark://h:7077") and is_cluster("yarn")
    assert not is_cluster("local[2]") and not is_cluster(None)


def test_spark_connect_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyspark")
    assert ordq_main(["verify", str(tmp_path), "--remote", "sc://h:15002"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Spark Connect is not supported" in err and "--master" in err


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": ()}, "at least one worker"),
    ({"workers": ("h2", "h2")}, "one worker at most"),
    ({"cores": 0}, "at least one core"),
    ({"memory": "lots"}, "512m or 1g"),
])
def test_a_bad_layout_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SparkLayout(**kwargs)  # type: ignore[arg-type]


@pytest.mark.spark
def test_progress_prints_one_line_per_stage_named_by_phase(tmp_path: Path) -> None:
    """``verify(progress=...)`` on local[2]: every line a finished stage, the phases named."""
    import io

    from ordq.spark_order_check import verify
    from ordq.spark_order_check.generate import Scenario, generate

    generate(tmp_path / "run", Scenario(), latency=False)  # clean: 2,000 seqs a queue
    out = io.StringIO()
    report = verify(acks=tmp_path / "run" / "acks", deliveries=tmp_path / "run" / "deliveries", master="local[2]",
                    progress=out)
    assert report.ok
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("stage ") and " tasks in " in line for line in lines), lines
    named = {line[line.rindex("[") + 1:-1] for line in lines if line.endswith("]")}
    assert {"1 read, partition, statistics", "3 findings, counts"} <= named, lines


@pytest.mark.parametrize(("options", "message"), [
    ({"credentialsFrom": "job"}, "needs .option('bootstrap'"),
    ({"bootstrap": "h:1", "credentialsFrom": "host"}, "credentialsFrom 'host': one of registered, job"),
    ({"bootstrap": "h:1", "tokenFile": "t"}, "give .option('credentialsFrom', 'job') with them"),
])
def test_credentials_options_are_checked_when_the_query_starts(options: dict[str, str], message: str) -> None:
    from ordq.spark_source import SourceOptions

    with pytest.raises(ConfigError, match=re.escape(message)):
        SourceOptions.parse({"queue": "q", **options})


def test_shipped_credentials_are_read_from_the_jobs_files_only(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``credentialsFrom=job`` the credentials are the job's copies (``SparkFiles.get``),
    a missing one a one-line ConfigError; a path is no file name of the job."""
    from pyspark import SparkFiles

    from ordq.spark_source import SourceOptions

    (tmp_path / "ordq-x-ca.pem").write_text("CA")
    (tmp_path / "ordq-x-token").write_text("ordq_token\n")
    monkeypatch.setattr(SparkFiles, "_root_directory", str(tmp_path))
    monkeypatch.setattr(SparkFiles, "_is_running_on_worker", True)
    o = SourceOptions.parse({"queue": "q", "bootstrap": "h:1", "credentialsFrom": "job", "caFile": "ordq-x-ca.pem",
                             "tokenFile": "ordq-x-token"})
    creds = o.credentials()
    assert creds is not None and creds.ca_file == str(tmp_path / "ordq-x-ca.pem") and creds.token == "ordq_token"
    assert creds.cert_file is None and creds.key_file is None
    assert SourceOptions.parse({"queue": "q", "bootstrap": "h:1"}).credentials() is None  # looked up as registered
    missing = SourceOptions.parse({"queue": "q", "bootstrap": "h:1", "credentialsFrom": "job", "caFile": "gone.pem"})
    with pytest.raises(ConfigError, match="the file gone.pem did not come with the job"):
        missing.credentials()
    path = SourceOptions.parse({"queue": "q", "bootstrap": "h:1", "credentialsFrom": "job", "caFile": "/etc/ca.pem"})
    with pytest.raises(ConfigError, match="is not the name of a file shipped with the job"):
        path.credentials()


def test_the_failure_reason_is_the_ordq_error_in_sparks_trace() -> None:
    from ordq.spark_source import failure_reason

    trace = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_"
             "RUNTIME_ERROR] Failed when Python streaming data source perform initialOffset: Traceback (most "
             "recent call last):\n  File \"/x/spark_source.py\", line 500, in initialOffset\n"
             "ordq.common.errors.PermissionDenied: permission denied: 'consume' on queue 'q': unknown token\n"
             "\tat org.apache.spark.sql.execution.python.PythonStreamingSourceRunner.x(Runner.scala:1)\n")
    assert failure_reason(RuntimeError(trace)) == ("PermissionDenied: permission denied: 'consume' on queue 'q': "
                                                   "unknown token")
    assert failure_reason(RuntimeError("GapDetected: queue 'q': expected seq 5, got 7")).startswith("GapDetected: ")
    assert failure_reason(RuntimeError("first line\nsecond")) == "first line"


def test_a_report_comes_back_whole_from_its_json() -> None:
    """``Report.from_dict`` (a verdict made by a driver on another host, ``drills/spark_lab.py``):
    what ``to_dict`` wrote, read back equal (but the latency histogram)."""
    import json

    from ordq.spark_order_check.report import (
        CLASSES,
        ClassResult,
        Inputs,
        InstanceStats,
        Latency,
        QueueStats,
        Report,
        SubscriptionStats,
    )

    classes = tuple(ClassResult(name=c.name, violation=i % 3 == 0, count=i, findings=i // 2,
                                by_subscription=(("q", "s", i), (None, None, 1)) if i else (),
                                examples=({"seq": i, "queue": "q"},) if i else ()) for i, c in enumerate(CLASSES))
    report = Report(ok=False, classes=classes, inputs=Inputs(1, 2, 30, 40, 0, 3, 50),
                    queues=(QueueStats("q", 30, ("P", "P2"), 0, 29),),
                    subscriptions=(SubscriptionStats("q", "s", 40, ("c1",), 0, 29, Latency(40, 1, 2, 3, 4, 0, 0)),),
                    instances=(InstanceStats("q", "s", "c1", 40, 2, 0, 29),), latency_method="m", seconds=1.5,
                    keyed=("s",), notes=("n",), topics=("t",))
    assert Report.from_dict(json.loads(report.to_json())) == report


def test_skip_records_are_found_in_an_audit_folder_given_as_a_file_url(tmp_path: Path) -> None:
    """``ordq verify file:///run --master spark://...`` (tests/test_lab_spark.py): the skip
    records of a ``file://`` audit folder are read too (found missing: parked seqs counted lost)."""
    from ordq.spark_order_check.cli import side_dirs

    (tmp_path / "run" / "skips").mkdir(parents=True)
    (tmp_path / "run" / "skips" / "c1-0.tsv").write_text("header\n")
    (tmp_path / "bare").mkdir()
    assert side_dirs([f"file://{tmp_path}/run", str(tmp_path / "run"), f"file://{tmp_path}/bare"], "skips") == [
        f"file://{tmp_path}/run/skips", str(tmp_path / "run" / "skips")]
