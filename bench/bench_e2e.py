"""End to end through the SDK: ordered produce → consume over real broker processes, 1 KiB
messages, both replicas fsynced before every ack. Not a test: prints numbers for
docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_e2e [--messages N] [--sync-messages N] [--aio-sync-messages N]
        [--rate 2000 --rate-seconds 10] [--token [--consumer-token] | --insecure]

It first measures the floor of the stack (bench/bench_floor.py, fdatasync in the cluster's
folder) in the same run, and ends with issue 15's four figures against their goals:
synchronous sends/s against 0.8x that floor (shown beside the floor with both replicas' syncs
on one disk and the floor on the lean links), end-to-end p99 at the steady rate, CPU per
batch across all processes at that rate, pipelined produce+ack msgs/s. TLS is on every hop
(as a default cluster has it); ``--insecure`` runs plaintext brokers and clients instead, to
see what TLS costs and to stand beside peers measured without it (../shared/peers).

pipelined: one Producer sends as fast as its in-flight window allows while one Consumer (in a
separate process) reads; msgs/s counts from the first send to the last delivery.
synchronous: send one message, wait for its ack, repeat; through the Producer (the application's
thread hands each send to the producer's loop thread and waits for its ack), then, after the
steady phase, through the AsyncProducer awaited on this process's uvloop loop (the producer's
I/O runs on that loop: no hand-off between threads). A consumer process reads meanwhile, as
../shared/peers runs every system's synchronous phase (its reads cost the master a Read answer
a send: ~18 % fewer sends/s on a 2-CPU host, docs/BENCHMARKS.md stop 103); ``--sync-alone``
runs them with none, as every run before stop 103 did. Each prints the CPU per send of every
process.
A phase given 0 messages is skipped; --linger-ms / --eager-batches set the producer's batching;
--sdk-metrics turns on the producer's and the consumer's Prometheus metrics (served, not
scraped: what it costs the hot paths). Brokers always keep theirs.
latency: a steady --rate msgs/s for --rate-seconds; ack latency = send() → its future resolved
(both replicas synced); end-to-end latency = delivery time − the message's timestamp (set at
send()), both taken on this machine's clock. It also prints the CPU each process (head master
and slave, producer, consumer, ZooKeeper) spent per acked batch in that phase: on two shared
cores that cost, not the disk, sets how many batches per second the system turns over.

--freeze-gc: the producer (this process) and the consumer child call
``ordq.sdk.freeze_startup_objects()`` once started, as an application may choose to (docs/SDK.md):
their full garbage collections then skip what start-up made. Off by default.

--stages [EVERY]: stage stamps on (ordq/common/stages.py) in every process, and after the steady
phase where its batches' time went: each stage's arrival since the batch opened in ``send()``,
for all batches and for the tail (the batches at or past the p99), each hop's p50/p99 (send →
the master's receipt → the slave's sync → the master's ack → the producer's ack; the slave's
answer → at the master → its Read answer → the consumer's receipt → its hand-out to the
application), the group commits' write+fdatasync, and
each process's garbage-collection pauses. Alone, ``--stages`` stamps every batch, which costs
CPU itself (a write per stage): run it apart from the figures above (``--messages 0
--sync-messages 0 --stages``). ``--stages 64`` stamps one batch in 64 (picked by its first
seq, the same in every process: a few a second at the steady rate), cheap enough to leave on
beside the figures; the hops are then those of the picked batches' first messages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import bench_floor
from bench._cluster import (
    QUEUE,
    ROOT,
    BenchCluster,
    CpuMeter,
    bench_cluster,
    host_line,
    percentile,
    send_at_rate,
    summary_ms,
)
from ordq.common import metrics, stages
from ordq.common.loop import new_loop
from ordq.common.proc import announce, dying_with_parent
from ordq.sdk import (
    AsyncProducer,
    BatchingConfig,
    CommitConfig,
    Consumer,
    ConsumerConfig,
    Producer,
    ProducerConfig,
    freeze_startup_objects,
)


def consume_main(hosts: str, sub: str, start: str, first: int, count: int) -> None:
    """Child process: consume seqs first..first+count-1 in order, print e2e latencies and the
    finish time."""
    every = int(os.environ.get(_COMMIT_EVERY, "0"))  # --commit-every: the consumer's commit policy
    commit = CommitConfig(every_messages=every, every_ms=every * 1000.0) if every else CommitConfig()
    cfg = ConsumerConfig(zk_hosts=hosts, root=ROOT, queue=QUEUE, subscription=sub, fetch_wait_ms=50, start=start,
                         metrics_listen="127.0.0.1:0" if os.environ.get(_SDK_METRICS) else None, commit=commit)
    lat: list[float] = []
    nxt = first
    with Consumer(cfg) as c:
        if os.environ.get(_FREEZE_GC):
            freeze_startup_objects()
        announce("READY")
        while nxt < first + count:
            for m in c.poll():
                if m.seq != nxt:
                    raise SystemExit(f"out of order: expected {nxt}, got {m.seq}")
                nxt += 1
                lat.append(time.time() - m.timestamp_us / 1e6)
    print(json.dumps({"done": time.time(), "latencies": lat[:: max(1, len(lat) // 20000)]}), flush=True)


_SDK_METRICS = "ORDQ_BENCH_SDK_METRICS"  # set: the consumer child serves its metrics too
_COMMIT_EVERY = "ORDQ_BENCH_COMMIT_EVERY"  # set: the consumer child commits every N messages (or N s)
_FREEZE_GC = "ORDQ_BENCH_FREEZE_GC"  # set: the consumer child freezes its start-up objects (--freeze-gc)


def start_consumer(hosts: str, sub: str, count: int, *, first: int = 0, start: str = "earliest",
                   token: str | None = None) -> subprocess.Popen[str]:
    """The consumer child; with ``token``, it calls with that token instead of this process's."""
    env = os.environ | {"ORDQ_TOKEN": token} if token is not None else None
    # dying with this process: a bench stopped by an error or a timeout left it reading (and
    # holding the pipe of whoever ran the bench) for ever
    p = subprocess.Popen(dying_with_parent([sys.executable, "-m", "bench.bench_e2e", "--consume", hosts, sub, start,
                                            str(first), str(count)]), stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "READY":
        raise RuntimeError("consumer did not start")
    return p


def cpu_meter(cluster: BenchCluster, consumer: subprocess.Popen[str] | None) -> CpuMeter:
    """Started: the CPU of the head group's processes, this producer, the consumer (if one
    reads), the coordinator (the consumer's commits and every lease renewal go through it) and
    ZooKeeper."""
    head = cluster.groups[0]
    pids = {"master": head.master.proc.pid or 0, "slave": head.slave.proc.pid or 0, "producer": os.getpid()}
    if consumer is not None:
        pids["consumer"] = consumer.pid
    meter = CpuMeter(pids | {"coordinator": cluster.coordinator.pid or 0,
                             "zookeeper": cluster.zk.status()[0].pid or 0})
    meter.start()
    return meter


# The head group's stream writes, by kind (issue 39: each costs its loop a write): (process, series)
STREAM_WRITES = (("master", "ordq_broker_produce_answers_total", "produce answers"),
                 ("master", "ordq_broker_fetch_requests_total", "Read answers"),
                 ("master", "ordq_broker_replication_requests_total", "replication requests"),
                 ("slave", "ordq_broker_replication_answers_total", "slave answers"),
                 ("slave", "ordq_broker_replication_answered_requests_total", "requests they answered"),
                 # where the master's group commits ran (write_path.py): on its loop (a lone small
                 # request) or on its sync thread, and how many were slow (loop_sync.py backs off)
                 ("master", "ordq_broker_syncs_total", "master commits"),
                 ("master", "ordq_broker_loop_commits_total", "of them on its loop"),
                 ("master", "ordq_broker_slow_syncs_total", "slow ones"),
                 # request-time charges (request_time.py): each costs the master's loop a few µs
                 ("master", "ordq_broker_request_time_charges_total", "master request-time charges"),
                 # what tokens waited for (budget.ReadPace, request_time.py): only while another
                 # tenant's token is active, so none when one application holds both tokens
                 ("master", "ordq_broker_read_paced_total", "Read answers paced"),
                 ("master", "ordq_broker_request_time_throttled_total", "steps held for request time"))


class WriteMeter:
    """The head group's stream writes between ``start()`` and ``report(batches)``, per batch
    (from the brokers' /metrics; a series the brokers do not serve counts 0)."""

    def __init__(self, cluster: BenchCluster) -> None:
        head = cluster.groups[0]
        self.urls = {"master": head.master.metrics_url, "slave": head.slave.metrics_url}
        self._t0: list[float] = []

    def _now(self) -> list[float]:
        samples = {role: metrics.scrape(url) if url else [] for role, url in self.urls.items()}
        return [metrics.value(samples[role], name) or 0.0 for role, name, _ in STREAM_WRITES]

    def start(self) -> None:
        self._t0 = self._now()

    def report(self, batches: int) -> str:
        spent = [b - a for a, b in zip(self._t0, self._now(), strict=True)]
        parts = ", ".join(f"{what} {n / max(batches, 1):.2f}" for (_, _, what), n in zip(STREAM_WRITES, spent,
                                                                                           strict=True))
        return f"stream writes per batch ({batches} batches): {parts}"


def finish(p: subprocess.Popen[str]) -> dict[str, object]:
    out, _ = p.communicate(timeout=600)
    return dict(json.loads(out.strip().splitlines()[-1]))


# Issue 15's goals: (figure, goal, met?, how it is shown); NaN: the phase did not run.
def goals(figures: dict[str, float]) -> list[str]:
    floor = figures.get("floor_sends_per_s", math.nan)
    paired = figures.get("floor_paired_sends_per_s", math.nan)  # both replicas' syncs on this one disk
    lean = figures.get("floor_lean_sends_per_s", math.nan)  # the lean links' round trips instead of gRPC's

    def against_floors(v: float) -> str:
        if math.isnan(floor):  # --floor-round-trips 0: nothing to compare with
            return f"{v:,.0f}"
        return (f"{v:,.0f} ({v / floor:.2f}x the floor's {floor:,.0f}; {v / paired:.2f}x the floor with both "
                f"replicas' syncs on this disk, {paired:,.0f}; {v / lean:.2f}x the floor on the lean links, "
                f"{lean:,.0f})")

    def sync_row(name: str, key: str) -> tuple[str, float, str, Callable[[float], bool | None], Callable[[float], str]]:
        return (name, figures.get(key, math.nan), f">= 0.8x the floor ({0.8 * floor:,.0f})",
                lambda v: None if math.isnan(floor) else v >= 0.8 * floor, against_floors)

    rows = [
        sync_row("synchronous sends/s", "sync_sends_per_s"),
        sync_row("synchronous sends/s, asyncio", "aio_sync_sends_per_s"),
        ("end-to-end p99 at the steady rate", figures.get("e2e_p99_ms", math.nan), "<= 4 ms",
         lambda v: v <= 4.0, lambda v: f"{v:.2f} ms"),
        ("CPU per batch at the steady rate", figures.get("cpu_per_batch_us", math.nan), "<= 1,500 µs",
         lambda v: v <= 1500, lambda v: f"{v:,.0f} µs"),
        ("pipelined produce+ack", figures.get("pipelined_msgs_per_s", math.nan), ">= 110,000 msgs/s",
         lambda v: v >= 110_000, lambda v: f"{v:,.0f} msgs/s"),
    ]
    out = []
    for name, value, goal, met, shown in rows:
        if math.isnan(value):
            verdict = "not run"
        else:
            judged = met(value)
            verdict = "no floor measured" if judged is None else ("met" if judged else "NOT met")
        out.append(f"goal: {name}: {'-' if math.isnan(value) else shown(value)}; goal {goal}: {verdict}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--sync-messages", type=int, default=3_000)
    ap.add_argument("--aio-sync-messages", type=int, default=3_000,
                    help="synchronous sends through the AsyncProducer, after the steady phase")
    ap.add_argument("--aio-io-thread", action="store_true",
                    help="the AsyncProducer with a loop thread of its own (io_thread=True), to compare")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--rate-seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--linger-ms", type=float, default=None, help="BatchingConfig.linger_ms (default: the SDK's)")
    ap.add_argument("--eager-batches", type=int, default=None, help="BatchingConfig.eager_batches (default: the SDK's)")
    ap.add_argument("--sdk-metrics", action="store_true", help="producer and consumer serve Prometheus metrics")
    ap.add_argument("--floor-round-trips", type=int, default=2000, help="bench_floor's round trips (0: no floor)")
    ap.add_argument("--floor-syncs", type=int, default=500, help="bench_floor's fdatasyncs")
    ap.add_argument("--token", action="store_true",
                    help="producer and consumer call with a token (produce, consume on the queue), as an "
                    "application does: charged to its request-time share and its read rate, answers of at most "
                    "4 MiB (the cluster's certificate alone is none of these)")
    ap.add_argument("--insecure", action="store_true",
                    help="plaintext brokers and clients (``ordq broker run --insecure``): what TLS costs, and the "
                    "figures beside a peer measured without TLS (../shared/peers runs Redis, NATS and RabbitMQ so)")
    ap.add_argument("--consumer-token", action="store_true",
                    help="with --token: the consumer calls with a token of its own (consume only), as a separate "
                    "application does; its reads then count as contended beside the producer's token (paced at "
                    "the read rate, answers cut to 256 KiB: docs/SECURITY.md, Limits)")
    ap.add_argument("--sync-alone", action="store_true",
                    help="the synchronous phases with no consumer reading (before stop 103 they ran so; "
                         "../shared/peers runs every system's with one)")
    ap.add_argument("--commit-every", type=int, default=0,
                    help="the consumer commits every N messages or N seconds (default: the SDK's policy)")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="producer and consumer call ordq.sdk.freeze_startup_objects() once started, as an "
                         "application may (docs/SDK.md): full collections skip what start-up made")
    ap.add_argument("--stages", nargs="?", type=int, const=1, default=0, metavar="EVERY",
                    help="stage stamps in every process, for one batch in EVERY (default: every batch); prints "
                         "where the steady phase's batches spent their time")
    ap.add_argument("--consume", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer_token and not args.token:
        ap.error("--consumer-token needs --token")
    if args.floor_round_trips and args.floor_syncs < 1:
        ap.error("the floor is round trips and syncs: give --floor-syncs 1 or more, or --floor-round-trips 0")
    if args.insecure and args.token:
        ap.error("--insecure makes a plaintext cluster, which has no tokens (docs/SECURITY.md): give one of them")
    if args.consume:
        hosts, sub, start, first, count = args.consume
        consume_main(hosts, sub, start, int(first), int(count))
        return
    payload = b"x" * args.size
    alone = ", no consumer reading" if args.sync_alone else ""
    figures: dict[str, float] = {}
    print(host_line())
    stamps_dir = Path(tempfile.mkdtemp(prefix="ordq-e2e-stages-")) if args.stages else None
    if stamps_dir is not None:
        stages.enable(stamps_dir, every=args.stages)  # before the cluster starts: its processes inherit it
    roles: dict[int, str] = {}
    steady = range(0)  # the steady phase's seqs (its batches' stage stamps)
    consumer_token: str | None = None  # --consumer-token: the consumer's own
    with bench_cluster(2, tls=not args.insecure) as cluster:
        if args.token:
            from ordq.coordinator.tokens import create_token, touch

            _rec, token = create_token(cluster.store.client, ROOT, {QUEUE: ["produce", "consume"]}, "bench_e2e")
            touch(cluster.store.client, ROOT)
            os.environ["ORDQ_TOKEN"] = token  # the producer here and the consumer child (ordq.common.security)
            if args.consumer_token:
                _rec, consumer_token = create_token(cluster.store.client, ROOT, {QUEUE: ["consume"]},
                                                    "bench_e2e consumer")
                touch(cluster.store.client, ROOT)
            time.sleep(1.0)  # the brokers' token watch (milliseconds)
        if args.floor_round_trips:
            floor = bench_floor.measure(args.floor_round_trips, args.floor_syncs, cluster.folder)
            print("\n".join(floor.lines))
            figures["floor_sends_per_s"] = floor.sends_per_s
            figures["floor_paired_sends_per_s"] = 1 / floor.paired_seconds
            figures["floor_lean_sends_per_s"] = 1 / floor.lean_seconds
        tuned = {k: v for k, v in (("linger_ms", args.linger_ms), ("eager_batches", args.eager_batches))
                 if v is not None}
        if args.sdk_metrics:
            os.environ[_SDK_METRICS] = "1"
        if args.commit_every:
            os.environ[_COMMIT_EVERY] = str(args.commit_every)
        cfg = ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE, batching=BatchingConfig(**tuned),
                             metrics_listen="127.0.0.1:0" if args.sdk_metrics else None)
        if args.freeze_gc:
            os.environ[_FREEZE_GC] = "1"
        with Producer(cfg) as producer:
            if args.freeze_gc:
                freeze_startup_objects()
            base = 0
            if args.messages:  # pipelined
                consumer = start_consumer(cluster.hosts, "pipelined", args.messages, token=consumer_token)
                writes = WriteMeter(cluster)
                writes.start()
                batches_before = producer.statistics().batches_acked
                meter = cpu_meter(cluster, consumer)
                t0 = time.time()
                for _ in range(args.messages):
                    producer.send(payload)
                producer.flush()
                t_acked = time.time()
                cpu = meter.report(args.messages, "message (until acked)")
                res = finish(consumer)
                secs = float(res["done"]) - t0  # type: ignore[arg-type]
                acked_rate = figures["pipelined_msgs_per_s"] = args.messages / (t_acked - t0)
                print(f"pipelined: {args.messages} x {args.size} B: produce+ack {acked_rate:,.0f} msgs/s;"
                      f" end to end (first send to last delivery) {args.messages / secs:,.0f} msgs/s,"
                      f" {args.messages * args.size / secs / 1e6:.1f} MB/s")
                print(cpu)
                print(writes.report(producer.statistics().batches_acked - batches_before))
                base = args.messages
            if args.sync_messages:  # synchronous
                def sends() -> tuple[list[float], float]:
                    lat = []
                    t0 = time.perf_counter()
                    for _ in range(args.sync_messages):
                        start = time.perf_counter()
                        producer.send(payload).result()
                        lat.append(time.perf_counter() - start)
                    return lat, time.perf_counter() - t0

                lat, secs, cpu = sync_phase(cluster, "sync", base, args.sync_messages, sends,
                                            reading=not args.sync_alone, token=consumer_token)
                figures["sync_sends_per_s"] = args.sync_messages / secs
                print(f"synchronous{alone}: {args.sync_messages / secs:,.0f} sends/s; ack latency {summary_ms(lat)}")
                print(cpu)
                base += args.sync_messages
            # steady rate, end-to-end latency
            n = int(args.rate * args.rate_seconds)
            if n:
                consumer = start_consumer(cluster.hosts, "latency", n, first=base, start="latest",
                                          token=consumer_token)
                writes = WriteMeter(cluster)
                writes.start()
                batches_before = producer.statistics().batches_acked
                meter = cpu_meter(cluster, consumer)
                roles = {pid: name for name, pid in meter.pids.items()}
                steady = range(base, base + n)
                _sent, acked = send_at_rate(producer, payload, args.rate, n)
                cpu = meter.report(producer.statistics().batches_acked - batches_before, "batch")
                figures["cpu_per_batch_us"] = meter.total_us
                res = finish(consumer)
                lats = list(res["latencies"])  # type: ignore[call-overload]
                figures["e2e_p99_ms"] = percentile(lats, 99) * 1000
                batches = producer.statistics().batches_acked - batches_before
                print(f"steady {args.rate:,.0f} msgs/s for {args.rate_seconds:g} s ({batches / args.rate_seconds:,.0f} "
                      f"batches/s, {n / max(batches, 1):.1f} msgs/batch): ack latency {summary_ms(acked)}; "
                      f"end-to-end latency {summary_ms(lats)}")
                # A message's share too: one batch is in flight, so a faster cycle makes more,
                # smaller batches and the CPU per batch falls while the cores used stay level
                # (docs/BENCHMARKS.md, stop 103): per message is what compares across runs.
                print(f"{cpu}; {meter.total_s / n * 1e6:,.0f} µs a message")
                print(writes.report(batches))
                base += n
        if args.aio_sync_messages:  # synchronous again, through the asyncio API
            lat, secs, cpu = sync_phase(
                cluster, "aio-sync", base, args.aio_sync_messages,
                lambda: aio_sync_sends(cfg, payload, args.aio_sync_messages, io_thread=args.aio_io_thread),
                reading=not args.sync_alone, token=consumer_token)
            figures["aio_sync_sends_per_s"] = args.aio_sync_messages / secs
            where = "a loop thread of its own" if args.aio_io_thread else "the caller's loop"
            print(f"synchronous (asyncio, the producer's I/O on {where}){alone}: "
                  f"{args.aio_sync_messages / secs:,.0f} sends/s; ack latency {summary_ms(lat)}")
            print(cpu)
    print("\n".join(goals(figures)))
    if stamps_dir is not None:
        print("\n".join(stage_lines(stages.read_keyed(stamps_dir), steady, roles, every=args.stages)))
        shutil.rmtree(stamps_dir, ignore_errors=True)


def sync_phase(cluster: BenchCluster, sub: str, first: int, n: int, sends: Callable[[], tuple[list[float], float]],
               *, reading: bool, token: str | None) -> tuple[list[float], float, str]:
    """A synchronous phase: ``sends()`` makes ``n`` sends, each waited for, and returns (each
    ack latency, the seconds of all). With ``reading``, a consumer process reads them meanwhile
    from ``first`` on (as ../shared/peers runs every system's synchronous phase: its reads cost
    the master a Read answer a send, and the host CPU). Returns them and the CPU per send line."""
    consumer = start_consumer(cluster.hosts, sub, n, first=first, start="latest", token=token) if reading else None
    meter = cpu_meter(cluster, consumer)
    lat, secs = sends()
    cpu = meter.report(n, "send")
    if consumer is not None:
        finish(consumer)
    return lat, secs, cpu


def aio_sync_sends(cfg: ProducerConfig, payload: bytes, n: int, *, io_thread: bool = False
                   ) -> tuple[list[float], float]:
    """``n`` sends through an AsyncProducer, each awaited before the next, on a new uvloop loop
    on this thread, as an asyncio application runs it: (each ack latency, the seconds of all)."""
    async def sends() -> tuple[list[float], float]:
        async with AsyncProducer(cfg, io_thread=io_thread) as producer:
            lat = []
            t0 = time.perf_counter()
            for _ in range(n):
                start = time.perf_counter()
                await (await producer.send(payload))
                lat.append(time.perf_counter() - start)
            return lat, time.perf_counter() - t0

    loop = new_loop()
    try:
        return loop.run_until_complete(sends())
    finally:
        loop.close()


# A steady-rate batch's stages, in the order they usually come (ordq/common/stages.py)
STEADY_PATH = ("P.open", "P.take", "P.write", "M.request", "M.placed", "M.forward", "M.sync", "M.synced",
               "S.request", "S.sync", "S.synced", "S.answer", "M.ack", "M.slave_answer", "M.read", "P.acked",
               "P.resolved", "C.read", "C.poll")


# A message's way, hop by hop (issue 39's breakdown of the p99): (from, to, what happens between)
HOPS = (("P.open", "P.take", "send() → handed to the stream (behind the batch in flight)"),
        ("P.take", "M.request", "→ the master's receipt"),
        ("M.request", "S.synced", "→ the slave's write+fdatasync done"),
        ("S.synced", "M.ack", "→ the master's ack (its own sync, the slave's answer)"),
        ("M.ack", "P.acked", "→ the ack at the producer"),
        ("M.ack", "M.read", "the master's ack → its Read answer built"),
        ("S.answer", "M.slave_answer", "the slave's answer → at the master (its LAC moves)"),
        ("M.slave_answer", "M.read", "→ the master's Read answer built"),
        ("M.read", "C.read", "→ the consumer's receipt"),
        ("C.read", "C.poll", "→ its delivery to the application"),
        ("P.open", "C.poll", "end to end: send() → delivery"))


def hop_lines(stamps: list[stages.Stamp]) -> list[str]:
    """Each of ``HOPS``: p50/p99/max over the batches that passed both ends; then every
    batch's hops as one JSON line (µs, ``HOP_SAMPLES``), to pool several runs' samples."""
    # signed: the consumer's read may come before the master stamps its ack (one signal wakes both)
    pairs = [(a, b) for a, b, _ in HOPS]
    rows = {(r.start, r.end): r for r in stages.spans(stamps, pairs, signed=True)}
    w = max(len(f"{a} > {b}: {what}") for a, b, what in HOPS)
    out = [f"{'hop (µs)':<{w}} {'n':>6} {'p50':>8} {'p99':>8} {'max':>8}"]
    for a, b, what in HOPS:
        r = rows.get((a, b))
        if r is not None:
            out.append(f"{f'{a} > {b}: {what}':<{w}} {r.count:>6} {r.p50_us:>8,.0f} {r.p99_us:>8,.0f} "
                       f"{r.max_us:>8,.0f}")
    out.append(HOP_SAMPLES + json.dumps({f"{a} > {b}": [round(v) for v in stages.span_values(stamps, a, b)]
                                         for a, b in pairs}))
    return out


HOP_SAMPLES = "hop samples (µs, JSON): "


def stage_lines(stamps: list[stages.Stamp], seqs: range, roles: dict[int, str], *, every: int = 1) -> list[str]:
    """Where the batches of ``seqs`` (the steady phase's, not the asyncio sends' after it) spent
    their time, and each process's GC pauses meanwhile."""
    steady = [s for s in stamps if not s.keys or min(s.keys) in seqs or s.name.startswith("gc.")]
    t1 = max((s.ns for s in steady if s.keys), default=0)  # the last stamp of the steady batches
    which = "batches" if every <= 1 else f"batches sampled (one in {every})"
    out = [f"stages of the steady phase's {which} (µs since the batch opened in send()):",
           *stages.keyed_lines(stages.keyed_breakdown(steady, STEADY_PATH)), *hop_lines(steady)]
    for s in stages.spans(steady, [("M.sync", "M.synced"), ("S.sync", "S.synced"), ("S.request", "S.answer"),
                                   ("M.ack", "P.acked"), ("M.ack", "C.read")]):
        out.append(f"{s.start} > {s.end}: n {s.count}, p50 {s.p50_us:,.0f} µs, p99 {s.p99_us:,.0f}, "
                   f"max {s.max_us:,.0f} (mean {s.mean_us:,.0f})")
    t0 = next((s.ns for s in steady if s.name == "P.open" and s.keys), 0)  # (keys in seqs: filtered above)
    pauses = stages.gc_pauses(s for s in steady if t0 <= s.ns <= t1)
    for pid, ps in sorted(pauses.items(), key=lambda kv: -sum(kv[1])):
        ps = sorted(ps)
        out.append(f"GC pauses in {roles.get(pid, pid)} during the steady phase: {len(ps)}, "
                   f"p50 {ps[len(ps) // 2]:,.0f} µs, max {ps[-1]:,.0f}, total {sum(ps) / 1000:,.1f} ms")
    return out


if __name__ == "__main__":
    main()
