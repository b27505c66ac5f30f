"""The local cluster on real processes: ``ordq up|status|down`` (also across processes),
starting twice, a killed process brought back, stale pid files, a port in use."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.cli import main
from ordq.cluster_config import STATE_FILE, ClusterConfig
from ordq.common.errors import ConfigError
from ordq.local_cluster import LocalCluster
from ordq.zk_server import free_ports
from tests.cluster import modules_loaded
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent
# What the local sweep of ``ordq status`` loads and its admin call does not.
SWEEP_MODULES = ("ordq.local_cluster", "ordq.cluster_health", "kazoo.client", "attrs")


def ordq(*argv: str, timeout_s: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, as a user runs it (``env``: more variables for it)."""
    return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO, env=os.environ | env if env else None)


def status_json(folder: Path) -> tuple[int, dict]:
    res = ordq("status", "--dir", str(folder), "--json")
    return res.returncode, json.loads(res.stdout)


def pids(folder: Path) -> list[int]:
    return [p.pid for _, p in LocalCluster.load(folder).processes() if p.pid is not None]


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2-group cluster started by ``ordq up`` in another process (stopped in teardown)."""
    folder = tmp_path_factory.mktemp("cluster") / "c"
    try:
        res = ordq("up", "--dir", str(folder), "--zk-port", "0", "--groups", "2", "--coordinators", "2")
        assert res.returncode == 0, res.stdout + res.stderr
        yield folder
    finally:
        if LocalCluster.exists(folder):
            LocalCluster.load(folder).stop()


def test_up_prints_where_everything_listens_and_status_is_healthy(cluster_dir: Path) -> None:
    code, doc = status_json(cluster_dir)
    assert code == 0, doc
    by_name = {p["name"]: p for p in doc["processes"]}
    assert set(by_name) == {"zk1", "g1/master", "g1/slave", "g2/master", "g2/slave", "coordinator-1",
                            "coordinator-2"}
    assert all(p["healthy"] and p["pid"] for p in doc["processes"]), doc
    assert by_name["zk1"]["state"] == "standalone"
    assert {by_name[f"coordinator-{i}"]["state"] for i in (1, 2)} == {"leader", "standby"}
    for name in ("g1/master", "g2/slave"):
        assert by_name[name]["listen"].startswith("127.0.0.1:")
    assert doc["zk"] == LocalCluster.load(cluster_dir).zk_hosts
    # one admin call (issue 42: the command's own sweep was a ZooKeeper session and a TLS
    # handshake with every process), with the folder's pids and names added
    assert doc["asked_by"] == "coordinator", doc
    assert modules_loaded(SWEEP_MODULES, "status", "--dir", str(cluster_dir), "--json") == []


def test_each_process_has_its_own_zookeeper_identity_and_the_admin_is_the_super_user(cluster_dir: Path) -> None:
    """Issue 37: ``ordq up`` generates the admin, coordinator and broker credentials (no
    client one), starts ZooKeeper with the admin's digest as its super-user (in a 0600 file,
    not on its command line), and each process runs with its own identity."""
    from kazoo.exceptions import NoAuthError

    from ordq.coordinator.acl import digest_id
    from ordq.coordinator.store_base import new_client
    from ordq.coordinator.tokens import tokens_path
    from ordq.zk_server import JVM_ARGS_FILE

    c = LocalCluster.load(cluster_dir)
    assert sorted(p.name for p in (cluster_dir / "zk-auth").iterdir()) == ["admin", "broker", "coordinator"]
    assert c.admin_auth and len({c.admin_auth, c.coordinator_auth, c.broker_auth}) == 3
    args = cluster_dir / "zk" / "node0" / JVM_ARGS_FILE
    assert digest_id(c.admin_auth) in args.read_text() and (args.stat().st_mode & 0o077) == 0
    zk_pid = c.zk.processes[0].pid
    assert zk_pid is not None and digest_id(c.admin_auth).encode() not in Path(f"/proc/{zk_pid}/cmdline").read_bytes()
    for name, proc in c.processes():
        if proc.pid is None or name.startswith("zk"):
            continue
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        env = dict(kv.split(b"=", 1) for kv in raw if b"=" in kv)
        want = c.coordinator_auth if name.startswith("coordinator") else c.broker_auth
        assert env.get(b"ORDQ_ZK_AUTH", b"").decode() == want, name
    for auth in (None, c.admin_auth):  # kazoo with TLS, as the cluster's ZooKeeper serves it
        client = new_client(c.zk_hosts, session_timeout_s=5.0, auth=auth)
        client.start(timeout=30)
        try:
            if auth is None:
                with pytest.raises(NoAuthError):
                    client.get_children(tokens_path(c.root))
            else:
                assert client.get_children(tokens_path(c.root))  # ordq up's own admin token
        finally:
            client.stop()
            client.close()


def test_the_cluster_serves_ordered_traffic(cluster_dir: Path) -> None:
    c = LocalCluster.load(cluster_dir)
    base = ["--zk", c.zk_hosts, "--root", c.root, "--zk-auth", str(c.admin_auth)]  # ACLs are on: act as admin
    assert main([*base, "queue", "create", "lc"]) == 0
    assert ordq(*base, "produce", "lc", "--count", "500").returncode == 0
    res = ordq(*base, "consume", "lc", "-s", "s1", "--count", "500", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["last_seq"] == 499


def test_starting_twice_is_refused(cluster_dir: Path) -> None:
    before = pids(cluster_dir)
    res = ordq("up", "--dir", str(cluster_dir))
    assert res.returncode == 1
    assert "already running" in res.stderr and "ordq down" in res.stderr
    assert pids(cluster_dir) == before


def test_a_killed_process_is_reported_and_up_starts_only_it(cluster_dir: Path) -> None:
    c = LocalCluster.load(cluster_dir)
    victim = c.broker("g2", "slave")
    others = [p.pid for name, p in c.processes() if name != "g2/slave"]
    victim.proc.kill()  # its pid file stays behind: stale
    code, doc = status_json(cluster_dir)
    assert code == 3
    rows = {p["name"]: p for p in doc["processes"]}
    assert rows["g2/slave"]["state"] == "down" and not rows["g2/slave"]["healthy"]
    assert doc["asked_by"] == "coordinator", doc
    assert rows["g2/master"]["detail"].startswith("slave not connected") or not rows["g2/master"]["healthy"]
    victim.proc.pid_path.write_text("999999\n")  # as after a crash: names no process
    res = ordq("up", "--dir", str(cluster_dir))
    assert res.returncode == 0, res.stderr
    assert "replaced stale pid file" in res.stdout and "g2/slave" in res.stdout
    assert [p.pid for name, p in LocalCluster.load(cluster_dir).processes() if name != "g2/slave"] == others
    wait_until(lambda: status_json(cluster_dir)[0] == 0, timeout_s=30, what="every process healthy again")


def test_shape_mismatch_is_refused(cluster_dir: Path) -> None:
    with pytest.raises(ConfigError, match="another shape"):
        LocalCluster(cluster_dir, ClusterConfig(groups=3))


def test_port_in_use_is_refused_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        res = ordq("up", "--dir", str(tmp_path / "c"), "--zk-port", str(port))
    assert res.returncode == 1
    assert f"127.0.0.1:{port} is already in use" in res.stderr
    assert "--zk-port" in res.stderr
    assert not (tmp_path / "c" / STATE_FILE).exists()
    assert not LocalCluster.exists(tmp_path / "c")


def test_down_stops_everything_keeps_data_and_up_resumes(cluster_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = pids(cluster_dir)
    assert running
    monkeypatch.setenv("ORDQ_PROGRESS", "1")  # waits said, as on a terminal (issue 42)
    res = ordq("down", "--dir", str(cluster_dir))
    assert res.returncode == 0, res.stderr
    assert "stopped" in res.stdout
    assert not pids(cluster_dir)
    for pid in running:
        assert not _alive(pid), pid
    assert ordq("down", "--dir", str(cluster_dir)).returncode == 0  # idempotent
    code, doc = status_json(cluster_dir)
    assert code == 3 and not any(p["healthy"] for p in doc["processes"])
    assert doc["asked_by"] == "this command", doc  # no coordinator runs to ask
    # the same cluster comes back with its data: the queue of the earlier test is still there
    res = ordq("up", "--dir", str(cluster_dir))
    assert res.returncode == 0, res.stderr
    # ZooKeeper's JVM alone takes over a second to serve: the wait is said, once
    assert res.stderr.count(f"ordq: starting the local cluster in {cluster_dir} and waiting until every process "
                            "serves ...") == 1, res.stderr
    c = LocalCluster.load(cluster_dir)
    res = ordq("--zk", c.zk_hosts, "--root", c.root, "queue", "list", "--json")
    assert "lc" in res.stdout


def coordinators_serving(c: LocalCluster) -> set[str]:
    """The address each coordinator's last SERVING line names (its log)."""
    out = set()
    for proc in c.coordinators:
        lines = [ln for ln in proc.log_path.read_text().splitlines() if ln.startswith("SERVING ")]
        out.add(lines[-1].split()[1])
    return out


