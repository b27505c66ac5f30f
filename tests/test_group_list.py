"""``ordq group list`` (and ``ordq top``) as one admin call (issue 42): the elected coordinator answers it from its
copies of the queues' states (``group list``, ordq/admin/api.py), so the command loads no
ZooKeeper client and a cluster named by its coordinators' addresses alone is listed; a broker
killed -9 shows its group unhealthy; with the coordinators killed it is one line naming them
(the command reads ZooKeeper itself only for a cluster with no coordinator known here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cluster import REPO, Cluster, cluster_fixture, modules_loaded_by  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk

HEAVY = ("attrs", "attr", "kazoo", "uuid", "platform", "ordq.coordinator.state", "ordq.sdk", "ordq.admin")


def _by_bootstrap(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_CONTEXT")}
    return subprocess.run([sys.executable, "-m", "ordq.cli", "--bootstrap", cluster.bootstrap, *argv],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, check=False)


def _loaded_by(cluster: Cluster, *argv: str) -> list[str]:
    return modules_loaded_by(cluster, HEAVY, *argv)


@pytest.mark.heavy  # a cluster of five processes and several CLI runs
def test_group_list_is_answered_by_the_coordinator(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    head = cluster.state("q").head
    done = _by_bootstrap(cluster, "--json", "group", "list")  # no ZooKeeper named: the coordinator answers
    assert done.returncode == 0, done.stderr
    rows = {r["group"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"g1", "g2"}
    for gid, row in rows.items():
        assert row["healthy"] is True and row["drained"] is False and row["queues"] == ["q"], row
        assert row["disk_full"] == [], row
        assert row["master"] and row["slave"], row
        assert row["sending"] == (["q"] if gid == head else []), row
    # the same through --zk/--root (the coordinators registered for it), and its table
    listed = cluster.ordq("--json", "group", "list")
    assert listed.returncode == 0 and {r["group"]: r for r in json.loads(listed.stdout)} == rows, listed.stderr
    table = cluster.ordq("group", "list")
    lines = table.stdout.decode().splitlines()
    assert table.returncode == 0 and lines[0].split() == ["GROUP", "MASTER", "SLAVE", "HEALTHY", "DRAINED", "DISK_FULL",
                                                          "QUEUES", "SENDING"], lines
    assert _loaded_by(cluster, "group", "list") == []  # no ZooKeeper client, no attrs, no admin library
    # ``top`` alike (``top sample``, a call a frame): by the coordinators' addresses alone
    done = _by_bootstrap(cluster, "--json", "top", "--once", "--interval", "0.1")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["queues"]
    assert (row["queue"], row["head"], row["produce_rate"]) == ("q", head, 0.0), row
    assert _loaded_by(cluster, "top", "--once", "--interval", "0.1") == []

    cluster.groups["g2"].slave.kill()  # kill -9: its liveness node goes with its session
    wait_until(lambda: not {r["group"]: r for r in json.loads(cluster.ordq("--json", "group", "list").stdout)}
               ["g2"]["healthy"], timeout_s=60, what="g2 unhealthy in group list")

    for proc in cluster.coordinators:
        proc.kill()
    refused = cluster.ordq("--zk-timeout", "1", "group", "list")
    err = refused.stderr.decode().strip()
    assert refused.returncode == 1 and refused.stdout == b"", err
    assert err.startswith("ordq: error: no coordinator of the cluster answered at ") and len(err.splitlines()) == 1
