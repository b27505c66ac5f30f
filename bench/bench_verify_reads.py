"""What the outbound CRC check costs (issue 25): read a sealed segment from the master over Read
streams (the consumer's way, 4 MiB answers), with the check on and off, alternating, in one run.
Not a test: prints numbers for docs/BENCHMARKS.md ("Outbound CRC check").

    .venv/bin/python -m bench.bench_verify_reads [--messages 100000] [--size 1024] [--batch 256]
        [--passes 5] [--rounds 2]

The master is restarted between modes (``--no-verify-reads`` or not) on the same data; each
mode reads the whole segment ``--passes`` times. Reported per mode: messages/s read (wall) and
the master's CPU per batch served (user + system, /proc). The reader does not decode (its own
CRC check is not what is measured).
"""

from __future__ import annotations

import argparse
import time

from bench._cluster import QUEUE, bench_cluster, cpu_seconds
from bench.bench_broker import pipelined
from ordq.admin.groups import roll_queue
from ordq.broker_group.process import BrokerProcess
from ordq.coordinator import state as sm
from ordq.sdk.replicas import ReplicaReader
from ordq.wire.batch import parse_header
from ordq.wire.client import GrpcTransport


def restart(master: BrokerProcess, store: object, *, verify: bool, base_argv: tuple[str, ...]) -> str:
    master.stop()
    master.proc.argv = base_argv if verify else (*base_argv, "--no-verify-reads")
    master.start()
    deadline = time.monotonic() + 30
    while "master" not in store.live_members(master.gid):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise RuntimeError("master did not come back")
        time.sleep(0.05)
    assert master.address is not None
    return master.address


def read_all(transport: GrpcTransport, address: str, end: int, passes: int) -> tuple[float, int, int]:
    """(seconds, messages, batches) for ``passes`` reads of segment 0 from offset 0 to ``end``."""
    messages = batches = 0
    t0 = time.perf_counter()
    for _ in range(passes):
        reader = transport.reader()
        offset = 0
        try:
            while offset < end:
                res = reader.fetch(address, QUEUE, 0, offset, max_bytes=4 << 20, max_wait_ms=0, known_end=end)
                if not res.batches:
                    raise RuntimeError(f"no batches at offset {offset} of {end}")
                last = parse_header(res.batches[-1], verify_crc=False)
                messages += last.end_offset - offset
                batches += len(res.batches)
                offset = last.end_offset
        finally:
            reader.close()
    return time.perf_counter() - t0, messages, batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="on/off pairs")
    args = ap.parse_args()
    with bench_cluster(1) as cluster:
        cluster.store.apply(QUEUE, lambda st, _f: sm.bump_epoch(st))
        transport = GrpcTransport(credentials=cluster.credentials, rpc_timeout_s=30)
        master = cluster.groups[0].master
        assert master.address is not None
        pipelined(transport, master.address, messages=args.messages, batch=args.batch, inflight=32, size=args.size)
        with ReplicaReader(cluster.store) as reader:
            roll_queue(cluster.store, reader, QUEUE)  # segment 0 sealed: what is checked on the way out
        end = cluster.store.load_state(QUEUE)[0].consume[0].end
        assert end is not None and end == args.messages, end
        base_argv = master.proc.argv
        results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for _ in range(args.rounds):
            for mode in ("on", "off"):
                address = restart(master, cluster.store, verify=mode == "on", base_argv=base_argv)
                transport.close()
                transport = GrpcTransport(credentials=cluster.credentials, rpc_timeout_s=30)
                read_all(transport, address, end, 1)  # warm: page cache, channel
                assert master.proc.pid is not None
                cpu0 = cpu_seconds(master.proc.pid)
                secs, msgs, batches = read_all(transport, address, end, args.passes)
                cpu = cpu_seconds(master.proc.pid) - cpu0
                rate, per_batch = msgs / secs, cpu / batches * 1e6
                results[mode].append((rate, per_batch))
                print(f"verify {mode:3}: {rate:,.0f} msgs/s ({msgs * args.size / secs / 1e6:,.0f} MB/s), "
                      f"master CPU {per_batch:,.0f} µs per batch of {args.batch} ({batches} batches, {secs:.1f} s)",
                      flush=True)
        transport.close()
        for mode, rows in results.items():
            rates = ", ".join(f"{r:,.0f}" for r, _ in rows)
            cpus = ", ".join(f"{c:,.0f}" for _, c in rows)
            print(f"summary verify {mode}: msgs/s {rates}; master µs/batch {cpus}")


if __name__ == "__main__":
    main()
