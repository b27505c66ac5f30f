"""The streaming verify (``ordq verify --follow``) against a producer at a fixed rate: the lag it
runs at and whether it keeps up (issue 44). Not a test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_follow [--rate 20000] [--seconds 150] [--size 16] [--master local[2]] [--json]

A throwaway local cluster (bench/_cluster.py: ZooKeeper, one broker group, one coordinator,
TLS, every process killed with the bench). ``ordq verify --follow bench --json`` runs as its own
process (its Spark driver on ``--master``) and its query is started on the empty queue; once it
has checked 100 warm-up messages (its first micro-batch with rows starts Spark's Python workers,
~10-20 s here: reported apart), one producer (this process, pipelined) sends ``--size``-byte
messages at ``--rate`` msgs/s for ``--seconds`` (paced in 1 ms steps: what is due is sent),
recording when its acked end (the highest seq both replicas synced) reached each seq. Every
micro-batch the follower reports (its JSON line, timestamped on arrival here) is one lag sample:

- seqs behind: the producer's acked end at that moment minus the last seq checked;
- seconds behind: now minus the moment the producer's acked end reached the last seq checked
  (how old the checked end is);
- the follower's own figures beside: ``lag_s`` (now minus the message's producer timestamp)
  and ``lag_messages`` (the queue's readable end minus the last seq checked).

Samples during production give p50/p99/max and the trend (least-squares slope of seqs behind
over the second half of the run: a follower that keeps up has a slope near 0, one that falls
behind grows at the producer's rate minus its own). After the producer stops: how long the
follower takes to check the last seq (bounded by ``--drain``), then Ctrl-C and its verdict.
CPU seconds (and share of a core) while the producer sends, of the producer (this process), the
follower (its live process tree: the driver, its JVM, Spark's Python workers) and the brokers,
with the load average: a producer near one core is the limit, not the follower.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from bench._cluster import QUEUE, ROOT, bench_cluster, cpu_seconds, percentile
from bench.bench_verify import _tree_cpu_s
from ordq.sdk import Producer, ProducerConfig, SendFuture

PACE_S = 0.001  # the producer's step: every step sends what is due by then
ACK_EVERY = 50  # the acked end is recorded from every 50th message's ack (acks come in seq order)
WARMUP = 100  # messages the follower checks before the clock starts
STARTUP_S = 300.0  # the follower's Spark session and query start, on a busy machine


@attrs.define
class AckTimeline:
    """When the producer's acked end reached each seq: (time, seq) points, both rising."""

    times: list[float] = attrs.field(factory=list)
    seqs: list[int] = attrs.field(factory=list)

    def record(self, t: float, seq: int) -> None:
        """An ack of ``seq`` seen at ``t``; acks out of order (or repeated) move nothing back."""
        if self.seqs and seq <= self.seqs[-1]:
            return
        if self.times and t < self.times[-1]:
            t = self.times[-1]
        self.times.append(t)
        self.seqs.append(seq)

    def end_at(self, t: float) -> int:
        """The acked end at time ``t`` (0 before the first ack)."""
        i = bisect.bisect_right(self.times, t)
        return self.seqs[i - 1] if i else 0

    def reached(self, seq: int) -> float | None:
        """The first time the acked end was at or past ``seq`` (None: not yet)."""
        i = bisect.bisect_left(self.seqs, seq)
        return self.times[i] if i < len(self.seqs) else None


@attrs.frozen
class Sample:
    t: float  # when the follower's line arrived (this process's perf_counter)
    checked: int  # the last seq checked
    behind_seqs: int
    behind_s: float
    own_lag_s: float | None  # the follower's lag_s
    own_lag_messages: int | None


