"""ordq queue create|list|describe|delete: queues, their send and consume lists."""

from __future__ import annotations

import argparse
from typing import Any

from coordinator.state import QueueState
from coordinator.store import DEFAULT_MAX_MESSAGE_BYTES, QueueConfig
from ordq.commands import add_command, open_store, wants_json
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "queue", help="create and inspect queues")
    sub = parser.add_subparsers(dest="queue_command", metavar="ACTION")
    sub.required = True
    create = add_command(sub, "create", help="create a queue", func=cmd_create)
    create.add_argument("queue", help="queue name, [A-Za-z0-9._-]{1,128}")
    create.add_argument(
        "--groups", help="comma-separated broker groups serving it (default: every registered group)"
    )
    create.add_argument(
        "--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest message accepted (default %(default)s)",
    )
    create.add_argument("--retention-segments", type=int, default=None,
                        help="keep at most this many sealed segments (default: all until consumed)")
    add_command(sub, "list", help="list queues with their send head and backlog", func=cmd_list)
    desc = add_command(sub, "describe", help="send list, consume list and subscriptions of a queue",
                       func=cmd_describe)
    desc.add_argument("queue")
    delete = add_command(sub, "delete", help="delete a queue's metadata (not broker data)",
                         func=cmd_delete)
    delete.add_argument("queue")


def cmd_create(args: argparse.Namespace) -> int:
    groups = [g for g in args.groups.split(",") if g] if args.groups else None
    cfg = QueueConfig(max_message_bytes=args.max_message_bytes,
                      retention_segments=args.retention_segments)
    with open_store(args) as store:
        st = store.create_queue(args.queue, groups, cfg)
    if wants_json(args):
        emit_json(st.to_dict())
    else:
        head = st.head or "none yet (no group has master and slave live)"
        print(f"queue {args.queue} created on groups {', '.join(st.groups)}; send head: {head}")
    return 0


def summary(st: QueueState, subs: list[str]) -> dict[str, Any]:
    open_seg = st.open_segment
    return {
        "queue": st.queue,
        "groups": list(st.groups),
        "send": list(st.send),
        "head": st.head,
        "open_segment": open_seg.seg if open_seg else None,
        "segments": len(st.consume),
        "epoch": st.producer_epoch,
        "subscriptions": subs,
    }


def cmd_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        rows = [summary(store.load_state(q)[0], store.list_subscriptions(q))
                for q in store.list_queues()]
    if wants_json(args):
        emit_json(rows)
    elif not rows:
        print("no queues (create one: ordq queue create NAME)")
    else:
        table(rows, ["queue", "head", "send", "open_segment", "segments", "epoch", "subscriptions"])
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        st, version = store.load_state(args.queue)
        cfg = store.queue_config(args.queue)
        cursors = {s: store.get_cursor(args.queue, s)[0] for s in store.list_subscriptions(args.queue)}
        live = {g: sorted(store.live_members(g)) for g in st.groups}
    doc = {
        **summary(st, sorted(cursors)),
        "config": {"max_message_bytes": cfg.max_message_bytes,
                   "retention_segments": cfg.retention_segments},
        "version": version,
        "consume": [s.to_dict() for s in st.consume],
        "cursors": {s: c.to_dict() for s, c in cursors.items()},
        "live": live,
        "trimmed_seq": st.trimmed_seq,
    }
    if wants_json(args):
        emit_json(doc)
        return 0
    print(f"queue {st.queue}  (producer epoch {st.producer_epoch}, "
          f"max message {cfg.max_message_bytes} B, state version {version})")
    print(f"send list: {' -> '.join(st.send) if st.send else '(empty: producers wait for a group)'}")
    print("\nconsume list:")
    if st.consume:
        table([{**s.to_dict(), "status": s.status.value} for s in st.consume],
              ["seg", "gid", "status", "end", "first_seq", "last_seq"])
    else:
        print("  (empty)")
    print("\ngroups:")
    table([{"group": g, "live": ",".join(live[g]) or "down", "in_send": g in st.send,
            "segments": [s.seg for s in st.consume if s.gid == g]} for g in st.groups],
          ["group", "live", "in_send", "segments"])
    if cursors:
        print("\nsubscriptions:")
        table([{"subscription": s, **c.to_dict()} for s, c in cursors.items()],
              ["subscription", "seg", "offset", "last_seq"])
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.delete_queue(args.queue)
    if wants_json(args):
        emit_json({"deleted": args.queue})
    else:
        print(f"queue {args.queue} deleted")
    return 0
