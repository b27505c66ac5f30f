"""Leases from the coordinator (issue 37): what holding them costs, and a takeover after a kill.
Not a test: prints numbers for docs/BENCHMARKS.md ("Leases").

    .venv/bin/python -m bench.bench_leases [--queues 1000] [--clients 100] [--ttl 3] [--window 20] [--takeovers 5]
                                           [--idle-consumers N]

One throwaway cluster (bench/_cluster.py: ZooKeeper, one broker group, one coordinator, TLS). It
creates ``--queues`` queues with one subscription each; ``--clients`` consumer leases (one per queue,
``sdk._lease_client.CoordinatorLease``, renewed every quarter of ``--ttl``) are held by this process.
Over ``--window`` seconds, first with no lease held, then with the clients holding theirs:

- the coordinator's CPU (user + system, /proc) and its share of a core;
- ZooKeeper's requests (``mntr`` ``zk_packets_received``) — heartbeats write nothing there;
- heartbeats answered (the coordinator's ``LeaseDesk`` counts; here: renewals this process saw).

With ``--idle-consumers N``, a third window: N whole SDK consumers (``ordq.sdk.Consumer``, one per
queue, each polled by a thread of this process, nothing to read), as idle applications hold them:
the coordinator's CPU again, and the calls each consumer makes of it (its lease's heartbeats, its
view's Describes at the end of an open segment).

Then ``--takeovers`` times: a child process acquires a lease and is killed (SIGKILL) while this
process waits as the standby; takeover = the kill → the standby's grant (the dead holder's ttl
plus the coordinator's margin is the floor, measured from its last renewal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from bench._cluster import bench_cluster, cpu_seconds, percentile
from ordq.coordinator.client import CoordinatorClient
from ordq.sdk import Consumer, ConsumerConfig
from ordq.sdk._lease_client import CoordinatorLease
from ordq.zk_server import four_letter_word

_CHILD = """
import sys, time
from ordq.coordinator.client import CoordinatorClient
from ordq.common.security import lookup_bootstrap
from ordq.sdk._lease_client import CoordinatorLease
bootstrap, queue, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
c = CoordinatorClient(bootstrap=bootstrap, credentials=lookup_bootstrap(bootstrap))
lease = CoordinatorLease(c, "consumer", queue, "s", "victim", ttl_s=ttl)
assert lease.acquire(30)
print("HELD", flush=True)
time.sleep(3600)
"""


def zk_packets(port: int) -> int:
    for line in four_letter_word(port, "mntr", timeout_s=5.0).splitlines():
        name, _, value = line.partition("\t")
        if name == "zk_packets_received":
            return int(value)
    return -1


def window(coordinator_pid: int, zk_port: int, seconds: float) -> dict[str, float]:
    cpu0, zk0, t0 = cpu_seconds(coordinator_pid), zk_packets(zk_port), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    cpu = cpu_seconds(coordinator_pid) - cpu0
    return {"coordinator_cpu_s": round(cpu, 3), "coordinator_core_pct": round(cpu / wall * 100, 2),
            "zk_requests_per_s": round((zk_packets(zk_port) - zk0) / wall, 1), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--ttl", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--takeovers", type=int, default=5)
    ap.add_argument("--idle-consumers", type=int, default=0,
                    help="then this many SDK consumers, idle, one per queue (at most --queues)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not 0 <= args.idle_consumers <= args.queues:
        ap.error(f"--idle-consumers must be from 0 to --queues ({args.queues}), not {args.idle_consumers}")
    out: dict[str, Any] = {"queues": args.queues, "clients": args.clients, "ttl_s": args.ttl}
    with bench_cluster(1) as cluster:
        zk_port = cluster.zk.specs[0].client_port
        t0 = time.monotonic()
        names = [f"lq-{i:06d}" for i in range(args.queues)]
        for name in names:
            cluster.store.create_queue(name, ["g1"])
            cluster.store.create_subscription(name, "s")
        out["create_s"] = round(time.monotonic() - t0, 1)
        pid = cluster.coordinator.pid
        assert pid is not None
        out["idle"] = window(pid, zk_port, args.window)
        coord = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials)
        leases = [CoordinatorLease(coord, "consumer", q, "s", f"c{i}", ttl_s=args.ttl)
                  for i, q in enumerate(names[:args.clients])]
        for lease in leases:
            assert lease.acquire(30), "lease not granted"
        mine0 = cpu_seconds_self()
        held = window(pid, zk_port, args.window)
        held["clients_cpu_s"] = round(cpu_seconds_self() - mine0, 3)
        held["heartbeats_per_s"] = heartbeats_per_s(args.clients, args.ttl)
        held["lapses"] = sum(lease.stats.lapses for lease in leases)
        held["lost"] = sum(lease.stats.lost for lease in leases)
        out["held"] = held
        for lease in leases:
            lease.stop()
        if args.idle_consumers:
            out["idle_consumers"] = idle_consumers(cluster, names[:args.idle_consumers], pid, zk_port, args.window)
        takeovers = []
        for i in range(args.takeovers):
            queue = names[-1 - i]
            child = subprocess.Popen([sys.executable, "-c", _CHILD, cluster.bootstrap, queue, str(args.ttl)],
                                     stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None and child.stdout.readline().startswith("HELD")
            standby = CoordinatorLease(coord, "consumer", queue, "s", f"standby{i}", ttl_s=args.ttl)
            killed = time.monotonic()
            child.send_signal(signal.SIGKILL)
            child.wait()
            assert standby.acquire(60)
            takeovers.append((time.monotonic() - killed) * 1000)
            standby.stop()
        if takeovers:
            out["takeover_ms"] = {"p50": round(percentile(takeovers, 50)), "max": round(max(takeovers)),
                                  "all": [round(t) for t in takeovers]}
        coord.close()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    return 0


def heartbeats_per_s(leases: int, ttl_s: float) -> float:
    """The renewals ``leases`` leases of ``ttl_s`` make a second: each renews every quarter of
    its ttl (the rate they are set to, not counted)."""
    return round(leases / (ttl_s * 0.25), 1)


def idle_consumers(cluster: Any, queues: list[str], pid: int, zk_port: int, seconds: float) -> dict[str, Any]:
    """Consumers of ``queues`` (subscription "s"), each polled by its own thread with nothing to
    read, over a window once all hold their lease: the coordinator's CPU and their calls."""
    stop = threading.Event()
    consumers = [Consumer(ConsumerConfig(bootstrap=cluster.bootstrap, credentials=cluster.credentials, queue=q,
                                         subscription="s")) for q in queues]

    def run(c: Consumer) -> None:
        while not stop.is_set():
            c.poll(timeout_s=0.5)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in consumers]
    with contextlib.ExitStack() as closing:
        for c in consumers:
            closing.enter_context(c)
        for t in threads:
            t.start()
        time.sleep(5)  # past each one's first Describes and reads
        views = [c._view for c in consumers]  # noqa: SLF001 - the view counts its Describes (a bench's look)
        before = sum(v.describes for v in views if v is not None)
        got = window(pid, zk_port, seconds)
        got["describes_per_s"] = round((sum(v.describes for v in views if v is not None) - before) / got["wall_s"], 1)
        got["heartbeats_per_s"] = heartbeats_per_s(len(consumers), consumers[0].config.lease_ttl_s)
        got["core_pct_per_consumer"] = round(got["coordinator_core_pct"] / len(consumers), 3)
        stop.set()
        for t in threads:
            t.join(10)
    return got


def cpu_seconds_self() -> float:
    return cpu_seconds(os.getpid())


if __name__ == "__main__":
    sys.exit(main())
