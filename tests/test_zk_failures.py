"""The store through ZooKeeper faults: a restart of the standalone server, and kill -9 of the
leader of a 3-node ensemble (DESIGN §6: "one ZooKeeper node of three: no effect")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.coordinator import state as sm
from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent


def bump(st: sm.QueueState, facts: sm.Facts) -> sm.QueueState:
    return sm.bump_epoch(st)


def test_store_survives_a_zookeeper_restart(zk_server, zk_root) -> None:
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        store.add_group("g1")
        store.create_queue("q")
        assert store.apply("q", bump).producer_epoch == 1
        try:
            zk_server.stop()
            wait_until(lambda: not store.client.connected, what="the client to notice the outage")
        finally:
            zk_server.start()
        # The same store object (its kazoo client reconnects by itself) works again.
        st = wait_until(lambda: store.apply("q", bump), timeout_s=30, what="a transition after the restart")
        assert st.producer_epoch == 2  # the write before the restart was kept, none was lost
        assert store.list_groups() == ["g1"]
        sm.check_invariants(st)


def spawn_live_member(hosts: str, root: str, *members: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a 5 s session: the liveness nodes outlast the ensemble's re-election
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.live_member", hosts, root, "5.0", *members],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


@pytest.mark.ensemble
def test_killing_the_ensemble_leader_does_not_stop_conditional_transitions(zk_ensemble, zk_root) -> None:
    hosts = zk_ensemble.connection_string
    assert sorted(s.mode or "" for s in zk_ensemble.status()) == ["follower", "follower", "leader"]
    member = None
    old = zk_ensemble.leader()
    assert old is not None
    try:
        with ZkStore.connect(hosts, zk_root) as store:
            for g in ("g1", "g2"):
                store.add_group(g)
            member = spawn_live_member(hosts, zk_root, "g1:master", "g1:slave", "g2:master", "g2:slave")
            st = store.create_queue("q")
            assert st.send == ("g1", "g2") and st.open_segment is not None

            zk_ensemble.kill(old)  # kill -9 the leader while the client is connected

            # Conditional transitions go on (a write cut off by the re-election may raise
            # CoordinationUnavailable, so they are retried until they succeed).
            def fail_over_g1(s: sm.QueueState, f: sm.Facts) -> sm.QueueState:
                if s.head != "g1":
                    return s  # done by an attempt whose answer was lost in the re-election
                return sm.fail_over(s, "g1", 0, f)

            st = wait_until(lambda: store.apply("q", fail_over_g1), timeout_s=30,
                            what="fail_over after the leader was killed")
            assert st.send == ("g2",) and st.consume[0].status is SegStatus.SEALING
            attempts = 0

            def bump_once() -> bool:
                nonlocal attempts
                attempts += 1
                store.apply("q", bump)
                return True

            for _ in range(20):
                wait_until(bump_once, timeout_s=30, what="an epoch bump on the 2 remaining nodes")
            st, _ = store.load_state("q")
            # every acknowledged bump is there; an unacknowledged one may have landed too
            assert 20 <= st.producer_epoch <= attempts
            assert st.open_segment is not None and st.open_segment.gid == "g2"
            sm.check_invariants(st)

            zk_ensemble.wait_serving()  # the two survivors elected a new leader
            assert zk_ensemble.leader() not in (None, old)
    finally:
        if member is not None:
            member.kill()
            member.wait()
            if member.stdout:
                member.stdout.close()
        zk_ensemble.restart(old)
    modes = {s.node: s.mode for s in zk_ensemble.status()}
    assert modes[old] == "follower" and sorted(m or "" for m in modes.values()) == ["follower", "follower", "leader"]
