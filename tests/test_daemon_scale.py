"""The coordinator daemon's cost follows changes, not the number of queues (issue 29): after
its first round an idle cluster costs it no ZooKeeper read, a change to one queue among 300 is
read and planned alone, and a group losing a process is acted on for the queues that use it.

In process, against a real ZooKeeper; liveness nodes are this test's own session's (no broker
needed: the daemon's rounds are called directly, with no prober)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from ordq.coordinator.daemon import CoordinatorDaemon
from ordq.coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk
N = 300
DEADLINE_S = 60.0  # generous: the box may be busy; nothing here is timed


@pytest.fixture(scope="module")
def setup(zk_server, tmp_path_factory) -> Iterator[tuple[ZkStore, CoordinatorDaemon]]:
    import uuid

    root = f"/t-{uuid.uuid4().hex[:10]}"
    with ZkStore.connect(zk_server.connection_string, root) as store:
        for g in ("g1", "g2", "g3"):
            store.add_group(g)
            for role in ("master", "slave"):
                store.register_live(g, role, address=f"127.0.0.1:0/{g}/{role}", incarnation="t")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: store.create_queue(f"q-{i:04d}", ["g1", "g2"]), range(N)))
        store.create_queue("solo", ["g3"])
        daemon = CoordinatorDaemon(store, identifier="t")
        yield store, daemon
        daemon.stop()
        if daemon.view is not None:
            daemon.view.close()
        # The root is left (a fresh uuid in the session's throwaway ZooKeeper): deleting its
        # 2,100 nodes costs as many ZooKeeper writes as creating them did.


def _round_until(daemon: CoordinatorDaemon, done, what: str) -> None:  # type: ignore[no-untyped-def]
    def step() -> bool:
        daemon.round()
        return bool(done())

    wait_until(step, timeout_s=DEADLINE_S, interval_s=0.05, what=what)


def test_idle_rounds_read_nothing_and_one_change_reads_one_queue(setup) -> None:
    store, daemon = setup
    daemon.round()  # the first round of a term reads (and watches) everything once
    assert daemon.view is not None
    first = daemon.view.reads
    assert first >= 2 * (N + 1)  # state and settings of every queue
    assert daemon.stats.planned >= N + 1
    for _ in range(5):
        daemon.round()
    assert daemon.view.reads == first, "an idle round read ZooKeeper"
    planned = daemon.stats.planned
    assert planned == N + 1, "an idle round planned queues"

    store.update_queue_config("q-0123", retention_segments=7)
    _round_until(daemon, lambda: daemon.stats.planned > planned, "the changed queue planned")
    assert daemon.stats.planned == planned + 1
    assert daemon.view.reads - first <= 2  # its settings (and nothing of the 300 others)
    assert daemon.view.entries["q-0123"].config.retention_segments == 7


def test_a_group_losing_a_process_is_acted_on_for_its_queues_only(setup) -> None:
    store, daemon = setup
    daemon.round()
    planned = daemon.stats.planned
    assert store.load_state("solo")[0].head == "g3"
    store.client.delete(store.paths.live("g3", "master"))
    # the daemon fails the head over (here: g3 was its only group, so no group takes writes)
    _round_until(daemon, lambda: store.load_state("solo")[0].head != "g3", "solo failed over")
    # only the queue that uses g3 was planned (again after its own write), not the 300 others
    assert daemon.stats.planned - planned <= 3
    assert daemon.stats.actions.get("fail_over", 0) >= 1
