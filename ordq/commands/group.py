"""ordq group add|list|remove: broker groups (a master and a slave process each)."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, open_store, wants_json
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "group", help="register and inspect broker groups")
    sub = parser.add_subparsers(dest="group_command", metavar="ACTION")
    sub.required = True
    add = add_command(sub, "add", help="register a broker group", func=cmd_add)
    add.add_argument("gid", help="group id, [A-Za-z0-9._-]{1,128}")
    add_command(sub, "list", help="list groups with the liveness of master and slave", func=cmd_list)
    rm = add_command(sub, "remove", help="unregister a group no queue uses", func=cmd_remove)
    rm.add_argument("gid")


def cmd_add(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.add_group(args.gid)
    if wants_json(args):
        emit_json({"added": args.gid})
    else:
        print(f"group {args.gid} registered; start its processes with: "
              f"ordq broker run --group {args.gid} --role master|slave ...")
    return 0


def group_rows(store: Any) -> list[dict[str, Any]]:
    queues = {q: store.load_state(q)[0] for q in store.list_queues()}
    rows = []
    for gid in store.list_groups():
        live = store.live_members(gid)
        rows.append({
            "group": gid,
            "master": live["master"].address if "master" in live else None,
            "slave": live["slave"].address if "slave" in live else None,
            "healthy": len(live) == 2,
            "queues": sorted(q for q, st in queues.items() if gid in st.groups),
            "sending": sorted(q for q, st in queues.items() if st.head == gid),
        })
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        rows = group_rows(store)
    if wants_json(args):
        emit_json(rows)
    elif not rows:
        print("no broker groups registered (add one: ordq group add G)")
    else:
        table(rows, ["group", "master", "slave", "healthy", "queues", "sending"])
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.remove_group(args.gid)
    if wants_json(args):
        emit_json({"removed": args.gid})
    else:
        print(f"group {args.gid} removed")
    return 0