def test_the_coordinators_keep_their_addresses_across_down_up_and_a_restart(cluster_dir: Path) -> None:
    """Guard: a local cluster's coordinators listen on ports fixed at its first ``ordq up`` and
    kept in its config, registered for its (ZooKeeper, root) in the user's credentials file and
    its own: a client that was given the bootstrap list finds the cluster again after ``ordq down
    && ordq up`` and after ``ordq up`` restarted a killed coordinator (clients hold no ZooKeeper
    session, issue 37: the coordinators' addresses are all a client knows)."""
    from ordq.common.security import lookup_bootstrap, registered_bootstrap
    from ordq.coordinator.client import CoordinatorClient

    code, doc = status_json(cluster_dir)
    assert code == 0, doc
    bootstrap = doc["bootstrap"]
    c = LocalCluster.load(cluster_dir)
    assert bootstrap == c.bootstrap and len(bootstrap.split(",")) == 2
    assert f"coordinators (bootstrap): {bootstrap}" in ordq("status", "--dir", str(cluster_dir)).stdout
    assert registered_bootstrap(c.zk_hosts, c.root) == bootstrap
    own = json.loads(c.own_credentials_file.read_text())
    assert [e["coordinators"] for e in own["clusters"].values()] == [bootstrap.split(",")]
    assert coordinators_serving(c) == set(bootstrap.split(","))
    main(["--zk", c.zk_hosts, "--root", c.root, "--zk-auth", str(c.admin_auth), "queue", "create", "boot"])

    def described() -> int:
        with CoordinatorClient(bootstrap=bootstrap, credentials=lookup_bootstrap(bootstrap)) as client:
            return client.describe("boot", timeout_s=30).version

    described()
    assert ordq("down", "--dir", str(cluster_dir)).returncode == 0
    assert registered_bootstrap(c.zk_hosts, c.root) is None  # removed with the entry
    res = ordq("up", "--dir", str(cluster_dir))
    assert res.returncode == 0, res.stderr
    assert f"coordinators (bootstrap): {bootstrap}" in res.stdout
    assert registered_bootstrap(c.zk_hosts, c.root) == bootstrap
    described()
    c = LocalCluster.load(cluster_dir)
    c.coordinators[0].kill()
    assert ordq("up", "--dir", str(cluster_dir)).returncode == 0
    assert status_json(cluster_dir)[1]["bootstrap"] == bootstrap
    assert coordinators_serving(LocalCluster.load(cluster_dir)) == set(bootstrap.split(","))
    described()


