"""The pure parts of running the verifier on a Spark cluster (issue 44), without a Spark
start: the code zip, the driver's address, the session settings of a cluster master, the
refusal of Spark Connect, the lab cluster's layout checks. The cluster itself:
tests/test_lab_spark.py (slow, in the lab)."""

from __future__ import annotations

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
