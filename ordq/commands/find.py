"""ordq find QUEUE --key K | --time T: messages by key, or the first at or after a time (issue 41)."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, admin_call, int_in, wants_json
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    find = add_command(
        subparsers, "find", func=cmd_find,
        help="find messages by key, or the first message at or after a time, without a scan",
        description="Find the messages with a key (oldest first, at most --limit), or the first message at or "
        "after a time, from each segment's key and time index (no scan). Each match shows its seq, time, "
        "segment and offset, and which subscriptions have passed it (their committed cursor is at or past it). "
        "With --topic and --key, searches the one partition the key routes to. Exit 1 when nothing matches.",
    )
    find.add_argument("queue", nargs="?", help="the queue (or give --topic)")
    find.add_argument("--topic", help="a keyed topic: search the partition --key routes to")
    find.add_argument("--key", help="the key (text, UTF-8)")
    find.add_argument("--time", metavar="T", help="the first message at or after T: ISO 8601 "
                      "(2026-11-22T19:30:00Z), Unix seconds, or a duration ago (15m)")
    find.add_argument("--from-time", metavar="T", help="with --key: only messages at or after T")
    find.add_argument("--limit", type=int_in(1, 10_000), default=100, help="at most this many matches (default 100)")


def cmd_find(args: argparse.Namespace) -> int:
    from ordq.common.errors import ConfigError
    from ordq.sdk.find import FindResult, find_args
    from ordq.sdk.replicas import parse_time

    if args.time is not None and args.key is not None:
        raise ConfigError("find: give --key or --time, not both")
    verb_args = find_args(args.queue, topic=args.topic, key=args.key,
                          at_time=parse_time(args.time) if args.time is not None else None,
                          from_time=parse_time(args.from_time) if args.from_time is not None else None,
                          limit=args.limit)
    found = FindResult.from_dict(admin_call(args, "find topic" if args.topic else "find", **verb_args))
    if wants_json(args):
        emit_json(found.to_dict())
        return 0 if found.matches else 1
    if not found.matches:
        raise found.no_match()
    rows = [{"seq": m.seq, "time": m.timestamp, "seg": m.seg, "offset": m.offset, "group": m.gid,
             "passed_by": list(m.passed_by)} for m in found.matches]
    if args.topic:
        print(f"key routes to {found.queue}")
    table(rows, ["seq", "time", "seg", "offset", "group", "passed_by"])
    return 0
