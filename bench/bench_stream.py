"""The Spark streaming source (ordq/spark_source.py) against a plain ``Consumer``, reading the
same stored queue on the same box. Not a test: prints numbers for docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench_stream [--messages 300000] [--size 100] [--master local[2]]

fill: one Producer writes --messages messages of --size bytes to one broker group (not timed).
consumer: one Consumer (subscription "bench", from earliest) polls until it delivered them all;
rows/s from its start to the last delivery.
spark: one streaming query (``trigger(availableNow=True)``, ``noop`` sink) reads them all; rows/s
from ``start()`` to its end (query planning included, the SparkSession start excluded), and the
same over the micro-batches' own ``triggerExecution`` time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench._cluster import QUEUE, ROOT, BenchCluster, bench_cluster
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig


def fill(cluster: BenchCluster, messages: int, size: int) -> None:
    payload = b"x" * size
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE)) as producer:
        for i in range(messages):
            producer.send(payload, key=b"k%d" % (i % 16), headers=(("h", b"v"),))
        producer.flush(timeout_s=300)


def consume(cluster: BenchCluster, messages: int) -> float:
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=ROOT, queue=QUEUE, subscription="bench")
    t0 = time.perf_counter()
    got = 0
    with Consumer(cfg) as consumer:
        while got < messages:
            got += len(consumer.poll(1.0))
    return messages / (time.perf_counter() - t0)


def stream(cluster: BenchCluster, messages: int, master: str) -> tuple[float, float, int]:
    from ordq.spark_order_check._session import make_session
    from ordq.spark_source import register

    spark = make_session(master, app_name="ordq-bench-stream", conf={"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        with tempfile.TemporaryDirectory(prefix="ordq-bench-ckpt-") as ckpt:
            df = spark.readStream.format("ordq").option("zk", cluster.hosts).option("root", ROOT) \
                .option("queue", QUEUE).load()
            t0 = time.perf_counter()
            query = df.writeStream.format("noop").option("checkpointLocation", str(Path(ckpt) / "c")) \
                .trigger(availableNow=True).start()
            query.awaitTermination()
            wall = time.perf_counter() - t0
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            progress = query.recentProgress
            rows = sum(p["numInputRows"] for p in progress)
            busy_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress if p["numInputRows"])
            if rows != messages:
                raise RuntimeError(f"the query read {rows} rows, not {messages}")
            return rows / wall, rows / (busy_ms / 1000.0), len(progress)
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    with bench_cluster(1) as cluster:
        t0 = time.perf_counter()
        fill(cluster, args.messages, args.size)
        print(f"fill: {args.messages:,} messages of {args.size} B in {time.perf_counter() - t0:.1f} s", flush=True)
        rate = consume(cluster, args.messages)
        print(f"consumer: {rate:,.0f} rows/s", flush=True)
        wall_rate, busy_rate, batches = stream(cluster, args.messages, args.master)
        print(f"spark source ({args.master}): {wall_rate:,.0f} rows/s from start() to the end "
              f"({busy_rate:,.0f} rows/s over {batches} micro-batch(es)' triggerExecution)", flush=True)


if __name__ == "__main__":
    main()
