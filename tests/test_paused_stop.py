"""A daemon paused (SIGSTOP) when its SIGTERM comes stops cleanly once continued.

`ordq down` and systemd's stop send SIGTERM, then SIGCONT, so a paused process can act on it.
The kernel may then hand the signal to any thread of the process, and Python runs a handler
only on the main thread, between bytecodes: a main thread blocked in an untimed wait never
woke to run it. Seen in a drive (stop 96): `ordq down` with a paused slave took its whole 10 s
grace and then SIGKILLed it, and a broker or coordinator sent SIGTERM while paused ran on
for ever once continued. Guard: ``ordq.common.proc.wait_for_stop`` (the main thread waits in
ticks).
"""

from __future__ import annotations

import time

import pytest

from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture

pytestmark = pytest.mark.zk

# Far above a clean stop (under a second here, a few seconds on a loaded box): a process that
# never acts on the signal is SIGKILLed at its end and exits -9.
GRACE_S = 8.0


def test_a_paused_broker_or_coordinator_stops_cleanly_on_sigterm(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")  # a coordinator serves from here on
    group = cluster.groups["g1"]
    for name, proc in (("coordinator", cluster.coordinators[0]), ("slave", group.slave.proc),
                       ("master", group.master.proc)):
        proc.pause()
        started = time.monotonic()
        code = proc.stop(timeout_s=GRACE_S)  # SIGTERM, SIGCONT; SIGKILL after the grace
        took = time.monotonic() - started
        assert code == 0, (f"the paused {name} exited {code} after {took:.1f} s: it did not act on SIGTERM "
                           f"once continued and was killed after the {GRACE_S:g} s grace")
