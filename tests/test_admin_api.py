"""The admin CLI speaks to the coordinator's admin API, not ZooKeeper (issue 37), against real
ZooKeeper, broker and coordinator processes: each verb authorised by the caller's token on the
coordinator, refusals typed and counted, a listing shows only what the token may read, and an
oversized request is refused before it is parsed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from ordq.cli import main
from ordq.common.errors import ConfigError, MessageTooLarge, OrdqError, PermissionDenied
from ordq.common.metrics import value
from ordq.common.security import register
from ordq.coordinator.admin_api import MAX_ARGS_BYTES
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.service import leader_address
from ordq.coordinator.tokens import create_token, touch
from ordq.output import json_text
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import read_metrics, wait_until

pytestmark = pytest.mark.zk


def _token(cluster: Cluster, grants: dict[str, list[str]], name: str) -> str:
    token = create_token(cluster.store.client, cluster.root, grants, name)[1]
    touch(cluster.store.client, cluster.root)
    return token


def _run(cluster: Cluster, capsys: pytest.CaptureFixture[str], token: str, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--zk", cluster.hosts, "--root", cluster.root, "--token", token, *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _refused(samples: Any) -> float:
    return value(samples, "ordq_coordinator_requests_total", rpc="Admin", outcome="PermissionDenied") or 0.0


def _coordinator_metrics(cluster: Cluster) -> str:
    [coordinator] = [p for p in cluster.coordinators if p.alive()]
    return coordinator.wait_for_line("METRICS ", timeout_s=10)


def test_a_consume_token_of_one_queue_sees_and_changes_only_what_it_may(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Guard: the admin API's authorisation (coordinator/admin_api.py, CoordinatorService.Admin).
    A consume token of queue a: ``queue list`` shows only a (issue 42: a one-queue token listed
    every queue); ``queue describe b`` and ``queue delete a`` refused, typed PermissionDenied and
    counted by the coordinator; nothing changed. An admin token does all of it."""
    cluster.add_groups("g1")
    cluster.create_queue("a")
    cluster.create_queue("b")
    cluster.start_daemon("coordinator")
    admin = _token(cluster, {"*": ["admin"]}, "ops")
    register(cluster.hosts, cluster.root, attrs.evolve(cluster.credentials, token=admin))
    reader = _token(cluster, {"a": ["consume"]}, "reader-of-a")
    url = _coordinator_metrics(cluster)

    def listed(token: str) -> list[str] | None:
        code, out, _ = _run(cluster, capsys, token, "queue", "list", "--json")
        return [r["queue"] for r in json.loads(out)] if code == 0 else None

    # the coordinator takes both tokens once it has read them (an unknown one waits for a load)
    assert wait_until(lambda: listed(reader), timeout_s=30, what="the reader's listing") == ["a"]
    code, out, _ = _run(cluster, capsys, reader, "topic", "list", "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = _run(cluster, capsys, reader, "queue", "describe", "a", "--json")
    assert code == 0 and json.loads(out)["queue"] == "a"
    before = _refused(read_metrics(url))
    for argv in (("queue", "describe", "b"), ("queue", "delete", "a"), ("sub", "list", "b"),
                 ("sub", "create", "a", "s"), ("auth", "list")):
        code, out, err = _run(cluster, capsys, reader, *argv)
        assert code == 1 and out == "" and "permission denied" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1
    assert _refused(read_metrics(url)) >= before + 5
    assert sorted(cluster.store.list_queues()) == ["a", "b"] and cluster.store.list_subscriptions("a") == []
    # typed on the wire: the client raises PermissionDenied itself
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=attrs.evolve(cluster.credentials, token=reader)
                           ) as client, pytest.raises(PermissionDenied):
        client.admin("queue describe", queue="b", timeout_s=30)
    # the admin token does all of it
    assert sorted(listed(admin) or []) == ["a", "b"]
    for argv in (("queue", "describe", "b"), ("sub", "create", "a", "s"), ("sub", "list", "a"), ("auth", "list"),
                 ("queue", "delete", "b")):
        code, out, err = _run(cluster, capsys, admin, *argv)
        assert code == 0, (argv, err)
    assert cluster.store.list_queues() == ["a"] and cluster.store.list_subscriptions("a") == ["s"]


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_an_oversized_admin_request_is_refused_before_it_is_parsed(cluster: Cluster) -> None:
    """Guards: ``admin_api.prepare``'s bound (MAX_ARGS_BYTES, 1 MiB: typed ConfigError, counted)
    and the coordinator server's receive limit (MAX_REQUEST_BYTES: gRPC refuses the request
    while reading it). Arguments just over 1 MiB that are not JSON at all are refused as too
    large, so they were never parsed; 2 MiB ones are refused by gRPC itself, and twenty of them
    leave the coordinator's RSS within a few MiB (measured before the receive limit: +44 MB
    for ten, refused after gRPC had decoded them; parsed, each would make ~700k Python lists);
    the CLI's client refuses such arguments without sending them."""
    cluster.add_groups("g1")
    cluster.create_queue("a")
    cluster.start_daemon("coordinator")
    admin = _token(cluster, {"*": ["admin"]}, "ops")
    [coordinator] = [p for p in cluster.coordinators if p.alive()]
    assert coordinator.pid is not None
    pb = CoordinatorClient._pb()
    huge = b'{"prefix": "", "x": [' + b"[]," * ((2 << 20) // 3) + b"[]]}"  # ~700k lists, parsed
    not_json = b"{" + b"x" * (MAX_ARGS_BYTES + 1024)
    url = _coordinator_metrics(cluster)
    with CoordinatorClient(bootstrap=cluster.bootstrap,
                           credentials=attrs.evolve(cluster.credentials, token=admin)) as client:
        wait_until(lambda: client.admin("queue list", timeout_s=30) is not None, timeout_s=30,
                   what="the coordinator takes the admin token")
        with pytest.raises(ConfigError, match="too large"):  # not sent
            client.admin("queue list", prefix="x" * (2 << 20))
        for _ in range(3):
            # typed, counted, never parsed: the service's frame bounds an Admin request at 1 MiB
            # (coordinator/service_frame.py) before admin_api.prepare would see it
            with pytest.raises(MessageTooLarge):
                client._call("Admin", pb.AdminRequest(verb="queue list", args_json=not_json), 30)
        assert (value(read_metrics(url), "ordq_coordinator_requests_total", rpc="Admin", outcome="MessageTooLarge")
                or 0) >= 3
        before = _rss_kib(coordinator.pid)
        for _ in range(20):
            # Each on a connection of its own: a request past gRPC's receive limit leaves its
            # stream open on its connection (the client cannot finish sending it; grpcio 1.85,
            # reproduced with a bare server), and a connection takes 100 calls in flight
            # (FrameConfig.max_streams_per_connection): past them such a sender's connection is
            # refused REFUSED_STREAM (at a bound of 8 this test failed at its 14th). Only its own.
            with CoordinatorClient(bootstrap=client._leader, credentials=client.credentials) as once:
                began = time.monotonic()
                with pytest.raises(OrdqError, match="RESOURCE_EXHAUSTED"):
                    once._call("Admin", pb.AdminRequest(verb="queue list", args_json=huge), 30)
                assert time.monotonic() - began < 10
        grown_kib = _rss_kib(coordinator.pid) - before
        print(f"coordinator RSS {before} KiB, +{grown_kib} KiB after twenty 2 MiB admin requests")
        assert grown_kib < 16 << 10, grown_kib
        assert client.admin("queue list", timeout_s=30)["names"] == ["a"]  # and it serves on


def test_unknown_names_exit_1_with_one_line(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Removing or reading what does not exist is an error of one line, not a silent success
    nor a traceback (the admin API types QueueNotFound, SubscriptionNotFound on the wire)."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    zk = ["--zk", cluster.hosts, "--root", cluster.root]
    for argv, message in [(("queue", "delete", "nosuch"), "unknown queue 'nosuch'"),
                          (("queue", "describe", "nosuch"), "unknown queue 'nosuch'"),
                          (("sub", "delete", "q", "nosuch"), "nosuch"),
                          (("sub", "delete", "nosuch", "s"), "unknown queue 'nosuch'")]:
        assert main([*zk, *argv]) == 1, argv
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ordq: error: ") and message in lines[0], (argv, err)


def test_many_queues_created_at_once_and_listed_from_the_coordinators_copy(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Issue 43: ``queue create A B ...`` and ``--names-from`` create many queues in batched
    transactions (heads spread), leave the ones that exist and name them (exit 1); the admin role
    is needed on every name before any is created. ``queue list`` of them all in one page
    (states from the elected coordinator's copies, one OpenSegments per group) says what a
    describe says of each, also of a queue written to (stored messages, last seq)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    cluster.start_daemon("coordinator")
    admin = _token(cluster, {"*": ["admin"]}, "ops")
    register(cluster.hosts, cluster.root, attrs.evolve(cluster.credentials, token=admin))
    narrow = _token(cluster, {"m-900": ["admin"]}, "admin-of-m-900")
    producer = cluster.producer(n=300, rate=3000.0)
    producer.start()
    names = tmp_path / "names.txt"
    names.write_text("".join(f"m-{i:03d}\n" for i in range(1, 240)))
    code, out, err = _run(cluster, capsys, admin, "--json", "queue", "create", "m-000", "--names-from", str(names))
    assert code == 0, err
    doc = json.loads(out)
    assert [r["queue"] for r in doc["created"]] == [f"m-{i:03d}" for i in range(240)] and doc["existing"] == []
    heads = [r["head"] for r in doc["created"]]
    assert abs(heads.count("g1") - heads.count("g2")) <= 1  # spread
    code, _, err = _run(cluster, capsys, narrow, "queue", "create", "m-900", "other")  # not admin of "other": none made
    assert code != 0 and "lacks the role" in err, err
    code, out, err = _run(cluster, capsys, admin, "queue", "create", "m-000", "m-900")
    assert code == 1 and out.startswith("created 1 queues") and "1 already existed" in err and "m-000" in err
    wait_until(lambda: len(producer.acked) >= 300, timeout_s=60, what="300 acks")
    producer.join(60)

    code, out, err = _run(cluster, capsys, admin, "--json", "queue", "list", "--limit", "1000")
    assert code == 0, err
    # The CLI prints the coordinator's text of the rows as it comes (issue 43: at 10^5 it decoded
    # ~20 MB of rows and encoded them again): byte for byte what --json prints of the rows. Asked
    # ``text_apart``, the text comes apart from the answer's JSON (not escaped into it); a CLI
    # that predates it gets it inside, and one older still the rows.
    leader = leader_address(cluster.store.client, cluster.paths.coordinator_leader)
    with CoordinatorClient(bootstrap=[leader], credentials=attrs.evolve(cluster.credentials, token=admin)) as client:
        plain = client.admin("queue list", timeout_s=30, reach_s=10, limit=1000)
        as_text = client.admin("queue list", timeout_s=30, reach_s=10, limit=1000, rows_as_text=True)
        apart, text = client.admin_with_text("queue list", timeout_s=30, reach_s=10, limit=1000, rows_as_text=True,
                                             text_apart=True)
    assert "rows" not in as_text and as_text["rows_text"] == json_text(plain["rows"]) == out
    assert text.decode() == out and apart == {k: v for k, v in as_text.items() if k != "rows_text"}
    assert json_text(plain["rows"] * 5).startswith("[\n  {")  # the long-list layout, also shared
    rows = {r["queue"]: r for r in json.loads(out)}
    assert set(rows) == {"q", "m-900", *(f"m-{i:03d}" for i in range(240))}
    for q in ("q", "m-000", "m-239"):
        code, out, _ = _run(cluster, capsys, admin, "--json", "queue", "describe", q)
        view = json.loads(out)
        row = rows[q]
        assert (row["head"], row["send"], row["last_seq"], row["stored"]) == (
            view["send"][0] if view["send"] else None, view["send"], view["last_seq"], view["stored"]), q
    assert rows["q"]["last_seq"] == 299 and rows["q"]["stored"] == 300
    assert rows["m-000"]["subscriptions"] == []


def test_topic_group_needs_a_role_on_every_partition(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Guard: ``ordq topic group T G`` is an admin verb that needs a role on every partition of T,
    as ``topic describe`` (ops42g; coordinator/admin_api.py). A consume token for one partition
    of a two-partition topic is refused: exit 1, one line naming the refusal, typed
    PermissionDenied on the wire and counted; the client certificate with no token is refused
    too. A token with a role on both partitions is answered (the verb works; only the role is
    missing)."""
    from ordq.coordinator.topic_names import partition_queue

    cluster.add_groups("g1")
    cluster.store.create_topic("t", 2)
    cluster.start_daemon("coordinator")
    one = _token(cluster, {partition_queue("t", 0): ["consume"]}, "reader-of-t~0")
    both = _token(cluster, {partition_queue("t", i): ["consume"] for i in range(2)}, "reader-of-t")
    url = _coordinator_metrics(cluster)
    # the coordinator takes both tokens once it has read them (an unknown one waits for a load)
    code, out, err = wait_until(lambda: (r := _run(cluster, capsys, both, "topic", "group", "t", "G", "--json"))[0] == 0
                                and r, timeout_s=30, what="topic group answered for a token of every partition")
    assert json.loads(out)["members"] == {}, out
    before = _refused(read_metrics(url))
    code, out, err = _run(cluster, capsys, one, "topic", "group", "t", "G")
    assert code == 1 and out == "" and "permission denied" in err and len(err.strip().splitlines()) == 1, err
    assert partition_queue("t", 1) in err, err  # names the partition it has no role on
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=attrs.evolve(cluster.credentials, token=one)
                           ) as client, pytest.raises(PermissionDenied):
        client.admin("topic group", topic="t", group="G", timeout_s=30)
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=attrs.evolve(cluster.credentials, token=None)
                           ) as client, pytest.raises(PermissionDenied):
        client.admin("topic group", topic="t", group="G", timeout_s=30)
    capsys.readouterr()
    code = main(["--bootstrap", cluster.bootstrap, "topic", "group", "t", "G"])  # the certificate, no token
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and "permission denied" in err and len(err.strip().splitlines()) == 1, err
    assert _refused(read_metrics(url)) >= before + 4
