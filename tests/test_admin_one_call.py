"""An admin command is one call (issue 42: ``ordq queue list`` ≤ 1 s beside six busy loops): the
Admin request goes to the first coordinator the client knows, without asking who leads first; a
follower's refusal names the leader, which answers it; a coordinator that accepts connections and
never answers (SIGSTOP) is given up after --zk-timeout with the command's one line, or left for
the leader the election names. Real ZooKeeper, broker and coordinator processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from ordq.cli import main
from ordq.common.metrics import value
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.service import leader_address
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.util import read_metrics, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]


def admin_calls(metrics_url: str, outcome: str) -> float:
    return value(read_metrics(metrics_url), "ordq_coordinator_requests_total", rpc="Admin", outcome=outcome) or 0.0


def test_an_admin_command_is_one_call_a_follower_names_the_leader_and_a_silent_one_is_given_up(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_groups("g1")  # and the harness's coordinator, which leads
    cluster.create_queue("q")
    leader = wait_until(lambda: leader_address(cluster.store.client, cluster.paths.coordinator_leader),
                        timeout_s=30, interval_s=0.05, what="a coordinator elected")
    [leading] = [p for p in cluster.coordinators if p.alive()]
    leader_metrics = leading.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    follower_proc = cluster.spawn("coordinator-f", [
        "-m", "ordq.cli", "--zk", cluster.hosts, "--root", cluster.root, "coordinator", "run",
        "--metrics", "127.0.0.1:0", "--interval", "0.2", "--session-timeout", "1.0"])
    follower = follower_proc.wait_for_line("SERVING ", timeout_s=30).split()[-1]
    follower_proc.wait_for_line("READY", timeout_s=30)
    follower_metrics = follower_proc.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    zk = ("--zk", cluster.hosts, "--root", cluster.root)

    def listed(*bootstrap: str, timeout: str = "10") -> list[Any]:
        code = main([*zk, "--bootstrap", ",".join(bootstrap), "--zk-timeout", timeout, "--json", "queue", "list"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return [row["queue"] for row in json.loads(out)]

    # The leader first: one Admin call, no "who leads" (no election read by the client).
    with CoordinatorClient(bootstrap=[leader, follower], credentials=cluster.credentials) as client:
        rows = client.admin("queue list", timeout_s=30, reach_s=10, prefix="", after="", limit=100)["rows"]
        assert [r["queue"] for r in rows] == ["q"] and client.resolves == 0
    # The follower first: it refuses naming the leader, which answers; still no election read.
    refused, answered = admin_calls(follower_metrics, "NotCoordinatorLeader"), admin_calls(leader_metrics, "ok")
    with CoordinatorClient(bootstrap=[follower, leader], credentials=cluster.credentials) as client:
        rows = client.admin("queue list", timeout_s=30, reach_s=10, prefix="", after="", limit=100)["rows"]
        assert [r["queue"] for r in rows] == ["q"] and client.resolves == 0
    assert admin_calls(follower_metrics, "NotCoordinatorLeader") == refused + 1
    assert admin_calls(leader_metrics, "ok") == answered + 1
    assert listed(follower, leader) == ["q"]  # the command, the same way
    # As the program (ordq/common/deferred.py): answered, and what grpc loads and never uses never imported.
    program = f"""
import atexit, json, sys
atexit.register(lambda: print(json.dumps({{m: type(sys.modules.get(m)).__name__
                                            for m in ("asyncio", "grpc.aio", "inspect", "socket")}})))
from ordq.cli import main
sys.argv = ["ordq", *{[*zk, "--bootstrap", f"{follower},{leader}", "--json", "queue", "list"]!r}]
sys.exit(main())
"""
    res = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    *table, deferred = res.stdout.splitlines()
    assert [row["queue"] for row in json.loads("\n".join(table))] == ["q"]
    assert json.loads(deferred) == {"asyncio": "Deferred", "grpc.aio": "Deferred", "inspect": "Deferred",
                                    "socket": "Deferred"}

    follower_proc.pause()  # accepts connections (the kernel's backlog), never answers
    try:
        # Only the silent one: the command's one line after --zk-timeout (+ one ask of it, 2 s)
        began = time.monotonic()
        assert main([*zk, "--bootstrap", follower, "--zk-timeout", "1", "queue", "list"]) == 1
        took = time.monotonic() - began
        err = capsys.readouterr().err
        assert err.startswith(f"ordq: error: no coordinator of the cluster answered at {follower} (given) "
                              "within 1s"), err
        assert len(err.strip().splitlines()) == 1, err
        assert took < 1 + 2 + 3, took  # --zk-timeout, one ask of it, a loaded box
        # The silent one first, the leader known too: the election names the leader while the call waits.
        began = time.monotonic()
        assert listed(follower, leader, timeout="10") == ["q"]
        assert time.monotonic() - began < 10
    finally:
        follower_proc.resume()
