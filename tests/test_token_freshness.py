"""Tokens as a user meets them right after ``ordq auth create`` and while a server cannot read
the token store (issue 24).

- A token used the moment ``auth create`` printed it is taken by the broker and by the
  coordinator service, every time (before: refused until their ZooKeeper watch fired).
- A garbage-token flood costs ZooKeeper at most one token load per ``REFRESH_EVERY_S``.
- A broker whose token store is unreadable answers TokensUnavailable (retriable), not
  PermissionDenied; a producer waits it out on the same head (no failover), a definite
  refusal stays final.

One local cluster (``ordq up``'s: tokens, ZooKeeper ACLs, TLS) serves the module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import grpc
import pytest

from ordq.cli import main
from ordq.cluster_config import ClusterConfig
from ordq.common.errors import PermissionDenied, QueueNotFound, TokensUnavailable
from ordq.common.security import channel, register_coordinators
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.store import ZkStore
from ordq.coordinator.token_book import REFRESH_EVERY_S, TokenBook
from ordq.coordinator.tokens import create_token, tokens_path, touch
from ordq.local_cluster import LocalCluster
from ordq.sdk import Producer, ProducerConfig
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS
from tests.util import wait_until

pytestmark = pytest.mark.zk
Q = "q"


@attrs.define
class Env:
    cluster: LocalCluster
    admin: ZkStore
    broker: Any  # a BrokerStub on g1's master
    coordinator: Any  # a CoordinatorStub on the leader
    channels: list[grpc.Channel]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    cluster = LocalCluster(tmp_path_factory.mktemp("fresh") / "c",
                           ClusterConfig(groups=1, coordinators=1, root="/fresh"))
    cluster.start()
    # where its coordinators answer, as a client finds them: the admin CLI asks them (issue 37)
    register_coordinators(cluster.zk_hosts, cluster.root,
                          [p.wait_for_line("SERVING ", timeout_s=30) for p in cluster.coordinators])
    admin = ZkStore.connect(cluster.zk_hosts, cluster.root, auth=cluster.admin_auth)
    channels: list[grpc.Channel] = []
    try:
        admin.create_queue(Q, ["g1"])
        creds = cluster.credentials
        master = admin.live_members("g1")["master"].address
        leader = CoordinatorClient(admin, credentials=creds).leader()
        channels = [channel(master, creds, GRPC_OPTIONS), channel(leader, creds, GRPC_OPTIONS)]
        yield Env(cluster, admin, pb_grpc.BrokerStub(channels[0]),  # type: ignore[no-untyped-call]
                  pb_grpc.CoordinatorStub(channels[1]), channels)  # type: ignore[no-untyped-call]
    finally:
        for ch in channels:
            ch.close()
        admin.close()
        cluster.stop()
        cluster.destroy()


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _broker_takes(env: Env, token: str) -> None:
    """A Health call with ``token`` (consume on every queue): passes, or raises the typed error."""
    try:
        env.broker.Health(pb.HealthRequest(), metadata=_md(token), timeout=10)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, "g1 master") from exc


def _coordinator_takes(env: Env, token: str) -> None:
    """A Subscribe on a queue that does not exist: a token the coordinator takes gets as far as
    QueueNotFound (nothing is created); one it refuses gets PermissionDenied."""
    try:
        env.coordinator.Subscribe(pb.SubscribeRequest(queue="nosuchq", subscription="s"), metadata=_md(token),
                                  timeout=10)
    except grpc.RpcError as exc:
        err = from_rpc_error(exc, "coordinator")
        if not isinstance(err, QueueNotFound):
            raise err from exc


def test_a_new_token_is_taken_at_once(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """``ordq auth create`` then the token at once, many times: never refused (fails on the
    old code, which knew a token only once its watch had fired)."""
    zk = ["--zk", env.cluster.zk_hosts, "--root", env.cluster.root]
    for i in range(6):
        assert main([*zk, "auth", "create", "--role", "consume", "--name", f"fresh{i}"]) == 0
        token = capsys.readouterr().out.splitlines()[0]
        (_broker_takes if i % 2 else _coordinator_takes)(env, token)
    for i in range(20):  # the API's own create, no CLI between: the tightest window
        token = create_token(env.admin.client, env.cluster.root, {"*": ["consume"]}, f"api{i}")[1]
        touch(env.admin.client, env.cluster.root)
        _broker_takes(env, token)
        _coordinator_takes(env, token)


def test_a_garbage_flood_is_bounded_and_refused(env: Env) -> None:
    """Well-formed unknown tokens from 8 threads for 1 s: every one refused PermissionDenied,
    and the broker's loads for them bounded by the rate limit (counted in-process on a
    TokenBook of our own: the same code)."""
    book = TokenBook()
    book.watch(env.admin.client, env.cluster.root)
    t0 = time.monotonic()
    refused: list[int] = []

    def flood(n: int) -> None:
        count = 0
        while time.monotonic() - t0 < 1.0:
            token = f"ordq_{n:04x}{count:04x}_" + "A" * 43
            book.fresh_for(token, book.now())
            assert book.unknown(token)
            count += 1
        refused.append(count)

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - t0
    assert sum(refused) >= 8
    assert book.refreshes <= elapsed / REFRESH_EVERY_S + 2, (book.refreshes, elapsed)
    with pytest.raises(PermissionDenied, match="unknown or revoked"):
        _broker_takes(env, "ordq_0badf00d_" + "A" * 43)


def test_a_waiter_that_gives_up_leaves_the_others_waiting(env: Env) -> None:
    """Callers waiting for the same refresh (a TokenBook of our own, the same code): one
    cancels its wait (its call went away), the other still gets the load. Before, every
    caller shared one future: the first to give up cancelled everyone's wait."""
    book = TokenBook(refresh_every_s=0.5)
    book.watch(env.admin.client, env.cluster.root)
    book.fresh_after(book.now()).result(timeout=10)  # a refresh now: the next waits ~0.5 s
    gives_up, waits = book.fresh_after(book.now()), book.fresh_after(book.now())
    assert gives_up.cancel()
    assert waits.result(timeout=10) is None
    assert not waits.cancelled()


