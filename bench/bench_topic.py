"""Keyed topics: throughput, CPU and latency with 1, 2, 4 and 8 partitions and 1 to 4 producer
and consumer processes (issue 29).

    python -m bench.bench_topic [--configs 1x1,2x1,2x2,4x1,4x2,4x4,8x2,8x4] [--messages 30000] [--size 256]

A config ``PxN`` is a topic of P partitions written by N producer processes (``TopicProducer``,
producer j leading partitions j, j+N, ...: they split the partitions as the issue says several
producer processes do) and read by N members of one consumer group (``GroupMember``, each in its
own process). Every config runs on one throwaway cluster of two broker groups (a master and a
slave each), one ZooKeeper and one coordinator, all on this machine: the partitions' heads are
spread over the two groups. The members start first; then every producer sends its share of
``--messages`` keyed messages as fast as they are acked (pipelined). Figures: produce msgs/s
(all producers' first send to last ack), consume msgs/s (first to last delivery of the group),
MB/s of payload, CPU per message (every process of the cluster and the bench's own, over the
run, divided by the messages: the machine's cost of one message) and end-to-end latency
percentiles (message timestamp to delivery; meaningful under load only as a ceiling).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from bench._cluster import ROOT, bench_cluster, cpu_seconds, percentile
from ordq.common.proc import announce
from ordq.coordinator.topics import partition_of

DEFAULT_CONFIGS = "1x1,2x1,2x2,4x1,4x2,4x4,8x2,8x4"


def keys_for(partitions: int, mine: list[int], n: int = 64) -> list[bytes]:
    """``n`` keys routed to the partitions in ``mine`` (round robin over them)."""
    out: list[bytes] = []
    i = 0
    per = {p: [] for p in mine}  # type: dict[int, list[bytes]]
    while min(len(v) for v in per.values()) < max(1, n // len(mine)):
        k = b"key-%06d" % i
        p = partition_of(k, partitions)
        if p in per:
            per[p].append(k)
        i += 1
    for j in range(max(len(v) for v in per.values())):
        out.extend(v[j] for v in per.values() if j < len(v))
    return out


def produce_main(hosts: str, topic: str, partitions: int, mine: list[int], count: int, size: int) -> None:
    from ordq.sdk.topic_producer import TopicProducer, TopicProducerConfig

    keys = keys_for(partitions, mine)
    payload = b"x" * size
    cfg = TopicProducerConfig(zk_hosts=hosts, root=ROOT, topic=topic, partitions=mine)  # type: ignore[arg-type]
    pending: deque[Any] = deque()
    with TopicProducer(cfg) as p:
        announce("READY")
        sys.stdin.readline()  # go
        cpu0, t0 = cpu_seconds(os.getpid()), time.time()
        for i in range(count):
            pending.append(p.send(payload, key=keys[i % len(keys)]))
            while len(pending) > 4000 or (pending and pending[0].done()):
                pending.popleft().result(timeout=120)
        p.flush(timeout_s=120)
        while pending:
            pending.popleft().result(timeout=120)
        t1 = time.time()
    print(json.dumps({"start": t0, "end": t1, "cpu": cpu_seconds(os.getpid()) - cpu0}), flush=True)


def consume_main(hosts: str, topic: str, group: str, total: int) -> None:
    """A member: counts deliveries (and samples latencies) until, after the producers finished
    (a line on stdin), nothing arrived for 3 s."""
    from ordq.sdk import CommitConfig, GroupConfig, GroupMember

    lock = threading.Lock()
    lat: list[float] = []
    st = {"n": 0, "first": 0.0, "last": 0.0}

    def handler(_p: int, m: Any) -> None:
        now = time.time()
        with lock:
            if not st["n"]:
                st["first"] = now
            st["n"] += 1
            st["last"] = now
            if st["n"] % 10 == 0:
                lat.append(now - m.timestamp_us / 1e6)

    stop = threading.Event()
    member = GroupMember(GroupConfig(zk_hosts=hosts, root=ROOT, topic=topic, group=group,
                                     commit=CommitConfig(every_messages=2000, every_ms=500)))
    with member:
        cpu0 = cpu_seconds(os.getpid())
        t = threading.Thread(target=member.run, args=(handler,), kwargs={"stop": stop}, daemon=True)
        t.start()
        announce("READY")
        sys.stdin.readline()  # the producers finished
        while True:
            with lock:
                idle = time.time() - (st["last"] or time.time())
            if idle > 3.0:
                break
            time.sleep(0.2)
        stop.set()
        t.join(timeout=60)
    print(json.dumps({"n": st["n"], "first": st["first"], "last": st["last"], "lat": lat,
                      "cpu": cpu_seconds(os.getpid()) - cpu0}), flush=True)


def child(args: list[str]) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-m", "bench.bench_topic", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    if line != "READY":
        raise RuntimeError(f"child {args[:2]} did not start: {line!r}")
    return p


def run_config(cluster: Any, partitions: int, procs: int, messages: int, size: int) -> dict[str, Any]:
    topic = f"t{partitions}x{procs}"
    cluster.store.create_topic(topic, partitions)
    hosts = cluster.hosts
    members = [child(["--consume", hosts, topic, "g", str(messages)]) for _ in range(procs)]
    # the members split the partitions before the load starts
    deadline = time.monotonic() + 60
    from ordq.admin.consumer_groups import describe_consumer_group
    from ordq.sdk.replicas import ReplicaReader

    with ReplicaReader(cluster.store) as reader:
        while time.monotonic() < deadline:
            doc = describe_consumer_group(cluster.store, reader, topic, "g")
            if len(doc["members"]) == procs and all(r["owner"] for r in doc["rows"]):
                break
            time.sleep(0.2)
    share = [list(range(j, partitions, procs)) for j in range(procs)]
    producers = [child(["--produce", hosts, topic, str(partitions), ",".join(map(str, mine)),
                        str(messages // procs), str(size)]) for mine in share]
    pids = {f"broker{i}": pid for i, pid in enumerate(
        p for g in cluster.groups for p in (g.master.proc.pid, g.slave.proc.pid))}
    pids["zookeeper"] = cluster.zk.status()[0].pid or 0
    pids.update({f"p{i}": p.pid for i, p in enumerate(producers)})
    pids.update({f"c{i}": c.pid for i, c in enumerate(members)})
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items() if v}
    for p in producers:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    prod = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in producers]
    # members and brokers measured up to the producers' end plus the drain (members read on)
    results = []
    for c in members:
        assert c.stdin is not None
        c.stdin.write("done\n")
        c.stdin.flush()
    cpu1 = {k: cpu_seconds(v) for k, v in pids.items() if v and k[0] not in "pc"}
    for c in members:
        results.append(json.loads(c.communicate(timeout=600)[0].strip().splitlines()[-1]))
    sent = (messages // procs) * procs
    got = sum(r["n"] for r in results)
    p_start, p_end = min(r["start"] for r in prod), max(r["end"] for r in prod)
    c_first = min(r["first"] for r in results if r["n"])
    c_last = max(r["last"] for r in results if r["n"])
    cpu = sum(cpu1[k] - cpu0[k] for k in cpu1) + sum(r["cpu"] for r in prod) + sum(r["cpu"] for r in results)
    lat_ms = sorted(x * 1000 for r in results for x in r["lat"])
    cluster.store.delete_topic(topic)
    return {
        "partitions": partitions, "producers": procs, "consumers": procs, "messages": sent, "delivered": got,
        "produce_msgs_s": sent / (p_end - p_start), "consume_msgs_s": got / max(c_last - c_first, 1e-9),
        "produce_mb_s": sent * size / (p_end - p_start) / 1e6,
        "cpu_us_per_msg": cpu / sent * 1e6, "cpu_cores": cpu / (max(p_end, c_last) - p_start),
        "e2e_p50_ms": percentile(lat_ms, 50), "e2e_p99_ms": percentile(lat_ms, 99),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        h, t, n, mine, count, size = sys.argv[2:8]
        produce_main(h, t, int(n), [int(x) for x in mine.split(",")], int(count), int(size))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--consume":
        h, t, g, total = sys.argv[2:6]
        consume_main(h, t, g, int(total))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="PxN list: P partitions, N producers and N members")
    ap.add_argument("--messages", type=int, default=30_000, help="messages per config (split over the producers)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows = []
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    with bench_cluster(groups=2) as cluster:
        for parts, procs in configs:
            row = run_config(cluster, parts, procs, args.messages, args.size)
            rows.append(row)
            print(f"{parts} partitions, {procs} producer(s) + {procs} member(s): produce {row['produce_msgs_s']:,.0f} "
                  f"msgs/s ({row['produce_mb_s']:.1f} MB/s), consume {row['consume_msgs_s']:,.0f} msgs/s, "
                  f"CPU {row['cpu_us_per_msg']:,.0f} µs/msg ({row['cpu_cores']:.2f} cores), "
                  f"e2e p50 {row['e2e_p50_ms']:.0f} ms p99 {row['e2e_p99_ms']:.0f} ms, "
                  f"delivered {row['delivered']}/{row['messages']}", flush=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    print(f"load before {' '.join(load_before)}, after {' '.join(load_after)}; {os.cpu_count()} cores")
    if args.json:
        print(json.dumps({"rows": rows, "load_before": load_before, "load_after": load_after}))


if __name__ == "__main__":
    main()
