"""What a roll costs under load: a steady stream of 1 KiB messages while the open segment is
rolled every --every seconds. Not a test: prints numbers for docs/BENCHMARKS.md ("Rolling").

    .venv/bin/python -m bench.bench_roll [--rate 2000] [--seconds 20] [--every 1] [--roll-to same]

Each roll is ``ordq.admin.groups.roll_queue`` (what ``ordq queue roll`` runs): one conditional
write that seals the open segment and opens the next, then the Seal protocol on the old one.
Reported: the roll call's duration (write + seal), and the send→ack latency of messages sent in
the quarter second after a roll started against those sent at other times (the producer's stream to the old
segment ends, it resends what was in flight on the new one). 2 groups of real processes.
"""

from __future__ import annotations

import argparse
import threading
import time

from bench._cluster import QUEUE, ROOT, bench_cluster, send_at_rate, summary_ms
from ordq.admin.groups import roll_queue
from ordq.sdk import Producer, ProducerConfig
from ordq.sdk.replicas import ReplicaReader

WINDOW_S = 0.25  # a message sent this soon after a roll started counts as "near" it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2000.0, help="messages per second")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between rolls")
    ap.add_argument("--roll-to", choices=("same", "next"), default="same")
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    payload = b"x" * args.size
    with bench_cluster(2) as cluster:
        cluster.store.update_queue_config(QUEUE, roll_to=args.roll_to)
        rolls: list[tuple[float, float]] = []  # (start, duration) on perf_counter
        stop = threading.Event()

        def roller() -> None:
            with ReplicaReader(cluster.store) as reader:
                while not stop.wait(args.every):
                    t = time.perf_counter()
                    roll_queue(cluster.store, reader, QUEUE)
                    rolls.append((t, time.perf_counter() - t))

        cfg = ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE)
        with Producer(cfg) as producer:
            producer.send(payload).result()  # leader, connected: the clock starts on a warm path
            thread = threading.Thread(target=roller, name="roller", daemon=True)
            thread.start()
            sent_at, latency = send_at_rate(producer, payload, args.rate, int(args.rate * args.seconds))
            sent_acked = list(zip(sent_at, latency, strict=True))
            stop.set()
            thread.join()
            stats = producer.statistics()
            failovers = stats.failovers + stats.rolls
        near = [lat for t, lat in sent_acked if any(0 <= t - r < WINDOW_S for r, _d in rolls)]
        away = [lat for t, lat in sent_acked if not any(0 <= t - r < WINDOW_S for r, _d in rolls)]
        print(f"{len(rolls)} rolls (to {args.roll_to}) every {args.every:g} s under {args.rate:,.0f} msgs/s of "
              f"{args.size} B for {args.seconds:g} s; {len(sent_acked)} acked, producer segment changes {failovers}")
        print(f"roll call (conditional write + seal of the old segment): {summary_ms([d for _r, d in rolls])}")
        print(f"send->ack, sent within {WINDOW_S:g} s after a roll ({len(near)}): {summary_ms(near)}")
        print(f"send->ack, other times ({len(away)}): {summary_ms(away) if away else 'none'}")


if __name__ == "__main__":
    main()
