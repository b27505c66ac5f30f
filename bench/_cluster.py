"""A throwaway local cluster for benchmarks: one ZooKeeper, N broker groups of real processes,
one queue. Everything lives in a temporary folder and is killed on exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.common.proc import ManagedProcess, owning_children
from ordq.common.security import Credentials, ensure_coordinator_pki, provision, register_coordinators, unregister
from ordq.coordinator.store import ZkStore
from ordq.sdk import Producer
from ordq.zk_server import ZkServer

ROOT = "/bench"
QUEUE = "bench"


@attrs.define
class BenchCluster:
    zk: ZkServer
    store: ZkStore
    groups: list[BrokerGroupProcesses]
    folder: Path
    credentials: Credentials  # what a client of this cluster presents (registered for hosts/ROOT)
    coordinator: ManagedProcess
    bootstrap: str  # the coordinator's address: what a client is given

    @property
    def hosts(self) -> str:
        return self.zk.connection_string


@contextlib.contextmanager
def bench_cluster(groups: int = 1, *, folder: Path | None = None, tls: bool = True) -> Iterator[BenchCluster]:
    """``tls`` False: plaintext brokers (``--insecure``), to measure what TLS costs. Every process
    it starts dies with the bench, even one stopped by a signal or kill -9 (a bench stopped by
    ``timeout`` left its ZooKeeper, brokers and coordinator running)."""
    with owning_children():
        base = folder or Path(tempfile.mkdtemp(prefix="ordq-bench-"))
        zk = ZkServer(base / "zk")
        zk.start()
        broker_tls, client_tls = provision(base / "tls", zk.connection_string, ROOT, tls=tls)
        procs: list[BrokerGroupProcesses] = []
        store = None
        coordinator: ManagedProcess | None = None
        try:
            store = ZkStore.connect(zk.connection_string, ROOT)
            gids = [f"g{i + 1}" for i in range(groups)]
            for gid in gids:
                store.add_group(gid)
                g = BrokerGroupProcesses(gid, zk_hosts=zk.connection_string, root=ROOT, base_dir=base, tls=broker_tls)
                g.start()
                procs.append(g)
            deadline = time.monotonic() + 30
            while len(store.live_groups(gids)) < len(gids):
                if time.monotonic() > deadline:
                    raise RuntimeError("broker groups did not come up")
                time.sleep(0.05)
            store.create_queue(QUEUE, gids)
            # Producers claim their epoch from the coordinator service (issue 23): one coordinator.
            tls_args = ["--insecure"]
            if tls:
                c = ensure_coordinator_pki(base / "tls")
                tls_args = ["--tls-cert", str(c.cert_file), "--tls-key", str(c.key_file), "--tls-ca", str(c.ca_file)]
            coordinator = ManagedProcess("coordinator", [sys.executable, "-m", "ordq.cli", "--zk", zk.connection_string,
                                                         "--root", ROOT, "coordinator", "run", *tls_args],
                                         run_dir=base / "coordinator")
            coordinator.start()
            address = coordinator.wait_for_line("SERVING ", timeout_s=30)
            coordinator.wait_for_line("READY ", timeout_s=30)
            # Clients reach the cluster by its coordinators only (issue 37): named by hosts/ROOT, they find it here.
            register_coordinators(zk.connection_string, ROOT, [address])
            yield BenchCluster(zk=zk, store=store, groups=procs, folder=base, credentials=client_tls,
                               coordinator=coordinator, bootstrap=address)
        finally:
            unregister(zk.connection_string, ROOT)
            if coordinator is not None and coordinator.alive():
                coordinator.kill()
            for g in procs:
                g.kill()
            if store is not None:
                store.close()
            zk.stop()
            if folder is None:
                shutil.rmtree(base, ignore_errors=True)


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU time (user, system; all threads) a live process has used so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a live process has used so far."""
    return sum(cpu_split(pid))


