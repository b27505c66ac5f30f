"""``ordq status`` of any cluster (issue 42: it knew only clusters started by ``ordq up``): a
cluster of real processes started by tests/cluster.py, which no --dir describes, read from
what its ZooKeeper registers; a broker killed -9 turns it unhealthy (exit 3). One admin call:
the elected coordinator asks every process (the command loads no ZooKeeper client, no attrs);
with the coordinator killed the command asks them itself, through ZooKeeper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordq import __version__
from ordq.cluster_live import Contender, parse_srvr, zk_servers
from tests.cluster import REPO, Cluster, cluster_fixture, modules_loaded_by  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk

EXIT_UNHEALTHY = 3


def _status(cluster: Cluster) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = cluster.ordq("--json", "status", timeout_s=60)
    assert done.returncode in (0, EXIT_UNHEALTHY), done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


@pytest.mark.heavy  # a cluster of five processes and three CLI runs: 20-70 s at load 9-14
def test_status_of_a_cluster_from_zookeeper_and_a_broker_killed(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    rc, doc = _status(cluster)
    rows = {p["name"]: p for p in doc["processes"]}
    assert rc == 0 and doc["healthy"] is True, doc
    assert {"g1/master", "g1/slave", "g2/master", "g2/slave", "zk1"} <= set(rows)
    for name in ("g1/master", "g1/slave", "g2/master", "g2/slave"):
        assert rows[name]["state"] == "live" and rows[name]["version"] == __version__, rows[name]
    assert rows["zk1"]["state"] in ("standalone", "leader", "follower") and rows["zk1"]["version"]
    (coordinator,) = [p for p in doc["processes"] if p["kind"] == "coordinator"]
    assert coordinator["state"] == "leader" and coordinator["version"] == __version__
    assert doc["leader"] == coordinator["name"] and coordinator["listen"] in cluster.bootstrap.split(",")
    assert doc["asked_by"] == "coordinator", doc
    # named by its coordinators' addresses alone: the same, with the ZooKeeper and root they serve
    env = {k: v for k, v in os.environ.items() if k not in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_CONTEXT")}
    done = subprocess.run([sys.executable, "-m", "ordq.cli", "--bootstrap", cluster.bootstrap, "--json", "status"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          check=False)
    by_address = json.loads(done.stdout or "{}")
    assert done.returncode == 0 and by_address["asked_by"] == "coordinator", done.stdout + done.stderr
    assert (by_address["zk"], by_address["root"]) == (cluster.hosts, cluster.root), by_address
    # what the command loaded: one admin call (tests/test_cli_quick.py pins the same for queue list)
    assert _loaded_by(cluster, "status") == []

    victim = cluster.groups["g2"].slave
    victim.kill()  # kill -9
    rc, doc = _status(cluster)
    rows = {p["name"]: p for p in doc["processes"]}
    assert rc == EXIT_UNHEALTHY and doc["healthy"] is False
    assert rows["g2/slave"]["healthy"] is False and rows["g2/slave"]["state"] in ("no answer", "not live")
    assert all(p["healthy"] for name, p in rows.items() if name not in ("g2/slave", "g2/master")), rows
    # the people's table says the same, and names the unhealthy process
    wait_until(lambda: "g2/slave" not in cluster.store.live_members("g2"), timeout_s=30, what="g2/slave's node gone")
    done = cluster.ordq("status", timeout_s=60)
    out = done.stdout.decode()
    assert done.returncode == EXIT_UNHEALTHY, done.stderr.decode()
    assert "coordinator leader: " + coordinator["name"] in out and "unhealthy: " in out and "g2/slave" in out
    row = out.split("g2/slave", 1)[1].splitlines()[0]
    # as in the JSON above: registered and not answering, or its liveness node gone (the status
    # may list the slave by the address its group recorded either way)
    assert "not live" in row or "no answer" in row, row

    # the coordinators are what is down: the command asks every process itself, through ZooKeeper
    for proc in cluster.coordinators:
        proc.kill()
    rc, doc = _status(cluster)
    assert rc == EXIT_UNHEALTHY and doc["asked_by"].startswith("no coordinator answered"), doc
    coordinators = [p for p in doc["processes"] if p["kind"] == "coordinator"]
    assert coordinators and not any(p["healthy"] for p in coordinators), coordinators
    assert {p["name"]: p["state"] for p in doc["processes"]}["g1/master"] == "live"


HEAVY = ("attrs", "attr", "kazoo", "uuid", "platform", "ordq.cluster_health", "ordq.local_cluster",
         "ordq.cluster_config", "ordq.zk_server", "ordq.common.security", "ordq.coordinator.state", "ordq.sdk")


def _loaded_by(cluster: Cluster, *argv: str) -> list[str]:
    return modules_loaded_by(cluster, HEAVY, *argv)


def test_contender_identifiers_and_srvr_answers_parse() -> None:
    assert Contender.parse("h-12@http://127.0.0.1:9/metrics@127.0.0.1:7000") == Contender(
        name="h-12", address="127.0.0.1:7000", metrics_url="http://127.0.0.1:9/metrics")
    assert Contender.parse("h-12@127.0.0.1:7000") == Contender(name="h-12", address="127.0.0.1:7000",
                                                               metrics_url=None)
    assert Contender.parse("h-12") == Contender(name="h-12", address="", metrics_url=None)
    srvr = "Zookeeper version: 3.8.0-5a02a05eddb59aee6ac762f7ea82e92a68eb9c0f, built on 2022-02-25\nMode: leader\n"
    assert parse_srvr(srvr) == ("leader", "3.8.0")
    assert parse_srvr("This ZooKeeper instance is not currently serving requests") == (None, "")
    assert zk_servers("a:1,b:2/chroot") == [("a", 1), ("b", 2)]


def test_srvr_presents_what_the_zookeeper_session_presents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator's own credentials do not say that ZooKeeper speaks TLS (its session finds
    that registered): ``srvr`` in its sweep went in plaintext to a TLS-only ZooKeeper, and every
    ``ordq up`` cluster showed zk1 "no answer" (issue 42)."""
    from ordq.cluster_live import zk_tls_credentials
    from ordq.common import security
    from ordq.common.security import Credentials, remember_zk_tls

    monkeypatch.setenv("ORDQ_CREDENTIALS", str(tmp_path / "credentials.json"))
    monkeypatch.setattr(security, "_ZK_TLS", {})
    files = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "cert", "key")}
    own = Credentials(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"], token="t")
    assert zk_tls_credentials("h:1", own) is own  # plaintext ZooKeeper: as given
    remember_zk_tls("h:1", Credentials(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"],
                                       zk_tls=True))
    found = zk_tls_credentials("h:1", own)
    assert found.zk_tls and (found.ca_file, found.cert_file, found.key_file) == (files["ca"], files["cert"],
                                                                                 files["key"])
    said = Credentials(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"], zk_tls=True)
    assert zk_tls_credentials("other:2", said) is said
