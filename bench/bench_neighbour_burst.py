"""What one token opening many streams at once costs a neighbour queue's acks, and how much of it is
the machine's: the noisy-neighbour drill's window start, alone, repeated and paired. Not a test:
prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_neighbour_burst [--bursts 20] [--rate 2000] [--kinds streams]

A neighbour queue on group g1 is written at --rate msgs/s with tokens on. Every --period s a
hand-made client (the drill's abuser, ordq/drills/neighbour.py, in a process of its own, its
connections made before each burst) starts a window of abuse (--kinds; by default its 24 unread
Read streams and 10 unwritten produce streams, opened at once) for --hold s, then closes it.
The bursts alternate between a queue on the neighbour's own broker (``same``: g1's master) and
one on another group's (``other``: g2's), so both kinds share the same minutes of the machine.

It reports the neighbour's ack latency (send() to its future resolved) over three spans of each
burst: the second before it (quiet), its first 250 ms, and the rest of its hold. What the
``other`` bursts cost the neighbour is the machine's (the abuser's client and another broker on
the same cores), not its broker's. On one 2-core box (docs/BENCHMARKS.md, stop 76) they cost
it more than ``same`` ones: alone on g2's broker, the abuser's token is neither paced nor cut
(a token alone may take a broker whole), so that broker takes the shared cores, while g1's,
with the neighbour's token active there, holds it to the read rate and 256 KiB answers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

import attrs

from bench._cluster import ROOT, bench_cluster, percentile
from ordq.coordinator.tokens import create_token, touch
from ordq.drills import neighbour
from ordq.sdk import Producer, ProducerConfig

NEIGHBOUR = "neighbour"
FIRST_S = 0.25  # a burst's start: the span the drill's slowest abused acks fell in (stop 76)
QUIET_S = 1.0  # the span before a burst taken as its quiet baseline
FILL = 2_000  # 1,000-byte messages in each abused queue: what its Read streams have to read


def fill(hosts: str, queue: str, count: int) -> None:
    with Producer(ProducerConfig(zk_hosts=hosts, root=ROOT, queue=queue, send_timeout_s=10.0)) as producer:
        for _ in range(count):
            producer.send(b"f" * 1000)
        producer.flush(timeout_s=60)


class Neighbour:
    """The neighbour queue's producer at a steady rate in a thread; each ack's (sent at, ms)."""

    def __init__(self, hosts: str, rate: float) -> None:
        self.acks: list[tuple[float, float]] = []
        self._rate = rate
        self._stop = threading.Event()
        self._producer = Producer(ProducerConfig(zk_hosts=hosts, root=ROOT, queue=NEIGHBOUR))
        self._thread = threading.Thread(target=self._run, name="neighbour", daemon=True)

    def start(self) -> None:
        self._producer.start()
        self._thread.start()

    def _run(self) -> None:
        t0, i, payload = time.monotonic(), 0, b"n" * 1000
        while not self._stop.is_set():
            i += 1
            time.sleep(max(0.0, t0 + i / self._rate - time.monotonic()))
            self._producer.send(payload).add_done_callback(self._acked_since(time.monotonic()))

    def _acked_since(self, sent: float) -> Callable[[object], None]:
        def acked(_future: object) -> None:
            self.acks.append((sent, (time.monotonic() - sent) * 1000))

        return acked

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(timeout_s=60)
        self._producer.close()


def span_line(name: str, acks: list[tuple[float, float]], spans: list[tuple[float, float]]) -> str:
    ms = [v for at, v in acks if any(a <= at < b for a, b in spans)]
    if not ms:
        return f"{name}: no acks"
    return (f"{name}: {len(ms)} acks, p50 {statistics.median(ms):.2f} ms, p99 {percentile(ms, 99):.2f} ms, "
            f"max {max(ms):.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bursts", type=int, default=20, help="bursts in all, alternating same and other (default 20)")
    ap.add_argument("--rate", type=float, default=2000.0, help="the neighbour's msgs/s (default 2000)")
    ap.add_argument("--period", type=float, default=3.0, help="s from one burst's start to the next (default 3)")
    ap.add_argument("--hold", type=float, default=1.5, help="s each burst's calls are held open (default 1.5)")
    ap.add_argument("--kinds", default="streams",
                    help=f"the abuse of each burst, of {', '.join(neighbour.ABUSE_KINDS)} (default streams)")
    args = ap.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in neighbour.ABUSE_KINDS]
    if unknown or not kinds:
        ap.error(f"--kinds: unknown {unknown}; known: {', '.join(neighbour.ABUSE_KINDS)}")
    if args.period - args.hold < QUIET_S + FIRST_S:
        ap.error(f"--period must leave {QUIET_S + FIRST_S:g} s between bursts after --hold")
    with bench_cluster(groups=2) as cluster:
        targets = {"same": "g1", "other": "g2"}
        cluster.store.create_queue(NEIGHBOUR, ["g1"])
        for target, gid in targets.items():
            cluster.store.create_queue(f"abused-{target}", [gid])
        _rec, token = create_token(cluster.store.client, ROOT, {NEIGHBOUR: ["produce"]}, "bench: the neighbour")
        abuse = {f"abused-{t}": ["produce", "consume"] for t in targets}
        _rec, abuse_token = create_token(cluster.store.client, ROOT, abuse, "bench: the abuser")
        touch(cluster.store.client, ROOT)
        os.environ["ORDQ_TOKEN"] = abuse_token  # this process's producers (ordq.common.security): the fills
        abusers = {}
        for target, gid in targets.items():
            fill(cluster.hosts, f"abused-{target}", FILL)
            state = cluster.store.wait_state(f"abused-{target}", lambda s: s.open_segment is not None, timeout_s=30)
            assert state.open_segment is not None
            address = cluster.store.live_members(gid)["master"].address
            creds = attrs.evolve(cluster.credentials, token=abuse_token)
            abusers[target] = neighbour.abuser_process(address, creds, f"abused-{target}", state.open_segment.seg,
                                                       idle=False, kinds=kinds)
        os.environ["ORDQ_TOKEN"] = token  # then the neighbour's
        n = Neighbour(cluster.hosts, args.rate)
        n.start()
        starts: dict[str, list[float]] = {t: [] for t in targets}
        try:
            time.sleep(2.0)
            for i in range(args.bursts):
                target = list(targets)[i % len(targets)]
                time.sleep(args.period - args.hold)
                starts[target].append(time.monotonic())
                abusers[target].go()
                time.sleep(args.hold)
                abusers[target].pause()
                print(f"burst {i + 1}/{args.bursts} ({target}) done", flush=True)
        finally:
            for a in abusers.values():
                a.close()
            n.stop()
    print(f"neighbour at {args.rate:g} msgs/s on g1; each burst: {'+'.join(kinds)} for {args.hold:g} s, "
          f"every {args.period:g} s")
    for target, gid in targets.items():
        s = starts[target]
        print(f"{target} ({gid}'s master), {len(s)} bursts:")
        print("  " + span_line("quiet, the second before", n.acks, [(t - QUIET_S, t) for t in s]))
        print("  " + span_line(f"first {FIRST_S * 1000:g} ms", n.acks, [(t, t + FIRST_S) for t in s]))
        print("  " + span_line("rest of the hold", n.acks, [(t + FIRST_S, t + args.hold) for t in s]))


if __name__ == "__main__":
    main()