def samples(lines: Sequence[tuple[float, dict[str, Any]]], acked: AckTimeline, t0: float, t1: float) -> list[Sample]:
    """The lag samples of the follower's batch lines that arrived in [t0, t1]."""
    out = []
    for t, d in lines:
        if d.get("event") != "batch" or d.get("last_seq") is None or not t0 <= t <= t1:
            continue
        checked = int(d["last_seq"])
        reached = acked.reached(checked)
        behind_s = 0.0 if reached is None else max(0.0, t - reached)  # None: checked before its ack came back
        out.append(Sample(t=t, checked=checked, behind_seqs=max(0, acked.end_at(t) - checked), behind_s=behind_s,
                          own_lag_s=d.get("lag_s"), own_lag_messages=d.get("lag_messages")))
    return out


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 with fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def keeps_up(taken: Sequence[Sample], rate: float, tolerance: float = 0.02) -> tuple[bool, float]:
    """Whether the lag stays bounded: the slope of seqs behind over the second half of the
    samples (msgs/s the follower loses) is at most ``tolerance`` of the producer's rate."""
    half = list(taken[len(taken) // 2:])
    growth = slope([(s.t, float(s.behind_seqs)) for s in half])
    return growth <= tolerance * rate, growth


def distribution(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values)}


def due(start: float, now: float, rate: float, sent: int, total: int) -> int:
    """How many messages are due by ``now`` at ``rate`` from ``start``, beyond ``sent``."""
    return max(0, min(total, int((now - start) * rate) + 1) - sent)


def produce(producer: Producer, payload: bytes, rate: float, seconds: float, acked: AckTimeline) -> tuple[int, float]:
    """Send at ``rate`` for ``seconds``, then wait for every ack; returns (messages, seconds from
    the first send to the last ack)."""
    total = int(rate * seconds)
    lock = threading.Lock()

    def on_ack(f: SendFuture) -> None:
        if f.exception() is not None:  # a failed send: flush() below raises it
            return
        seq = f.result().seq
        with lock:
            acked.record(time.perf_counter(), seq)

    start = time.perf_counter()
    sent = 0
    while sent < total:
        for _ in range(due(start, time.perf_counter(), rate, sent, total)):
            future = producer.send(payload)
            sent += 1
            if sent % ACK_EVERY == 0 or sent == total:
                future.add_done_callback(on_ack)
        pause = start + (sent / rate) - time.perf_counter()
        if pause > 0:
            time.sleep(min(pause, PACE_S))
    producer.flush(timeout_s=120)
    return total, time.perf_counter() - start


def read_lines(stream: IO[str], into: list[tuple[float, dict[str, Any]]], raw: list[str]) -> None:
    for line in stream:
        raw.append(line)
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            into.append((time.perf_counter(), d))


def wait_for(lines: list[tuple[float, dict[str, Any]]], pred: Any, deadline_s: float,
             proc: subprocess.Popen[str]) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if any(pred(d) for _, d in list(lines)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=20_000.0, help="messages per second (default 20000)")
    ap.add_argument("--seconds", type=float, default=150.0, help="how long the producer sends (default 150)")
    ap.add_argument("--size", type=int, default=16, help="payload bytes (default 16)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--trigger", default="1s", help="the follower's micro-batch interval (default 1s)")
    ap.add_argument("--drain", type=float, default=120.0, help="at most this long to check the last seq after")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--record", type=Path, default=None, metavar="FILE",
                    help="write the raw samples here (the follower's lines with their arrival times, the acks)")
    args = ap.parse_args(argv)

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    with bench_cluster(1) as cluster:
        follower_argv = [sys.executable, "-m", "ordq.cli", "--zk", cluster.hosts, "--root", ROOT, "verify",
                         "--follow", QUEUE, "--master", args.master, "--trigger", args.trigger, "--json"]
        t_spark = time.monotonic()
        follower = subprocess.Popen(follower_argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        lines: list[tuple[float, dict[str, Any]]] = []
        raw: list[str] = []
        reader = threading.Thread(target=read_lines, args=(follower.stdout, lines, raw), daemon=True)
        reader.start()
        try:
            if not wait_for(lines, lambda d: d.get("event") == "started", STARTUP_S, follower):
                print(f"the follower did not start in {STARTUP_S:.0f} s: {''.join(raw)[-2000:]}", file=sys.stderr)
                return 1
            say(f"follower ({args.master}) started in {time.monotonic() - t_spark:.1f} s; "
                f"load {os.getloadavg()[0]:.1f}")
            acked = AckTimeline()
            cfg = ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE)
            with Producer(cfg) as producer:
                # Warm-up: the follower's first micro-batch with rows starts Spark's Python workers
                # (~10-20 s here); the lag measured is the one it runs at after that.
                t_warm = time.monotonic()
                warm = [producer.send(b"x" * args.size) for _ in range(WARMUP)]
                producer.flush(timeout_s=60)
                acked.record(time.perf_counter(), warm[-1].result().seq)
                warm_seq = warm[-1].result().seq
                if not wait_for(lines, lambda d: (d.get("last_seq") or 0) >= warm_seq, STARTUP_S, follower):
                    print(f"the follower did not check the warm-up messages in {STARTUP_S:.0f} s: "
                          f"{''.join(raw)[-2000:]}", file=sys.stderr)
                    return 1
                warm_s = time.monotonic() - t_warm
                say(f"warm-up: {WARMUP} messages checked {warm_s:.1f} s after the first send")
                brokers = [m.proc.pid or 0 for g in cluster.groups for m in g.members]

                def cpu() -> tuple[float, float, float]:  # the producer (this process), the follower, the brokers
                    return time.process_time(), _tree_cpu_s(follower.pid), sum(cpu_seconds(p) for p in brokers)

                cpu0 = cpu()
                load0 = os.getloadavg()
                t0 = time.perf_counter()
                messages, took = produce(producer, b"x" * args.size, args.rate, args.seconds, acked)
                t1 = time.perf_counter()
                cpu1 = cpu()
            if not acked.seqs:
                raise RuntimeError("no ack was recorded: the bench's ack timeline is broken")
            last = acked.seqs[-1]
            drained = wait_for(lines, lambda d: (d.get("last_seq") or 0) >= last, args.drain, follower)
            t2 = time.perf_counter()
            load1 = os.getloadavg()
            follower.send_signal(signal.SIGINT)  # the verdict
            try:
                follower.wait(timeout=120)
            except subprocess.TimeoutExpired:
                follower.kill()
            reader.join(timeout=10)
        finally:
            if follower.poll() is None:
                os.killpg(follower.pid, signal.SIGKILL)
                follower.wait()
    taken = samples(lines, acked, t0, t1)
    if args.record is not None:
        args.record.write_text(json.dumps({"t0": t0, "t1": t1, "t2": t2, "lines": lines,
                                           "acked": list(zip(acked.times, acked.seqs, strict=True))}))
    bounded, growth = keeps_up(taken, args.rate)
    verdict: dict[str, Any] = next((d for _, d in reversed(lines) if d.get("event") == "verdict"), {})
    result = {
        "rate_asked": args.rate, "messages": messages, "produced_per_s": round(messages / (t1 - t0), 1),
        "send_to_last_ack_s": round(took, 1), "warmup_s": round(warm_s, 1),
        "size": args.size, "master": args.master, "samples": len(taken),
        "behind_seqs": {k: v if v != v else round(v) for k, v in  # NaN (no sample) stays NaN
                        distribution([float(s.behind_seqs) for s in taken]).items()},
        "behind_s": {k: round(v, 2) for k, v in distribution([s.behind_s for s in taken]).items()},
        "own_lag_s": {k: round(v, 2) for k, v in
                      distribution([s.own_lag_s for s in taken if s.own_lag_s is not None]).items()},
        "lag_growth_per_s": round(growth, 1), "keeps_up": bounded,
        "drained": drained, "drain_s": round(t2 - t1, 1) if drained else None,
        "verdict": verdict.get("verdict"), "rows_checked": verdict.get("rows"),
        # while the producer sent (t0..t1): CPU seconds and the share of one core
        "cpu_s": {name: round(cpu1[i] - cpu0[i], 1) for i, name in enumerate(("producer", "follower", "brokers"))},
        "cores": {name: round((cpu1[i] - cpu0[i]) / (t1 - t0), 2)
                  for i, name in enumerate(("producer", "follower", "brokers"))},
        "load": [round(load0[0], 1), round(load1[0], 1)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        say(f"producer: {messages:,} messages of {args.size} B asked at {args.rate:,.0f}/s: "
            f"{result['produced_per_s']:,.0f} msgs/s sent (last ack {took:.1f} s after the first send)")
        say(f"lag over {len(taken)} micro-batches: seqs behind the acked end p50 {result['behind_seqs']['p50']:,} "
            f"p99 {result['behind_seqs']['p99']:,} max {result['behind_seqs']['max']:,}; seconds behind "
            f"p50 {result['behind_s']['p50']} p99 {result['behind_s']['p99']} max {result['behind_s']['max']} "
            f"(the follower's own lag_s p50 {result['own_lag_s']['p50']} max {result['own_lag_s']['max']})")
        say(f"trend: {'keeps up' if bounded else 'falls behind'} (seqs behind grow {growth:,.1f}/s over the second "
            f"half); last seq checked {result['drain_s']} s after the last ack" if drained else
            f"trend: {'keeps up' if bounded else 'falls behind'} (seqs behind grow {growth:,.1f}/s over the second "
            f"half); the last seq NOT checked within {args.drain:.0f} s after the last ack")
        say(f"verdict {result['verdict']}, {result['rows_checked']} rows checked; CPU s while sending (cores): "
            + ", ".join(f"{k} {v} ({result['cores'][k]})" for k, v in result["cpu_s"].items())
            + f"; load {result['load'][0]} -> {result['load'][1]}")
    return 0 if result["verdict"] == "clean" and drained else 1


if __name__ == "__main__":
    sys.exit(main())
