"""Issue 38, stop e: a coordinator call that changes nothing costs what it needs to know so, not a
read of every fact. The handler is run in-process on a real ZooKeeper (no server, no gRPC); its
ZooKeeper requests are counted on its thread (``store_base.requests_waited``), as the fair share
charges them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ordq.common.errors import AlreadyExists, ConflictError, QueueNotFound, SubscriptionNotFound
from ordq.coordinator import state as sm
from ordq.coordinator.lease_desk import Grant
from ordq.coordinator.leases import Kind, LeaseName
from ordq.coordinator.service import CoordinatorService
from ordq.coordinator.state import Facts
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import requests_waited
from ordq.wire import ordq_pb2 as pb

pytestmark = pytest.mark.zk


@pytest.fixture
def service(zk_server, zk_root) -> Iterator[CoordinatorService]:  # type: ignore[no-untyped-def]
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        svc = CoordinatorService(store, is_leader=lambda: True)
        svc._pb = pb
        yield svc


def test_a_pop_that_can_drop_nothing_is_answered_from_one_read(service: CoordinatorService) -> None:
    """An open queue's Pop (its head not sealed) read every subscription's cursor, the groups'
    liveness and drain marks, then the state again: 8.6 ZooKeeper requests each (measured), for
    a flood of Pops ~7 ms of the coordinator's and ZooKeeper's CPU a call. Now one read; a Pop
    that can drop its head still does."""
    store = service.store
    for gid in ("g1", "g2"):
        store.add_group(gid)
    store.create_queue("a", ["g1", "g2"])
    for i in range(5):
        store.create_subscription("a", f"s{i}")
    store.apply("a", lambda s, _f: sm.admit_all(s, Facts(live_groups=frozenset({"g1", "g2"}))))
    st, _ = store.load_state("a")
    assert st.open_segment is not None and not sm.may_pop(st)
    before = requests_waited()
    answer = service._pop("a")
    assert requests_waited() - before == 1
    assert json.loads(answer.state_json) == st.to_dict()
    # Sealed (empty) at the head: the facts are read and the transition decides, as before:
    # kept while a subscription is at it, dropped on a queue with none.
    live = Facts(live_groups=frozenset({"g1", "g2"}))
    for q in ("a", "b"):
        if q == "b":
            store.create_queue("b", ["g1", "g2"])
            store.apply("b", lambda s, _f: sm.admit_all(s, Facts(live_groups=frozenset({"g1", "g2"}))))
        seg = store.load_state(q)[0].consume[0].seg
        store.apply(q, lambda s, _f, seg=seg: sm.fail_over(s, "g1", seg, live))  # type: ignore[misc]
        store.apply(q, lambda s, _f, seg=seg: sm.seal(s, seg, 0, None, None))  # type: ignore[misc]
        assert sm.may_pop(store.load_state(q)[0])
        before = requests_waited()
        answer = json.loads(service._pop(q).state_json)
        assert requests_waited() - before > 5
        assert [x["seg"] for x in answer["consume"]] == ([seg, seg + 1] if q == "a" else [seg + 1])


def test_a_subscribe_of_one_that_exists_is_refused_on_one_read(service: CoordinatorService) -> None:
    """Creating it again wrote a transaction (the state and the cursor) that ZooKeeper's leader
    refused: ~5 requests and 6.6 ms of the coordinator's and ZooKeeper's CPU for a call that
    changes nothing. Refused AlreadyExists as before, on one read; a new one is still created,
    and one on a queue that does not exist is still QueueNotFound."""
    store = service.store
    store.add_group("g1")
    store.create_queue("a", ["g1"])
    store.create_subscription("a", "s")
    version = store.client.exists(store.paths.state("a")).version
    before = requests_waited()
    with pytest.raises(AlreadyExists):
        service._subscribe(pb.SubscribeRequest(queue="a", subscription="s"))
    assert requests_waited() - before == 1
    assert store.client.exists(store.paths.state("a")).version == version
    cursor = json.loads(service._subscribe(pb.SubscribeRequest(queue="a", subscription="t")).cursor_json)
    assert store.get_cursor("a", "t")[0].to_dict() == cursor
    with pytest.raises(QueueNotFound):
        service._subscribe(pb.SubscribeRequest(queue="nope", subscription="s"))


def test_a_commit_reads_its_cursor_and_the_state_in_one_round_trip(service: CoordinatorService) -> None:
    """Stop k: the neighbour's Commit in the control-plane drill was almost all ZooKeeper waiting
    (its three requests, each behind the flood's on the leader's one session), slower in the
    flood's windows. It read the cursor, waited, then read the state and waited: both reads now
    go out before either is awaited (ZooKeeper answers them in order, as before), then the write.
    The answers are as before: committed, a moved cursor ConflictError, a missing subscription
    SubscriptionNotFound, a missing queue QueueNotFound."""
    store = service.store
    store.add_group("g1")
    store.create_queue("a", ["g1"])
    store.apply("a", lambda s, _f: sm.admit_all(s, Facts(live_groups=frozenset({"g1"}))))
    store.create_subscription("a", "s")
    grant = service.leases.acquire(LeaseName(Kind.CONSUMER, "a", "s"), "consumer-1", ttl_ms=30_000)
    assert isinstance(grant, Grant)
    cursor, version = store.get_cursor("a", "s")
    steps: list[str] = []
    send, wait = store.client.get_async, store._wait

    def sent(*args: object, **kwargs: object) -> object:
        steps.append("send")
        return send(*args, **kwargs)

    def waited(request: object) -> object:
        steps.append("wait")
        return wait(request)

    def commit(sub: str = "s", version: int = version, queue: str = "a") -> int:
        request = pb.CommitRequest(queue=queue, subscription=sub, cursor_json=json.dumps(cursor.to_dict()).encode(),
                                   version=version, generation=grant.record.generation, lease_key=grant.key)
        return int(service._commit(request).version)

    store.client.get_async, store._wait = sent, waited  # type: ignore[method-assign]
    try:
        assert commit() == version + 1
        assert steps[:2] == ["send", "send"], steps  # both reads in flight before the first answer
        assert steps.count("wait") == 3, steps  # the two answers and the write's
        with pytest.raises(ConflictError):
            commit()  # the version it read moved
    finally:
        store.client.get_async, store._wait = send, wait  # type: ignore[method-assign]
    assert store.get_cursor("a", "s") == (cursor, version + 1)
    with pytest.raises(SubscriptionNotFound):
        store.cursor_and_state("a", "nope")
    with pytest.raises(QueueNotFound):
        store.cursor_and_state("nope", "s")
