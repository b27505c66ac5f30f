"""The keyed-topic drill: a topic of ``PARTITIONS`` partitions written by a ``TopicProducer``
process and read by a consumer group whose members are ``ordq consume --topic --group``
processes, through head-master kills and members joining, leaving and hanging past their
session.

    python -m ordq.drills.keyed_topic produce --zk H --root R --topic T --total N --status FILE [...]

The story (each step at a share of the stream acked, so it falls inside the stream on a slow
machine): two members share the partitions; the head master of partition 0 is killed (-9) and
restarted once its partition failed over; a third member joins; member 1 is hung (SIGSTOP) until
its member lease expired and the others took its partitions, then resumed (its lease is lost: it
joins again); member 2 leaves (SIGTERM: it finishes, commits, releases); the head master of
partition 2 is killed. Once the stream is acked and the group's lag is 0 the members are
stopped. The verdict is the verifier's over every partition (lost, out of order, duplicates,
``concurrent_consumers``: two consumers of one partition delivering at once) and per key
(``--topic``: no key in two partitions); the drill's own checks: every message acked, every
fault had its effect.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from ordq.bootstrap import add_cluster_arguments, cluster_options
from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, announce
from ordq.drills.runner import DrillContext
from ordq.drills.workload import now_us, write_status

PARTITIONS = 4
GROUP = "drill"
KEYS = 32
TOTAL = 6000
RATE = 150.0  # msgs/s: a 40 s stream, the length of the other drills' load
SIZE = 64


def topic_of_drill(ctx: DrillContext) -> str:
    return f"{ctx.queue}-t"


# -- the producer process --------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> int:
    from ordq.sdk.topic_producer import TopicProducer, TopicProducerConfig

    cfg = TopicProducerConfig(**cluster_options(args), topic=args.topic, audit_dir=args.audit_dir,
                              send_timeout_s=args.send_timeout, lease_ttl_s=args.session_timeout,
                              producer_id=args.writer)
    acked = 0
    pending: deque[Any] = deque()
    last_status = 0.0
    with TopicProducer(cfg) as producer:
        announce("STARTED")
        start = time.monotonic()
        for i in range(args.total):
            due = start + i / args.rate
            while True:
                while pending and pending[0].done():
                    pending.popleft().result()
                    acked += 1
                now = time.monotonic()
                if now - last_status > 0.2:
                    write_status(args.status, {"state": "leading", "acked": acked, "at_us": now_us()})
                    last_status = now
                if now >= due and len(pending) < 2000:
                    break
                time.sleep(min(0.005, max(due - now, 0.001)))
            key = b"k%02d" % (i % KEYS)
            pending.append(producer.send(b"%d|%s|" % (i, key) + b"x" * SIZE, key=key))
        producer.flush(timeout_s=120)
        while pending:
            pending.popleft().result(timeout=60)
            acked += 1
    write_status(args.status, {"state": "done", "acked": acked, "at_us": now_us()})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ordq.drills.keyed_topic")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    add_cluster_arguments(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--total", type=int, required=True)
    p.add_argument("--rate", type=float, default=RATE)
    p.add_argument("--status", type=Path, required=True)
    p.add_argument("--writer", required=True)
    p.add_argument("--audit-dir", type=Path, default=None)
    p.add_argument("--send-timeout", type=float, default=1.0)
    p.add_argument("--session-timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        return produce(args)
    except OrdqError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


# -- the drill ------------------------------------------------------------------------------------


class _Run:
    def __init__(self, ctx: DrillContext) -> None:
        self.ctx = ctx
        self.topic = topic_of_drill(ctx)
        self.audit = ctx.run_dir / "audit"
        self.members: dict[str, ManagedProcess] = {}
        self.status = ctx.status_dir / "producer.status.json"
        self.producer: ManagedProcess | None = None

    def spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        c = self.ctx.cluster
        # no ZooKeeper identity for producers and consumers (issue 37): the cluster's credentials only
        proc = ManagedProcess(name, [c.python, *argv], run_dir=self.ctx.run_dir)
        proc.start()
        return proc

    def join(self, name: str) -> None:
        c = self.ctx.cluster
        proc = self.spawn(name, ["-m", "ordq.cli", "--zk", c.zk_hosts, "--root", c.root, "consume", "--topic",
                                 self.topic, "--group", GROUP, "--member", self.member_id(name), "--quiet",
                                 "--audit-dir", str(self.audit)])
        self.members[name] = proc
        proc.wait_for_line("joined group", timeout_s=60)
        self.ctx.wait(lambda: name in self.live(), timeout_s=30, what=f"member {name} in the group")
        self.ctx.event(f"member {name} joined: members {self.live()}")

    def member_id(self, name: str) -> str:
        """Member ``name``'s id in this run: unique among runs (its consumers' ids name the audit
        files, and one verification reads every run's: ``drill all --rounds 2`` gave two runs'
        ``m1-p0-1-0.tsv``, which the verifier refuses), as the producer's ``tp-<queue>``."""
        return f"{name}-{self.ctx.queue}"

    def live(self) -> list[str]:
        with self.ctx.cluster.store() as store:
            from ordq.admin.consumer_groups import group_members

            try:  # the member leases the coordinator keeps (an expired one goes once it noticed)
                ids = group_members(store, self.topic, GROUP)
                return sorted(n for n in self.members if self.member_id(n) in ids)
            except Exception:  # noqa: BLE001 - not there yet
                return []

    def acked(self) -> int:
        from ordq.drills.workload import read_status

        return int(read_status(self.status).get("acked", 0))

    def at(self, share: float) -> None:
        n = int(share * TOTAL)
        self.ctx.wait(lambda: self.acked() >= n, timeout_s=TOTAL / RATE * 4 + 60, what=f"{n} messages acked")

    def kill_head_master(self, partition: int) -> None:
        from ordq.coordinator.topics import partition_queue

        ctx, queue = self.ctx, partition_queue(self.topic, partition)
        with ctx.cluster.store() as store:
            st = store.wait_state(queue, lambda s: s.open_segment is not None, timeout_s=15)
        seg = st.open_segment
        assert seg is not None
        at = now_us()
        ctx.cluster.broker(seg.gid, "master").kill()
        ctx.fault(f"kill -9 master of {seg.gid} (head of {queue}, segment {seg.seg})", at_us=at)

        def moved() -> bool:
            with ctx.cluster.store() as store:
                now = store.load_state(queue)[0].open_segment
            return now is not None and now.seg > seg.seg

        ctx.wait(moved, timeout_s=30, what=f"{queue} to fail over past segment {seg.seg}")
        ctx.event(f"{queue} failed over")
        ctx.restart_broker(seg.gid, "master")

    def pause_member(self, name: str) -> None:
        ctx, proc = self.ctx, self.members[name]
        proc.pause()
        ctx.fault(f"SIGSTOP member {name}")
        ctx.wait(lambda: name not in self.live(), timeout_s=30, what=f"member {name}'s session to expire")
        ctx.event(f"member {name} left by its session: members {self.live()}")
        ctx.wait(lambda: self.owned_by_live(), timeout_s=60, what="the live members to own every partition")
        proc.resume()
        ctx.event(f"SIGCONT member {name}")
        ctx.wait(lambda: name in self.live(), timeout_s=30, what=f"member {name} to join again")
        ctx.event(f"member {name} joined again: members {self.live()}")

    def group(self) -> dict[str, Any]:
        from ordq.admin.consumer_groups import describe_consumer_group
        from ordq.sdk.replicas import ReplicaReader

        with self.ctx.cluster.store() as store, ReplicaReader(store) as reader:
            return describe_consumer_group(store, reader, self.topic, GROUP)

    def owned_by_live(self) -> bool:
        doc = self.group()
        return all(r["owner"] in doc["members"] for r in doc["rows"])

    def drained(self) -> bool:
        doc = self.group()
        return doc["lag_known"] and doc["lag"] == 0 and self.owned_by_live()


