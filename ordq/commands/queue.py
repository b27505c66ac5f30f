"""ordq queue create|list|describe|roll|delete: queues, their send and consume lists."""

from __future__ import annotations

import argparse
from typing import Any

from coordinator.state import QueueState
from coordinator.store import DEFAULT_MAX_MESSAGE_BYTES, QueueConfig
from ordq.commands import MAX_PAYLOAD_BYTES, add_command, int_in, open_store, wants_json
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
        "--max-message-bytes", type=int_in(1, MAX_PAYLOAD_BYTES), default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest message accepted (default %(default)s)",
    )
    create.add_argument("--retention-segments", type=int_in(1, 10**6), default=None,
                        help="keep at most this many sealed segments (default: all until consumed)")
    add_command(sub, "list", help="list queues with their send head, stored messages and last seq",
                func=cmd_list)
    desc = add_command(
        sub, "describe", func=cmd_describe,
        help="send list, consume list with segments, per-group backlog, subscriptions and their lag",
        description="Show a queue: its send list, its consume list (each segment's group, status, readable "
        "messages and seq range; open and sealing segments are asked of their replicas, '?' when none "
        "answers), the backlog each group holds, and each subscription's cursor, lag and holder.")
    desc.add_argument("queue")
    roll = add_command(
        sub, "roll", func=cmd_roll, help="seal the open segment and continue on a new one on the same head",
        description="Seal the queue's open segment and open the next one on the same send head, in one "
        "conditional write; then seal the old one on its replicas. Producers continue on the new segment with "
        "the next seq (what was in flight is resent; consumers drop duplicates by seq). Once every "
        "subscription has read the old segment it can be popped and its disk freed.")
    roll.add_argument("queue")
    delete = add_command(sub, "delete", help="delete a queue: its metadata, and its data on every replica",
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


def cmd_roll(args: argparse.Namespace) -> int:
    from ordq.admin.groups import roll_queue
    from ordq.admin.read import ReplicaReader

    with open_store(args) as store, ReplicaReader(store) as reader:
        rolled = roll_queue(store, reader, args.queue)
    if wants_json(args):
        emit_json(rolled.to_dict())
    else:
        state = "sealed" if rolled.sealed else "sealing (completed later: no replica answered)"
        print(f"queue {rolled.queue}: segment {rolled.sealing_seg} {state}; segment {rolled.new_seg} open on "
              f"{rolled.head}")
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


def unknown(value: Any) -> Any:
    """None read from a broker means 'no replica answered': show '?' (a table shows None as '-')."""
    return "?" if value is None else value


def cmd_list(args: argparse.Namespace) -> int:
    from ordq.admin import ReplicaReader, describe_queue

    with open_store(args) as store, ReplicaReader(store) as reader:
        views = [describe_queue(store, reader, q) for q in store.list_queues()]
    rows = [{**summary(v.state, [s.name for s in v.subscriptions]), "last_seq": v.last_seq, "stored": v.stored}
            for v in views]
    if wants_json(args):
        emit_json(rows)
    elif not rows:
        print("no queues (create one: ordq queue create NAME)")
    else:
        table([{**r, "last_seq": unknown(r["last_seq"]), "stored": unknown(r["stored"])} for r in rows],
              ["queue", "head", "send", "open_segment", "segments", "stored", "last_seq", "epoch", "subscriptions"])
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from ordq.admin import ReplicaReader, describe_queue

    with open_store(args) as store, ReplicaReader(store) as reader:
        view = describe_queue(store, reader, args.queue)
    if wants_json(args):
        emit_json(view.to_dict())
        return 0
    st, cfg = view.state, view.config
    retention = f"keep {cfg.retention_segments} sealed segments" if cfg.retention_segments else "keep until consumed"
    print(f"queue {st.queue}  (producer epoch {st.producer_epoch}, max message {cfg.max_message_bytes} B, "
          f"{retention}, state version {view.version})")
    print(f"send list: {' -> '.join(st.send) if st.send else '(empty: producers wait for a group)'}")
    print(f"last readable seq: {unknown(view.last_seq)}   stored messages: {unknown(view.stored)}")
    print("\nconsume list:")
    if view.extents:
        rows = []
        for e in view.extents:
            d = {**e.to_dict(), "bytes": unknown(view.sizes.get(e.seg))}
            if e.end is None:  # no replica answered: the seq range is unknown, not empty
                d.update(messages="?", first_seq="?", last_seq="?", read_from="(no replica answered)")
            rows.append(d)
        table(rows, ["seg", "gid", "status", "messages", "bytes", "first_seq", "last_seq", "read_from"])
    else:
        print("(empty)")
    print("\ngroups:")
    table([{**g, "live": ",".join(g["live"]) or "down", "backlog": unknown(g["backlog"]), "bytes": unknown(g["bytes"])}
           for g in view.group_rows()],
          ["group", "live", "drained", "in_send", "segments", "backlog", "bytes"])
    print("\nsubscriptions:")
    if view.subscriptions:
        table([{**s.to_dict(), "lag": unknown(s.lag)} for s in view.subscriptions],
              ["subscription", "seg", "offset", "last_seq", "lag", "held_by"])
    else:
        print("(none)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.delete_queue(args.queue)
    if wants_json(args):
        emit_json({"deleted": args.queue})
    else:
        print(f"queue {args.queue} deleted")
    return 0
