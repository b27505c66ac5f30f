"""Mirror cost: throughput of ``ordq mirror run`` catching up a backlog, and end-to-end lag
(produced on A -> delivered from B's copy) at a steady rate. Not a test: prints numbers for
docs/BENCHMARKS.md ("Mirror to another cluster").

    .venv/bin/python -m bench.bench_mirror [--backlog 20000] [--rate 2000] [--seconds 20] [--size 100]
        [--cut 60 [--after 60]]

Two throwaway clusters on this machine (``bench._cluster``: a ZooKeeper, one broker group of
two processes and a coordinator each, TLS on), the mirror as one ``ordq mirror run`` process.
Throughput: ``--backlog`` messages stored on A before the mirror starts; from its ``LEADING``
line to the last copy a consumer of B delivers. Lag: a producer on A at ``--rate`` for
``--seconds`` while the mirror runs; for each copy, B's consumer's delivery time minus the
source message's timestamp (the producer's send time on A, carried in the copy's chain), on
this machine's clock. Link cut (``--cut S``, root: iptables): after the steady phase, the
producer goes on at ``--rate`` for ``--cut`` + ``--after`` seconds while every packet the mirror
sends to B is dropped for the first ``--cut`` seconds (``ordq.drills.cdc_mirror.LinkCut``: the
mirror runs under a group id of its own); catch-up time = from the heal to the first copy B
delivers with an end-to-end lag back under 1 s (the backlog drained while traffic goes on).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time

from bench._cluster import QUEUE, ROOT, BenchCluster, bench_cluster, cpu_seconds, percentile
from ordq.common.proc import ManagedProcess
from ordq.drills.cdc_mirror import LinkCut, published_ports
from ordq.mirror.chain import parse_chain
from ordq.sdk import BatchingConfig, Consumer, ConsumerConfig, Producer, ProducerConfig


def end(c: BenchCluster) -> str:
    return f"{c.hosts}{ROOT}/{QUEUE}"


def produce(c: BenchCluster, n: int, size: int, rate: float | None) -> None:
    cfg = ProducerConfig(zk_hosts=c.hosts, root=ROOT, queue=QUEUE, batching=BatchingConfig(linger_ms=2.0))
    with Producer(cfg) as p:
        start = time.perf_counter()
        for i in range(n):
            if rate:
                pause = start + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            p.send(i.to_bytes(8, "big") * (size // 8 + 1))
        p.flush(120)


def read_copies(c: BenchCluster, n: int, sub: str, timeout_s: float) -> list[tuple[float, int]]:
    """(delivery time, source timestamp µs) of the first ``n`` copies on B."""
    out: list[tuple[float, int]] = []
    cfg = ConsumerConfig(zk_hosts=c.hosts, root=ROOT, queue=QUEUE, subscription=sub, fetch_wait_ms=50)
    deadline = time.monotonic() + timeout_s
    with Consumer(cfg) as consumer:
        while len(out) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(out)} of {n} copies in {timeout_s}s")
            batch = consumer.poll(0.1)
            now = time.time()
            out.extend((now, parse_chain(m.headers)[-1].ts_us) for m in batch)
    return out[:n]


def cut_and_catch_up(a: BenchCluster, b: BenchCluster, link: LinkCut, args: argparse.Namespace) -> dict[str, object]:
    """The link cut for ``args.cut`` s under a steady stream, then healed: how long B takes to
    be back within 1 s of A."""
    m = int(args.rate * (args.cut + args.after))
    got: list[list[tuple[float, int]]] = []
    reader = threading.Thread(target=lambda: got.append(read_copies(b, m, "bench-lag", 900)))
    reader.start()  # the steady phase's subscription: it resumes after what it read
    link.cut(published_ports(b.store))
    cut_at = time.time()
    producer = threading.Thread(target=produce, args=(a, m, args.size, args.rate))
    producer.start()
    time.sleep(args.cut)  # the cut lasts its time
    healed_at = time.time()
    link.heal()
    producer.join(args.cut + args.after + 600)
    reader.join(900)
    copies = got[0]
    during = sum(1 for t, _ in copies if t < healed_at)
    lags = [(t, (t - ts / 1e6) * 1000) for t, ts in copies if t >= healed_at]
    back = next((t for t, lag in lags if lag < 1000), None)
    produced_by_heal = sum(1 for _, ts in copies if ts / 1e6 < healed_at)
    settled = [lag for t, lag in lags if back is not None and t >= back]
    out: dict[str, object] = {"cut_s": round(healed_at - cut_at, 1), "backlog_at_heal": produced_by_heal - during,
                              "copied_during_cut": during,
                              "catch_up_s": None if back is None else round(back - healed_at, 2),
                              "lag_after_p50_ms": round(percentile(settled, 50), 1) if settled else None}
    print(f"link cut {healed_at - cut_at:.1f}s at {args.rate:,.0f} msgs/s: {during} copies during the cut, backlog "
          f"{produced_by_heal - during:,} at the heal; B back within 1 s of A "
          + (f"{back - healed_at:.1f}s after the heal" if back is not None else "never in this run")
          + f" (the stream went on {args.after:g}s after the heal)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=2_000.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--max-batch", type=int, default=2000, help="the mirror's --max-batch")
    ap.add_argument("--cut", type=float, default=0.0, help="seconds of a link cut after the steady phase (0: none)")
    ap.add_argument("--after", type=float, default=60.0, help="seconds the producer goes on after the heal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(bench_cluster(1))
        b = stack.enter_context(bench_cluster(1))
        produce(a, args.backlog, args.size, None)
        link = LinkCut(gid=random.SystemRandom().randrange(40_000, 60_000))
        stack.callback(link.heal)
        prefix = ["setpriv", f"--regid={link.gid}", "--clear-groups", "--"] if args.cut else []
        mirror = ManagedProcess("mirror", [*prefix, sys.executable, "-m", "ordq.cli", "mirror", "run", "--from",
                                           end(a), "--to", end(b), "--max-batch", str(args.max_batch)],
                                 run_dir=a.folder / "mirror")
        mirror.start()
        stack.callback(mirror.kill)
        mirror.wait_for_line("LEADING", timeout_s=60)
        started = time.time()
        cpu0 = cpu_seconds(mirror.pid or 0)
        copies = read_copies(b, args.backlog, "bench-catch-up", 600)
        seconds = copies[-1][0] - started
        cpu = cpu_seconds(mirror.pid or 0) - cpu0
        result["catch_up"] = {"messages": args.backlog, "seconds": round(seconds, 2),
                              "msgs_per_s": round(args.backlog / seconds), "mirror_cpu_s": round(cpu, 2)}
        print(f"catch-up: {args.backlog} messages of {args.size} B in {seconds:.2f}s = "
              f"{args.backlog / seconds:,.0f} msgs/s (mirror CPU {cpu:.2f}s, "
              f"{cpu / args.backlog * 1e6:.0f} µs/msg)")
        n = int(args.rate * args.seconds)
        got: list[list[tuple[float, int]]] = []
        reader = threading.Thread(target=lambda: got.append(read_copies(b, args.backlog + n, "bench-lag", 600)))
        reader.start()
        cpu0 = cpu_seconds(mirror.pid or 0)
        produce(a, n, args.size, args.rate)
        reader.join(600)
        cpu = cpu_seconds(mirror.pid or 0) - cpu0
        lags = [(t - ts / 1e6) * 1000 for t, ts in got[0][args.backlog:]]
        result["steady"] = {"rate": args.rate, "messages": n, "p50_ms": round(percentile(lags, 50), 1),
                            "p99_ms": round(percentile(lags, 99), 1), "max_ms": round(max(lags), 1),
                            "mirror_cpu_per_s": round(cpu / args.seconds, 3)}
        print(f"steady {args.rate:,.0f} msgs/s for {args.seconds:g}s: end-to-end lag A produce -> B deliver "
              f"p50 {percentile(lags, 50):.1f} ms, p99 {percentile(lags, 99):.1f} ms, max {max(lags):.1f} ms "
              f"(mirror CPU {cpu / args.seconds:.2f} s/s)")
        if args.cut:
            result["cut"] = cut_and_catch_up(a, b, link, args)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
