"""Issue #14, TLS and tokens: grants (pure), the credentials file, and intruders at real
TLS brokers refused with a typed PermissionDenied that the broker counts; ``ordq auth``."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.cli import main
from ordq.common.errors import ClosedError, ConfigError, PermissionDenied
from ordq.common.metrics import value
from ordq.common.security import (
    Credentials,
    StubCache,
    credentials_path,
    ensure_pki,
    lookup,
    lookup_bootstrap,
    register,
    register_coordinators,
    unregister,
)
from ordq.coordinator.tokens import (
    ANY,
    ROLES,
    authorize,
    create_token,
    make_record,
    new_token,
    parse_grants,
    token_id,
    touch,
)
from ordq.drills.security import probe_intruders
from ordq.sdk import Producer, ProducerConfig
from ordq.wire import ordq_pb2 as pb
from ordq.wire.client import GrpcTransport
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import read_metrics

# -- grants (no I/O) --------------------------------------------------------------------------


def test_one_channel_and_stub_per_address_until_closed() -> None:
    """The clients of brokers (sync and grpc.aio) and of the coordinator share this cache."""
    opened: list[str] = []
    cache: StubCache[str, tuple[str]] = StubCache(lambda a: opened.append(a) or f"ch:{a}", lambda ch: (ch,), "client")
    assert cache.get("a:1") is cache.get("a:1") and cache.get("b:2") == ("ch:b:2",)
    assert opened == ["a:1", "b:2"]
    assert cache.close() == ["ch:a:1", "ch:b:2"]  # the caller closes them (sync, or awaited on the loop)
    with pytest.raises(ClosedError, match="client is closed"):
        cache.get("a:1")
    assert cache.close() == []


def test_a_call_whose_channel_its_owner_closed_on_the_way_is_closed_error() -> None:
    """A background seal (coordinator/head.py ``seal_in_background``) took its stub, then the
    head's owner closed the transport before the call went: gRPC's ValueError ("Cannot invoke
    RPC on closed channel!") escaped ``_seal_quietly``, an unhandled thread exception (the loaded
    tier of stop 87). It is ClosedError now, which the seal takes as deferred. No traffic: the
    channel is closed before its first call."""
    transport = GrpcTransport(rpc_timeout_s=0.5)

    def closed_on_the_way(stub: Any) -> Any:
        transport.close()
        return stub.Seal(pb.SegmentRef(queue="q", seg=1), timeout=0.5)

    with pytest.raises(ClosedError, match="transport is closed"):
        transport._call("127.0.0.1:9", closed_on_the_way)
    with pytest.raises(ClosedError, match="transport is closed"):
        transport.seal("127.0.0.1:9", "q", 1)


def test_grants_parse_roles_on_queues_and_refuse_nonsense() -> None:
    assert parse_grants(["produce:orders", "consume:orders", "admin"]) == {"orders": ["produce", "consume"],
                                                                           "*": ["admin"]}
    for bad in (["root"], ["produce:bad/name"], []):
        with pytest.raises(ConfigError):
            parse_grants(bad)


@given(role=st.sampled_from(ROLES), granted=st.sets(st.sampled_from(ROLES)), scope=st.sampled_from(["q", "*", "r"]))
def test_a_token_allows_exactly_its_roles_on_its_queues(role: str, granted: set[str], scope: str) -> None:
    tid, token = new_token()
    assert token_id(token) == tid
    records = {tid: make_record(tid, token, {scope: sorted(granted)}, "t")} if granted else {}
    allowed = bool(granted) and scope in ("q", "*") and (role in granted or "admin" in granted)
    if allowed:
        assert authorize(records, token, "q", role).tid == tid
        assert authorize(records, token, "q", ANY).tid == tid
    else:
        with pytest.raises(PermissionDenied) as err:
            authorize(records, token, "q", role)
        assert (err.value.queue, err.value.role) == ("q", role)
    # Another token of the same id (a forged secret) is never accepted.
    with pytest.raises(PermissionDenied, match="unknown or revoked"):
        authorize(records, token[:-4] + "AAAA" if not token.endswith("AAAA") else token[:-4] + "BBBB", "q", role)


def test_the_credentials_file_is_per_cluster_private_and_env_overrides_the_token(tmp_path: Path,
                                                                               monkeypatch: Any) -> None:
    monkeypatch.setenv("ORDQ_CREDENTIALS", str(tmp_path / "c" / "credentials.json"))
    monkeypatch.delenv("ORDQ_TOKEN", raising=False)
    broker, client = ensure_pki(tmp_path / "tls")
    assert stat.S_IMODE(os.stat(str(client.key_file)).st_mode) == 0o600
    register("127.0.0.1:1", "/a", attrs.evolve(client, token="t-a"))
    assert lookup("127.0.0.1:1", "/a").token == "t-a" and lookup("127.0.0.1:1", "/b") == Credentials()
    assert stat.S_IMODE(os.stat(credentials_path()).st_mode) == 0o600
    monkeypatch.setenv("ORDQ_TOKEN", "t-env")
    assert lookup("127.0.0.1:1", "/a").token == "t-env"
    unregister("127.0.0.1:1", "/a")
    assert lookup("127.0.0.1:1", "/a") == Credentials(token="t-env")


def test_an_address_a_new_cluster_serves_at_is_no_longer_found_for_one_killed_before(tmp_path: Path,
                                                                                     monkeypatch: Any) -> None:
    """A cluster killed without ``ordq down`` keeps its entry; when another cluster's coordinator
    then gets one of its ports, ``--bootstrap`` naming the new cluster found the dead one's CA and
    was refused ("a certificate not signed by the CA this command trusts": CI of stop 86)."""
    monkeypatch.setenv("ORDQ_CREDENTIALS", str(tmp_path / "credentials.json"))
    register("127.0.0.1:1", "/dead", Credentials(ca_file="/dead/ca.pem"))
    register_coordinators("127.0.0.1:1", "/dead", ["127.0.0.1:14501", "127.0.0.1:14502"])
    register("127.0.0.1:2", "/new", Credentials(ca_file="/new/ca.pem"))
    register_coordinators("127.0.0.1:2", "/new", ["127.0.0.1:14501", "127.0.0.1:16335"])
    assert lookup_bootstrap("127.0.0.1:14501,127.0.0.1:16335").ca_file == "/new/ca.pem"
    assert lookup_bootstrap("127.0.0.1:14501").ca_file == "/new/ca.pem"
    # the dead cluster keeps what no one else serves at
    assert lookup_bootstrap("127.0.0.1:14502").ca_file == "/dead/ca.pem"


# -- real brokers -----------------------------------------------------------------------------


def _admin(cluster: Cluster) -> Credentials:
    """Turn token enforcement on with an admin token; the cluster's clients use it."""
    _, token = create_token(cluster.store.client, cluster.root, {"*": ["admin"]}, "test admin")
    touch(cluster.store.client, cluster.root)
    creds = attrs.evolve(cluster.credentials, token=token)
    register(cluster.hosts, cluster.root, creds)
    return creds


