"""ZooKeeper over TLS (issue 24): a server with a certificate of the cluster CA serves clients
on its TLS port only and requires theirs; every ordq client (``new_client``) finds the TLS
settings of the address; readiness and status still ask ``srvr`` (over TLS), and no other
four-letter word is answered."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from ordq.common.security import ensure_pki, remember_zk_tls, zk_tls_options
from ordq.coordinator.store import ZkStore
from ordq.coordinator.zk_tls import _CONTEXTS, TlsHandler
from ordq.zk_server import ZkServer, four_letter_word, server_mode

pytestmark = pytest.mark.zk


def test_zookeeper_serves_tls_only_and_ordq_clients_find_it(tmp_path: Path, make_zk: Callable[..., ZkServer],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    server_tls, client_tls = ensure_pki(tmp_path / "tls")
    zk = make_zk(tls=server_tls)
    zk.start(timeout_s=60)
    port = zk.specs[0].client_port
    assert server_mode(port, server_tls) == "standalone"
    assert "not in the whitelist" in four_letter_word(port, "cons", tls=client_tls)
    assert ZkServer.load(zk.folder).tls == server_tls  # another process finds how to ask it

    # A client without TLS gets no session.
    plain = KazooClient(hosts=zk.connection_string, timeout=2.0)
    try:
        with pytest.raises(KazooTimeoutError):
            plain.start(timeout=2.0)
    finally:
        plain.stop()
        plain.close()

    # ordq's clients: TLS once the address is known as TLS (remembered here; from the
    # credentials file in other processes).
    assert zk_tls_options(zk.connection_string) == {}
    remember_zk_tls(zk.connection_string, attrs.evolve(client_tls, zk_tls=True))
    assert zk_tls_options(zk.connection_string)["use_ssl"] is True
    # One SSL context per process with the cluster CA only: the system CA bundle, which kazoo
    # loaded at every attempt (140-500 ms each), is never loaded.
    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", _never)
    for _ in range(3):
        with ZkStore.connect(zk.connection_string, "/tls-test", timeout_s=10) as store:
            store.add_group("g1") if not store.list_groups() else None
            assert store.list_groups() == ["g1"]
    # (other tests of this worker process may have made contexts for their own clusters' CAs)
    assert len([key for key in _CONTEXTS if str(tmp_path) in repr(key)]) == 1

    # A connect's budget is the handshake's, not the session's: kazoo gives the session timeout
    # (1 s for a daemon; here a tenth of a millisecond), which cut handshakes off under load.
    # It returns once the server has checked the client (its session ticket arrived), and the
    # next connect of the process resumes that TLS session; ZooKeeper still knows the client's
    # certificate then (the store's reads above and below are authorised by it).
    host, port_s = zk.connection_string.split(":")
    files = {"ca": client_tls.ca_file, "certfile": client_tls.cert_file, "keyfile": client_tls.key_file}
    for resumed in (False, True):
        if not resumed:
            from ordq.coordinator import zk_tls
            monkeypatch.setattr(zk_tls, "_SESSIONS", {})
        conn = TlsHandler().create_connection((host, int(port_s)), hostname=host, timeout=0.0001, use_ssl=True,
                                              **files)
        try:
            assert conn.session is not None and conn.session_reused == resumed
        finally:
            conn.close()
    with ZkStore.connect(zk.connection_string, "/tls-test", timeout_s=1) as store:
        assert store.list_groups() == ["g1"]


def _never(*_args: object) -> None:
    raise AssertionError("the system CA bundle was loaded")


def test_a_local_cluster_with_zookeeper_over_tls_serves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    from ordq.cli import main
    from ordq.cluster_config import ClusterConfig
    from ordq.local_cluster import LocalCluster

    # The brokers' default 1 s sessions: a TLS connect is a handshake (coordinator/zk_tls.py)
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=1, coordinators=1, zk_tls=True))
    try:
        cluster.start()
        assert "secureClientPort" in (tmp_path / "c" / "zk" / "node0" / "zoo.cfg").read_text()
        zk = ("--zk", cluster.zk_hosts, "--root", cluster.root)
        assert main([*zk, "queue", "create", "q"]) == 0
        assert main([*zk, "produce", "q", "--count", "5"]) == 0
        assert main([*zk, "consume", "q", "-s", "s", "--count", "5", "--quiet"]) == 0
        assert "delivered 5 messages" in capsys.readouterr().err
        # another process finds ZooKeeper's TLS in the credentials file (status asks srvr over TLS)
        res = subprocess.run([sys.executable, "-m", "ordq.cli", "status", "--dir", str(tmp_path / "c")],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        res = subprocess.run([sys.executable, "-m", "ordq.cli", *zk, "queue", "list"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "?" not in res.stdout, res.stdout + res.stderr
        # the status of the cluster by its name: its coordinator asks every process, ZooKeeper by
        # srvr over TLS with what its own ZooKeeper session presents (issue 42)
        res = subprocess.run([sys.executable, "-m", "ordq.cli", *zk, "--json", "status"],
                             capture_output=True, text=True, timeout=60)
        doc = json.loads(res.stdout or "{}")
        assert res.returncode == 0 and doc["asked_by"] == "coordinator", res.stdout + res.stderr
        assert {p["name"]: p["state"] for p in doc["processes"]}["zk1"] == "standalone", doc
    finally:
        cluster.destroy()


def test_poll_select_answers_as_select_does() -> None:
    """kazoo's handler ``select`` over poll(2) (issue 29: kazoo's own built a new epoll selector
    per request and answer): ready lists as ``select.select`` gives them, and a timeout."""
    import select
    import socket
    import time

    from ordq.coordinator.zk_tls import PollHandler, poll_select

    a, b = socket.socketpair()
    try:
        def both(r: list, w: list, timeout: float) -> tuple:  # type: ignore[type-arg]
            return poll_select(r, w, [], timeout), select.select(r, w, [], timeout)

        got, want = both([a, b], [a], 0)  # nothing to read; room to write
        assert got == want == ([], [a], [])
        b.send(b"x")
        got, want = both([a, b], [], 0)
        assert got == want == ([a], [], [])
        a.recv(1)
        started = time.monotonic()
        assert poll_select([a], [], [], 0.05) == ([], [], [])  # waited, nothing came
        assert time.monotonic() - started >= 0.04
        b.close()  # end of file: readable, as select says
        got, want = both([a], [], 0)
        assert got == want == ([a], [], [])
        assert PollHandler().select([a.fileno()], [], [], 0) == ([a.fileno()], [], [])  # descriptors too
    finally:
        a.close()
        b.close()
