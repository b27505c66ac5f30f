"""The ZooKeeper store against a real ZooKeeper: conditional writes, liveness, cursors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.common.errors import (
    AlreadyExists,
    ConflictError,
    CoordinationUnavailable,
    GroupNotFound,
    IllegalTransition,
    QueueNotFound,
    SubscriptionNotFound,
)
from ordq.coordinator import state as sm
from ordq.coordinator.state import Cursor, SegStatus
from ordq.coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent


def spawn(module: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )


@pytest.fixture
def store(zk_server, zk_root) -> Iterator[ZkStore]:
    with ZkStore.connect(zk_server.connection_string, zk_root) as s:
        yield s


@pytest.fixture
def live(zk_server, zk_root):
    """Start a process holding liveness nodes; killed (-9) at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(*members: str) -> subprocess.Popen[str]:
        p = spawn("tests.helpers.live_member", zk_server.connection_string, zk_root, "1.0", *members)
        procs.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
        if p.stdout:
            p.stdout.close()


def both(gid: str) -> tuple[str, str]:
    return (f"{gid}:master", f"{gid}:slave")


def test_queue_lifecycle_and_clear_errors(store: ZkStore, live) -> None:
    with pytest.raises(GroupNotFound):
        store.create_queue("q", ["g1"])
    store.add_group("g1")
    store.add_group("g2")
    with pytest.raises(AlreadyExists):
        store.add_group("g1")
    st = store.create_queue("q")
    assert st.groups == ("g1", "g2") and st.send == ()  # nothing live yet
    with pytest.raises(AlreadyExists):
        store.create_queue("q")
    with pytest.raises(QueueNotFound):
        store.load_state("nope")
    live(*both("g1"), *both("g2"))
    st = store.apply("q", sm.admit_all)
    assert st.send == ("g1", "g2") and st.open_segment is not None and st.open_segment.gid == "g1"
    assert store.load_state("q")[0] == st
    assert store.list_queues() == ["q"]


def test_liveness_disappears_when_process_is_killed(store: ZkStore, live) -> None:
    store.add_group("g1")
    proc = live(*both("g1"))
    assert set(store.live_members("g1")) == {"master", "slave"}
    assert store.live_groups(["g1"]) == {"g1"}
    os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: not store.live_members("g1"), timeout_s=10, what="ephemeral nodes to vanish")
    assert store.live_groups(["g1"]) == frozenset()


def test_illegal_transition_changes_nothing(store: ZkStore, live) -> None:
    store.add_group("g1")
    live(*both("g1"))
    store.create_queue("q")
    before = store.load_state("q")
    with pytest.raises(IllegalTransition):
        store.apply("q", lambda st, f: sm.fail_over(st, "g1", 99, f))
    assert store.load_state("q") == before


def test_cursor_cas_and_pop_checks_cursors(store: ZkStore, live) -> None:
    store.add_group("g1")
    store.add_group("g2")
    live(*both("g1"), *both("g2"))
    store.create_queue("q")
    store.create_subscription("q", "s")
    with pytest.raises(AlreadyExists):
        store.create_subscription("q", "s")
    with pytest.raises(SubscriptionNotFound):
        store.get_cursor("q", "other")
    store.apply("q", lambda st, f: sm.fail_over(st, "g1", 0, f))
    store.apply("q", lambda st, f: sm.seal(st, 0, 3, 0, 2))
    with pytest.raises(IllegalTransition, match="have not passed"):
        store.apply("q", sm.pop)
    cursor, version = store.get_cursor("q", "s")
    assert cursor == Cursor(seg=0, offset=0, last_seq=-1)
    v2 = store.commit_cursor("q", "s", Cursor(seg=1, offset=0, last_seq=2), version)
    with pytest.raises(ConflictError):
        store.commit_cursor("q", "s", Cursor(seg=1, offset=5, last_seq=7), version)  # stale
    assert store.get_cursor("q", "s") == (Cursor(seg=1, offset=0, last_seq=2), v2)
    with pytest.raises(IllegalTransition, match="newest message"):  # nothing stored after seq 2 yet
        store.apply("q", sm.pop)
    store.commit_cursor("q", "s", Cursor(seg=1, offset=1, last_seq=3), v2)
    st = store.apply("q", sm.pop)
    assert [s.seg for s in st.consume] == [1] and st.trimmed_seq == 2
    assert st.consume[0].status is SegStatus.OPEN


def test_a_subscription_created_as_an_empty_segment_is_popped_never_starts_before_the_head(
        store: ZkStore, live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: with no subscription, a segment sealed empty is popped. A subscription created
    meanwhile (at 'earliest': that very segment) must not be left pointing before the head
    (I5), whichever lands first."""
    store.add_group("g1")
    store.add_group("g2")
    live(*both("g1"), *both("g2"))

    def blip(queue: str) -> None:  # a failover whose segment is sealed empty
        head = store.create_queue(queue).head
        assert head is not None
        store.apply(queue, lambda st, f: sm.fail_over(st, head, 0, f))
        store.apply(queue, lambda st, f: sm.seal(st, 0, 0, None, None))

    # the pop read "no subscription", then the subscription landed, then the pop's write: it
    # fails (the subscription wrote the state's version) and the pop, planned again, refuses
    blip("q")
    raced: list[int] = []

    def pop_after_a_subscription(st: sm.QueueState, f: sm.Facts) -> sm.QueueState:
        if not raced:
            raced.append(1)
            assert store.create_subscription("q", "late") == Cursor(seg=0)
        return sm.pop(st, f)

    with pytest.raises(IllegalTransition, match="have not passed"):
        store.apply("q", pop_after_a_subscription)
    assert store.load_state("q")[0].consume[0].seg == 0 and store.get_cursor("q", "late")[0].seg == 0

    # the subscription read the state, then the pop landed: its write fails, it reads again and
    # starts at the new head
    blip("r")
    real = store.load_state_to_write
    popped: list[int] = []

    def read_then_pop(queue: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        got = real(queue, *args, **kwargs)
        if queue == "r" and not popped:
            popped.append(1)
            assert store.apply("r", sm.pop).consume[0].seg == 1
        return got

    monkeypatch.setattr(store, "load_state_to_write", read_then_pop)
    assert store.create_subscription("r", "late") == Cursor(seg=1)
    sm.check_invariants(real("r")[0], {"late": store.get_cursor("r", "late")[0]})


def test_concurrent_conflicting_transitions_lose_nothing(store: ZkStore, zk_server, zk_root, live) -> None:
    for g in ("g1", "g2", "g3"):
        store.add_group(g)
    live(*both("g1"), *both("g2"), *both("g3"))
    store.create_queue("q")
    workers = [spawn("tests.helpers.churn", zk_server.connection_string, zk_root, "q", "60", str(i))
               for i in range(4)]
    totals: dict[str, int] = {}
    for w in workers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0
        for k, v in json.loads(out).items():
            totals[k] = totals.get(k, 0) + v
    st, _ = store.load_state("q")
    sm.check_invariants(st)
    # Every bump and every pop that a worker saw succeed is in the final state: none lost.
    assert st.producer_epoch == totals["bump"] > 0
    assert st.next_seg == len(st.consume) + totals["pop"]
    assert totals["fail_over"] > 0 and totals["pop"] > 0


def test_unreachable_zookeeper_is_a_clear_error() -> None:
    with pytest.raises(CoordinationUnavailable, match="cannot reach ZooKeeper"):
        ZkStore.connect("127.0.0.1:1", "/x", timeout_s=0.5)
