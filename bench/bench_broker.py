"""Broker group throughput and ack latency: one produce stream into one group of real master
and slave processes, fsync on, 1 KiB messages. Not a test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_broker [--messages N] [--batch 256] [--inflight 32] [--sync-messages N]
        [--tls on|off|both]

pipelined: batches of --batch messages, up to --inflight batches unacked on one stream; the
ack latency is per batch (send → ack). synchronous: one message per batch, the next sent only
after the previous was acked (both replicas synced). --tls both runs everything twice, over
mutual TLS (the default of every cluster) and over plaintext (--insecure): what TLS costs.
"""

from __future__ import annotations

import argparse
import time
from collections import deque

from bench._cluster import QUEUE, bench_cluster, summary_ms
from ordq.coordinator import state as sm
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport


def pipelined(transport: GrpcTransport, address: str, *, messages: int, batch: int, inflight: int,
              size: int, first_seq: int = 0) -> tuple[float, list[float]]:
    stream = transport.open_produce(address, QUEUE, 0, 1)
    acks = stream.acks()
    payload = b"x" * size
    sent_at: deque[float] = deque()
    latencies: list[float] = []
    seq = first_seq
    end = first_seq + messages
    t0 = time.perf_counter()
    try:
        while seq < end or sent_at:
            while seq < end and len(sent_at) < inflight:
                n = min(batch, end - seq)
                msgs = [Message(payload=payload, timestamp_us=0)] * n
                stream.send([encode_batch(msgs, epoch=1, first_seq=seq)])
                sent_at.append(time.perf_counter())
                seq += n
            ack = next(acks)
            now = time.perf_counter()
            # One ack may cover several batches (the broker merges contiguous ones).
            covered = max(1, -(-ack.count // batch))
            for _ in range(min(covered, len(sent_at))):
                latencies.append(now - sent_at.popleft())
    finally:
        stream.close()
    return time.perf_counter() - t0, latencies


def synchronous(transport: GrpcTransport, address: str, *, messages: int, size: int, first_seq: int
                ) -> tuple[float, list[float]]:
    stream = transport.open_produce(address, QUEUE, 0, 1)
    acks = stream.acks()
    payload = b"x" * size
    latencies = []
    t0 = time.perf_counter()
    try:
        for seq in range(first_seq, first_seq + messages):
            start = time.perf_counter()
            stream.send([encode_batch([Message(payload=payload, timestamp_us=0)], epoch=1, first_seq=seq)])
            next(acks)
            latencies.append(time.perf_counter() - start)
    finally:
        stream.close()
    return time.perf_counter() - t0, latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--sync-messages", type=int, default=5_000)
    ap.add_argument("--tls", choices=["on", "off", "both"], default="on",
                    help="mutual TLS between client and brokers (off: --insecure brokers; both: one run each, "
                    "what TLS costs; default %(default)s)")
    args = ap.parse_args()
    for tls in {"on": [True], "off": [False], "both": [True, False]}[args.tls]:
        measure(args, tls=tls)


def measure(args: argparse.Namespace, *, tls: bool) -> None:
    label = "tls" if tls else "plaintext"
    with bench_cluster(1, tls=tls) as cluster:
        address = cluster.store.live_members("g1")["master"].address
        # The raw streams write with epoch 1: have ZooKeeper issue it (brokers refuse any other).
        cluster.store.apply(QUEUE, lambda st, _f: sm.bump_epoch(st))
        transport = GrpcTransport(credentials=cluster.credentials)
        try:
            pipelined(transport, address, messages=20_000, batch=args.batch, inflight=args.inflight, size=args.size)
            secs, lat = pipelined(transport, address, messages=args.messages, batch=args.batch,
                                  inflight=args.inflight, size=args.size, first_seq=20_000)
            rate = args.messages / secs
            print(f"{label} pipelined: {args.messages} x {args.size} B in {secs:.2f} s: {rate:,.0f} msgs/s, "
                  f"{rate * args.size / 1e6:.1f} MB/s; batch ack latency {summary_ms(lat)}")
            first = 20_000 + args.messages
            secs, lat = synchronous(transport, address, messages=args.sync_messages, size=args.size, first_seq=first)
            print(f"{label} synchronous: {args.sync_messages} in {secs:.2f} s: {args.sync_messages / secs:,.0f} "
                  f"sends/s; latency {summary_ms(lat)}")
        finally:
            transport.close()


if __name__ == "__main__":
    main()
