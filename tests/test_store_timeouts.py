"""Every store call is bounded while ZooKeeper is down (kazoo would queue it for the whole
outage), and removing something that does not exist is an error, not a silent success.
Real ZooKeeper servers only: a private one (``make_zk``) for the tests that stop it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from ordq.cli import main
from ordq.common.errors import ConfigError, ConflictError, CoordinationUnavailable, QueueNotFound, SubscriptionNotFound
from ordq.coordinator import state as sm
from ordq.coordinator.leases import Kind, LeaseName, LeaseRecord, key_digest
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import OP_TIMEOUT_S
from tests.util import wait_until

pytestmark = pytest.mark.zk
OP_TIMEOUT = 1.0
MARGIN_S = 3.0
LEASE = LeaseName(Kind.CONSUMER, "q", "s")
RECORD = LeaseRecord(holder="admin", generation=1, key_hash=key_digest("k"), ttl_ms=3000)


def bump(st: sm.QueueState, facts: sm.Facts) -> sm.QueueState:
    return sm.bump_epoch(st)


def fails_in_time(call: Callable[[], Any], bound_s: float) -> float:
    start = time.monotonic()
    with pytest.raises(CoordinationUnavailable) as info:
        call()
    took = time.monotonic() - start
    assert took < bound_s, f"{call} took {took:.1f}s"
    assert info.value.retriable
    return took


def test_calls_while_zookeeper_is_down_fail_within_the_op_timeout_then_work_again(make_zk) -> None:
    server = make_zk()
    server.start()
    with ZkStore.connect(server.connection_string, "/ordq", op_timeout_s=OP_TIMEOUT) as store:
        store.add_group("g1")
        store.create_queue("q", ["g1"])
        store.create_subscription("q", "s")
        cursor, version = store.get_cursor("q", "s")
        server.stop()
        wait_until(lambda: not store.client.connected, what="the client to notice the outage")

        # Every kind of call: reads (retried across a lost connection, not across a silence),
        # writes, transactions, the recursive deletes and a lease's versioned write.
        one = OP_TIMEOUT + MARGIN_S
        calls: list[tuple[Callable[[], Any], float]] = [
            (store.list_groups, one),
            (lambda: store.get_group("g1"), one),
            (lambda: store.load_state("q"), one),
            (lambda: store.add_group("g2"), one),
            (lambda: store.commit_cursor("q", "s", cursor, version), 2 * OP_TIMEOUT + MARGIN_S),  # write, re-read
            (lambda: store.apply("q", bump), 2 * OP_TIMEOUT + MARGIN_S),  # read, or commit then re-read
            (lambda: store.delete_subscription("q", "s"), one),
            (lambda: store.write_lease(LEASE, RECORD, -1), one),
            (lambda: store.wait_state("q", lambda st: False, timeout_s=60), one),  # a read fails it early
        ]
        took = [fails_in_time(call, bound) for call, bound in calls]
        assert min(took) >= 0.9 * OP_TIMEOUT  # they did wait for an answer, up to the timeout

        # Several threads at once (the SDK's producer and consumer call the store from several).
        errors: list[BaseException] = []

        def list_groups() -> None:
            try:
                store.list_groups()
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)

        threads = [threading.Thread(target=list_groups) for _ in range(4)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert time.monotonic() - start < one and not any(t.is_alive() for t in threads)
        assert len(errors) == 4 and all(isinstance(e, CoordinationUnavailable) for e in errors)

        server.start()
        # The same store works again once its client has reconnected (kazoo backs off while
        # reconnecting, so the first calls after the restart may still time out).
        wait_until(store.list_groups, timeout_s=60, what="a read after the restart")
        st = wait_until(lambda: store.apply("q", bump), timeout_s=30, what="a transition after the restart")
        assert st.producer_epoch >= 1
        assert store.get_cursor("q", "s")[0] == cursor  # the delete that timed out was never sent
        # The lease create that timed out may have landed on reconnecting (kazoo sends what it
        # queued), or may land even after the read below: its parents were missing, and kazoo
        # sends them and the create's second try from its callbacks (``ZkBase._wait``). So a
        # conflict, at most one, answered as the lease desk answers one: read, write again.
        for attempt in (1, 2):
            _, version = store.read_lease(LEASE)
            try:
                assert store.write_lease(LEASE, attrs.evolve(RECORD, holder="after"), version) == version + 1
                break
            except ConflictError:
                if attempt == 2:
                    raise
        assert store.subscription_holder("q", "s") == "after"


def test_the_default_op_timeout_bounds_a_call(make_zk) -> None:
    server = make_zk()
    server.start()
    with ZkStore.connect(server.connection_string, "/ordq") as store:
        store.add_group("g1")
        server.stop()
        wait_until(lambda: not store.client.connected, what="the client to notice the outage")
        took = fails_in_time(store.list_groups, OP_TIMEOUT_S + MARGIN_S)
        assert took >= 0.9 * OP_TIMEOUT_S


def test_op_timeout_must_be_positive(zk_server, zk_root) -> None:
    with pytest.raises(ConfigError, match="op_timeout_s"):
        ZkStore.connect(zk_server.connection_string, zk_root, op_timeout_s=0)


def test_deleting_an_unknown_subscription_is_an_error(zk_server, zk_root) -> None:
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        store.add_group("g1")
        store.create_queue("q", ["g1"])
        with pytest.raises(SubscriptionNotFound):
            store.delete_subscription("q", "nosuch")
        with pytest.raises(QueueNotFound):
            store.delete_subscription("nosuch", "s")
        store.create_subscription("q", "s")
        store.delete_subscription("q", "s")
        assert store.list_subscriptions("q") == []
        with pytest.raises(SubscriptionNotFound):
            store.delete_subscription("q", "s")


def test_removing_unknown_names_exits_1_with_one_line(zk_server, zk_root, capsys: pytest.CaptureFixture[str]) -> None:
    zk = ("--zk", zk_server.connection_string, "--root", zk_root)
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        store.add_group("g1")  # a cluster lives under the root (else: "no ordq cluster under --root")
    # (a queue's verbs go to the coordinator's admin API: tests/test_admin_api.py)
    for argv, message in [(("group", "remove", "nosuch"), "unknown broker group 'nosuch'")]:
        assert main([*zk, *argv]) == 1
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ordq: error: ") and message in lines[0], err