class CpuMeter:
    """CPU spent by named processes between ``start()`` and ``report()``: the cost of each
    unit of work per process, a steadier measure than latency on a shared 2-core box."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0: dict[str, tuple[float, float]] = {}
        self._wall0 = 0.0
        self.total_s = 0.0  # of the last report: all processes' CPU, in seconds
        self.total_us = 0.0  # of the last report: all processes' CPU per unit

    def start(self) -> None:
        self._t0 = {name: cpu_split(pid) for name, pid in self.pids.items()}
        self._wall0 = time.perf_counter()

    def report(self, units: int, unit: str) -> str:
        wall = time.perf_counter() - self._wall0
        now = {name: cpu_split(pid) for name, pid in self.pids.items()}
        spent = {name: sum(now[name]) - sum(self._t0[name]) for name in self.pids}
        system = sum(now[name][1] - self._t0[name][1] for name in self.pids)
        total = sum(spent.values())
        self.total_s = total
        self.total_us = total / units * 1e6
        parts = ", ".join(f"{name} {secs / units * 1e6:,.0f}" for name, secs in spent.items())
        # The kernel's share (loopback TCP runs the receiver's path in the sender's call, the
        # file system's in the syncing thread's): what fewer Python steps would not move.
        return (f"CPU per {unit}: {parts}; total {total / units * 1e6:,.0f} µs, "
                f"{system / total * 100 if total else 0:.0f}% of it in the kernel "
                f"({total / wall * 100:.0f}% of one core over {wall:.1f} s)")


_CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
_HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def host_line() -> str:
    """What of the host, beside ordq, sets a batch's cost: the CPUs, what an idle CPU does
    and the load. On a KVM guest whose idle vCPUs halt at once (the haltpoll cpuidle driver
    with ``guest_halt_poll_ns`` 0), the work after each idle gap runs cache-cold: at a steady
    2,000 msgs/s the CPU per batch was 1.7-1.9x, and a synchronous send took 1.5-1.8x as long,
    as with the same guest polling up to 2 ms before it halts (docs/BENCHMARKS.md, stop 102;
    docs/OPERATIONS.md)."""
    driver = _read(_CPUIDLE / "current_driver") or "none"
    idle = f"cpuidle driver {driver}"
    if driver == "haltpoll" and (poll := _read(_HALT_POLL)) is not None:
        idle += f", guest_halt_poll_ns {poll}" + (" (an idle CPU halts at once)" if poll == "0" else "")
    return f"host: {os.cpu_count()} CPUs, {idle}; {interpreter()}; load average {os.getloadavg()[0]:.1f}"


def interpreter() -> str:
    """Which Python runs this process (and the cluster's processes, started from it): its
    version, its executable, and whether libpython is a shared library beside it. A plain
    source build (pyenv's, first on PATH here) cost ordq ~15 % more CPU per send than Debian's
    PGO and LTO build with libpython linked in (docs/BENCHMARKS.md, stop 104)."""
    maps = _read(Path("/proc/self/maps")) or ""
    shared = sorted({line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/libpython" in line})
    version = ".".join(map(str, sys.version_info[:3]))
    where = os.path.realpath(sys.executable)
    return f"Python {version} at {where}, " + (f"{shared[0]} shared" if shared else "libpython linked in")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def summary_ms(latencies_s: Sequence[float]) -> str:
    ms = [x * 1000 for x in latencies_s]
    return (f"p50 {percentile(ms, 50):.2f} ms, p99 {percentile(ms, 99):.2f} ms, "
            f"max {max(ms):.2f} ms, mean {statistics.fmean(ms):.2f} ms")


def send_at_rate(producer: Producer, payload: bytes, rate: float, n: int) -> tuple[array, array]:
    """Send ``n`` messages at a steady ``rate`` and wait for every ack; returns each message's
    send time and send->ack latency on ``time.perf_counter``, in ack order. In arrays of
    floats: a tuple kept per message would be an object the collector walks at every full
    collection, and their number starts full collections in the sending process (20,000 of
    them in a 10 s steady phase: pauses of 12-22 ms, issue 39), which an application that
    keeps nothing per send would not have."""
    sent_at, latency = array("d"), array("d")
    start = time.perf_counter()
    for i in range(n):
        pause = start + i / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent = time.perf_counter()

        def on_ack(_f: object, t: float = sent) -> None:
            sent_at.append(t)
            latency.append(time.perf_counter() - t)

        producer.send(payload).add_done_callback(on_ack)
    producer.flush()
    return sent_at, latency
