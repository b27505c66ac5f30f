"""Issue 38, stop e: what one served call of each kind costs the coordinator and ZooKeeper, measured
with a hand-made client calling one kind at a time for 2 s (docs/BENCHMARKS.md, "stop e"): the
coordinator's CPU and context switches (its threads' wake-ups) per call, ZooKeeper's requests
(``mntr`` packets received, the brokers' pings included: ~20/s) and CPU per call. A measurement
(heavy tier); it asserts only the cut it documents: a Pop that can drop nothing waits for one
ZooKeeper request, not ~8.6.

    pytest -m heavy tests/test_coordinator_call_cost.py -s
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import attrs
import grpc
import pytest

from ordq.coordinator import state as sm
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.drills.control_plane_placement import thread_switches
from ordq.wire import ordq_pb2 as pb
from ordq.zk_server import four_letter_word
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.test_coordinator_defences import stub_of
from tests.test_coordinator_share import flood_stage
from tests.util import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]
SECONDS = 2.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def _zk_packets(port: int) -> int:
    return next(int(line.split()[1]) for line in four_letter_word(port, "mntr").splitlines()
                if line.startswith("zk_packets_received"))


def test_what_one_call_of_each_kind_costs(cluster: Cluster) -> None:
    # as the drill's cluster: a Describe with live members reads each group's
    address, flooder, neighbour = flood_stage(cluster, ("g1", "g2", "g3"))
    pid = cluster.coordinators[0].pid
    zk = cluster.zk.status()[0]
    assert pid is not None and zk.pid is not None
    stub, ch = stub_of(address, cluster, token=flooder)
    client = CoordinatorClient(bootstrap=address, credentials=attrs.evolve(cluster.credentials, token=neighbour),
                               timeout_s=30)
    try:
        wait_until(lambda: stub.Pop(pb.QueueRef(queue="a"), timeout=10) is not None, timeout_s=30,
                   interval_s=0.05, what="the leader answers")
        stub.Subscribe(pb.SubscribeRequest(queue="a", subscription="exists"), timeout=10)
        lease = wait_until(lambda: client.acquire("consumer", "b", "s", "C", ttl_ms=60_000), timeout_s=30,
                           interval_s=0.05, what="the neighbour's lease")
        assert isinstance(lease, Held)
        d = client.describe("b", subscription="s")
        assert d.cursor is not None
        version = [d.cursor_version]

        def commit() -> None:
            version[0] = client.commit("b", "s", d.cursor, version[0], lease)

        kinds: dict[str, Callable[[], object] | None] = {
            "idle (the brokers' pings)": None,
            "Describe": lambda: stub.Describe(pb.DescribeRequest(queue="a"), timeout=10),
            "Describe (config, live)": lambda: stub.Describe(pb.DescribeRequest(queue="a", with_config=True,
                                                                                with_live=True), timeout=10),
            "Subscribe (exists: refused)": lambda: stub.Subscribe(pb.SubscribeRequest(queue="a",
                                                                                      subscription="exists"),
                                                                  timeout=10),
            "Pop (nothing to drop)": lambda: stub.Pop(pb.QueueRef(queue="a"), timeout=10),
            "Commit": commit,
            "Pop (refused: no role)": lambda: stub.Pop(pb.QueueRef(queue="b"), timeout=10),
        }
        per_call: dict[str, float] = {}
        for name, call in kinds.items():
            c0, s0, z0 = _cpu_s(pid), thread_switches(pid), _zk_packets(zk.port)
            zc0, t0 = _cpu_s(zk.pid), time.monotonic()
            n = 0
            while time.monotonic() - t0 < SECONDS:
                if call is None:
                    time.sleep(0.05)
                    continue
                try:
                    call()
                except grpc.RpcError:
                    pass  # a refusal is what some kinds measure
                n += 1
            dt = time.monotonic() - t0
            c, s, z, zc = _cpu_s(pid) - c0, thread_switches(pid) - s0, _zk_packets(zk.port) - z0, _cpu_s(zk.pid) - zc0
            per = max(n, 1)
            per_call[name] = z / per
            print(f"\n{name:30s} {n / dt:5.0f}/s  coordinator {c / per * 1e6:5.0f} us, {s / per:5.1f} switches; "
                  f"ZooKeeper {z / per:5.2f} requests, {zc / per * 1e6:5.0f} us per call")
        # A queue's head may be a segment sealed empty meanwhile (a broker's session blip on a busy
        # box fails the head over), which a Pop must then read the facts for: judged only if not.
        if not sm.may_pop(cluster.store.load_state("a")[0]):
            assert per_call["Pop (nothing to drop)"] < 1.5 + 0.5  # + the brokers' pings at a high load
    finally:
        client.close()
        ch.close()
