"""ordq group add|list|drain|undrain|remove: broker groups (a master and a slave process each)."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, admin_call, admin_call_if_known, open_store, wants_json
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "group", help="register and inspect broker groups")
    sub = parser.add_subparsers(dest="group_command", metavar="ACTION")
    sub.required = True
    add = add_command(sub, "add", help="register a broker group", func=cmd_add, admin=True)
    add.add_argument("gid", help="group id, [A-Za-z0-9._-]{1,128}")
    add_command(sub, "list", help="list groups with the liveness of master and slave", func=cmd_list, reads=True)
    drain = add_command(
        sub, "drain", func=cmd_drain, admin=True,
        help="take a group out of every send list for maintenance (and keep it out)",
        description="Mark a group drained and take it out of every queue's send list. Where it is the head "
        "this is a failover: its open segment is sealed and producers move to the next group at once. "
        "Consumers still read its segments. A drained group is never admitted again (not even by the "
        "coordinator daemon) until 'ordq group undrain'.",
    )
    drain.add_argument("gid")
    drain.add_argument("--force", action="store_true",
                       help="drain even when it leaves a queue with no group to write to (its producers wait)")
    undrain = add_command(sub, "undrain", func=cmd_undrain, admin=True,
                          help="clear a group's drain mark and admit it to the send lists it is eligible for")
    undrain.add_argument("gid")
    rm = add_command(
        sub, "remove", func=cmd_remove, admin=True,
        help="unregister a group (drained, processes stopped, no unconsumed segments)",
        description="Take a group out of every queue it serves and unregister it. Refused while its "
        "processes are live, while it is in a send list (drain it first) or while it holds segments not "
        "yet consumed by every subscription.",
    )
    rm.add_argument("gid")
    rebalance = add_command(
        sub, "rebalance", func=cmd_rebalance,
        help="move idle queues' heads towards an even spread over the live groups",
        description="Ask the elected coordinator to move the heads of idle queues (none written in the last "
        "minute) from the groups heading the most queues to those heading the fewest, each move a roll to "
        "another group of the queue's send list (the old segment is sealed, writes go on in a new one). The "
        "coordinator does this by itself, a bounded number a second, once a returning group has been live for "
        "10 s; this runs it now, for every live group that is not drained. --dry-run shows the plan only.",
    )
    rebalance.add_argument("--dry-run", action="store_true", help="show the moves, make none")
    rebalance.add_argument("--max-moves", type=int, default=1000, metavar="N",
                           help="move at most N heads (default 1000)")


def cmd_add(args: argparse.Namespace) -> int:
    with open_store(args, new_root=True) as store:  # the first group of a new cluster makes its root
        store.add_group(args.gid)
    if wants_json(args):
        emit_json({"added": args.gid})
    else:
        print(f"group {args.gid} registered; start its processes with: "
              f"ordq broker run --group {args.gid} --role master|slave ...")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = _rows_from_coordinator(args)
    if rows is None:
        rows = _rows_from_zookeeper(args)
    if wants_json(args):
        emit_json(rows)
    elif not rows:
        print("no broker groups registered (add one: ordq group add G)")
    else:
        table(rows, ["group", "master", "slave", "healthy", "drained", "disk_full", "queues", "sending"])
    return 0


def _rows_from_coordinator(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The elected coordinator's rows (``group list``, ordq/admin/api.py: one call, no ZooKeeper
    session, issue 42), or None when no coordinator is known for the cluster (a hand-deployed
    one whose coordinators this machine has not registered) or it predates the verb."""
    doc = admin_call_if_known(args, "group list")
    return None if doc is None else list(doc["rows"])


def _rows_from_zookeeper(args: argparse.Namespace) -> list[dict[str, Any]]:
    """This command's own read, through ZooKeeper, of a cluster with no coordinator known here."""
    from ordq.admin.group_list import group_rows
    from ordq.commands import readable

    with open_store(args) as store:
        may_read = readable(store)
        states = {q: store.load_state(q)[0] for q in store.list_queues() if may_read(q)}
        return group_rows(store, states, may_read)


def cmd_drain(args: argparse.Namespace) -> int:
    from ordq.admin import ReplicaReader, drain_group

    with open_store(args) as store, ReplicaReader(store) as reader:
        queues = drain_group(store, reader, args.gid, force=args.force)
    if wants_json(args):
        emit_json({"drained": args.gid, "queues": [q.to_dict() for q in queues]})
        return 0
    print(f"group {args.gid} drained: it is admitted to no send list until 'ordq group undrain {args.gid}'")
    if not queues:
        print("it was in no send list")
    for q in queues:
        head = q.new_head or "none (producers wait until a group is admitted)"
        if q.was_head:
            sealed = "sealed" if q.sealed else "sealing (no replica answered; completed later)"
            print(f"  {q.queue}: was the send head; segment {q.sealing_seg} {sealed}; new head {head}")
        else:
            print(f"  {q.queue}: taken out of the send list; head stays {head}")
    return 0


def cmd_undrain(args: argparse.Namespace) -> int:
    from ordq.admin import undrain_group

    with open_store(args) as store:
        queues = undrain_group(store, args.gid)
    if wants_json(args):
        emit_json({"undrained": args.gid, "queues": [q.to_dict() for q in queues]})
        return 0
    print(f"group {args.gid} undrained")
    for q in queues:
        print(f"  {q.queue}: " + ("in the send list" if q.admitted else f"not admitted yet: {q.why_not}"))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from ordq.admin import remove_group

    with open_store(args) as store:
        queues = remove_group(store, args.gid)
    if wants_json(args):
        emit_json({"removed": args.gid, "queues": queues})
    else:
        where = f" (taken out of queues {', '.join(queues)})" if queues else ""
        print(f"group {args.gid} removed{where}")
    return 0


def cmd_rebalance(args: argparse.Namespace) -> int:
    from ordq.common.errors import ConfigError

    if not 0 <= args.max_moves <= 1_000_000:
        raise ConfigError("--max-moves must be from 0 to 1000000")
    doc = admin_call(args, "group rebalance", max_moves=args.max_moves, dry_run=args.dry_run)
    if wants_json(args):
        emit_json(doc)
        return 0
    rows = [{"group": g, "heads before": n, "heads after": doc["after"].get(g, n)} for g, n in doc["before"].items()]
    if rows:
        table(rows, ["group", "heads before", "heads after"])
    else:
        print("no live group")
    verb = "would move" if doc["dry_run"] else "moved"
    print(f"{verb} {len(doc['moves'])} heads" + (f"; {doc['busy_skipped']} written lately left alone"
                                                  if doc["busy_skipped"] else ""))
    for m in doc["moves"][:20]:
        print(f"  {m['queue']}: {m['from']} -> {m['to']}")
    if len(doc["moves"]) > 20:
        print(f"  ... and {len(doc['moves']) - 20} more (--json lists them all)")
    if doc["left"]:
        print(f"{len(doc['left'])} not moved: written meanwhile (run again to retry)")
    return 0
