"""The status page's charts from an operator's Prometheus (issue 42): a REAL Prometheus (Debian's
``prometheus``, /usr/bin/prometheus) scrapes a cluster of real processes while a producer and a
consumer run, and the coordinator, started with ``--prometheus-url``, serves the last hour from
Prometheus' ``query_range`` in ``/status.json``; before Prometheus runs, the page says it does not
answer and draws the coordinator's own samples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ordq.common.proc import ManagedProcess
from ordq.zk_server import free_ports
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
REPO = Path(__file__).resolve().parent.parent


def host_port(url: str) -> str:
    """``127.0.0.1:PORT`` of a metrics URL (``http://127.0.0.1:PORT/metrics``)."""
    return urllib.parse.urlsplit(url).netloc


def start_prometheus(folder: Path, port: int, targets: list[str]) -> ManagedProcess:
    """Prometheus on 127.0.0.1:``port`` scraping ``targets`` every second, storing in ``folder``;
    serving once this returns (``/-/ready``)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: ordq\n    static_configs:\n"
                      f"      - targets: {json.dumps(targets)}\n")
    proc = ManagedProcess("prometheus", [PROMETHEUS, f"--config.file={config}",
                                         f"--storage.tsdb.path={folder / 'data'}",
                                         f"--web.listen-address=127.0.0.1:{port}"], run_dir=folder)
    proc.start()

    def ready() -> bool:
        assert proc.alive(), proc.log_tail()
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5).status == 200
        except OSError:
            return False

    wait_until(ready, timeout_s=60, interval_s=0.5, what="Prometheus ready")
    return proc


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian's prometheus is not installed (make test-deps)")
def test_the_charts_come_from_prometheus_and_from_the_coordinator_while_it_does_not_answer(
        cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("orders")
    assert cluster.ordq("sub", "create", "orders", "billing").returncode == 0
    prom_port = free_ports(1)[0]
    prom_url = f"http://127.0.0.1:{prom_port}"
    daemon = cluster.start_daemon("coordinator-1", extra=["--prometheus-url", prom_url])
    metrics = daemon.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    page = metrics.rsplit("/", 1)[0] + "/status.json"

    def history() -> dict[str, Any]:
        return json.loads(urllib.request.urlopen(page, timeout=30).read())["history"]  # type: ignore[no-any-return]

    # Prometheus not started yet: the coordinator's own samples, and the page says why.
    before = history()
    assert before["source"] == "coordinator", before
    assert f"Prometheus at {prom_url} does not answer" in before["note"], before

    targets = [host_port(b.metrics_url or "") for group in cluster.groups.values() for b in group.members]
    prom = start_prometheus(tmp_path / "prometheus", prom_port, [*targets, host_port(metrics)])
    try:
        cluster.spawn_ordq("producer", "produce", "orders", "--count", "1000000", "--rate", "100")
        cluster.spawn_ordq("consumer", "consume", "orders", "-s", "billing", "--quiet")

        def from_prometheus() -> dict[str, Any] | None:
            h = history()
            every = h["queues"]["*"]
            moving = any((r or 0) > 0 for r in every["produce"]) and any((r or 0) > 0 for r in every["consume"])
            return h if h["source"] == "prometheus" and moving else None

        h = wait_until(from_prometheus, timeout_s=180, interval_s=1.0,
                       what="produce and consume rates from Prometheus in /status.json")
        assert h["note"].startswith(f"charts from Prometheus at {prom_url}"), h["note"]
        assert "ordq_consumer_lag_messages" in h["note"]  # `ordq consume` exports no metrics: said, not hidden
        # the last hour at 10 s, as the ring buffer: 361 points, 10 s apart, the last within a step of now
        t = h["t_ms"]
        assert len(t) == 361 and {b - a for a, b in zip(t, t[1:], strict=False)} == {10_000}
        assert len(h["queues"]["*"]["produce"]) == len(t)
        # what Prometheus itself says the produce rate was: the same series, point by point
        answer = urllib.request.urlopen(
            f"{prom_url}/api/v1/query_range?" + urllib.parse.urlencode({
                "query": 'sum(rate(ordq_broker_produce_messages_total{role="master"}[2m]))',
                "start": t[0] / 1000, "end": t[-1] / 1000, "step": 10}), timeout=30).read()
        theirs = {round(float(at) * 1000): float(v) for at, v in json.loads(answer)["data"]["result"][0]["values"]}
        # (all but the last two steps: a scrape in flight when the page asked may still land in those)
        settled = t[-1] - 20_000
        ours = {at: v for at, v in zip(t, h["queues"]["*"]["produce"], strict=True) if at < settled}
        assert {at for at, v in ours.items() if v is not None} == {at for at in theirs if at < settled}
        assert all(abs(v - theirs[at]) < 1e-6 for at, v in ours.items() if v is not None)
    finally:
        prom.kill()
    # Prometheus gone: back to the coordinator's samples, saying so (within its retry pause, 10 s)
    wait_until(lambda: history()["source"] == "coordinator", timeout_s=60, interval_s=1.0,
               what="the page back on the coordinator's samples")
    assert "does not answer" in history()["note"]


def ordq(*argv: str, env: dict[str, str], timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO, env=env)


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian's prometheus is not installed (make test-deps)")
def test_a_cluster_started_by_ordq_up_with_a_prometheus_url_draws_its_charts_from_it(tmp_path: Path) -> None:
    """docs/OPERATIONS.md's ``ordq up --prometheus-url http://HOST:9090``, run as written (a local
    Prometheus for HOST:9090): the coordinator ``ordq up`` starts serves Prometheus' rates in
    ``/status.json`` once Prometheus scrapes the processes ``ordq up`` lists."""
    doc = (REPO / "docs" / "OPERATIONS.md").read_text()
    assert "`ordq up --prometheus-url http://HOST:9090`" in doc
    prom_port = free_ports(1)[0]
    prom_url = f"http://127.0.0.1:{prom_port}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_BOOTSTRAP", "ORDQ_CONTEXT", "ORDQ_CONTEXTS", "ORDQ_HOME")}
    env.update(ORDQ_CREDENTIALS=str(tmp_path / "credentials.json"), ORDQ_CONTEXTS=str(tmp_path / "contexts.json"))
    folder = tmp_path / "c"
    programs: list[ManagedProcess] = []
    prom: ManagedProcess | None = None
    try:
        up = ordq("up", "--prometheus-url", prom_url, "--dir", str(folder), "--zk-port", "0", "--groups", "1",
                  "--coordinators", "1", "--json", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        started = json.loads(up.stdout)
        metrics = started["metrics"]
        page = metrics["coordinator-1"].rsplit("/", 1)[0] + "/status.json"

        def history() -> dict[str, Any]:
            return json.loads(urllib.request.urlopen(page, timeout=30).read())["history"]  # type: ignore[no-any-return]

        before = history()
        assert before["source"] == "coordinator" and f"Prometheus at {prom_url} does not answer" in before["note"]
        prom = start_prometheus(tmp_path / "prometheus", prom_port, [host_port(u) for u in metrics.values() if u])
        cluster = ["--zk", started["zk"], "--root", started["root"]]
        created = ordq(*cluster, "queue", "create", "orders", env=env)
        assert created.returncode == 0, created.stderr
        for name, argv in (("producer", ["produce", "orders", "--count", "1000000", "--rate", "100"]),
                           ("consumer", ["consume", "orders", "-s", "billing", "--quiet"])):
            proc = ManagedProcess(name, [sys.executable, "-m", "ordq.cli", *cluster, *argv], run_dir=tmp_path / "run",
                                  env=env, cwd=REPO)
            proc.start()
            programs.append(proc)

        def from_prometheus() -> dict[str, Any] | None:
            for proc in programs:
                assert proc.alive(), proc.log_tail()
            h = history()
            every = h["queues"]["*"]
            moving = any((r or 0) > 0 for r in every["produce"]) and any((r or 0) > 0 for r in every["consume"])
            return h if h["source"] == "prometheus" and moving else None

        h = wait_until(from_prometheus, timeout_s=180, interval_s=1.0,
                       what="produce and consume rates from Prometheus in /status.json of a cluster ordq up started")
        assert h["note"].startswith(f"charts from Prometheus at {prom_url}"), h["note"]
        assert len(h["t_ms"]) == 361
    finally:
        for proc in programs:
            proc.kill()
        if prom is not None:
            prom.kill()
        ordq("down", "--dir", str(folder), env=env)


def test_the_prometheus_url_of_a_coordinator_config_file_is_the_one_the_page_asks(
        cluster: Cluster, tmp_path: Path) -> None:
    """docs/OPERATIONS.md's other way to give it: ``prometheus_url = "http://HOST:9090"`` in the
    coordinator's ``--config`` file. Nobody listens there: the page draws the coordinator's own
    samples and names that URL as not answering."""
    doc = (REPO / "docs" / "OPERATIONS.md").read_text()
    assert '`prometheus_url = "http://HOST:9090"` in its `--config` file' in doc
    prom_url = f"http://127.0.0.1:{free_ports(1)[0]}"
    config = tmp_path / "coordinator.toml"
    config.write_text(f'prometheus_url = "{prom_url}"\n')
    cluster.add_groups("g1")
    daemon = cluster.start_daemon("coordinator-1", extra=["--config", str(config)])
    metrics = daemon.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    page = metrics.rsplit("/", 1)[0] + "/status.json"
    history = json.loads(urllib.request.urlopen(page, timeout=30).read())["history"]
    assert history["source"] == "coordinator", history
    assert f"Prometheus at {prom_url} does not answer" in history["note"], history
