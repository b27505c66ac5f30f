"""ordq topic create|describe|list|alter|delete: keyed topics, N ordered partition queues under one
name (coordinator/topics.py; docs/CLI.md, "Topics")."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ordq.commands import add_command, admin_call, int_in, wants_json
from ordq.commands.paging import Page, add_paging, say_next
from ordq.commands.queue import SETTINGS, _asdict, _config, add_settings, settings_line, unknown
from ordq.coordinator.topic_names import HASH_NAME, MAX_PARTITIONS, REKEY_NOTE, partition_queue
from ordq.output import emit_json, table

# ``topic list`` (issue 42: 362 M instructions, queue list's 253 M) needs neither attrs nor the
# queue settings' class nor the topic's config class: the verbs that build settings import them
# (ordq/commands/queue.py's ``_config`` and ``_asdict``); tests/test_cli_quick.py pins it.


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "topic", help="create and inspect keyed topics (N ordered partitions)")
    sub = parser.add_subparsers(dest="topic_command", metavar="ACTION")
    sub.required = True
    create = add_command(
        sub, "create", func=cmd_create, admin=True, help="create a topic of N partition queues",
        description="Create a keyed topic: the queues T.p0 .. T.p<N-1>, each a full ordq queue, and the topic's "
        f"record, in one ZooKeeper write. A producer routes each message by its key ({HASH_NAME}: BLAKE2b-64 of "
        "the key modulo N), so a key's messages stay in one partition, in order. The partitions share the groups "
        "(each partition's group order rotated, so their heads spread over the groups) and the queue settings.")
    create.add_argument("topic", help="topic name, [A-Za-z0-9._-]{1,120}")
    create.add_argument("--partitions", type=int_in(1, MAX_PARTITIONS), required=True, metavar="N",
                        help=f"number of partitions, 1..{MAX_PARTITIONS}; fixed for the topic's life (see alter)")
    create.add_argument("--groups", help="comma-separated broker groups serving it (default: every registered group)")
    add_settings(create, defaults=True)
    desc = add_command(
        sub, "describe", func=cmd_describe, help="each partition: head group, send list, stored messages, "
        "last seq, subscriptions' lag",
        description="Show a topic: its partition count and hash, and per partition its queue, send head, stored "
        "messages, last readable seq (asked of the replicas: '?' when none answers) and each subscription's lag.")
    desc.add_argument("topic")
    ls = add_command(sub, "list", func=cmd_list, help="list topics with their partition count and groups")
    add_paging(ls, "topics")
    alter = add_command(
        sub, "alter", func=cmd_alter, admin=True, help="change a topic's partition count (only with --rekey)",
        description="Change the partition count of a live topic. Refused without --rekey: keys would move to "
        "other partitions, which breaks their order. With --rekey the count may only grow (shrinking would drop "
        "partitions holding messages); the new partitions get partition 0's groups and settings.")
    alter.add_argument("topic")
    alter.add_argument("--partitions", type=int_in(1, MAX_PARTITIONS), required=True, metavar="M",
                       help="the new partition count")
    alter.add_argument("--rekey", action="store_true",
                       help="route keys among M partitions from now on, accepting that a moved key's order holds "
                       "only among messages sent before, and among those sent after")
    delete = add_command(sub, "delete", func=cmd_delete, admin=True,
                         help="delete a topic: its record and every partition queue (their data on every replica)")
    delete.add_argument("topic")
    try:  # consumer groups of topics (``ordq topic group ...``), in a module of their own
        groups = importlib.import_module("ordq.commands.topic_group")
    except ModuleNotFoundError as exc:
        if exc.name != "ordq.commands.topic_group":
            raise
    else:
        groups.register(sub)


def cmd_create(args: argparse.Namespace) -> int:
    groups = [g for g in args.groups.split(",") if g] if args.groups else None
    cfg = _config(**{name: getattr(args, name) for name in SETTINGS})
    doc = admin_call(args, "topic create", topic=args.topic, partitions=args.partitions, groups=groups,
                     config=_asdict(cfg))
    if wants_json(args):
        emit_json(doc)
    else:
        heads = [st["send"][0] if st["send"] else "none yet" for st in doc["queues"].values()]
        print(f"topic {args.topic} created: {args.partitions} partitions {partition_queue(args.topic, 0)}.."
              f"{partition_queue(args.topic, args.partitions - 1)}; heads: {', '.join(heads)}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    doc = admin_call(args, "topic describe", topic=args.topic)
    if wants_json(args):
        emit_json(doc)
        return 0
    rows = doc["queues"]
    print(f"topic {args.topic}  ({doc['partitions']} partitions, hash {doc['hash']})")
    if doc["config"] is not None:
        print(f"settings: {settings_line(_config(**doc['config']))}")
    table([{**r, "stored": unknown(r["stored"]), "last_seq": unknown(r["last_seq"]),
            "subscriptions": ", ".join(f"{n} lag {unknown(s['lag'])}" for n, s in r["subscriptions"].items()) or None}
           for r in rows],
          ["partition", "queue", "head", "send", "open_segment", "stored", "last_seq", "epoch", "subscriptions"])
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    # Only the topics whose partitions the caller's token has a role on (issue 42).
    doc = admin_call(args, "topic list", prefix=args.prefix, after=args.after, limit=args.limit)
    rows, shown = doc["rows"], Page(names=doc["names"], more=doc["more"])
    if wants_json(args):
        emit_json(rows)
    elif not rows:
        print("no topics (create one: ordq topic create NAME --partitions N)" if not (args.prefix or args.after)
              else "no topics match")
    else:
        table(rows, ["topic", "partitions", "hash", "groups"])
    say_next(shown, "topics")
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    new = admin_call(args, "topic alter", topic=args.topic, partitions=args.partitions, rekey=args.rekey)
    if wants_json(args):
        emit_json({"topic": args.topic, "partitions": new["partitions"], "hash": new["hash"], "note": REKEY_NOTE})
    else:
        print(f"topic {args.topic} re-keyed to {new['partitions']} partitions")
        print(f"note: {REKEY_NOTE}", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    admin_call(args, "topic delete", topic=args.topic)
    if wants_json(args):
        emit_json({"deleted": args.topic})
    else:
        print(f"topic {args.topic} deleted")
    return 0
