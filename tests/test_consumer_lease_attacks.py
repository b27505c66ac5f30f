"""Issue 37's attack on a subscription, against consumers that hold leases: a client with a
consume token of queue Q forges a commit for another subscription of Q. Every forgery is
refused (LeaseLost or PermissionDenied), counted in ``ordq_coordinator_requests_total``, and the
other subscription's cursor and records are unchanged."""

from __future__ import annotations

import json
import uuid

import attrs
import pytest

from ordq.common.errors import LeaseLost, PermissionDenied
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.state import Cursor
from ordq.coordinator.tokens import create_token, touch
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk._lease_client import CoordinatorLease
from ordq.wire import ordq_pb2 as pb
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import refused, wait_until

pytestmark = pytest.mark.zk




def test_a_consume_token_cannot_commit_for_another_subscription(cluster: Cluster) -> None:
    """Guards: ``check_lease`` in Commit and ``LeaseDesk.check`` in SubscriptionRecord (a lease
    is checked against the record of the subscription the request names: its generation and the
    digest of its secret key); a commit carrying no lease is refused, whatever lock node it
    names (coordinator/service.py ``_commit``: the election path from before leases is gone).
    Failing first: while that path was there, a node planted in subscription b's (now empty)
    election was its "first contender", and a commit naming it moved b's cursor past messages
    b's consumer never delivered."""
    cluster.add_groups("g1")
    cluster.create_queue("q", ["g1"])
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=30.0)) as p:
        p.send(b"m").result(60)
    for sub in ("a", "b"):
        cluster.store.create_subscription("q", sub)
    _, token = create_token(cluster.store.client, cluster.root, {"q": ["consume"]}, "consumer of q/a")
    _, real_token = create_token(cluster.store.client, cluster.root, {"q": ["consume"]}, "consumer of q/b")
    touch(cluster.store.client, cluster.root)
    attacker = CoordinatorClient(bootstrap=cluster.bootstrap, timeout_s=5,
                                 credentials=attrs.evolve(cluster.credentials, token=token))
    anonymous = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials, timeout_s=5)
    own = CoordinatorLease(attacker, "consumer", "q", "a", "attacker", ttl_s=3.0)
    # b's real consumer holds b's lease.
    real = Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="b",
                                   credentials=attrs.evolve(cluster.credentials, token=real_token)))
    try:
        wait_until(lambda: isinstance(refused(lambda: anonymous.pop("q")), PermissionDenied), timeout_s=30,
                   interval_s=0.05, what="the coordinator service enforcing tokens")
        real.start()
        assert own.acquire(30)  # the attacker's own, legitimate lease of subscription a
        before, version = cluster.store.get_cursor("q", "b")
        b_lease = cluster.consumer_lease("q", "b")
        assert b_lease is not None and b_lease.holder == real.config.consumer_id
        moved = Cursor(seg=before.seg, offset=before.offset + 1, last_seq=before.last_seq + 1)
        lost0 = cluster.coordinator_requests(rpc="Commit", outcome="LeaseLost")
        denied0 = cluster.coordinator_requests(rpc="Commit", outcome="PermissionDenied")
        records0 = cluster.coordinator_requests(rpc="SubscriptionRecord", outcome="LeaseLost")

        forged = Held(kind="consumer", queue="q", sub="b", holder="attacker", generation=b_lease.generation,
                      key=uuid.uuid4().hex, ttl_ms=3000)
        guessed = attrs.evolve(forged, generation=b_lease.generation + 1)
        a_for_b = attrs.evolve(own.held, sub="b")  # its own lease of a, named for b
        for what, held in (("b's generation with a made-up key", forged), ("a made-up generation", guessed),
                           ("its lease of a, used for b", a_for_b)):
            exc = refused(lambda held=held: attacker.commit("q", "b", moved, version, held))
            assert isinstance(exc, LeaseLost), (what, exc)
            for op, body in (("set_blocked", {"seq": 0, "error": "planted"}),
                             ("record_parked", {"seq": 0, "status": "replay", "parking_queue": "q",
                                                "parked_seq": 0}),
                             ("parked", None)):
                exc = refused(lambda held=held, op=op, body=body: attacker.record(held, op, body))
                assert isinstance(exc, LeaseLost), (what, op, exc)
        # A commit with no lease at all, and one naming a node planted in b's election.
        no_lease = Held(kind="consumer", queue="q", sub="b", holder="attacker", generation=0, key="", ttl_ms=3000)
        assert isinstance(refused(lambda: attacker.commit("q", "b", moved, version, no_lease)), PermissionDenied)
        planted = cluster.store.client.create(f"{cluster.paths.sub_leader('q', 'b')}/x__lock__", b"attacker",
                                              ephemeral=True, sequence=True, makepath=True)
        naming_it = pb.CommitRequest(queue="q", subscription="b", version=version, holder=planted,
                                     cursor_json=json.dumps(moved.to_dict()).encode())
        exc = refused(lambda: attacker._call("Commit", naming_it, 5.0))  # as a client from before leases sent it
        assert isinstance(exc, PermissionDenied), exc

        assert cluster.store.get_cursor("q", "b") == (before, version)  # nothing moved
        assert cluster.store.parked("q", "b") == [] and cluster.store.blocked("q", "b") is None
        assert cluster.consumer_lease("q", "b") == b_lease  # b's consumer keeps its lease
        assert cluster.coordinator_requests(rpc="Commit", outcome="LeaseLost") == lost0 + 3
        assert cluster.coordinator_requests(rpc="Commit", outcome="PermissionDenied") == denied0 + 2
        assert cluster.coordinator_requests(rpc="SubscriptionRecord", outcome="LeaseLost") == records0 + 9
        # b's consumer is untouched: it delivers seq 0 and commits.
        got: list[int] = []
        wait_until(lambda: got.extend(m.seq for m in real.poll(timeout_s=0.1)) or got, timeout_s=30,
                   what="b's consumer to deliver")
        assert got == [0]
        real.commit()
        assert cluster.store.get_cursor("q", "b")[0].last_seq == 0
    finally:
        real.close()
        own.stop()
        attacker.close()
        anonymous.close()