def keyed_topic(ctx: DrillContext) -> None:
    run = _Run(ctx)
    ctx.notes["topic"] = run.topic
    with ctx.cluster.store() as store:
        store.create_topic(run.topic, PARTITIONS)
    run.audit.mkdir(parents=True, exist_ok=True)
    (run.audit / "topics").write_text(run.topic + "\n", encoding="ascii")  # for the verifier's key checks
    ctx.event(f"topic {run.topic}: {PARTITIONS} partitions; group {GROUP}")
    try:
        run.join("m1")
        run.join("m2")
        c = ctx.cluster
        run.producer = run.spawn("producer", [
            "-m", "ordq.drills.keyed_topic", "produce", "--zk", c.zk_hosts, "--root", c.root, "--topic", run.topic,
            "--total", str(TOTAL), "--rate", str(RATE), "--status", str(run.status), "--writer", f"tp-{ctx.queue}",
            "--audit-dir", str(run.audit)])
        run.producer.wait_for_line("STARTED", timeout_s=60)
        ctx.event(f"load running: {TOTAL} keyed messages ({KEYS} keys) at {RATE:g}/s")
        run.at(0.15)
        run.kill_head_master(0)
        run.at(0.3)
        run.join("m3")
        run.at(0.45)
        run.pause_member("m1")
        run.at(0.6)
        run.members["m2"].stop(timeout_s=30)  # SIGTERM: finishes, commits, releases, leaves
        ctx.event(f"member m2 left (exit {run.members['m2'].returncode}): members {run.live()}")
        ctx.expect("member m2 left cleanly", run.members["m2"].returncode == 0)
        run.at(0.7)
        run.kill_head_master(2)
        ctx.wait(lambda: run.producer is not None and not run.producer.alive(), timeout_s=TOTAL / RATE * 4 + 90,
                 what="the producer to finish the stream")
        ctx.expect(f"the producer acked all {TOTAL} messages", run.producer.returncode == 0 and run.acked() == TOTAL)
        ctx.wait(run.drained, timeout_s=120, what="the group's lag to reach 0")
        ctx.event(f"group drained: {json.dumps({m: i['owns'] for m, i in run.group()['members'].items()})}")
    finally:
        for name, proc in run.members.items():
            if proc.alive():
                proc.stop(timeout_s=30)
                ctx.event(f"member {name} stopped (exit {proc.returncode})")
        if run.producer is not None and run.producer.alive():
            run.producer.stop(timeout_s=10)
    ctx.expect("every member exited cleanly", all(p.returncode == 0 for p in run.members.values()))


if __name__ == "__main__":
    sys.exit(main())
