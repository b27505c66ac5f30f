"""Where a synchronous send's time and CPU go (issue 39): stage stamps across the producer, the
head master and its slave (ordq/common/stages.py), and each thread's wake-ups and CPU per send.
Not a test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_stages [--sends 1000] [--token] [--insecure]

One message at a time (send, wait for its future), on a local two-group cluster with TLS on
every hop (``--insecure``: without), 1 KiB messages. Prints:
- the commonest path of stages of one send, and each step's p50/p90/p99 (microseconds on
  CLOCK_MONOTONIC, one clock for all the processes): ``send`` (Producer.send), ``P.write``
  (the request handed to gRPC), ``M.request``/``M.placed`` (the master read and placed it),
  ``M.forward`` (sent to the slave), ``S.request``/``S.answer`` (the slave appended, synced and
  answered), ``M.synced`` (the master's own group commit), ``M.slave_answer``, ``M.ack``,
  ``P.ack``, ``P.resolved``, ``woke`` (``result()`` returned in the sending thread);
- per process and thread: voluntary/involuntary context switches and CPU µs per send (every
  wake-up of a thread is a voluntary switch out of its wait), with the idle CPU per second.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._cluster import QUEUE, ROOT, bench_cluster, cpu_seconds, summary_ms
from ordq.common import stages
from ordq.sdk import Producer, ProducerConfig

Threads = dict[str, tuple[str, int, int, float]]  # tid -> (name, voluntary, involuntary, cpu s)


def threads_of(pid: int) -> Threads:
    out: Threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        v = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        nv = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[task.name] = ((task / "comm").read_text().strip(), v, nv,
                          (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def python_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name (py-spy, when installed; else the kernel's names stay)."""
    if pid == os.getpid():
        return {str(t.native_id): t.name for t in threading.enumerate()}
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {}
    dump = subprocess.run([str(spy), "dump", "--nonblocking", "-p", str(pid)], capture_output=True, text=True,
                          timeout=60).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r'Thread (\d+) \([a-z]+\): "([^"]+)"', dump)}


def wakeup_lines(name: str, pid: int, before: Threads, after: Threads, n: int) -> str:
    names = python_names(pid)
    rows, total_v, total_cpu = [], 0.0, 0.0
    for tid, (comm, v, nv, cpu) in after.items():
        _, v0, nv0, cpu0 = before.get(tid, (comm, 0, 0, 0.0))
        dv, dnv, dcpu = (v - v0) / n, (nv - nv0) / n, (cpu - cpu0) / n * 1e6
        total_v += dv
        total_cpu += dcpu
        if dv >= 0.05 or dcpu >= 10:
            rows.append(f"{names.get(tid, comm)} {dv:.1f}/{dnv:.1f}/{dcpu:,.0f}")
    return (f"{name}: {total_v:.1f} wake-ups, {total_cpu:,.0f} µs CPU per send; by thread "
            f"(voluntary/involuntary switches/CPU µs per send): " + ", ".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--token", action="store_true", help="the producer calls with a produce token")
    ap.add_argument("--insecure", action="store_true", help="plaintext brokers (no TLS)")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ordq-stages-"))
    stages.enable(folder)  # before the cluster starts: its processes inherit it
    payload = b"x" * 1024
    with bench_cluster(2, tls=not args.insecure) as cluster:
        if args.token:
            from ordq.coordinator.tokens import create_token, touch

            _rec, token = create_token(cluster.store.client, ROOT, {QUEUE: ["produce"]}, "bench_stages")
            touch(cluster.store.client, ROOT)
            os.environ["ORDQ_TOKEN"] = token
            time.sleep(1.0)  # the brokers' token watch (milliseconds)
        with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE)) as producer:
            for _ in range(args.warmup):
                producer.send(payload).result()
            head = cluster.groups[0]
            pids = {"master": head.master.proc.pid or 0, "slave": head.slave.proc.pid or 0, "producer": os.getpid()}
            idle0 = {k: cpu_seconds(p) for k, p in pids.items()}
            time.sleep(2.0)
            idle = {k: (cpu_seconds(p) - idle0[k]) / 2.0 * 1000 for k, p in pids.items()}
            before = {k: threads_of(p) for k, p in pids.items()}
            lat = []
            t0 = time.perf_counter()
            for _ in range(args.sends):
                start = time.perf_counter()
                producer.send(payload).result()
                stages.stamp("woke")
                lat.append(time.perf_counter() - start)
            secs = time.perf_counter() - t0
            after = {k: threads_of(p) for k, p in pids.items()}
            print(f"synchronous: {args.sends / secs:,.0f} sends/s; ack latency {summary_ms(lat)}; "
                  f"load average {os.getloadavg()[0]:.1f}")
            print("idle CPU per second: " + ", ".join(f"{k} {v:.0f} ms" for k, v in idle.items()))
            for k, p in pids.items():
                print(wakeup_lines(k, p, before[k], after[k], args.sends))
    b = stages.breakdown(stages.read_stamps(folder), "send", "woke", skip=args.warmup)
    shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(stages.lines(b)))


if __name__ == "__main__":
    main()
