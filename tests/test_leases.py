"""Leases the coordinator grants (coordinator/leases.py, lease_desk.py, service_leases.py;
sdk/_lease_client.py): the arithmetic without I/O, property-tested for "never two holders at
once"; then on a real ZooKeeper and real coordinator processes, reached by address only."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ClosedError, LeaseLost, PermissionDenied, SubscriptionNotFound
from ordq.coordinator import state as sm
from ordq.coordinator.client import CoordinatorClient, Held, Refusal
from ordq.coordinator.leases import (
    CLIENT_TRUST,
    Kind,
    LeaseBook,
    LeaseName,
    LeaseRecord,
    key_digest,
    margin_s,
)
from ordq.coordinator.state import Cursor
from ordq.sdk._lease_client import CoordinatorLease
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.util import wait_until

Q = LeaseName(Kind.CONSUMER, "q", "s")


def grant(book: LeaseBook, holder: str, now: float, *, ttl_ms: int = 1000, key: str = "k") -> LeaseRecord:
    d = book.decide(Q, now)
    assert d.free
    rec = LeaseRecord(holder=holder, generation=d.generation + 1, key_hash=key_digest(key), ttl_ms=ttl_ms)
    book.granted(Q, rec, now)
    return rec


def test_a_successor_is_granted_only_after_ttl_and_margin() -> None:
    book = LeaseBook()
    book.learn(Q, None, 0.0)
    grant(book, "A", 0.0, key="a")
    until = 1.0 + margin_s(1000)
    d = book.decide(Q, until - 0.01)
    assert not d.free and d.holder == "A" and d.retry_s == pytest.approx(0.01)
    book.renew(Q, 1, "a", 0.5)  # a renewal pushes it on
    assert not book.decide(Q, until + 0.1).free
    assert book.decide(Q, 0.5 + until).free
    rec = grant(book, "B", 0.5 + until, key="b")
    assert rec.generation == 2
    with pytest.raises(LeaseLost, match="superseded"):
        book.renew(Q, 1, "a", 10.0)  # A's generation is gone for good
    with pytest.raises(LeaseLost, match="key"):
        book.renew(Q, 2, "a", 10.0)  # B's generation with A's key: a forgery


def test_a_lapsed_lease_nobody_took_is_revived_and_a_released_one_is_free_at_once() -> None:
    book = LeaseBook()
    book.learn(Q, None, 0.0)
    grant(book, "A", 0.0, key="a")
    assert not book.held(Q, 5.0)
    assert book.renew(Q, 1, "a", 5.0).generation == 1  # nobody took it: A goes on
    assert book.held(Q, 5.1)
    released = book.released(Q, 1, "a")
    book.granted(Q, released, 5.2)
    assert book.decide(Q, 5.2).free  # no wait after a release
    with pytest.raises(LeaseLost):
        book.check(Q, 1, "a", 5.2)  # and the released holder may not commit


def test_a_new_term_honours_a_lease_it_reads_in_full() -> None:
    book = LeaseBook()
    rec = LeaseRecord(holder="A", generation=7, key_hash=key_digest("a"), ttl_ms=2000)
    book.learn(Q, rec, 100.0)  # we cannot know when A last renewed: as if just now
    assert not book.decide(Q, 100.0 + 2.0 + margin_s(2000) - 0.01).free
    assert book.decide(Q, 100.0 + 2.0 + margin_s(2000)).free
    assert book.check(Q, 7, "a", 100.5).generation == 7


# A client's validity, as sdk/_lease_client.py counts it: from the send time of the request
# whose answer granted or renewed it, for CLIENT_TRUST of the ttl.
op = st.tuples(st.sampled_from(["acquire", "beat", "release", "wait"]), st.integers(0, 2),
               st.floats(0.0, 1.5), st.floats(0.0, 1.5))


@settings(max_examples=300, deadline=None)
@given(st.lists(op, min_size=1, max_size=40))
def test_never_two_holders_believe_they_hold_the_lease_at_once(ops: list[tuple[str, int, float, float]]) -> None:
    """Whatever the delays of requests and answers (up to 1.5 ttl each way) and pauses between
    them, the intervals in which clients believe they hold the lease never overlap."""
    book = LeaseBook()
    book.learn(Q, None, 0.0)
    t = 0.0
    held: dict[int, tuple[int, str]] = {}  # client -> (generation, key) it was granted
    beliefs: list[tuple[float, float, int]] = []  # (from, until, client)
    ttl_ms = 1000
    for kind, c, to_coord, back in ops:
        sent = t
        t = sent + to_coord  # the coordinator handles it now (time only goes forward)
        answered = t + back
        if kind == "wait":
            continue
        if kind == "acquire":
            d = book.decide(Q, t)
            if not d.free:
                continue
            key = f"{c}-{d.generation + 1}"
            rec = LeaseRecord(holder=str(c), generation=d.generation + 1, key_hash=key_digest(key), ttl_ms=ttl_ms)
            book.granted(Q, rec, t)
            held[c] = (rec.generation, key)
        elif c not in held:
            continue
        elif kind == "beat":
            try:
                book.renew(Q, *held[c], t)
            except LeaseLost:
                continue
        else:  # release
            try:
                book.granted(Q, book.released(Q, *held[c]), t)
            except LeaseLost:
                pass
            # it stops believing when it sends the release
            beliefs[:] = [(a, min(b, sent), x) if x == c else (a, b, x) for a, b, x in beliefs]
            continue
        until = sent + ttl_ms / 1000.0 * CLIENT_TRUST
        if answered < until:
            beliefs.append((answered, until, c))
    for i, (a1, b1, c1) in enumerate(beliefs):
        for a2, b2, c2 in beliefs[i + 1:]:
            if c1 != c2:
                assert b1 <= a2 or b2 <= a1, f"clients {c1} and {c2} both held the lease: {beliefs}"


# -- on real processes ------------------------------------------------------------------------

def _client(cluster: Cluster) -> CoordinatorClient:
    """A client as an application has one: the coordinators' addresses, its certificate and
    its token; no ZooKeeper."""
    return CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials)


@pytest.mark.zk
def test_leases_through_the_service_with_no_zookeeper_session(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")
    cluster.store.create_subscription("q", "s")
    with _client(cluster) as c:
        a = c.acquire("consumer", "q", "s", "A", ttl_ms=1000)
        assert isinstance(a, Held) and a.generation == 1
        b = c.acquire("consumer", "q", "s", "B", ttl_ms=1000)
        assert isinstance(b, Refusal) and b.holder == "A" and b.retry_s > 0
        # A commits with its lease; a forged key or an old generation is refused, counted
        st = c.describe("q", subscription="s", with_config=True, with_live=True)
        assert st.cursor == Cursor(seg=0) and st.live is not None and set(st.live["g1"]) == {"master", "slave"}
        assert c.commit("q", "s", Cursor(seg=0), st.cursor_version, a) == st.cursor_version + 1
        forged = Held(kind="consumer", queue="q", sub="s", holder="B", generation=1, key="guess", ttl_ms=1000)
        with pytest.raises(LeaseLost):
            c.commit("q", "s", Cursor(seg=0), st.cursor_version + 1, forged)
        with pytest.raises(PermissionDenied):  # no lease at all (and no election node either)
            c.commit("q", "s", Cursor(seg=0), st.cursor_version + 1, attrs.evolve(a, generation=0, key=""))
        # A stops renewing (a pause): B is granted once A's lease ran out, not before
        asked = time.monotonic()
        got = wait_until(lambda: (r if isinstance(r := c.acquire("consumer", "q", "s", "B", ttl_ms=1000), Held)
                                  else None), timeout_s=30, interval_s=0.05, what="B granted")
        assert time.monotonic() - asked >= 1.0  # at least the ttl after A's grant
        assert got.generation == 2
        with pytest.raises(LeaseLost):
            c.heartbeat(a)  # A comes back: it is told, and rejoins as a standby
        with pytest.raises(SubscriptionNotFound):
            c.acquire("consumer", "q", "nope", "A")
        assert c.coordinators[0] in cluster.bootstrap.split(",")


@pytest.mark.zk
def test_a_new_coordinator_honours_leases_in_flight(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")
    cluster.store.create_subscription("q", "s")
    first = cluster.start_daemon("coordinator-1")
    cluster.start_daemon("coordinator-2")
    with _client(cluster) as c:
        lease = CoordinatorLease(c, "consumer", "q", "s", "A", ttl_s=2.0)
        assert lease.acquire(30)
        assert lease.valid()
        first.kill()  # the leader dies with A's lease in memory only
        # the standby takes over; B asks all along and must not get it while A renews
        standby_grants = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            r = c.acquire("consumer", "q", "s", "B", ttl_ms=2000, timeout_s=15)
            if isinstance(r, Held):
                standby_grants.append(r)
                break
            time.sleep(0.1)
        assert not standby_grants, "a new coordinator granted a lease its holder kept renewing"
        assert lease.valid() or lease.wait_valid(5.0)
        assert lease.stats.lost == 0
        lease.stop()  # released: B at once
        assert isinstance(c.acquire("consumer", "q", "s", "B", ttl_ms=2000, timeout_s=15), Held)


def test_a_renewal_whose_client_was_closed_under_a_live_lease_says_so_and_ends(caplog: Any) -> None:
    """The owner closed its coordinator client without stopping the lease first: the renewal
    ends with a warning (the lease then runs out), not an unhandled exception on its thread."""
    class Closed:
        def heartbeat(self, held: Held, *, with_state: bool = False, timeout_s: float) -> Held:
            raise ClosedError("coordinator client is closed")

    lease = CoordinatorLease(Closed(), "consumer", "q", "s", "A", ttl_s=1.0)  # type: ignore[arg-type]
    lease._held = Held(kind="consumer", queue="q", sub="s", holder="A", generation=1, key="k", ttl_ms=1000)
    lease._renew_once()
    assert "its coordinator client was closed under it" in caplog.text


@pytest.mark.zk
def test_a_renewal_under_way_when_the_owner_stops_and_closes_its_client_ends_quietly(cluster: Cluster) -> None:
    """Seen once in test_zookeeper_leader_node_killed (load 12): a consumer's close stopped its
    lease, then closed its coordinator client while the lease thread was already renewing; the
    thread died on gRPC's ``ValueError: Channel closed`` (an unhandled thread exception). Here
    the renewal is held after it took its channel, until the client is closed."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    cluster.store.create_subscription("q", "s")
    entered, go, hold = threading.Event(), threading.Event(), threading.Event()

    class HeldRenewal(CoordinatorClient):
        def _stub(self, address: str) -> Any:
            stub = super()._stub(address)  # the channel taken, then closed under the call
            if hold.is_set():
                entered.set()
                go.wait(30)
            return stub

    c = HeldRenewal(bootstrap=cluster.bootstrap, credentials=cluster.credentials)
    lease = CoordinatorLease(c, "consumer", "q", "s", "A", ttl_s=1.0)
    assert lease.acquire(30)
    hold.set()
    assert entered.wait(10), "the lease thread renews"
    lease.stop(release=False)
    c.close()
    errors: list[BaseException] = []
    previous = threading.excepthook

    def record(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            errors.append(args.exc_value)

    threading.excepthook = record
    try:
        go.set()
        thread = lease._thread
        assert thread is not None
        thread.join(10)
        assert not thread.is_alive()
    finally:
        threading.excepthook = previous
    assert errors == [], errors


@pytest.mark.zk
def test_a_consumers_renewal_tells_the_states_stamp_and_is_not_held_by_a_silent_zookeeper(cluster: Cluster) -> None:
    """``LeaseRequest.with_state`` (what an idle consumer's renewals ask, sdk/_queue_view.py):
    the answer's ``state_zxid`` is the stamp a Describe answers with the state, a later one
    after the state changed, -1 once the subscription is gone; asked of a producer lease or
    not asked, 0 (not told). Guard: a renewal is answered from memory, so the stamp is waited
    for ``STAMP_WAIT_S`` at most: with ZooKeeper stopped (SIGSTOP) the renewal is answered
    without it (0), not when ZooKeeper answers again (before the bound: after the pause)."""
    from ordq.coordinator.service_leases import STAMP_WAIT_S

    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    cluster.store.create_subscription("q", "s")
    with _client(cluster) as c:
        a = c.acquire("consumer", "q", "s", "A", ttl_ms=10_000)
        assert isinstance(a, Held)
        stamp = c.heartbeat(a, with_state=True).state_zxid
        assert stamp > 0 and stamp == c.describe("q").zxid
        assert c.heartbeat(a).state_zxid == 0
        p = c.acquire("producer", "q", "", "P", ttl_ms=10_000)
        assert isinstance(p, Held) and c.heartbeat(p, with_state=True).state_zxid == 0
        cluster.store.apply("q", lambda st, _facts: sm.bump_epoch(st))  # the state changes (nothing follows)
        later = c.heartbeat(a, with_state=True).state_zxid
        assert later > stamp and later == c.describe("q").zxid
        [zk] = cluster.zk.processes
        zk.pause()
        try:
            asked = time.monotonic()
            silent = c.heartbeat(a, with_state=True, timeout_s=5.0)
            took = time.monotonic() - asked
        finally:
            zk.resume()
        # bounded by STAMP_WAIT_S and the call's own time (a loaded box: seconds); unbounded,
        # it was not answered within the call's 5 s
        assert silent.state_zxid == 0 and took < STAMP_WAIT_S + 2.0, (silent, took)
        wait_until(lambda: c.heartbeat(a, with_state=True).state_zxid == later, timeout_s=30,
                   what="the stamp told again once ZooKeeper answers")
        cluster.store.delete_subscription("q", "s")  # forced, as `ordq sub delete --force` under a holder
        assert c.heartbeat(a, with_state=True).state_zxid == -1
        assert cluster.store.state_stamp("q") == later and cluster.store.state_stamp("nope") == -1
