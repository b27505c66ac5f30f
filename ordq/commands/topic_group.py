"""Consumer groups from the shell: ``ordq consume --topic T --group G`` (one member) and
``ordq topic group T G`` (members, which partitions each owns, lag per partition).

Under ``topic``, not ``ordq group``: ``ordq group`` names the *broker* groups (a master and a
slave that store segments); a consumer group is a subscription shared over a topic's partitions,
so it is shown where the topic is."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from ordq.commands import add_command, admin_call_if_known, open_store, wants_json
from ordq.common.errors import ConfigError
from ordq.output import emit_json, table


def register(topic_subparsers: Any) -> None:
    """``ordq topic group T G``: called by the ``topic`` command's ``register``."""
    p = add_command(topic_subparsers, "group", func=cmd_describe, reads=True,
                    help="a consumer group of a topic: its members, the partitions each owns, lag per partition")
    p.add_argument("topic")
    p.add_argument("group", help="the consumer group (the subscription name on every partition)")


def cmd_describe(args: argparse.Namespace) -> int:
    doc = admin_call_if_known(args, "topic group", topic=args.topic, group=args.group)
    if doc is None:  # a hand-deployed cluster whose coordinators this machine does not know
        from ordq.admin import ReplicaReader
        from ordq.admin.consumer_groups import describe_consumer_group

        with open_store(args) as store, ReplicaReader(store) as reader:
            doc = describe_consumer_group(store, reader, args.topic, args.group)
    if wants_json(args):
        emit_json(doc)
        return 0
    members = doc["members"]
    print(f"topic {doc['topic']}, group {doc['group']}: {doc['partitions']} partitions, {len(members)} member(s) "
          f"in generation {doc['generation']}, "
          f"lag {doc['lag']}{'' if doc['lag_known'] else ' (some unknown)'}")
    if members:
        table([{"member": m, "lease": i.get("lease_generation"), "owns": _plist(i["owns"]),
                "assigned": _plist(i["assigned"])} for m, i in members.items()],
              ["member", "lease", "owns", "assigned"])
    table([{**r, "lag": "?" if r["lag"] is None else r["lag"]} for r in doc["rows"]],
          ["partition", "queue", "owner", "assigned", "seg", "last_seq", "lag"])
    return 0


def _plist(ps: list[int]) -> str:
    return ",".join(map(str, ps)) or "-"


def check_member_args(args: argparse.Namespace) -> None:
    if args.queue is not None:
        raise ConfigError("give a queue or --topic, not both")
    if args.group is None:
        raise ConfigError("--topic needs --group (the consumer group this process joins)")
    if args.count is not None:
        raise ConfigError("--count is for one queue; a group member runs until --idle-exit or Ctrl-C")


def consume_group(args: argparse.Namespace, interrupt: Any) -> int:
    """One member of group ``--group`` on ``--topic``: prints ``partition<TAB>seq<TAB>payload``
    per message (partitions in parallel, each in order) until Ctrl-C/SIGTERM or ``--idle-exit``;
    on the way out every partition commits what was printed and is released."""
    from ordq.bootstrap import check_queue, cluster_options, topic_partitions
    from ordq.coordinator.topics import partition_queue
    from ordq.sdk import GroupConfig, GroupMember

    check_member_args(args)
    partitions = topic_partitions(args, args.topic)  # TopicNotFound; the coordinators answer
    for p in {0, partitions - 1}:
        check_queue(args, partition_queue(args.topic, p))  # a token with no role there: one line now
    cfg = GroupConfig(**cluster_options(args), topic=args.topic, group=args.group, start=args.start,
                      audit_dir=args.audit_dir, connect_timeout_s=args.zk_timeout,
                      workers_per_partition=args.workers or 1,
                      **({"member_id": args.member} if args.member else {}))
    lock = threading.Lock()
    count = [0, time.monotonic()]
    out = sys.stdout.buffer

    def handler(partition: int, m: Any) -> None:
        with lock:
            if not args.quiet and not args.json:
                out.write(b"%d\t%d\t" % (partition, m.seq) + m.payload + b"\n")
                out.flush()
            count[0] += 1
            count[1] = time.monotonic()

    stop = interrupt.stop

    def watch_idle() -> None:
        while not stop.wait(0.1):
            if not member.assignment():
                count[1] = time.monotonic()  # idle counts once it delivers from a partition
            elif time.monotonic() - count[1] > args.idle_exit:
                stop.set()

    member = GroupMember(cfg)
    with member:
        print(f"joined group {args.group} of {args.topic} as member {cfg.member_id}", file=sys.stderr, flush=True)
        if args.idle_exit is not None:
            threading.Thread(target=watch_idle, daemon=True).start()
        member.run(handler, stop=stop)
    st = member.statistics()
    summary = {"topic": args.topic, "group": args.group, "member": cfg.member_id, "delivered": count[0],
               "by_partition": {str(p): n for p, n in sorted(st.delivered.items())}, "rebalances": st.rebalances,
               "takeovers": st.takeovers, "deposed": st.deposed, "rejoins": st.rejoins, "generation": st.generation}
    if args.json:
        emit_json(summary)
    else:
        print(f"delivered {count[0]} messages from {args.topic}/{args.group} as member {cfg.member_id}",
              file=sys.stderr)
        print_partitions(summary["by_partition"], out=sys.stderr)
    return 0


def print_partitions(by_partition: dict[str, int], *, out: Any) -> None:
    """The messages a member delivered, a row per partition (issue 42: it was a Python dict)."""
    table([{"partition": p, "delivered": n} for p, n in sorted(by_partition.items(), key=lambda kv: int(kv[0]))],
          ["partition", "delivered"], out=out)