def test_intruders_are_refused_typed_and_counted_while_the_owner_produces(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds = _admin(cluster)
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", credentials=creds)) as p:
        p.send(b"before").result(timeout=10)
        st_ = cluster.state("q")
        assert st_.open_segment is not None
        master = cluster.groups["g1"].master
        address = cluster.store.live_members("g1")["master"].address
        results = probe_intruders(cluster.store, creds, address, "q", st_.open_segment.seg)
        assert [what for what, ok in results if not ok] == []
        p.send(b"after").result(timeout=10)  # the owner was never disturbed
    assert master.metrics_url is not None
    refused = value(read_metrics(master.metrics_url), "ordq_broker_refused_requests_total", reason="PermissionDenied")
    assert refused is not None and refused >= 4


def test_auth_cli_creates_lists_revokes_and_admin_verbs_need_the_admin_role(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--zk", cluster.hosts, "--root", cluster.root, *argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    code, out, _ = run("auth", "list")
    assert code == 0 and "NOT enforced" in out
    # The first token turns enforcement on; later ones need the admin role.
    code, out, _ = run("auth", "create", "--role", "admin", "--name", "ops", "--json")
    admin = __import__("json").loads(out)["token"]
    register(cluster.hosts, cluster.root, attrs.evolve(cluster.credentials, token=admin))
    code, out, _ = run("auth", "create", "--role", "consume:q", "--name", "reader")
    reader = out.splitlines()[0]
    assert code == 0 and reader.startswith("ordq_")
    code, out, _ = run("auth", "list")
    assert "tokens enforced" in out and "consume on q" in out and "admin on every queue" in out
    code, _, err = run("--token", reader, "queue", "delete", "q")
    assert code == 1 and "permission denied: 'admin' on queue 'q'" in err
    assert os.environ.get("ORDQ_TOKEN") is None  # --token does not outlive the command
    code, _, err = run("--token", reader, "auth", "create", "--role", "admin")
    assert code == 1 and "permission denied" in err
    # `ordq status` is the admin verb `cluster status` (issue 42): a refusal is its one line
    code, out, err = run("--token", reader, "status")
    assert code == 1 and out == "" and "permission denied: 'admin'" in err, err
    code, out, _ = run("status")
    assert code == 0 and "coordinator leader: " in out and "g1/master" in out, out
    code, out, _ = run("auth", "revoke", token_id(reader))
    assert code == 0 and "revoked" in out
    code, _, err = run("auth", "revoke", token_id(reader))
    assert code == 1 and "no token" in err
    # issue 42: `auth list` shows the tokens in force; --all the revoked ones too, and when
    code, out, _ = run("auth", "list")
    assert code == 0 and "reader" not in out and "revoked" not in out
    code, out, _ = run("auth", "list", "--all")
    line = next(x for x in out.splitlines() if "reader" in x)
    assert code == 0 and token_id(reader) in line and "consume on q" in line and " UTC" in line
    assert "ops" in out and out.splitlines()[1].split()[-1] == "REVOKED"  # the header names the column
    code, out, _ = run("--json", "auth", "list", "--all")
    doc = __import__("json").loads(out)
    assert [r["id"] for r in doc["revoked"]] == [token_id(reader)] and doc["revoked"][0]["revoked_ms"] > 0
    assert "hash" not in doc["revoked"][0] and token_id(reader) not in [r["id"] for r in doc["tokens"]]
