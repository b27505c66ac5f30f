"""Many queues on one local cluster: what idle queues cost, and a busy queue's failover among them.
Not a test: prints numbers for docs/BENCHMARKS.md ("Many queues").

    .venv/bin/python -m bench.bench_queues [--counts 100,1000,10000] [--window 20] [--kills 10] [--json]

One local cluster (``ordq.local_cluster``: one ZooKeeper, 3 broker groups, 2 coordinators, TLS),
grown in steps to each count of idle queues (never written). At each step:

- the time to create the step's queues (``ZkStore.create_queue``, ``--threads`` at once);
- ZooKeeper's node count, approximate data size and watch count (``mntr``);
- each broker's RSS, threads and open files (/proc);
- the CPU every process spent over ``--window`` seconds of idleness;
- the elected coordinator's duty rounds in that window (``ordq_coordinator_rounds``) and, when it
  exports it, the mean time of one (``ordq_coordinator_round_seconds``);
- with ``--profile DIR``: after the idle window, ``py-spy record --gil`` (the dev extra) samples the
  elected coordinator and one broker for ``--window`` seconds more (collapsed stacks in DIR,
  ``<count>-<process>.txt``; ``bench/spy_top.py`` sums them), outside the CPU window;
- ``--kills`` times (after the idle window): one busy queue (a producer in this process, ``--rate`` msgs/s) has its head
  master killed (SIGKILL); failover = the kill → the first ack on a later segment; then the
  master is restarted. Also how long until every idle queue headed by that group has moved on
  (a sample of ``--sample`` of them), which the coordinator daemon does by itself; and, over
  every idle queue the group headed (read pipelined), until all moved and until the segments
  it held open were all sealed (``all_moved_s``, ``all_sealed_s``; issue 43).
  Each failover's parts (ms, ``spans``): from the producer's ``statistics().last_failover``
  (``FailoverTimes``) and the new head's master's and slave's ``first write of busy/<seg>``
  log lines (``broker_group/first_write.py``), on the one monotonic clock of the machine.
  With ``--up`` the master comes back by what ``ordq up`` runs (``LocalCluster.start``), timed
  (``restart_s``); with ``--spread-wait S``, how long until the group heads 90 % of an even share
  of the idle queues again (the coordinator spreads heads back, issue 43: ``spread.back_s``).
- ``--admin``: after a step's kills, ``ordq --json queue list`` of every queue and ``ordq status``;
  ``--list-after-kill S``: that listing also S seconds after each kill, in a process of its own,
  while the dead group's segments are being sealed (``list_after_kill``; run through
  ``bench/timed_cli.py``: ``steps``, the CLI's start, its request and the answer's arrival, in
  seconds from the listing's start, on the clock of the coordinators' log lines);
- ``--grow-to N``: after the steps, idle queues created up to N with ``ordq queue create
  --names-from`` (``--grow-chunk`` names a call, for ``--grow-budget`` seconds at most), the rate
  per call; with ``--admin`` then the listing, status, and g1's master killed and ``ordq up`` timed.
- ``--keep-logs DIR``: every process's log copied into DIR before the cluster is wiped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from prometheus_client.parser import text_string_to_metric_families

from bench._cluster import cpu_seconds, percentile
from ordq.broker_group.first_write import Reported, parse_line
from ordq.cluster_config import ClusterConfig
from ordq.common.errors import CoordinationUnavailable, CorruptState, OrdqError
from ordq.coordinator.rebalance import head_counts
from ordq.coordinator.state import QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import parse_state
from ordq.local_cluster import LocalCluster
from ordq.sdk import Producer, ProducerConfig
from ordq.zk_server import four_letter_word

BUSY = "busy"


def proc_facts(pid: int) -> dict[str, Any]:
    """RSS (MiB), threads and open files of a live process."""
    rss_kb, threads = 0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss_mib": round(rss_kb / 1024, 1), "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def zk_facts(cluster: LocalCluster) -> dict[str, Any]:
    port = cluster.zk.specs[0].client_port
    out: dict[str, Any] = {}
    try:
        text = four_letter_word(port, "mntr", timeout_s=5.0)
    except OSError:
        text = ""
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[0] in ("zk_znode_count", "zk_approximate_data_size", "zk_watch_count"):
            out[parts[0][3:]] = int(parts[1])
    if not out:  # an older config: srvr only says the node count
        for line in four_letter_word(port, "srvr", timeout_s=5.0).splitlines():
            if line.startswith("Node count:"):
                out["znode_count"] = int(line.split(":")[1])
    return out


def scrape(url: str) -> dict[str, float]:
    """Sample name -> value of one Prometheus endpoint (unlabelled samples only)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def leader_metrics(cluster: LocalCluster) -> tuple[str, dict[str, float]] | None:
    for name, url in cluster.metrics_urls().items():
        if not name.startswith("coordinator"):
            continue
        try:
            m = scrape(url)
        except OSError:
            continue
        if m.get("ordq_coordinator_leader") == 1:
            return name, m
    return None


def create_queues(store: ZkStore, names: list[str], threads: int) -> float:
    started = time.monotonic()
    if threads <= 0:  # batched transactions (``ZkStore.create_queues``, issue 43)
        store.create_queues(names)
        return time.monotonic() - started

    def one(name: str) -> None:
        for _ in range(20):
            try:
                store.create_queue(name)
                return
            except OrdqError as exc:
                if "already exists" in str(exc):
                    return
                time.sleep(0.2)
        raise RuntimeError(f"could not create {name}")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return time.monotonic() - started


