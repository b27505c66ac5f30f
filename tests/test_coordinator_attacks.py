"""Issue 23: what a client may ask the coordinator service for, consumer side. A consume token of
one queue commits and subscribes on that queue only; a commit moves a cursor only for the holder
of the subscription's consumer lease (issue 37; forged leases: tests/test_consumer_lease_attacks.py).
Refusals are typed, counted by the service, and move nothing.

The service is the coordinator process the test cluster starts with its first queue; refusals
are read from its metrics (``ordq_coordinator_requests_total{rpc, outcome}``)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from ordq.common.errors import LeaseLost, OrdqError, PermissionDenied
from ordq.common.metrics import value
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.state import Cursor
from ordq.coordinator.tokens import create_token, touch
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import read_metrics, refused, wait_until

pytestmark = pytest.mark.zk




def refusals(cluster: Cluster, outcome: str) -> float:
    """Requests the coordinator refused with ``outcome`` (an error type), all RPCs."""
    line = cluster.coordinators[0].wait_for_line("METRICS ", timeout_s=30)
    return value(read_metrics(line.split()[-1]), "ordq_coordinator_requests_total", outcome=outcome) or 0.0


def test_a_consume_token_of_one_queue_cannot_commit_or_subscribe_on_another(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    for q in ("a", "b"):
        cluster.create_queue(q, ["g1"])
    cluster.store.create_subscription("b", "s")
    _, token_a = create_token(cluster.store.client, cluster.root, {"a": ["consume"]}, "consumer of a")
    _, token_b = create_token(cluster.store.client, cluster.root, {"b": ["consume"]}, "consumer of b")
    touch(cluster.store.client, cluster.root)
    anonymous = CoordinatorClient(cluster.store, credentials=cluster.credentials, timeout_s=5)
    holder_of_a = CoordinatorClient(cluster.store, credentials=attrs.evolve(cluster.credentials, token=token_a),
                                    timeout_s=5)
    try:
        # The service learns of tokens through a ZooKeeper watch: wait until it enforces them.
        wait_until(lambda: isinstance(refused(lambda: anonymous.pop("b")), PermissionDenied), timeout_s=30,
                   interval_s=0.05, what="the coordinator service enforcing tokens")
        with CoordinatorClient(cluster.store, credentials=attrs.evolve(cluster.credentials, token=token_b),
                               timeout_s=5) as consumer_of_b:
            real = consumer_of_b.acquire("consumer", "b", "s", "real-consumer-of-b")
        assert isinstance(real, Held)
        before = cluster.store.get_cursor("b", "s")
        subs_before = cluster.store.list_subscriptions("b")
        denied_before = refusals(cluster, "PermissionDenied")
        moved = Cursor(seg=before[0].seg, offset=before[0].offset + 13, last_seq=before[0].last_seq + 13)
        for what, call in (
                ("Subscribe on b", lambda: holder_of_a.subscribe("b", "stolen")),
                ("Commit on b", lambda: holder_of_a.commit("b", "s", moved, before[1], real)),
                ("EnsureParkingQueue on b", lambda: holder_of_a.ensure_parking_queue("b", "s"))):
            err = refused(call)
            assert isinstance(err, PermissionDenied), (what, err)
            assert (err.queue, err.role) == ("b", "consume"), what
        # counted (the wait for enforcement above may have added some Pops; none since)
        assert refusals(cluster, "PermissionDenied") - denied_before == 3
        assert cluster.store.get_cursor("b", "s") == before  # nothing moved
        assert cluster.store.list_subscriptions("b") == subs_before  # nothing created
        assert "b.parked.s" not in cluster.store.list_queues()
        # Its own queue: allowed.
        cursor, _ = holder_of_a.subscribe("a", "mine")
        assert cluster.store.get_cursor("a", "mine")[0] == cursor
    finally:
        anonymous.close()
        holder_of_a.close()


def test_a_commit_from_anyone_but_the_lease_holder_moves_nothing(cluster: Cluster) -> None:
    """Guard: ``check_lease`` in ``_commit`` (coordinator/service.py), then the cursor write
    conditional on the lease node's version. The election path from before leases is gone:
    a commit naming a lock node (as the issue's forged ``x__lock__-0000000001`` did) carries
    no lease and is refused."""
    cluster.add_groups("g1")
    cluster.create_queue("q", ["g1"])
    cluster.store.create_subscription("q", "s")
    cluster.store.create_subscription("q", "other")
    client = CoordinatorClient(cluster.store, credentials=cluster.credentials, timeout_s=5)
    try:
        lease = client.acquire("consumer", "q", "s", "real-consumer")
        other = client.acquire("consumer", "q", "other", "holder-of-other")
        assert isinstance(lease, Held) and isinstance(other, Held)
        cursor, version = cluster.store.get_cursor("q", "s")
        moved = Cursor(seg=cursor.seg, offset=cursor.offset + 13, last_seq=cursor.last_seq + 13)
        lost_before, denied_before = refusals(cluster, "LeaseLost"), refusals(cluster, "PermissionDenied")
        forged = f"{cluster.paths.root}/x__lock__-0000000001"
        for what, held, expected in (
                ("no lease", attrs.evolve(lease, generation=0, key=""), PermissionDenied),
                ("the lease of another subscription", attrs.evolve(other, sub="s"), LeaseLost),
                ("a guessed key", attrs.evolve(lease, key=uuid.uuid4().hex), LeaseLost),
                ("an earlier generation", attrs.evolve(lease, generation=lease.generation - 1), LeaseLost),
                ("a lock node name for a key", attrs.evolve(lease, key=forged), LeaseLost)):
            err = refused(lambda h=held: client.commit("q", "s", moved, version, h))
            assert isinstance(err, expected), (what, err)
        assert refusals(cluster, "LeaseLost") - lost_before == 4  # counted
        assert refusals(cluster, "PermissionDenied") - denied_before == 1
        assert cluster.store.get_cursor("q", "s") == (cursor, version)  # nothing moved
        # The holder itself commits.
        new_version = client.commit("q", "s", moved, version, lease)
        assert cluster.store.get_cursor("q", "s") == (moved, new_version)
    finally:
        client.close()


def test_a_consume_token_cannot_rebalance_heads(cluster: Cluster) -> None:
    """Issue 43: ``ordq group rebalance`` moves the heads of any queue, so it is an admin verb
    (``"group rebalance": AdminVerb("admin", everywhere, ...)`` in ordq/admin/api.py). A
    hand-made client holding a consume token of every queue asks the admin API to rebalance,
    for real and as a dry run: refused, typed PermissionDenied, counted, and no head moved. The
    admin token's dry run shows the refusal was not an empty plan."""
    cluster.add_groups("g1", "g2")
    # the coordinator's own spread off: only the verb could move a head
    coordinator = cluster.start_daemon("coordinator-1", extra=["--rebalance-moves-per-s", "0"])
    idle = [f"idle-{i}" for i in range(6)]
    created, _ = cluster.store.create_queues(idle, groups=["g1", "g2"])
    assert all(st.head == "g1" for st in created)
    _, admin = create_token(cluster.store.client, cluster.root, {"*": ["admin"]}, "ops")
    _, consume = create_token(cluster.store.client, cluster.root, {"*": ["consume"]}, "reader of every queue")
    touch(cluster.store.client, cluster.root)
    url = coordinator.wait_for_line("METRICS ", timeout_s=30).split()[-1]

    def denied() -> float:
        return value(read_metrics(url), "ordq_coordinator_requests_total", rpc="Admin",
                     outcome="PermissionDenied") or 0.0

    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=attrs.evolve(cluster.credentials, token=admin),
                           timeout_s=10) as operator, \
            CoordinatorClient(bootstrap=cluster.bootstrap,
                              credentials=attrs.evolve(cluster.credentials, token=consume), timeout_s=10) as reader:
        # the tokens are in force, the daemon leads and its view holds the 6 queues made after it
        # started once the operator's dry run counts their heads (make test, stop 94: a first
        # answer from a view read before the queues came counted none)
        def counted() -> Any:
            plan = _ok(lambda: operator.admin("group rebalance", max_moves=1000, dry_run=True))
            return plan if plan is not None and sum(plan["before"].values()) == len(idle) else None

        plan = wait_until(counted, timeout_s=30, interval_s=0.1, what="the operator's dry run, counting the queues")
        assert plan["before"] == {"g1": 6, "g2": 0} and len(plan["moves"]) == 3, plan
        before = denied()
        for dry_run in (False, True):
            err = refused(functools.partial(reader.admin, "group rebalance", max_moves=1000, dry_run=dry_run))
            assert isinstance(err, PermissionDenied), (dry_run, err)
            assert err.role == "admin", err
        assert denied() - before == 2  # counted
    states = cluster.store.load_states(idle)
    assert all(not isinstance(v, Exception) and v[0].head == "g1" for v in states.values()), states  # nothing moved


def _ok(call: Callable[[], Any]) -> Any:
    """What ``call`` returned, or None when it raised an OrdqError (not ready yet)."""
    try:
        return call()
    except OrdqError:
        return None