def test_a_producer_given_only_bootstrap_sends_before_and_after_down_up(cluster_dir: Path) -> None:
    """Guard: ``ProducerConfig(bootstrap=...)``, no zk_hosts, reaches the local cluster, and
    the same bootstrap list reaches it after ``ordq down && ordq up`` (ports kept)."""
    from ordq.sdk import Producer, ProducerConfig

    c = LocalCluster.load(cluster_dir)
    bootstrap = c.bootstrap
    main(["--zk", c.zk_hosts, "--root", c.root, "--zk-auth", str(c.admin_auth), "queue", "create", "bootp"])

    def send(n: int) -> int:
        with Producer(ProducerConfig(bootstrap=bootstrap, queue="bootp", connect_timeout_s=30)) as p:
            last = [p.send(b"%d" % i) for i in range(n)][-1]
            p.flush()
            return int(last.result(timeout=30).seq)

    assert send(10) == 9
    assert ordq("down", "--dir", str(cluster_dir)).returncode == 0
    assert ordq("up", "--dir", str(cluster_dir)).returncode == 0
    assert LocalCluster.load(cluster_dir).bootstrap == bootstrap
    assert send(10) == 19


def test_a_coordinator_port_taken_at_restart_is_named(cluster_dir: Path) -> None:
    """Guard: a kept coordinator port that another process holds when the cluster starts again
    is one clear error naming it (the port never moves: clients find the cluster by it)."""
    c = LocalCluster.load(cluster_dir)
    port = c.config.coordinator_ports[1]
    assert ordq("down", "--dir", str(cluster_dir)).returncode == 0
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            res = ordq("up", "--dir", str(cluster_dir))
        assert res.returncode == 1
        [line] = res.stderr.strip().splitlines()
        assert f"coordinator-2: its port 127.0.0.1:{port} is taken" in line, line
    finally:
        assert ordq("up", "--dir", str(cluster_dir)).returncode in (0, 1)
    assert LocalCluster.load(cluster_dir).config.coordinator_ports[1] == port


