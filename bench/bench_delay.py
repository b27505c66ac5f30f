"""Delayed delivery: how late a message is handed out after its due time (actual − due), at a
steady rate, with and without a kill -9 of the head master in the middle. Not a test: prints
numbers for docs/BENCHMARKS.md ("Delayed delivery").

    .venv/bin/python -m bench.bench_delay [--rate 2000] [--seconds 10] [--delay-s 1.0] [--forms delay,deliver_at]

Real processes: ZooKeeper, three broker groups and a coordinator (bench/_cluster.py); the
producer runs here, the consumer in a child process (its own interpreter, as an application's
would). Two runs per form, each on a fresh subscription started at ``latest``:

- ``delay``: the subscription's delay is ``--delay-s`` (``sub create --delay``); messages carry
  no due time of their own: due = timestamp + delay.
- ``deliver_at``: no subscription delay; every message is sent with ``deliver_at`` = its send
  time + ``--delay-s``: due = deliver_at.
- ``none`` (the baseline): no delay at all, due = the timestamp: the error is the end-to-end
  latency, what a delayed message has to absorb within its delay.

each steady, then with the head group's master killed (-9) halfway (restarted once the run is
over). Error = the wall time the consumer handed the message out − its due time, on this
machine's clock (producer and consumer share it). Every message is checked to arrive once, in
order, and never early (an early one is counted and fails the run: exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._cluster import QUEUE, ROOT, BenchCluster, bench_cluster, percentile
from ordq.common.proc import announce
from ordq.coordinator.client import CoordinatorClient
from ordq.sdk import BatchingConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk.delay import due_us


def consume_main(hosts: str, sub: str, count: int, out: str) -> None:
    """Child process: deliver ``count`` messages of ``sub`` in order; write each one's error
    (hand-out wall time − due time, µs) to ``out`` as JSON."""
    cfg = ConsumerConfig(zk_hosts=hosts, root=ROOT, queue=QUEUE, subscription=sub, fetch_wait_ms=50)
    errors: list[int] = []
    nxt = None
    with Consumer(cfg) as c:
        announce("READY")
        while len(errors) < count:
            for m in c.poll(0.5):
                now = time.time_ns() // 1000
                if nxt is not None and m.seq != nxt:
                    raise SystemExit(f"out of order: expected {nxt}, got {m.seq}")
                nxt = m.seq + 1
                # a message due at once (the baseline form "none"): due at its timestamp
                errors.append(now - (due_us(m.timestamp_us, m.headers, round(c.delay_s * 1e6)) or m.timestamp_us))
        c.commit()
    Path(out).write_text(json.dumps(errors))


def head_master_pid(cluster: BenchCluster) -> tuple[int, str]:
    head = cluster.store.load_state(QUEUE)[0].head
    assert head is not None, "no head group: nothing to kill"
    group = next(g for g in cluster.groups if g.gid == head)
    return group.master.proc.pid or 0, head


def run(cluster: BenchCluster, form: str, *, rate: float, seconds: float, delay_s: float, kill: bool,
        folder: Path, index: int) -> dict[str, object]:
    sub = f"{form}-{'kill' if kill else 'steady'}-{index}"
    with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials) as coord:
        coord.admin("sub create", queue=QUEUE, subscription=sub, start=["latest"],
                    delay_ms=round(delay_s * 1000) if form == "delay" else 0)
    n = int(rate * seconds)
    out = folder / f"{sub}.json"
    child = subprocess.Popen([sys.executable, "-m", "bench.bench_delay", "--consume", cluster.hosts, sub, str(n),
                              str(out)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "READY":
        raise RuntimeError("consumer did not start")
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE, send_timeout_s=1.0,
                         batching=BatchingConfig(linger_ms=2.0))
    killed = ""
    load = os.getloadavg()[0]
    with Producer(cfg) as p:
        start = time.perf_counter()
        for i in range(n):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            if kill and not killed and i == n // 2:
                pid, killed = head_master_pid(cluster)
                os.kill(pid, 9)
            p.send(b"x" * 200, deliver_at=time.time() + delay_s if form == "deliver_at" else None)
        p.flush(timeout_s=120)
        failovers = p.statistics().failovers
    child.wait(timeout=300)
    if child.returncode != 0:
        raise RuntimeError(f"consumer exited {child.returncode}")
    if killed:
        group = next(g for g in cluster.groups if g.gid == killed)
        group.master.start()  # back for the next run (the coordinator admits it again)
    errors_ms = [e / 1000 for e in json.loads(out.read_text())]
    early = sum(1 for e in errors_ms if e < 0) if form != "none" else 0
    return {"form": form, "fault": f"head master {killed} killed at {n // 2}" if killed else "none",
            "messages": len(errors_ms), "rate": rate, "delay_s": delay_s, "failovers": failovers,
            "p50_ms": round(percentile(errors_ms, 50), 2), "p99_ms": round(percentile(errors_ms, 99), 2),
            "max_ms": round(max(errors_ms), 2), "early": early,
            "late_100ms": round(sum(1 for e in errors_ms if e > 100) / len(errors_ms), 3), "load": round(load, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="messages per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    ap.add_argument("--delay-s", type=float, default=1.0, help="the delay (subscription) or deliver_at - send")
    ap.add_argument("--forms", default="none,delay,deliver_at")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--consume", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.consume:
        hosts, sub, count, out = args.consume
        consume_main(hosts, sub, int(count), out)
        return 0
    rows = []
    with bench_cluster(3) as cluster:
        for i, (form, kill) in enumerate((f, k) for k in (False, True) for f in args.forms.split(",")):
            row = run(cluster, form, rate=args.rate, seconds=args.seconds, delay_s=args.delay_s, kill=kill,
                      folder=cluster.folder, index=i)
            rows.append(row)
            print(json.dumps(row) if args.json else
                  f"{row['form']:>10} fault={row['fault']}: {row['messages']} msgs at {row['rate']:g}/s, "
                  f"actual-due p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms max {row['max_ms']} ms, "
                  f"{row['late_100ms']:.1%} > 100 ms late, "
                  f"early {row['early']}, failovers {row['failovers']} (load {row['load']})", flush=True)
            if row["early"]:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
