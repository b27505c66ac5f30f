"""ZkServer with real ZooKeeper processes: start, status, kill, restart, clear refusals,
and ``ordq zk start|status|stop`` across processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from ordq import zk_server as zk_module
from ordq.cli import main
from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.zk_server import ZkServer, free_ports, server_mode

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent


def znode_value(server: ZkServer, path: str, value: bytes | None = None) -> bytes:
    """Write ``value`` at ``path`` if given; return what is stored there."""
    client = KazooClient(hosts=server.connection_string, timeout=5.0)
    client.start(timeout=30)
    try:
        if value is not None:
            client.create(path, value, makepath=True)
        return bytes(client.get(path)[0])
    finally:
        client.stop()
        client.close()


def test_standalone_start_status_kill_restart_destroy(make_zk, monkeypatch: pytest.MonkeyPatch) -> None:
    # ZooKeeper's SERVER_JVMFLAGS come after ordq's own JVM options (a flag there wins), split as
    # a shell would
    monkeypatch.setenv("SERVER_JVMFLAGS", "-XX:TieredStopAtLevel=1 -Dordq.test='a b'")
    server = make_zk()
    server.start()
    [st] = server.status()
    assert (st.node, st.myid, st.mode, st.state) == (0, 1, "standalone", "standalone")
    assert st.pid is not None and server.connection_string == f"127.0.0.1:{st.port}"
    argv = Path(f"/proc/{st.pid}/cmdline").read_text().split("\0")
    assert argv[len(zk_module.JVM_OPTIONS) + 1:][:3] == ["-XX:TieredStopAtLevel=1", "-Dordq.test=a b", "-cp"]
    assert argv[1:len(zk_module.JVM_OPTIONS) + 1] == list(zk_module.JVM_OPTIONS)
    assert server.leader() == 0
    assert znode_value(server, "/kept", b"v1") == b"v1"
    # The JIT compiler's threads at nice 19, every other thread at 0 (JIT_AT_IDLE_PRIORITY)
    nice = {}
    for task in Path(f"/proc/{st.pid}/task").iterdir():
        stat = (task / "stat").read_text()
        nice.setdefault(int(stat[stat.rfind(")") + 2:].split()[16]), set()).add((task / "comm").read_text().strip())
    assert sorted(nice) == [0, 19], nice
    assert all(n.startswith(("C1 Compiler", "C2 Compiler", "Sweeper")) for n in nice[19]), nice

    server.kill(0)
    [st] = server.status()
    assert (st.pid, st.mode, st.state) == (None, None, "down")
    assert server_mode(st.port) is None

    server.restart(0)
    [after] = server.status()
    assert after.mode == "standalone" and after.port == st.port
    assert znode_value(server, "/kept") == b"v1"  # same data folder
    assert server.processes[0].log_path.read_text().count("ordq: starting zk1") == 2

    server.stop()
    assert not server.processes[0].pid_path.exists()
    server.destroy()
    assert not server.folder.exists()


def test_port_in_use_is_refused_before_starting(make_zk, zk_server) -> None:
    taken = int(zk_server.connection_string.rpartition(":")[2])
    server = make_zk(client_port=taken)  # a leftover server on the port must not look ready
    with pytest.raises(ExternalProcessError, match=f"127.0.0.1:{taken} is already in use"):
        server.start()
    assert not server.processes[0].alive()
    with socket.create_server(("127.0.0.1", 0)) as listener:  # any program, not only ZooKeeper
        port = listener.getsockname()[1]
        with pytest.raises(ExternalProcessError, match="already in use"):
            make_zk(client_port=port).start()


def test_missing_java_or_jars_name_the_packages(make_zk, monkeypatch: pytest.MonkeyPatch) -> None:
    packages = "apt-get install zookeeper libslf4j-java default-jre-headless"
    with pytest.raises(ExternalProcessError, match="Java not found") as err:
        make_zk(java="/nonexistent/java").start()
    assert packages in str(err.value)
    monkeypatch.setattr(zk_module, "SLF4J_SIMPLE_JAR", "/nonexistent/slf4j-simple.jar")
    with pytest.raises(ExternalProcessError, match="/nonexistent/slf4j-simple.jar not found") as err:
        make_zk().start()
    assert packages in str(err.value)


def test_folder_keeps_the_layout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ZkServer(tmp_path / "a", nodes=2)
    first = ZkServer(tmp_path / "b", nodes=3)
    first._save()  # what start() records
    again = ZkServer(tmp_path / "b")
    assert again.specs == first.specs and again.connection_string == first.connection_string
    with pytest.raises(ConfigError, match="holds a 3-node ZooKeeper"):
        ZkServer(tmp_path / "b", nodes=1)
    with pytest.raises(ExternalProcessError, match="no ZooKeeper set up"):
        ZkServer.load(tmp_path / "nothing")


def test_cli_start_status_stop_across_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "zk"
    [port] = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        started = subprocess.run(
            [sys.executable, "-m", "ordq.cli", "zk", "start", "--dir", str(folder), "--port", str(port), "--json"],
            capture_output=True, text=True, timeout=120, cwd=REPO, env=env, check=False,
        )
        assert started.returncode == 0, started.stderr
        assert json.loads(started.stdout)["connection_string"] == f"127.0.0.1:{port}"
        assert server_mode(port) == "standalone"  # serving after `ordq zk start` exited

        assert main(["zk", "status", "--dir", str(folder), "--json"]) == 0
        [node] = json.loads(capsys.readouterr().out)["nodes"]
        assert (node["port"], node["mode"]) == (port, "standalone") and node["pid"] > 0

        assert main(["zk", "start", "--dir", str(folder)]) == 0  # idempotent
        assert "already running" in capsys.readouterr().out

        assert main(["zk", "stop", "--dir", str(folder)]) == 0
        assert "stopped" in capsys.readouterr().out
        assert server_mode(port) is None
        assert main(["zk", "status", "--dir", str(folder)]) == 3
        assert "down" in capsys.readouterr().out
    finally:
        if (folder / "cluster.json").exists():
            ZkServer.load(folder).destroy()