def test_after_up_on_any_port_a_command_without_zk_finds_the_cluster(cluster_dir: Path) -> None:
    """Issue 42: after ``ordq up --zk-port 0``, ``ordq status`` found the cluster but ``ordq
    queue create`` tried 127.0.0.1:2181 and suggested ``ordq zk start``. ``ordq up`` adds the
    cluster as a context and selects it; a command given no --zk (nor ORDQ_ZK) uses it."""
    env = {k: v for k, v in os.environ.items() if k not in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_BOOTSTRAP")}
    zk = LocalCluster.load(cluster_dir).zk_hosts
    assert not zk.endswith(":2181")
    shown = subprocess.run([sys.executable, "-m", "ordq.cli", "context", "show", "--json"], capture_output=True,
                           text=True, timeout=60, cwd=REPO, env=env, check=False)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"name": "c", "current": True, "zk": zk, "root": "/ordq",
                                        "dir": str(cluster_dir.resolve())}
    made = subprocess.run([sys.executable, "-m", "ordq.cli", "queue", "create", "found-by-context"],
                          capture_output=True, text=True, timeout=180, cwd=REPO, env=env, check=False)
    assert made.returncode == 0, made.stderr
    assert "queue found-by-context created" in made.stdout


def test_down_in_a_folder_without_cluster_stops_the_current_contexts(tmp_path: Path, cluster_dir: Path) -> None:
    """After ``ordq up --dir X``, which says every command uses that cluster, ``ordq down`` run in
    a folder that holds none said "nothing to stop" and left X running. It stops X now and says
    it was the current context's; ``--wipe`` that way deletes nothing and names the folder."""
    env = {k: v for k, v in os.environ.items() if k != "ORDQ_CONTEXT"}

    def down(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ordq.cli", "down", *argv], capture_output=True, text=True,
                              timeout=180, cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, check=False)

    running = pids(cluster_dir)
    wipe = down("--wipe")
    assert wipe.returncode == 1 and f"(ordq down --wipe --dir {cluster_dir.resolve()})" in wipe.stderr, wipe.stderr
    assert all(_alive(p) for p in running) and LocalCluster.exists(cluster_dir)
    res = down()
    assert res.returncode == 0, res.stderr
    assert f"local cluster in {cluster_dir.resolve()} (the current context, c): stopped" in res.stdout, res.stdout
    assert not any(_alive(p) for p in running)
    assert ordq("up", "--dir", str(cluster_dir)).returncode == 0  # the module's cluster, for the tests after


def test_down_wipe_and_a_folder_without_cluster(tmp_path: Path, cluster_dir: Path) -> None:
    res = ordq("status", "--dir", str(tmp_path / "none"))
    assert res.returncode == 1 and "no local cluster" in res.stderr
    assert "nothing to stop" in ordq("down", "--dir", str(tmp_path / "none")).stdout
    if LocalCluster.exists(cluster_dir):
        running = pids(cluster_dir)
        assert ordq("down", "--dir", str(cluster_dir), "--wipe").returncode == 0
        assert not cluster_dir.exists() or not any(cluster_dir.iterdir())
        assert not any(_alive(p) for p in running)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