def idle_window(cluster: LocalCluster, window_s: float) -> dict[str, Any]:
    pids = {name: p.pid for name, p in cluster.processes() if p.pid is not None}
    # The scrapes stay outside the CPU window: at 10,000 queues a coordinator's page holds
    # 50,000 per-queue series, and rendering it costs the coordinator about a second.
    scrape_started = time.monotonic()
    lead0 = leader_metrics(cluster)
    scrape_s = time.monotonic() - scrape_started  # both coordinators' pages (the standby's is short)
    s0 = time.monotonic()
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    wall = time.monotonic() - t0
    cpu = {name: round((cpu_seconds(pid) - before[name]) / wall * 100, 1) for name, pid in pids.items()}
    lead1 = leader_metrics(cluster)
    between = time.monotonic() - s0
    out: dict[str, Any] = {"window_s": round(wall, 1), "cpu_pct": cpu, "scrape_s": round(scrape_s, 2)}
    if lead0 and lead1 and lead0[0] == lead1[0]:
        m0, m1 = lead0[1], lead1[1]
        rounds = m1.get("ordq_coordinator_rounds_total", 0) - m0.get("ordq_coordinator_rounds_total", 0)
        out["coordinator"] = lead1[0]
        out["rounds_per_s"] = round(rounds / between, 2)
        n = m1.get("ordq_coordinator_round_seconds_count", 0) - m0.get("ordq_coordinator_round_seconds_count", 0)
        s = m1.get("ordq_coordinator_round_seconds_sum", 0) - m0.get("ordq_coordinator_round_seconds_sum", 0)
        if n:
            out["round_ms_mean"] = round(s / n * 1000, 2)
        for key in ("ordq_coordinator_zk_reads_total", "ordq_coordinator_probes_total"):
            if key in m1:
                out[key.removeprefix("ordq_coordinator_").removesuffix("_total") + "_per_s"] = round(
                    (m1[key] - m0.get(key, 0)) / between, 1)
    return out


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a live process, by its OS thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def profile(cluster: LocalCluster, folder: Path, count: int, window_s: float) -> dict[str, Any]:
    """Over ``window_s`` at once, for the elected coordinator and g1's master: ``py-spy record
    --gil`` (samples of whichever thread holds the GIL: where Python's CPU goes; collapsed
    stacks in ``folder``, summed by ``bench/spy_top.py``) and each thread's CPU from /proc,
    named by one ``py-spy dump`` (its OS thread id -> the Python thread's top frame)."""
    lead = leader_metrics(cluster)
    pids = dict((name, p.pid) for name, p in cluster.processes() if p.pid is not None)
    targets = [n for n in ((lead[0] if lead else None), "g1/master") if n is not None and n in pids]
    folder.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    before = {name: thread_cpu(pids[name]) for name in targets}
    started = time.monotonic()
    for name in targets:
        out = folder / f"{count}-{name.replace('/', '-')}.txt"
        cmd = [spy, "record", "--pid", str(pids[name]), "--duration", str(int(window_s)), "--rate", "100",
               "--format", "raw", "--gil", "--output", str(out), "--nonblocking"]
        running[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
    for proc, _ in running.values():
        proc.wait(window_s + 60)
    wall = time.monotonic() - started
    result: dict[str, Any] = {}
    for name in targets:
        after = thread_cpu(pids[name])
        dump = subprocess.run([spy, "dump", "--pid", str(pids[name]), "--nonblocking"], capture_output=True,
                              text=True, timeout=60).stdout
        (folder / f"{count}-{name.replace('/', '-')}.dump").write_text(dump)
        names: dict[int, str] = {}
        lines = dump.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Thread "):
                parts = line.split()
                tid = int(parts[1], 16) if parts[1].startswith("0x") else int(parts[1])
                top = lines[i + 1].strip() if i + 1 < len(lines) else ""
                names[tid] = f"{' '.join(parts[2:])} {top}"[:120]
        busy = sorted(((after[t] - before[name].get(t, 0.0), t) for t in after), reverse=True)[:8]
        result[name] = {"spy": str(running[name][1]),
                        "thread_cpu_pct": [(round(c / wall * 100, 2), t, names.get(t, "?")) for c, t in busy]}
    return result


class BusyProducer:
    """A producer in this process sending ``rate`` msgs/s to BUSY; records each ack's segment."""

    def __init__(self, cluster: LocalCluster, rate: float) -> None:
        self.producer = Producer(ProducerConfig(zk_hosts=cluster.zk_hosts, root=cluster.root, queue=BUSY,
                                                credentials=cluster.credentials, send_timeout_s=2.0))
        self.rate = rate
        self.acks: list[tuple[float, int]] = []  # (monotonic, seg)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def spans(self, cluster: LocalCluster, t_kill: float) -> dict[str, Any] | None:
        """The parts of the failover after ``t_kill``, in ms: the producer's steps
        (``FailoverTimes``) and its new head's master's and slave's first write of the segment
        (their log lines), laid end to end."""
        fo = self.producer.statistics().last_failover
        if fo is None or fo.failed_at < t_kill or fo.acked_at is None or fo.answered_at is None:
            return None
        out: dict[str, Any] = {"detect_ms": ms(fo.failed_at - t_kill), "failover_call_ms": ms(
            fo.answered_at - (fo.asked_at or fo.failed_at)), "to_ack_ms": ms(fo.acked_at - fo.answered_at),
            "producer": fo.spans_ms(), "new_channel": fo.new_channel}
        if fo.gid is None or fo.seg is None:
            return out
        master = first_write_line(cluster, fo.gid, "master", fo.seg)
        slave = first_write_line(cluster, fo.gid, "slave", fo.seg)
        out["master"] = None if master is None else master.ms
        out["slave"] = None if slave is None else slave.ms
        if master is None or fo.opened_at is None:
            return out
        at = master.at
        head_at = fo.head_at or fo.answered_at
        # answer -> head known -> stream made -> the master has the first request -> set up
        # (epoch, state, files, config) -> placed and forwarded -> the slave's answer -> ack
        # taken -> the producer reads it
        out["parts_ms"] = {
            "head_lookup": ms(head_at - fo.answered_at),
            "open": ms(fo.opened_at - head_at),
            "to_master": ms(master.arrived - fo.opened_at),
            "master_setup": ms(at("ready_at") - master.arrived),
            "place": ms(at("placed_at") - at("ready_at")),
            "replicate": ms(at("replicated_at") - at("placed_at")),
            "ack_taken": ms(at("done_at") - at("replicated_at")),
            "ack_back": ms(fo.acked_at - at("done_at")),
        }
        out["master_synced_after_placed_ms"] = ms(at("synced_at") - at("placed_at"))
        if slave is not None:
            out["slave_parts_ms"] = {
                "to_slave": ms(slave.arrived - at("placed_at")),
                "slave_setup": ms(slave.at("ready_at") - slave.arrived),
                "slave_sync": ms(slave.at("synced_at") - slave.at("ready_at")),
                "answer_back": ms(at("replicated_at") - slave.at("done_at")),
            }
        return out

    def start(self) -> None:
        self.producer.start()
        self.thread.start()

    def _on_ack(self, future: Any) -> None:
        try:
            seg = future.result().seg
        except Exception:  # noqa: BLE001 - a failed send is not a sample
            return
        with self.lock:
            self.acks.append((time.monotonic(), seg))

    def _run(self) -> None:
        i = 0
        start = time.monotonic()
        while not self.stopping.is_set():
            pause = start + i / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self.producer.send(b"x" * 100).add_done_callback(self._on_ack)
            i += 1

    def first_ack_after(self, t: float, seg: int, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                hit = next((at for at, s in self.acks if at >= t and s > seg), None)
            if hit is not None:
                return hit
            time.sleep(0.01)
        return None

    def last_seg(self) -> int:
        with self.lock:
            return self.acks[-1][1] if self.acks else -1

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.producer.close()


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def first_write_line(cluster: LocalCluster, gid: str, role: str, seg: int) -> Reported | None:
    """The fields of the ``first write of busy/<seg>`` line in that broker's log (the last one)."""
    path = cluster.broker(gid, role).proc.log_path
    marker = f"first write of {BUSY}/{seg} ("
    found = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if marker in line:
                    found = parse_line(line)
    except OSError:
        return None
    return found


def leader_pid(cluster: LocalCluster) -> int | None:
    lead = leader_metrics(cluster)
    if lead is None:
        return None
    return next((p.pid for p in cluster.coordinators if p.name == lead[0]), None)


def spy_at_kill(pid: int | None, folder: Path | None, tag: str, seconds: float) -> subprocess.Popen[bytes] | None:
    """``py-spy record --idle`` of ``pid`` (the elected coordinator, the dead group's slave)
    for ``seconds`` from the kill (collapsed stacks, every thread, waiting ones too: where a
    move's or a seal's wall time goes)."""
    if pid is None or folder is None or seconds <= 0:
        return None
    return spy_process(pid, folder / f"kill-{tag}.txt", seconds)


def spy_process(pid: int, out: Path, seconds: float, *, tell: bool = False) -> subprocess.Popen[bytes]:
    """``py-spy record --idle`` (raw collapsed stacks, every thread) of ``pid`` into ``out``
    for ``seconds`` at most, or until the process ends. ``tell``: its stdout is a pipe, whose
    first line says it is attached and sampling."""
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100",
                             "--format", "raw", "--idle", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.PIPE if tell else subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def patient(read: Any, *args: Any, bound_s: float = 120.0) -> Any:
    """``read(*args)``, again while ZooKeeper does not answer (a full collection of its heap at
    10^5 queues stalled it 5.5 s and ended a run: scale43f), for ``bound_s`` at most."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            return read(*args)
        except CoordinationUnavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


class TimedListing:
    """``ordq --json queue list`` of every queue, in a process of its own, ``delay_s`` after
    ``start()`` (a kill): a listing while a dead group's segments are being sealed (issue 43:
    one call per sealing segment; at 10^5 queues no answer after 300 s, scale43f). ``spy``: a
    file for ``py-spy record --idle`` of that CLI process (where its wall time goes, waits too)."""

    def __init__(self, cluster: LocalCluster, count: int, delay_s: float, out_path: Path,
                 spy: Path | None = None) -> None:
        from bench.bench_admin_scale import cli_base  # (it imports this module)

        # the CLI with its admin call's steps timed (bench/timed_cli.py: the last stderr line)
        self.argv = [sys.executable, "-m", "bench.timed_cli", *cli_base(cluster), "--json", "queue", "list",
                     "--limit", str(count + 10)]
        self.delay_s = delay_s
        self.out_path = out_path
        self.spy = spy
        self.result: dict[str, Any] = {"delay_s": delay_s}
        self._thread = threading.Thread(target=self._run, name="timed-listing", daemon=True)

    def start(self) -> TimedListing:
        self._thread.start()
        return self

    def _run(self) -> None:
        time.sleep(self.delay_s)
        self.result["load"] = round(os.getloadavg()[0], 2)
        self.result["at"] = time.time()  # on the clock of the coordinator's log and the CLI's steps
        started = time.monotonic()
        try:
            with open(self.out_path, "wb") as out:
                # With a profile asked for, the CLI waits for its go until py-spy is attached: a
                # listing that ended while py-spy attached left no profile (bench/timed_cli.py).
                spied = self.spy is not None
                child = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.PIPE,
                                         stdin=subprocess.PIPE if spied else subprocess.DEVNULL,
                                         env={**os.environ, "TIMED_CLI_WAIT": "1"} if spied else None)
                spy = None if self.spy is None else spy_process(child.pid, self.spy, 200, tell=True)
                try:
                    # "py-spy> Sampling process ...", or nothing if it failed; 30 s at most
                    if spy is not None and spy.stdout is not None and select.select([spy.stdout], [], [], 30)[0]:
                        spy.stdout.readline()
                    _, err = child.communicate(b"go\n" if spied else None, timeout=180)
                finally:
                    child.kill()
                    child.wait()
                    if spy is not None:
                        spy.communicate(timeout=60)
            self.result.update(rc=child.returncode, s=round(time.monotonic() - started, 2),
                               bytes=self.out_path.stat().st_size, err=err.decode(errors="replace")[-300:])
            self.result["steps"] = cli_steps(err, self.result["at"])
            if child.returncode == 0:
                self.result["rows"] = len(json.loads(self.out_path.read_bytes() or b"[]"))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self.result["failed"] = repr(exc)[:300]

    def wait(self, timeout_s: float) -> dict[str, Any]:
        self._thread.join(timeout_s)
        return self.result


def cli_steps(err: bytes, at: float) -> dict[str, Any] | None:
    """The timed CLI's steps (bench/timed_cli.py, its last stderr line), in seconds from ``at``."""
    try:
        times = json.loads(err.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return {"started": round(times["started"] - at, 2), "ready": round(times["ready"] - at, 2),
            "asked": round(times["asked"] - at, 2) if "asked" in times else None,
            "answers": [(round(a["at"] - at, 2), a["bytes"]) for a in times["answers"]],
            "ended": round(times["ended"] - at, 2)}


def kill_once(cluster: LocalCluster, store: ZkStore, busy: BusyProducer, idle: list[str],
              sample: int, rng: random.Random, idle_wait_s: float, *, up: bool = False,
              spread_wait_s: float = 0.0, spy_folder: Path | None = None, spy_s: float = 0.0,
              tag: str = "", list_after_s: float | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while busy.last_seg() < 0 or (st := store.load_state(BUSY)[0]).open_segment is None:
        if time.monotonic() > deadline:
            raise RuntimeError("busy queue acks nothing")
        time.sleep(0.05)
    open_seg = st.open_segment
    assert open_seg is not None
    gid, seg = open_seg.gid, open_seg.seg
    # every idle queue the group heads, with its open segment: all moved, all sealed (issue 43)
    states = {q: v[0] for q, v in patient(store.load_states, idle).items() if not isinstance(v, CorruptState)}
    headed = {q: st.open_segment.seg for q, st in states.items()
              if st.open_segment is not None and st.open_segment.gid == gid}
    # a sample of those, watched for the failover's first moves (read above, not once more each)
    watched = [q for q in rng.sample(idle, min(sample, len(idle))) if q in headed]
    # the idle heads per group at the kill: concurrent creators (--threads) can read the same
    # queue count and so skew the creation's spread, until the coordinator evens it (10 s grace)
    heads_at_kill = head_counts((st.head for st in states.values()), cluster.gids)
    spy_pid = leader_pid(cluster) if spy_folder is not None else None
    load_at_kill = round(os.getloadavg()[0], 2)
    t_kill, t_kill_wall = time.monotonic(), time.time()
    cluster.broker(gid, "master").kill()
    listing = None if list_after_s is None else TimedListing(
        cluster, len(idle), list_after_s, cluster.folder.parent / f"list-{tag}.json",
        spy=None if spy_folder is None else spy_folder / f"list-{tag}.txt").start()
    spy = spy_at_kill(spy_pid, spy_folder, f"{tag}-{gid}", spy_s)
    # the dead group's slave seals its segments (SealMany): where that time goes
    spy_slave = spy_at_kill(cluster.broker(gid, "slave").proc.pid, spy_folder, f"{tag}-{gid}-slave", spy_s)
    acked_at = busy.first_ack_after(t_kill, seg, timeout_s=30)
    # the brokers log a first write's line once its ack is written: give it a moment
    spans = None
    until = time.monotonic() + 5
    while acked_at is not None and time.monotonic() < until:
        spans = busy.spans(cluster, t_kill)
        if spans is None or (spans.get("master") is not None and spans.get("slave") is not None):
            break
        time.sleep(0.1)
    idle_moved: float | None = None
    left = set(watched)
    deadline = time.monotonic() + idle_wait_s
    while left and time.monotonic() < deadline:
        for q in list(left):
            o = patient(store.load_state, q)[0].open_segment
            if o is not None and o.gid != gid:
                left.discard(q)
        if left:
            time.sleep(0.05)
    if not left:
        idle_moved = time.monotonic() - t_kill
    all_moved, all_sealed = track_headed(store, headed, gid, t_kill_wall, idle_wait_s)
    listed = None if listing is None else listing.wait(200.0)
    for spying in (spy, spy_slave):
        if spying is not None:
            spying.wait(spy_s + 60)
    restarted = time.monotonic()
    # A restarted master opens every segment file it holds: at 10,000 queues on a box at load
    # 30+ that passed the default 30 s once and ended a run (stop 28).
    if up:  # what `ordq up` runs: start what is not running, wait until every process is healthy
        cluster.start(timeout_s=180.0)
    else:
        cluster.restart_broker(gid, "master", timeout_s=180.0)
    restart_s = round(time.monotonic() - restarted, 1)
    spread = track_spread(store, idle, gid, cluster.gids, spread_wait_s) if spread_wait_s > 0 else None
    return {"restart_s": restart_s, "restart_by": "ordq up" if up else "restart_broker", "spread": spread,
            "group": gid, "failover_s": None if acked_at is None else round(acked_at - t_kill, 3),
            "spans": spans,
            "idle_moved_s": None if idle_moved is None else round(idle_moved, 2), "idle_watched": len(watched),
            "headed": len(headed), "heads_at_kill": heads_at_kill, "all_moved_s": all_moved,
            "all_sealed_s": all_sealed, "list_after_kill": listed,
            "load_at_kill": load_at_kill, "load_after": round(os.getloadavg()[0], 2)}


def track_headed(store: ZkStore, headed: dict[str, int], gid: str, t_kill_wall: float,
                 wait_s: float) -> tuple[float | None, float | None]:
    """Seconds from the kill (``t_kill_wall``, wall clock) until every queue of ``headed``
    (queue -> its open segment then) has its head off ``gid``, and until each of those segments
    is sealed (or popped); None for what did not happen within ``wait_s``. Each state is read
    once with a watch, then again only when its watch fired (``StateWatch``); a change is timed
    by ZooKeeper's commit of the version read (its ``mtime``, on this machine's clock): the
    first version read that shows it, an upper bound of when it happened (a later write
    meanwhile, a seal after the move, only makes it later).

    Why (stop 74): until then every state not yet sealed was read again every 0.2 s, a pass of
    ~33,000 reads at 10^5 queues (~3 s of this process's CPU), each change timed by the pass that
    saw it: the figure held the bench's own reading, up to a pass and more under load."""
    moved_at: float | None = None
    sealed_at: float | None = None
    deadline = time.monotonic() + wait_s
    todo = dict(headed)
    unmoved = set(headed)
    watch = StateWatch(store, sorted(headed))
    while unmoved or todo:
        changed = watch.changed(deadline)
        if changed is None:
            break
        for q, (st, mtime) in changed.items():
            o = st.open_segment
            if q in unmoved and o is not None and o.gid != gid:
                unmoved.discard(q)
                moved_at = max(moved_at or 0.0, mtime - t_kill_wall)
            s = st.segment(todo.get(q, -1))
            if q in todo and (s is None or s.status is SegStatus.SEALED):
                del todo[q]
                sealed_at = max(sealed_at or 0.0, mtime - t_kill_wall)
        watch.keep(unmoved | set(todo))
    return (None if unmoved or moved_at is None else round(moved_at, 2),
            None if todo or sealed_at is None else round(sealed_at, 2))


class StateWatch:
    """Queues' states as they change: each read with a watch, read again once it fires."""

    SLICE = 500  # reads sent before their answers are taken (kazoo pipelines them)

    def __init__(self, store: ZkStore, queues: list[str]) -> None:
        self._store = store
        self._cv = threading.Condition()
        self._fired: set[str] = set(queues)  # to read (the first time: all)
        self._kept = set(queues)

    def keep(self, queues: set[str]) -> None:
        """Only these are read again from now on (a watch of another may still fire: ignored)."""
        with self._cv:
            self._kept = set(queues)

    def _on_change(self, event: Any) -> None:
        path = getattr(event, "path", None)
        with self._cv:
            if not path:  # the connection dropped: kazoo fires every watch once, with no path
                self._fired |= self._kept
            else:
                self._fired.add(path.rsplit("/", 2)[-2])  # .../<queue>/state
            self._cv.notify()

    def changed(self, deadline: float) -> dict[str, tuple[QueueState, float]] | None:
        """(state, ZooKeeper's commit time of it: wall clock, s) of each kept queue whose watch
        fired, read now and watched again, once one did; None at ``deadline``. A queue deleted
        or unreadable meanwhile is left out (read again if its watch fires)."""
        with self._cv:
            while not self._fired & self._kept:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            todo, self._fired = sorted(self._fired & self._kept), set()
        out: dict[str, tuple[QueueState, float]] = {}
        for i in range(0, len(todo), self.SLICE):
            part = todo[i:i + self.SLICE]
            asked = [self._store.client.get_async(self._store.paths.state(q), watch=self._on_change) for q in part]
            for q, request in zip(part, asked, strict=True):
                try:
                    data, stat = request.get(timeout=60)
                    out[q] = (parse_state(q, data), stat.mtime / 1000)
                except (KazooException, KazooTimeoutError, CorruptState):
                    with self._cv:  # read again next time
                        self._fired.add(q)
        return out


def track_spread(store: ZkStore, idle: list[str], gid: str, gids: tuple[str, ...], wait_s: float) -> dict[str, Any]:
    """After ``gid`` is back (its master restarted): seconds until it heads 90 % of an even
    share of the idle queues again (the coordinator spreads heads back after a grace, at a
    bounded rate: issue 43), and the heads per group then (or at the deadline). The states are
    read with watches (``StateWatch``: until stop 74 every state was read again each second)."""
    share = len(idle) / len(gids)
    started = time.monotonic()
    deadline = started + wait_s
    watch = StateWatch(store, idle)
    heads: dict[str, str | None] = {}
    first: dict[str, int] | None = None
    counts: dict[str, int] = {}
    reached: float | None = None
    while (changed := watch.changed(deadline)) is not None:
        heads.update((q, st.head) for q, (st, _mtime) in changed.items())
        counts = head_counts(heads.values(), gids)  # the coordinator's own count (groups heading none: 0)
        first = counts if first is None else first
        if counts.get(gid, 0) >= 0.9 * share:
            reached = time.monotonic() - started
            break
    return {"back_s": None if reached is None else round(reached, 1), "heads_at_restart": first or {},
            "heads": counts}


def admin_figures(cluster: LocalCluster, count: int) -> dict[str, Any]:
    """``ordq --json queue list`` of every queue and ``ordq status``, in this process, timed."""
    from bench.bench_admin_scale import cli  # (it imports this module)

    load = round(os.getloadavg()[0], 2)
    rc, text, took = cli(cluster, "--json", "queue", "list", "--limit", str(count + 10))
    rows = json.loads(text) if rc == 0 and text else []
    rc2, _, took2 = cli(cluster, "status", "--dir", str(cluster.folder))
    return {"load": load, "list": {"rc": rc, "rows": len(rows), "s": round(took, 2), "bytes": len(text)},
            "status": {"rc": rc2, "s": round(took2, 2)}}


def zk_heap(cluster: LocalCluster) -> dict[str, Any]:
    """ZooKeeper's JVM: RSS and ``jcmd GC.heap_info`` (used / committed heap)."""
    pid = cluster.zk.processes[0].pid
    out: dict[str, Any] = {}
    if pid is None:
        return out
    out.update(proc_facts(pid))
    try:
        text = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {**out, "jcmd_failed": repr(exc)}
    out["heap_info"] = " | ".join(line.strip() for line in text.splitlines()[1:4])
    return out


def ops_figures(cluster: LocalCluster, rate: float, *, lean: bool = False) -> dict[str, Any]:
    """/metrics and /health size of the elected coordinator, ZooKeeper's heap and nodes,
    ``ordq group rebalance --dry-run`` timed, then the whole cluster stopped (``ordq down``)
    and started (``ordq up``), timed to serving and to a busy producer's first ack."""
    from bench.bench_admin_scale import cli, fetch, leader_url

    out: dict[str, Any] = {"load": round(os.getloadavg()[0], 2)}
    lead = leader_url(cluster)
    if lead is not None:
        base = lead[1].rsplit("/", 1)[0]
        out["metrics_page"] = fetch(lead[1])
        out["health_page"] = fetch(base + "/health", timeout_s=10)
    out["zk"] = zk_facts(cluster)
    out["zk_heap"] = zk_heap(cluster)
    if not lean:
        rc, text, took = cli(cluster, "--json", "group", "rebalance", "--dry-run")
        out["rebalance_dry_run"] = {"rc": rc, "s": round(took, 2), "bytes": len(text)}
    print(json.dumps({"ops": out}), file=sys.stderr, flush=True)
    cluster.stop(timeout_s=60.0)
    out["down_load"] = round(os.getloadavg()[0], 2)
    t0 = time.monotonic()
    if not timed_up(cluster, out, "full_up"):
        return out
    busy = BusyProducer(cluster, rate)
    try:
        busy.start()
        hit = busy.first_ack_after(t0, -1, timeout_s=300)
        out["full_up_first_ack_s"] = None if hit is None else round(hit - t0, 1)
    finally:
        busy.close()
    out["up_load"] = round(os.getloadavg()[0], 2)
    return out


def timed_up(cluster: LocalCluster, out: dict[str, Any], key: str) -> bool:
    """What ``ordq up`` runs (start what is not running, wait until healthy), timed into
    ``out[key + "_s"]``, or why it failed into ``out[key + "_failed"]`` (False)."""
    t0 = time.monotonic()
    try:
        cluster.start(timeout_s=600.0)
    except Exception as exc:  # noqa: BLE001 - a number, not a crash
        out[f"{key}_failed"] = repr(exc)[:300]
        return False
    out[f"{key}_s"] = round(time.monotonic() - t0, 1)
    return True


def grow(cluster: LocalCluster, have: list[str], target: int, budget_s: float, chunk: int,
         folder: Path) -> dict[str, Any]:
    """Create idle queues up to ``target`` with ``ordq queue create --names-from FILE`` (batched
    transactions through the admin API), ``chunk`` at a time, until ``target`` or ``budget_s``
    (a chunk is not started past it). Each chunk's rate and the load beside it."""
    from bench.bench_admin_scale import cli

    started = time.monotonic()
    chunks: list[dict[str, Any]] = []
    while len(have) < target and time.monotonic() - started < budget_s:
        names = [f"idle-{i:06d}" for i in range(len(have), min(target, len(have) + chunk))]
        listing = folder / f"names-{len(have)}.txt"
        listing.write_text("\n".join(names) + "\n")
        rc, _, took = cli(cluster, "queue", "create", "--names-from", str(listing))
        if rc != 0:
            chunks.append({"rc": rc, "n": len(names), "s": round(took, 1)})
            break
        have += names
        chunks.append({"to": len(have), "n": len(names), "s": round(took, 1), "per_s": round(len(names) / took, 1),
                       "load": round(os.getloadavg()[0], 2)})
        print(json.dumps({"grow": chunks[-1]}), file=sys.stderr, flush=True)
    total = sum(c["n"] for c in chunks if "per_s" in c)
    took = sum(c["s"] for c in chunks if "per_s" in c)
    return {"queues": len(have), "created": total, "s": round(took, 1),
            "per_s": round(total / took, 1) if took else None, "chunks": chunks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="100,1000", help="idle queue counts, ascending")
    ap.add_argument("--window", type=float, default=20.0, help="idle seconds measured per step")
    ap.add_argument("--kills", type=int, default=5, help="head-master kills per step")
    ap.add_argument("--rate", type=float, default=200.0, help="busy queue msgs/s")
    ap.add_argument("--threads", type=int, default=8,
                    help="queues created at once; 0: in batched transactions (ZkStore.create_queues)")
    ap.add_argument("--sample", type=int, default=30, help="idle queues watched for the daemon's failover")
    ap.add_argument("--idle-wait", type=float, default=60.0, help="seconds to wait for the idle queues to move")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", type=Path, help="py-spy the leader coordinator and g1/master into this folder")
    ap.add_argument("--up", action="store_true",
                    help="bring the killed master back with what `ordq up` runs (LocalCluster.start), timed")
    ap.add_argument("--spread-wait", type=float, default=0.0,
                    help="after each restart, seconds to wait for the group to head its share again")
    ap.add_argument("--admin", action="store_true", help="after each step's kills: `queue list` of all, `status`")
    ap.add_argument("--grow-to", type=int, default=0,
                    help="after the steps: create idle queues up to this count with `ordq queue create`, timed")
    ap.add_argument("--grow-budget", type=float, default=300.0, help="seconds of creation at most (--grow-to)")
    ap.add_argument("--grow-chunk", type=int, default=5000, help="names per `queue create` call (--grow-to)")
    ap.add_argument("--spy-kill", type=Path,
                    help="py-spy record --idle the elected coordinator from each kill into this folder")
    ap.add_argument("--spy-s", type=float, default=20.0, help="seconds of --spy-kill")
    ap.add_argument("--create-cli", action="store_true",
                    help="create each step's queues with `ordq queue create --names-from` (--grow-chunk a call)")
    ap.add_argument("--ops", action="store_true",
                    help="after the last step: /metrics size, ZooKeeper heap, rebalance --dry-run, ordq down/up")
    ap.add_argument("--lean", action="store_true",
                    help="leave out the steps that read every state once more (idle segments after --admin, "
                         "rebalance --dry-run in --ops): a 10^5 run in a 15-minute window")
    ap.add_argument("--list-after-kill", type=float, default=None, metavar="S",
                    help="S seconds after each kill: `ordq --json queue list` of all in a process of its own, timed")
    ap.add_argument("--keep-logs", type=Path, metavar="DIR",
                    help="copy every process's log into DIR before the cluster is wiped (its coordinators' "
                         "lines on long admin calls and rounds)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="ordq-bench-queues-"))
    cluster = LocalCluster(folder / "c", ClusterConfig(groups=3, zk_nodes=1, coordinators=2))
    steps: list[dict[str, Any]] = []
    busy: BusyProducer | None = None
    try:
        cluster.start()
        with cluster.store() as store:
            store.create_queue(BUSY)
            have: list[str] = []
            for count in counts:
                names = [f"idle-{i:06d}" for i in range(len(have), count)]
                load0 = os.getloadavg()[0]
                if args.create_cli:
                    grown_now = grow(cluster, have, count, 1e9, args.grow_chunk, folder)  # adds to have
                    created_s = grown_now["s"]
                    step_created = grown_now["created"]
                else:
                    created_s = create_queues(store, names, args.threads)
                    have += names
                    step_created = len(names)
                step: dict[str, Any] = {"queues": count, "created": step_created, "create_s": round(created_s, 1),
                                        "create_per_s": round(step_created / created_s, 1) if created_s else None}
                time.sleep(min(10.0, args.window / 2))  # let the creation's work drain
                step["load_before"] = round(os.getloadavg()[0], 2)
                step["idle"] = idle_window(cluster, args.window)
                step["load_after"] = round(os.getloadavg()[0], 2)
                step["zk"] = zk_facts(cluster)
                step["brokers"] = {name: proc_facts(b.proc.pid) for name, b in cluster.brokers()
                                   if b.proc.pid is not None}
                if args.profile is not None:
                    try:
                        step["profiles"] = profile(cluster, args.profile, count, args.window)
                    except (OSError, subprocess.SubprocessError, ValueError) as exc:  # numbers go on without it
                        step["profiles"] = {"failed": repr(exc)}
                # the busy producer runs only now: the idle window above is idle
                busy = BusyProducer(cluster, args.rate)
                busy.start()
                kills: list[dict[str, Any]] = []
                for _ in range(args.kills):  # each also on stderr: a run that fails keeps what it measured
                    kills.append(kill_once(cluster, store, busy, have, args.sample, rng, args.idle_wait,
                                           up=args.up, spread_wait_s=args.spread_wait, spy_folder=args.spy_kill,
                                           spy_s=args.spy_s, tag=f"{count}-{len(kills)}",
                                           list_after_s=args.list_after_kill))
                    print(json.dumps({"queues": count, "kill": kills[-1], "load": os.getloadavg()[0]}),
                          file=sys.stderr, flush=True)
                busy.close()
                busy = None
                fo = [k["failover_s"] for k in kills if k["failover_s"] is not None]
                moved = [k["idle_moved_s"] for k in kills if k["idle_moved_s"] is not None]
                step["kills"] = kills
                if fo:
                    step["failover_ms"] = {"p50": round(percentile(fo, 50) * 1000), "p99": round(
                        percentile(fo, 99) * 1000), "max": round(max(fo) * 1000), "n": len(fo)}
                if moved:
                    step["idle_moved_s"] = {"p50": percentile(moved, 50), "max": max(moved)}
                for key in ("all_moved_s", "all_sealed_s"):
                    got = [k[key] for k in kills if k.get(key) is not None]
                    step[key] = {"p50": percentile(got, 50), "max": max(got), "n": len(got),
                                 "of": len(kills)} if got else None
                step["headed"] = [k["headed"] for k in kills]
                step["spans_ms"] = span_summary([k["spans"] for k in kills if k["spans"] is not None])
                step["load_create_start"] = round(load0, 2)
                if args.admin:
                    step["admin"] = admin_figures(cluster, len(have))
                if args.admin and not args.lean:
                    # segments kept by the idle queues (never written, no subscription): one each
                    # once a failover's empty segment is popped (state.pop, issue 43)
                    states = [v[0] for v in store.load_states(have).values() if not isinstance(v, CorruptState)]
                    kept = [len(st.consume) for st in states]
                    step["idle_segments"] = {"total": sum(kept), "max": max(kept, default=0),
                                             "queues_with_more_than_one": sum(1 for k in kept if k > 1),
                                             "examples": [[st.queue, [(c.seg, c.gid, c.status.value, c.end, c.last_seq)
                                                                      for c in st.consume]]
                                                          for st in states if len(st.consume) > 1][:8]}
                steps.append(step)
                print(json.dumps(step) if args.json else summary(step), flush=True)
            if args.ops:
                try:
                    print(json.dumps({"ops": ops_figures(cluster, args.rate, lean=args.lean)}), flush=True)
                except Exception as exc:  # noqa: BLE001 - what was measured is printed already
                    print(json.dumps({"ops_failed": repr(exc)[:500]}), flush=True)
            if args.grow_to > len(have):
                grown: dict[str, Any] = {"grow": grow(cluster, have, args.grow_to, args.grow_budget,
                                                      args.grow_chunk, folder)}
                if args.admin:
                    grown["admin"] = admin_figures(cluster, len(have))
                    # a killed master brought back by `ordq up` at this count, with nothing written
                    cluster.broker("g1", "master").kill()
                    timed_up(cluster, grown, "up")
                    grown["up_load"] = round(os.getloadavg()[0], 2)
                print(json.dumps(grown), flush=True)
    finally:
        if busy is not None:
            busy.close()
        if args.keep_logs is not None:
            keep_logs(cluster, args.keep_logs)
        cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)  # the grow's scratch files; the cluster is gone
    return 0


def keep_logs(cluster: LocalCluster, into: Path) -> None:
    """Every process's log copied into ``into`` (``--keep-logs``), as ``NAME.log``."""
    into.mkdir(parents=True, exist_ok=True)
    for name, path in cluster.log_paths().items():
        if path.is_file():
            shutil.copyfile(path, into / f"{name.replace('/', '-')}.log")


def span_summary(spans: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """p50 / p99 / max of each part of the failovers (``BusyProducer.spans``), in ms."""
    values: dict[str, list[float]] = {}
    for sp in spans:
        flat = {k: v for k, v in sp.items() if k.endswith("_ms") and isinstance(v, (int, float))}
        flat.update(sp.get("parts_ms") or {})
        flat.update(sp.get("slave_parts_ms") or {})
        for side in ("master", "slave"):
            for k, v in (sp.get(side) or {}).items():
                if k in ("epoch", "state", "files", "config", "synced_at"):
                    flat[f"{side}.{k}"] = v
        for k, v in flat.items():
            values.setdefault(k, []).append(float(v))
    return {k: {"p50": percentile(v, 50), "p99": percentile(v, 99), "max": max(v), "n": len(v)}
            for k, v in values.items()}


def summary(step: dict[str, Any]) -> str:
    idle = step["idle"]
    cpu = idle["cpu_pct"]
    brokers = step["brokers"]
    b: dict[str, Any] = next(iter(brokers.values()), {})
    lines = [
        f"== {step['queues']} idle queues (load {step['load_before']} -> {step['load_after']})",
        f"created {step['created']} in {step['create_s']} s ({step['create_per_s']}/s)",
        f"zookeeper: {step['zk']}",
        f"broker g1/master: {b}; all brokers RSS MiB: {[v['rss_mib'] for v in brokers.values()]}",
        f"idle CPU % over {idle['window_s']} s: {cpu}",
        f"coordinator {idle.get('coordinator')}: {idle.get('rounds_per_s')} rounds/s, "
        f"round {idle.get('round_ms_mean', '?')} ms, zk reads/s {idle.get('zk_reads_per_s', '?')}, "
        f"probes/s {idle.get('probes_per_s', '?')}",
        f"busy-queue failover: {step.get('failover_ms')}; idle queues moved on: {step.get('idle_moved_s')}",
        f"queues the killed group headed: {step.get('headed')}; all moved: {step.get('all_moved_s')}; "
        f"all sealed: {step.get('all_sealed_s')}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
