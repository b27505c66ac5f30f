"""ordq context list|use|show|add|remove: named clusters and the current one (ordq/contexts.py)."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, wants_json
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    ctx = subparsers.add_parser(
        "context", help="named clusters and the current one, which every client command uses",
        description="A context names a cluster (its ZooKeeper and root, or its coordinators); the current one "
        "is what every client and admin command uses when no --zk, --root, --bootstrap (or ORDQ_ZK, ORDQ_ROOT, "
        "ORDQ_BOOTSTRAP) says otherwise. `ordq up` adds its cluster and selects it. --context NAME (env "
        "ORDQ_CONTEXT) picks another for one command.")
    sub = ctx.add_subparsers(dest="context_command", metavar="COMMAND")
    sub.required = True
    add_command(sub, "list", func=cmd_list, help="every context; * marks the current one")
    use = add_command(sub, "use", func=cmd_use, help="make a context the current one")
    use.add_argument("name")
    show = add_command(sub, "show", func=cmd_show, help="the current context (or NAME)")
    show.add_argument("name", nargs="?", default=None)
    add = add_command(sub, "add", func=cmd_add, help="add (or replace) a context",
                      description="Add (or replace) the context NAME: the cluster the options name. "
                      "--zk and --root name a cluster `ordq up` or `ordq cert register` registered; --bootstrap "
                      "gives its coordinators' addresses.")
    add.add_argument("name")
    add.add_argument("--use", action="store_true", help="make it the current context too")
    remove = add_command(sub, "remove", func=cmd_remove, help="remove a context")
    remove.add_argument("name")


def _row(context: Any, current: str | None) -> dict[str, Any]:
    return {"current": "*" if context.name == current else "", "name": context.name, "zk": context.zk or "-",
            "root": context.root, "bootstrap": context.bootstrap or "-"}


def cmd_list(args: argparse.Namespace) -> int:
    from ordq.contexts import contexts_path, load

    found = load()
    rows = [_row(c, found.current) for _, c in sorted(found.contexts.items())]
    if wants_json(args):
        emit_json({"current": found.current, "contexts": [{k: v for k, v in r.items() if k != "current"}
                                                           for r in rows]})
    elif not rows:
        print(f"no contexts in {contexts_path()} (ordq up adds one; ordq context add NAME --zk HOST:PORT adds one)")
    else:
        table(rows, ["current", "name", "zk", "root", "bootstrap"])
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    from ordq.contexts import use

    context = use(args.name)
    if wants_json(args):
        emit_json({"current": context.name, **context.to_dict()})
    else:
        print(f"current context: {context.name} ({_where(context)})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ordq.common.errors import ConfigError
    from ordq.contexts import load

    found = load()
    name = args.name or found.current
    if name is None:
        raise ConfigError("no current context (ordq context use NAME selects one; ordq context list lists them)")
    context = found.get(name)
    if wants_json(args):
        emit_json({"name": context.name, "current": context.name == found.current, **context.to_dict()})
    else:
        print(f"{context.name}{' (current)' if context.name == found.current else ''}: {_where(context)}")
    return 0


def _where(context: Any) -> str:
    named = f"ZooKeeper {context.zk}, root {context.root}" if context.zk else ""
    boot = f"coordinators {context.bootstrap}" if context.bootstrap else ""
    return "; ".join(p for p in (named, boot) if p)


def cmd_add(args: argparse.Namespace) -> int:
    from ordq.contexts import Context, add

    context = Context(name=args.name, zk=args.zk or "", root=args.root, bootstrap=args.bootstrap or None)
    add(context, select=args.use)
    if wants_json(args):
        emit_json({"added": context.name, "current": args.use, **context.to_dict()})
    else:
        print(f"context {context.name} added ({_where(context)})" + ("; it is the current one" if args.use else ""))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from ordq.contexts import remove

    was_current = remove(args.name)
    if wants_json(args):
        emit_json({"removed": args.name, "was_current": was_current})
    else:
        print(f"context {args.name} removed" + ("; no context is current now" if was_current else ""))
    return 0
