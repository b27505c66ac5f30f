"""ordq auth create|list|revoke: access tokens (coordinator/tokens.py, docs/SECURITY.md)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ordq.commands import add_command, admin_call, wants_json
from ordq.common.errors import ConfigError
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "auth", help="create, list and revoke access tokens")
    sub = parser.add_subparsers(dest="auth_command", metavar="ACTION")
    sub.required = True
    create = add_command(
        sub, "create", func=cmd_create,
        help="create a token with roles (printed once; ZooKeeper keeps only its hash)",
        description="Create a token granting ROLE (produce, consume, admin) on QUEUE, or on every queue when "
        "no queue is given. The first token turns enforcement on: from then on every broker call and admin "
        "command needs a token with the role. Needs the admin role once tokens are enforced.",
    )
    create.add_argument("--role", action="append", required=True, metavar="ROLE[:QUEUE]", dest="roles",
                        help="produce|consume|admin, optionally on one queue (repeat for more)")
    create.add_argument("--name", default="", help="who or what holds it (shown by auth list)")
    create.add_argument("--allow-unknown-queue", action="store_true",
                        help="grant roles on queues that do not exist yet (else refused: a typo would make a "
                             "token that is refused everywhere)")
    listing = add_command(sub, "list", func=cmd_list, help="list tokens: id, name, grants (never the secrets)")
    listing.add_argument("--all", action="store_true", help="the revoked tokens too, with when they were revoked")
    revoke = add_command(sub, "revoke", func=cmd_revoke,
                         help="revoke a token: brokers refuse it on its next call")
    revoke.add_argument("id", help="the token id (ordq auth list); a whole token is taken too, and never printed")


def cmd_create(args: argparse.Namespace) -> int:
    from ordq.coordinator.tokens import parse_grants

    parse_grants(args.roles)  # a usage error here, before any call
    doc = admin_call(args, "auth create", roles=args.roles, name=args.name,
                     allow_unknown_queue=args.allow_unknown_queue)
    if wants_json(args):
        emit_json(doc)
    else:
        print(doc["token"])
        print(f"token {doc['id']} created ({_grants(doc['grants'])}); give it with --token-file, "
              "ORDQ_TOKEN, or the SDK's credentials: it is not shown again")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from ordq.output import format_time_ms

    doc = admin_call(args, "auth list", **({"all": True} if args.all else {}))
    on, rows = doc["enforced"], doc["tokens"]
    revoked = doc.get("revoked", []) if args.all else []
    if wants_json(args):
        emit_json({"enforced": on, "tokens": rows, **({"revoked": revoked} if args.all else {})})
        return 0
    print(f"tokens {'enforced' if on else 'NOT enforced (no token created yet): anyone may call'}")
    shown = [{"id": r["id"], "name": r["name"], "grants": _grants(r["grants"]), "revoked": None} for r in rows]
    shown += [{"id": r["id"], "name": r["name"], "grants": _grants(r["grants"]),
               "revoked": format_time_ms(int(r["revoked_ms"]))} for r in revoked]
    table(shown, ["id", "name", "grants", *(["revoked"] if args.all else [])])
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from ordq.coordinator.tokens import token_id

    tid = _token_id(args.id, token_id)  # a whole token never leaves this process
    admin_call(args, "auth revoke", id=tid)
    if wants_json(args):
        emit_json({"revoked": tid})
    else:
        print(f"token {tid} revoked")
    return 0


def _token_id(given: str, token_id: Any) -> str:
    """The id to revoke: ``given`` itself, or the id inside a whole token. An error never
    quotes what was given, which may be a secret."""
    if given.startswith("ordq_"):
        return str(token_id(given))  # its error does not quote the token either
    if not re.fullmatch(r"[0-9a-f]{8}", given):
        raise ConfigError("not a token id: 8 hex digits, as ordq auth list shows (or the whole token)")
    return given


def _grants(grants: dict[str, list[str]]) -> str:
    return ", ".join(f"{'+'.join(roles)} on {'every queue' if q == '*' else q}" for q, roles in sorted(grants.items()))
