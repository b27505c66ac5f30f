"""A second local cluster never breaks the first (issue 24): ``ordq up`` in two folders at
once, a third on a port the first holds (refused, leaving no files and the first's
credentials entry as it was), ``ordq down --wipe`` of a folder where nothing runs, and the
modes of the data the clusters keep."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.common.security import credentials_path
from ordq.local_cluster import LocalCluster
from ordq.zk_server import free_ports

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent
SMALL = ("--groups", "1", "--coordinators", "1")


def ordq(*argv: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO)


def entries() -> dict:
    try:
        return json.loads(credentials_path().read_text())["clusters"]
    except FileNotFoundError:
        return {}


def key(cluster: LocalCluster) -> str:
    return f"{cluster.zk_hosts}{cluster.root}"


def test_two_clusters_side_by_side_and_a_third_on_a_taken_port_breaks_neither(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    port_a, port_b = free_ports(2)
    try:
        # Two users' shells at once: two processes, each registering its cluster when it serves.
        ups = [subprocess.Popen([sys.executable, "-m", "ordq.cli", "up", "--dir", str(folder), "--zk-port",
                                 str(port), *SMALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO)
               for folder, port in ((a, port_a), (b, port_b))]
        for up in ups:
            out, err = up.communicate(timeout=240)
            assert up.returncode == 0, out + err
        cluster_a, cluster_b = LocalCluster.load(a), LocalCluster.load(b)
        assert cluster_a.cluster_id != cluster_b.cluster_id
        registered = entries()
        assert registered[key(cluster_a)]["cluster"] == cluster_a.cluster_id
        assert registered[key(cluster_b)]["cluster"] == cluster_b.cluster_id
        entry_a = registered[key(cluster_a)]

        # A third cluster on the port A holds: refused, and nothing of it is left anywhere.
        res = ordq("up", "--dir", str(c), "--zk-port", str(port_a), *SMALL)
        assert res.returncode == 1 and "already in use" in res.stderr, res.stdout + res.stderr
        assert not c.exists() or not any(c.iterdir()), list(c.iterdir())  # no c/tls, no state file
        assert entries()[key(cluster_a)] == entry_a
        # A works from the CLI with what the credentials file holds for it
        zk_a = ("--zk", cluster_a.zk_hosts, "--root", cluster_a.root)
        assert ordq(*zk_a, "queue", "create", "qa").returncode == 0
        res = ordq(*zk_a, "produce", "qa", "--count", "3")
        assert res.returncode == 0 and "acked 3 of 3" in res.stderr, res.stderr
        res = ordq(*zk_a, "queue", "list")
        assert res.returncode == 0 and "?" not in res.stdout, res.stdout + res.stderr

        # Files an older version left after a refused start: `down --wipe` deletes them though
        # nothing runs there.
        (c / "tls").mkdir(parents=True)
        (c / "tls" / "ca.pem").write_text("left over")
        res = ordq("down", "--dir", str(c), "--wipe")
        assert res.returncode == 0 and "deleted" in res.stdout, res.stdout + res.stderr
        assert not c.exists()

        # Data at rest: the service's user only.
        for folder in (a / "brokers" / "g1" / "master", a / "zk" / "node0" / "data"):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        logs = list((a / "brokers" / "g1" / "master").rglob("segment.log"))
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)

        # B goes: A's entry stays.
        assert ordq("down", "--dir", str(b), "--wipe").returncode == 0
        assert key(cluster_b) not in entries() and entries()[key(cluster_a)] == entry_a
    finally:
        for folder in (a, b, c):
            if LocalCluster.exists(folder):
                LocalCluster.load(folder).destroy()


def test_stopping_a_cluster_leaves_another_clusters_entry_at_the_same_address(tmp_path: Path) -> None:
    # An entry names the cluster it is for: a folder whose cluster never served at an address
    # (or no longer does) does not remove the entry of the one that does.
    from ordq.common.security import Credentials, register, unregister

    register("127.0.0.1:1", "/ordq", Credentials(token="a"), cluster="A")
    assert not unregister("127.0.0.1:1", "/ordq", cluster="B")
    assert entries()["127.0.0.1:1/ordq"]["cluster"] == "A"
    assert unregister("127.0.0.1:1", "/ordq", cluster="A")
    assert "127.0.0.1:1/ordq" not in entries()
    own = tmp_path / "own.json"  # a cluster's own file is another file
    register("127.0.0.1:1", "/ordq", Credentials(token="a"), cluster="A", path=own)
    assert "127.0.0.1:1/ordq" not in entries() and os.stat(own).st_mode & 0o077 == 0
