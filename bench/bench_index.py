"""The key and time index (issue 41): disk overhead, seal-time cost, lookup latency.

Usage: .venv/bin/python -m bench.bench_index [--messages 10000000] [--segments 40] [--payload 100]
                                             [--keys 1000000] [--batch 256] [--lookups 300]
                                             [--dir DIR] [--keep] [--json]

The segments are written directly with the log-writing code (``SegmentLog.append``/``sync``,
as bench/bench_log.py does), not through the network: a queue of ``--messages`` in
``--segments`` sealed segments of one replica. Message *i* has key ``order-<i mod keys>``
(so each key has messages/keys matches spread over the queue) and timestamp
``T0 + i * 100 us``. Then, with the broker's own code (broker_group/finder.py on real
``Segment`` objects; no gRPC and no coordinator hop, which add one call each):

- **seal-time cost**: ``Finder.index_of(segment, at_seal=True)``, what a seal triggers: read
  the whole log, build the index, write ``index.oqx``. Per segment, median and max.
- **disk overhead**: index bytes / segment.log bytes.
- **lookups**: ``Finder.find`` over all segments, as the Find RPC runs it: by key (random
  keys, limit 100: every match read back from the log and its key compared), and by time
  (random T: one block scanned). p50/p99 over ``--lookups`` each, with the indexes in memory
  (``warm``) and with a cache too small to hold them (``cold``: every segment's file read and
  CRC-checked at each lookup, what a broker does once the indexes outgrow its cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.finder import Finder
from ordq.broker_group.log import SegmentLog, segment_dir
from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.seg_index import INDEX_FILE
from ordq.broker_group.shared import Segment, Shared
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import Message, encode_batch, stamp_offset

QUEUE = "bench-index"
T0_US = 1_790_000_000_000_000
STEP_US = 100


def generate(data: Path, *, messages: int, segments: int, batch: int, payload: int, keys: int) -> float:
    """Write the segments; seconds taken."""
    started = time.perf_counter()
    body = os.urandom(payload)
    per_seg = messages // segments
    i = 0
    for seg in range(segments):
        folder = segment_dir(data, QUEUE, seg)
        folder.mkdir(parents=True, exist_ok=True)
        with SegmentLog.open(data, QUEUE, seg, create=True) as lg:
            end = i + per_seg if seg < segments - 1 else messages
            while i < end:
                n = min(batch, end - i)
                ms = [Message(payload=body, key=b"order-%d" % ((i + k) % keys), timestamp_us=T0_US + (i + k) * STEP_US)
                      for k in range(n)]
                lg.append(stamp_offset(encode_batch(ms, epoch=1, first_seq=i), lg.end), verify_crc=False)
                i += n
                if lg.end % (batch * 64) < batch:
                    lg.sync()
            lg.sync()
    return time.perf_counter() - started


def open_segments(shared: Shared, data: Path, segments: int) -> list[Segment]:
    out = []
    for seg in range(segments):
        lg = SegmentLog.open(data, QUEUE, seg)
        replica = SegmentReplica(QUEUE, seg, Role.MASTER)
        replica.restored(end=lg.synced_end, first_seq=lg.first_seq, last_seq=lg.last_seq)
        replica.seal()
        s = Segment(replica=replica, directory=segment_dir(data, QUEUE, seg), log=lg)
        shared.segments[s.key] = s
        out.append(s)
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--segments", type=int, default=40)
    ap.add_argument("--payload", type=int, default=100, help="payload bytes per message")
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    ap.add_argument("--batch", type=int, default=256, help="messages per batch")
    ap.add_argument("--lookups", type=int, default=300, help="lookups of each kind")
    ap.add_argument("--dir", default=None, help="where the segments are written (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep the segments (a rerun with the same --dir reuses them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ordq-bench-index-"))
    data = base / "data"
    rows: dict[str, object] = {}
    try:
        marker = data / f"{QUEUE}.generated"
        spec = f"{args.messages} {args.segments} {args.batch} {args.payload} {args.keys}"
        if marker.exists() and marker.read_text() == spec:
            rows["generate_s"] = None  # reused
        else:
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(parents=True)
            rows["generate_s"] = round(generate(data, messages=args.messages, segments=args.segments,
                                                batch=args.batch, payload=args.payload, keys=args.keys), 1)
            marker.write_text(spec)
        shared = Shared(BrokerConfig(gid="bench", role=Role.MASTER, data_dir=data, zk_hosts=""))
        segs = open_segments(shared, data, args.segments)

        # seal-time cost: build from the log and write the file, per segment
        finder = Finder(shared, cache_bytes=1 << 40)
        seal_s, seal_cpu = [], []
        for s in segs:
            (s.directory / INDEX_FILE).unlink(missing_ok=True)
            t0, c0 = time.perf_counter(), time.process_time()
            finder.index_of(s, at_seal=True)
            seal_s.append(time.perf_counter() - t0)
            seal_cpu.append(time.process_time() - c0)
        log_bytes = sum(s.log.synced_bytes for s in segs if s.log is not None)
        index_bytes = sum((s.directory / INDEX_FILE).stat().st_size for s in segs)
        per_seg_msgs = args.messages // args.segments
        rows.update({
            "messages": args.messages, "segments": args.segments, "messages_per_segment": per_seg_msgs,
            "segment_mb": round(log_bytes / args.segments / 1e6, 1),
            "index_mb": round(index_bytes / args.segments / 1e6, 2),
            "overhead_pct": round(100 * index_bytes / log_bytes, 2),
            "seal_ms_p50": round(1000 * statistics.median(seal_s), 1), "seal_ms_max": round(1000 * max(seal_s), 1),
            "seal_cpu_ms_p50": round(1000 * statistics.median(seal_cpu), 1),
            "seal_msgs_per_cpu_s": round(per_seg_msgs / statistics.median(seal_cpu)),
        })

        refs = [pb.FindSegmentRef(seg=s.key[1], known_end=s.replica.local_synced) for s in segs]
        rng = random.Random(41)
        key_reqs = [pb.FindRequest(queue=QUEUE, segments=refs, key=b"order-%d" % rng.randrange(args.keys), limit=100)
                    for _ in range(args.lookups)]
        time_reqs = [pb.FindRequest(queue=QUEUE, segments=refs,
                                    time_us=T0_US + rng.randrange(args.messages) * STEP_US + rng.randrange(STEP_US))
                     for _ in range(args.lookups)]
        expect_matches = min(100, args.messages // args.keys)
        for label, fnd in (("warm", finder), ("cold", Finder(shared, cache_bytes=0))):
            for kind, reqs in (("key", key_reqs), ("time", time_reqs)):
                took, cpu = [], []
                for req in reqs:
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = fnd.find(req)
                    took.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                    if kind == "key":
                        assert len(res.matches) >= expect_matches, (req.key, len(res.matches))
                    else:
                        assert len(res.matches) == 1
                rows[f"{kind}_{label}_ms_p50"] = round(1000 * pct(took, 50), 2)
                rows[f"{kind}_{label}_ms_p99"] = round(1000 * pct(took, 99), 2)
                rows[f"{kind}_{label}_cpu_ms_p50"] = round(1000 * pct(cpu, 50), 2)
                rows[f"{kind}_{label}_cpu_ms_p99"] = round(1000 * pct(cpu, 99), 2)
        for s in segs:
            if s.log is not None:
                s.log.close()
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"# {args.messages:,} messages in {args.segments} segments ({rows['segment_mb']} MB each), payload "
          f"{args.payload} B, {args.keys:,} keys, {args.batch} per batch; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    print(f"generated in {rows['generate_s']} s" if rows["generate_s"] is not None else "segments reused")
    print(f"index: {rows['index_mb']} MB per segment, {rows['overhead_pct']} % of the segment")
    print(f"seal-time build+write per segment: p50 {rows['seal_ms_p50']} ms (max {rows['seal_ms_max']} ms), "
          f"CPU p50 {rows['seal_cpu_ms_p50']} ms ({rows['seal_msgs_per_cpu_s']:,} msgs/CPU-s)")
    print("| lookup over all segments | p50 ms | p99 ms | CPU p50 ms | CPU p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind in ("key", "time"):
        for label in ("warm", "cold"):
            k = f"{kind}_{label}"
            print(f"| {kind}, {label} | {rows[k + '_ms_p50']} | {rows[k + '_ms_p99']} | {rows[k + '_cpu_ms_p50']} "
                  f"| {rows[k + '_cpu_ms_p99']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
