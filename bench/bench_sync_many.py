"""Several producers sending synchronously at once into one broker group (issue 39): each of
``--producers`` queues on g1 gets one Producer in this process, driven by a thread of its own
that sends one 1 KiB message, waits for its ack, and sends the next, for ``--seconds``. Not a
test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_sync_many [--producers 4] [--seconds 10] [--token]

What it is for: a master commits a lone small request on its event loop, and any other on its
sync thread (broker_group/write_path.py ``LOOP_SYNC_BYTES``); with several producers their
requests meet on the one master, so this shows what that rule does when they do. Prints the
sends/s of all producers together, the ack latency (send() to its future resolved), the CPU of
the master, the slave and this process per send, and how many of the master's group commits
were made on its loop (``ordq_broker_loop_commits_total`` of ``ordq_broker_syncs_total``).
The producers share this process (and its GIL): its CPU per send is theirs together.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time

from bench._cluster import ROOT, CpuMeter, bench_cluster, summary_ms
from ordq.common import metrics
from ordq.sdk import Producer, ProducerConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--token", action="store_true", help="the producers call with a token (produce on their queues)")
    args = ap.parse_args()
    payload = b"x" * args.size
    queues = [f"sync{i}" for i in range(args.producers)]
    with bench_cluster(1) as cluster:
        for q in queues:
            cluster.store.create_queue(q, ["g1"])
        if args.token:
            from ordq.coordinator.tokens import create_token, touch

            _rec, token = create_token(cluster.store.client, ROOT, {q: ["produce"] for q in queues}, "bench_sync_many")
            touch(cluster.store.client, ROOT)
            os.environ["ORDQ_TOKEN"] = token
            time.sleep(1.0)  # the brokers' token watch (milliseconds)
        with contextlib.ExitStack() as started:
            producers = [started.enter_context(Producer(ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=q)))
                         for q in queues]
            for p in producers:  # started, and each stream open, before the clock runs
                p.send(payload).result(timeout=30)
            head = cluster.groups[0]
            meter = CpuMeter({"master": head.master.proc.pid or 0, "slave": head.slave.proc.pid or 0,
                              "bench (producers)": os.getpid()})
            url = head.master.metrics_url or ""
            series = ("ordq_broker_syncs_total", "ordq_broker_loop_commits_total")

            def commits() -> list[float]:
                samples = metrics.scrape(url) if url else []
                return [metrics.value(samples, name) or 0.0 for name in series]

            latencies: list[list[float]] = [[] for _ in producers]
            stop_at = time.monotonic() + args.seconds

            def run(p: Producer, out: list[float]) -> None:
                while time.monotonic() < stop_at:
                    t0 = time.perf_counter()
                    p.send(payload).result(timeout=30)
                    out.append(time.perf_counter() - t0)

            before = commits()
            meter.start()
            t0 = time.perf_counter()
            threads = [threading.Thread(target=run, args=(p, out)) for p, out in zip(producers, latencies, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            secs = time.perf_counter() - t0
            sends = sum(map(len, latencies))
            cpu = meter.report(sends, "send")
            syncs, on_loop = (b - a for a, b in zip(before, commits(), strict=True))
    every = [x for out in latencies for x in out]
    print(f"{args.producers} producers, synchronous, {args.seconds:g} s: {sends / secs:,.0f} sends/s in all "
          f"({', '.join(f'{len(out) / secs:,.0f}' for out in latencies)}); ack latency {summary_ms(every)}")
    print(cpu)
    print(f"master's group commits: {syncs:,.0f}, of which on its loop {on_loop:,.0f} "
          f"({on_loop / max(syncs, 1):.0%}); {syncs / max(sends, 1):.2f} per send")


if __name__ == "__main__":
    main()
