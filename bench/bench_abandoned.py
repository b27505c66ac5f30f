"""A broker's memory under abandoned streams: N produce streams that each send a batch and
then never read their acks nor close, and N fetch long-polls past the end asking for
unbounded bytes and waits, never collected. Not a test: prints the master's RSS for
docs/BENCHMARKS.md, and checks a real producer is still served meanwhile.

    .venv/bin/python -m bench.bench_abandoned [--streams 200] [--batch-bytes 65536]
"""

from __future__ import annotations

import argparse
import queue
import time
from pathlib import Path

import grpc

from bench._cluster import QUEUE, bench_cluster
from bench.bench_broker import pipelined
from ordq.common.security import channel
from ordq.coordinator import state as sm
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport
from ordq.wire.framing import GRPC_OPTIONS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--batch-bytes", type=int, default=64 << 10)
    args = ap.parse_args()
    with bench_cluster(1) as cluster:
        cluster.store.apply(QUEUE, lambda st, _f: sm.bump_epoch(st))
        master = cluster.groups[0].master
        address = cluster.store.live_members("g1")["master"].address
        pid = master.proc.pid
        assert pid is not None
        transport = GrpcTransport(credentials=cluster.credentials)
        channels: list[grpc.Channel] = []
        blockers: list[queue.SimpleQueue[pb.ProduceRequest | None]] = []
        calls: list[object] = []  # held: a dropped call object is cancelled
        try:
            pipelined(transport, address, messages=2_000, batch=100, inflight=8, size=1024)  # warm up
            before = rss_mib(pid)
            print(f"  master pid {pid}", flush=True)
            seq = 2_000
            payload = b"a" * args.batch_bytes
            t0 = time.perf_counter()
            for i in range(args.streams):
                if i % 25 == 0:
                    print(f"  {i} streams open: master RSS {rss_mib(pid):.1f} MiB, "
                          f"{len(list(Path(f'/proc/{pid}/task').iterdir()))} threads", flush=True)
                # A connection per stream, as many clients would have (one connection carries at
                # most max_streams_per_connection streams; gRPC shares one between channels unless
                # told not to).
                ch = channel(address, cluster.credentials, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
                channels.append(ch)
                stub = pb_grpc.BrokerStub(ch)
                requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
                blockers.append(requests)
                requests.put(pb.ProduceRequest(queue=QUEUE, seg=0, epoch=1, batches=[
                    encode_batch([Message(payload=payload, timestamp_us=0)], epoch=1, first_seq=seq)]))
                calls.append(stub.Produce(iter(requests.get, None)))  # the responses are never read
                seq += 1
                while transport.segment_info(address, QUEUE, 0).end < seq:  # in order: one at a time
                    time.sleep(0.002)
                # A long-poll past the end, asking for everything, never collected.
                far = pb.FetchRequest(queue=QUEUE, seg=0, offset=seq + 10**6, max_bytes=2**31 - 1,
                                      max_wait_ms=2**31 - 1, known_end=-1)
                calls.append(stub.Fetch.future(far))
            opened_s = time.perf_counter() - t0
            during = rss_mib(pid)
            secs, _ = pipelined(transport, address, messages=5_000, batch=100, inflight=8, size=1024, first_seq=seq)
            after = rss_mib(pid)
            print(f"abandoned: {args.streams} produce streams (one {args.batch_bytes} B batch each, acks never read) "
                  f"+ {args.streams} fetch long-polls, opened in {opened_s:.1f} s")
            print(f"master RSS: before {before:.1f} MiB, with them open {during:.1f} MiB "
                  f"(+{during - before:.1f} MiB), after 5000 more messages {after:.1f} MiB; "
                  f"a real producer meanwhile: 5000 msgs acked in {secs:.2f} s")
        finally:
            for requests in blockers:
                requests.put(None)
            for ch in channels:
                ch.close()
            transport.close()


if __name__ == "__main__":
    main()
