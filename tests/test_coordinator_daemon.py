"""The coordinator daemon as real processes: fails the head over when a head process dies,
and a standby daemon takes over its duties when the leader is killed -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kazoo.recipe.election import Election

from coordinator.state import SegStatus
from coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)


def test_daemon_fails_over_and_standby_takes_over(zk_server, zk_root) -> None:
    hosts = zk_server.connection_string
    procs: list[subprocess.Popen[str]] = []
    try:
        with ZkStore.connect(hosts, zk_root) as store:
            members = {}
            for g in ("g1", "g2", "g3"):
                store.add_group(g)
                p = spawn("-m", "tests.helpers.live_member", hosts, zk_root, "1.0",
                          f"{g}:master", f"{g}:slave")
                procs.append(p)
                assert p.stdout is not None and p.stdout.readline().strip() == "READY"
                members[g] = p
            store.create_queue("q")
            daemons = []
            for _ in range(2):
                d = spawn("-m", "ordq.cli", "--zk", hosts, "--root", zk_root, "coordinator", "run",
                          "--metrics", "127.0.0.1:0", "--interval", "0.2")
                procs.append(d)
                assert d.stdout is not None
                metrics_line = d.stdout.readline().split()
                assert d.stdout.readline().startswith("READY")
                daemons.append((d, metrics_line[1]))

            election = Election(store.client, store.paths.coordinator_leader)
            leader_ident = wait_until(lambda: (election.contenders() or [None])[0], what="a leader")
            leader = next(d for d, _ in daemons if leader_ident.endswith(f"-{d.pid}"))
            standby_url = next(url for d, url in daemons if d is not leader)

            # 1. head g1 loses its processes: the daemon fails over to g2 at once
            killed_at = time.monotonic()
            os.kill(members["g1"].pid, signal.SIGKILL)
            st = store.wait_state("q", lambda s: s.head == "g2", timeout_s=10)
            failover_s = time.monotonic() - killed_at
            assert st.consume[0].status is SegStatus.SEALING and st.open_segment.gid == "g2"
            assert failover_s < 5, failover_s  # ~1 s session expiry + one watch event

            # 2. the leading daemon is killed -9; the standby is elected and does the duties
            os.kill(leader.pid, signal.SIGKILL)
            os.kill(members["g2"].pid, signal.SIGKILL)
            st = store.wait_state("q", lambda s: s.head == "g3", timeout_s=15)
            assert [s.status for s in st.consume[:2]] == [SegStatus.SEALING, SegStatus.SEALING]
            body = urllib.request.urlopen(standby_url, timeout=5).read().decode()
            assert "ordq_coordinator_leader 1" in body
            assert 'ordq_coordinator_actions_total{kind="fail_over"}' in body
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.stdout:
                p.stdout.close()