def test_a_call_that_gives_up_waiting_for_a_token_load_does_not_cancel_its_neighbours(env: Env) -> None:
    """The attack: calls with a token the broker does not know yet wait for the next token
    load, which one refresh serves (rate-limited: one per 0.2 s). A client sends such calls
    with a 50 ms deadline, so they give up while waiting; a neighbour's call with a token
    created a moment ago (the broker's copy not yet told) waits for the same load. Guard:
    each waiter holds its own future (TokenBook.fresh_after); before, the first caller to
    give up cancelled the shared one and the neighbour's call was never answered: it ended
    at its own 10 s deadline (DEADLINE_EXCEEDED) in 3 of the 5 rounds."""
    ended: list[str] = []
    for i in range(5):
        with pytest.raises(PermissionDenied):  # a load starts now: the next one waits for the rate limit
            _broker_takes(env, f"ordq_0bad{i:04x}_" + "A" * 43)
        quitter = env.broker.Health.future(pb.HealthRequest(), metadata=_md(f"ordq_0bae{i:04x}_" + "A" * 43),
                                           timeout=0.05)
        token = create_token(env.admin.client, env.cluster.root, {"*": ["consume"]}, f"neighbour{i}")[1]
        try:
            _broker_takes(env, token)  # no touch: the broker learns of it from the shared load
        except Exception as exc:  # noqa: BLE001 - every outcome is reported below
            ended.append(repr(exc))
        with pytest.raises(grpc.RpcError):
            quitter.result()
    assert not ended, ended


def _lock_tokens(env: Env) -> Any:
    """Make ``<root>/auth/tokens`` unreadable to the cluster's identity (a third digest identity
    holds it): the broker's and the coordinator's next token load fails. Returns the undo."""
    from kazoo.client import KazooClient
    from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

    path = tokens_path(env.cluster.root)
    acls, _ = env.admin.client.get_acls(path)
    env.admin.client.set_acls(path, [ACL(Permissions.ALL, Id("digest", make_digest_acl_credential("locker", "pw")))])

    def undo() -> None:
        locker = KazooClient(hosts=env.cluster.zk_hosts, auth_data=[("digest", "locker:pw")])
        locker.start(timeout=15)
        try:
            locker.set_acls(path, acls)
        finally:
            locker.stop()
            locker.close()

    return undo


def _wait_broker(env: Env, token: str, want: type[BaseException] | None) -> None:
    def seen() -> bool:
        try:
            _broker_takes(env, token)
        except (TokensUnavailable, PermissionDenied) as exc:
            return want is not None and isinstance(exc, want)
        return want is None

    wait_until(seen, timeout_s=30, interval_s=0.05, what=f"the broker answers {want}")


def test_unreadable_token_store_is_retriable_not_a_refusal(env: Env) -> None:
    """While the master's token store is unreadable it answers TokensUnavailable (UNAVAILABLE),
    not PermissionDenied; a running producer waits on the same head and its sends are acked
    once the store loads again, with no failover and no new segment (fails on the old code:
    the producer stopped with PermissionDenied)."""
    good = create_token(env.admin.client, env.cluster.root, {"*": ["produce", "consume"]}, "good")[1]
    touch(env.admin.client, env.cluster.root)
    creds = attrs.evolve(env.cluster.credentials, token=good)
    with Producer(ProducerConfig(zk_hosts=env.cluster.zk_hosts, root=env.cluster.root, queue=Q,
                                 credentials=creds, send_timeout_s=5)) as p:
        p.send(b"before").result(timeout=30)
        segments = [s.seg for s in env.admin.load_state(Q)[0].consume]
        undo = _lock_tokens(env)
        try:
            touch(env.admin.client, env.cluster.root)
            _wait_broker(env, good, TokensUnavailable)
            with pytest.raises(TokensUnavailable):  # garbage too: nothing can be judged now
                _broker_takes(env, "ordq_0badf00d_" + "A" * 43)
            futures = [p.send(f"m{i}".encode()) for i in range(5)]
            wait_until(lambda: p.statistics().tokens_unavailable > 0, timeout_s=30,
                       what="the producer met the unreadable store")
            assert not any(f.done() for f in futures)
        finally:
            undo()
        touch(env.admin.client, env.cluster.root)
        for f in futures:
            f.result(timeout=60)
        assert p.statistics().failovers == 0
    assert [s.seg for s in env.admin.load_state(Q)[0].consume] == segments
    _wait_broker(env, good, None)
    with pytest.raises(PermissionDenied):  # a definite refusal is final again
        _broker_takes(env, "ordq_0badf00d_" + "A" * 43)
