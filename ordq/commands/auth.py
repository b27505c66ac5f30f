"""ordq auth create|list|revoke: access tokens (coordinator/tokens.py, docs/SECURITY.md)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ordq.commands import add_command, check_admin, open_store, wants_json
from ordq.common.errors import ConfigError, NotFound
from ordq.coordinator.store_base import zk_errors
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
    add_command(sub, "list", func=cmd_list, help="list tokens: id, name, grants (never the secrets)")
    revoke = add_command(sub, "revoke", func=cmd_revoke,
                         help="revoke a token: brokers refuse it on its next call")
    revoke.add_argument("id", help="the token id (ordq auth list); a whole token is taken too, and never printed")


def cmd_create(args: argparse.Namespace) -> int:
    from ordq.coordinator.tokens import create_token, parse_grants, touch

    grants = parse_grants(args.roles)
    with open_store(args) as store:
        check_admin(store, "*")
        unknown = sorted(set(grants) - {"*"} - set(store.list_queues()))
        if unknown and not args.allow_unknown_queue:
            # A grant on a name no queue has is most often a typo: the token would be refused
            # on the queue meant, far from here. Creating the queue later is what the flag is for.
            raise NotFound(f"no queue {', '.join(unknown)} (see: ordq queue list); give --allow-unknown-queue "
                           "to grant roles on a queue created later")
        with zk_errors(args.zk):  # a wrong ZooKeeper credential: one line
            rec, token = create_token(store.client, args.root, grants, args.name)
            touch(store.client, args.root)  # brokers reload (a token is no ZooKeeper identity: no ACL changes)
    if wants_json(args):
        emit_json({**rec.describe(), "token": token})
    else:
        print(token)
        print(f"token {rec.tid} created ({_grants(rec.describe()['grants'])}); give it with --token-file, "
              "ORDQ_TOKEN, or the SDK's credentials: it is not shown again")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from ordq.coordinator.tokens import enforced, load_tokens

    with open_store(args) as store:
        check_admin(store, "*")
        on = enforced(store.client, args.root)
        rows = [r.describe() for r in sorted(load_tokens(store.client, args.root).values(), key=lambda r: r.tid)]
    if wants_json(args):
        emit_json({"enforced": on, "tokens": rows})
        return 0
    print(f"tokens {'enforced' if on else 'NOT enforced (no token created yet): anyone may call'}")
    table([{"id": r["id"], "name": r["name"], "grants": _grants(r["grants"])} for r in rows], ["id", "name", "grants"])
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from ordq.coordinator.tokens import revoke_token, token_id, touch

    tid = _token_id(args.id, token_id)
    with open_store(args) as store:
        check_admin(store, "*")
        with zk_errors(args.zk):
            revoke_token(store.client, args.root, tid)
            touch(store.client, args.root)  # brokers refuse it
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
