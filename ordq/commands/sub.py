"""ordq sub list|create|alter|reset|delete|policy|parked: subscriptions of a queue, their cursors,
lag and state; create, change, move and delete them; what their consumers do with a failing message."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, admin_call, duration, int_in, wants_json
from ordq.commands.paging import add_paging, page, say_next
from ordq.common.errors import ConfigError
from ordq.common.units import format_duration
from ordq.output import emit_json, table


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "sub", help="inspect subscriptions and reset their cursors")
    sub = parser.add_subparsers(dest="sub_command", metavar="ACTION")
    sub.required = True
    ls = add_command(sub, "list", func=cmd_list, reads=True,
                     help="subscriptions of a queue with cursor, lag and the consumer holding each")
    ls.add_argument("queue")
    add_paging(ls, "subscriptions")
    reset = add_command(
        sub, "reset", func=cmd_reset, admin=True,
        help="move a subscription's cursor: earliest, latest, a seq or a time",
        description="Move a subscription's cursor so its consumer next delivers: the oldest kept message "
        "(earliest), only messages produced from now on (latest), the message with seq N (seq N, earlier "
        "or later than now: earlier ones are delivered again), or the first message stamped at or after "
        "T (time T: ISO 8601, UTC unless a zone is given; Unix seconds; or a duration ago such as 15m). "
        "Refused while a consumer holds the subscription, unless --force.",
    )
    reset.add_argument("queue")
    reset.add_argument("subscription")
    reset.add_argument("--to", required=True, nargs="+", metavar="TARGET",
                       help="earliest | latest | seq N | time T")
    reset.add_argument("--force", action="store_true",
                       help="reset even while a consumer holds the subscription (its next cursor commit fails "
                       "with a conflict and it must restart)")
    register_create_delete(sub)


def register_create_delete(sub: Any) -> None:
    create = add_command(
        sub, "create", func=cmd_create, help="create a subscription starting at earliest, latest, a seq or a time",
        description="Create a subscription whose first consumer delivers from the target: the oldest kept "
        "message (earliest, the default), only messages produced from now on (latest), the message with seq N "
        "(seq N: an application that keeps its position in its own database resumes exactly there), or the "
        "first message stamped at or after T (time T, as for reset).", admin=True)
    create.add_argument("queue")
    create.add_argument("subscription")
    create.add_argument("--start", nargs="+", default=["earliest"], metavar="TARGET",
                        help="earliest | latest | seq N | time T (default: earliest)")
    create.add_argument("--delay", type=duration(0, MAX_DELAY_S), default=0.0, metavar="D",
                        help=DELAY_HELP)
    alter = add_command(
        sub, "alter", func=cmd_alter, admin=True, help="change a subscription's settings (its delay)",
        description="Change a subscription's delay: each message is delivered no earlier than its timestamp "
        "+ D, in order (a message waits behind the one before it). The consumer holding the subscription "
        "applies it within a few seconds; docs/SDK.md, \"Delayed delivery\".")
    alter.add_argument("queue")
    alter.add_argument("subscription")
    alter.add_argument("--delay", type=duration(0, MAX_DELAY_S), required=True, metavar="D", help=DELAY_HELP)
    delete = add_command(
        sub, "delete", func=cmd_delete, help="delete a subscription (it no longer keeps segments from being freed)",
        description="Delete a subscription and its cursor, so it no longer keeps consumed segments from being "
        "popped. Refused while a consumer holds it, unless --force (that consumer then stops).", admin=True)
    delete.add_argument("queue")
    delete.add_argument("subscription")
    delete.add_argument("--force", action="store_true", help="delete even while a consumer holds it")
    policy = add_command(
        sub, "policy", func=cmd_policy, help="what consumers do with a message their handler keeps failing on",
        description="Show or set the subscription's failure policy, used by Consumer.run when its config sets "
        "none: block (retry for ever, never skip; the default), park (after N attempts move it to the "
        "parking queue Q.parked.SUB and go on) or raise (stop with HandlerError). docs/SDK.md.", admin=True)
    policy.add_argument("queue")
    policy.add_argument("subscription")
    policy.add_argument("--on-failure", choices=["block", "park", "raise"], default=None)
    policy.add_argument("--attempts", type=int_in(1, 10**6), default=None, help="tries before the alarm, "
                        "parking or the error (default 5)")
    policy.add_argument("--backoff", default=None, metavar="S,S,...",
                        help="seconds to wait before each retry, the last repeating (default 0.1,0.5,1,5,10,30)")
    parked = add_command(
        sub, "parked", func=cmd_parked,
        help="the messages a subscription parked; replay or drop them",
        description="sub parked Q SUB lists the subscription's ledger of parked messages: each seq its handler "
        "kept failing on (or, in keyed delivery, that followed a parked message of its key), moved to the parking "
        "queue Q.parked.SUB (an ordinary queue: read it with ordq consume or peek), with its key, attempts, last "
        "error, time and status. sub parked replay Q SUB hands the chosen ones to the subscription's consumer "
        "again, from the parking queue, one key's in seq order, before that key goes on; sub parked drop Q SUB "
        "--reason TEXT gives them up, recorded in the ledger. A parked key goes on once every parked message of "
        "it is replayed or dropped.",
    )
    parked.add_argument("words", nargs="+", metavar="[replay|drop] Q SUB",
                        help="Q SUB to list; replay Q SUB or drop Q SUB to resolve")
    which = parked.add_mutually_exclusive_group()
    which.add_argument("--seq", type=int_in(0), default=None, help="one parked seq")
    which.add_argument("--key", default=None, help="every parked message of this key (text, as ordq produce --key)")
    which.add_argument("--key-hex", default=None, metavar="HEX", help="the key as the ledger shows it (hex)")
    which.add_argument("--all", action="store_true", help="every parked message")
    parked.add_argument("--reason", default=None, help="drop: why (recorded in the ledger)")


MAX_DELAY_S = 7 * 24 * 3600  # sdk/delay.py MAX_DELAY_MS
DELAY_HELP = ("deliver each message no earlier than its timestamp + D (90s, 15m, 2h; 0: at once), in order "
              "(default 0)")


def cmd_create(args: argparse.Namespace) -> int:
    from ordq.sdk.positions import parse_reset_target

    parse_reset_target(args.start)  # a usage error here, before any call
    doc = admin_call(args, "sub create", queue=args.queue, subscription=args.subscription, start=args.start,
                     delay_ms=round(args.delay * 1000))
    first = doc.pop("first")
    if wants_json(args):
        emit_json(doc)
        return 0
    delayed = f", each message delivered {delay_text(doc['delay_ms'])} after its timestamp" if doc["delay_ms"] else ""
    print(f"subscription {args.queue}/{args.subscription} created at {doc['start']}{delayed}: first delivered: {first}")
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    doc = admin_call(args, "sub alter", queue=args.queue, subscription=args.subscription,
                     delay_ms=round(args.delay * 1000))
    if wants_json(args):
        emit_json(doc)
        return 0
    print(f"subscription {args.queue}/{args.subscription}: delay {delay_text(doc['before'].get('delay_ms', 0))} -> "
          f"{delay_text(doc['settings']['delay_ms'])}")
    return 0


def delay_text(delay_ms: int) -> str:
    return "none" if not delay_ms else format_duration(delay_ms / 1000.0)


def cmd_delete(args: argparse.Namespace) -> int:
    doc = admin_call(args, "sub delete", queue=args.queue, subscription=args.subscription, force=args.force)
    holder = doc["held_by"]
    if wants_json(args):
        emit_json({"queue": args.queue, "subscription": args.subscription, "deleted": True, "held_by": holder})
        return 0
    print(f"subscription {args.queue}/{args.subscription} deleted")
    if holder is not None:
        print(f"forced while held by {holder}: that consumer stops (its lease is gone)")
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    import attrs

    from ordq.sdk.failure import FailurePolicy

    change: dict[str, Any] | None = None
    if args.on_failure is not None or args.attempts is not None or args.backoff is not None:
        try:
            backoff = [float(b) for b in args.backoff.split(",")] if args.backoff else None
        except ValueError:
            raise ConfigError(f"bad --backoff {args.backoff!r}: seconds separated by commas") from None
        change = {"on_failure": args.on_failure, "attempts": args.attempts, "backoff_s": backoff}
    doc = admin_call(args, "sub policy", queue=args.queue, subscription=args.subscription, set=change)
    current = FailurePolicy(on_failure=doc["on_failure"], attempts=doc["attempts"], backoff_s=tuple(doc["backoff_s"]))
    if wants_json(args):
        emit_json({"queue": args.queue, "subscription": args.subscription, **attrs.asdict(current)})
    else:
        print(f"{args.queue}/{args.subscription}: on failure {current.on_failure} after {current.attempts} attempts, "
              f"waits {', '.join(f'{b:g}' for b in current.backoff_s)} s")
    return 0


def cmd_parked(args: argparse.Namespace) -> int:
    action, names = _parked_action(args)
    if action != "list":
        return _cmd_resolve(args, action, *names)
    from ordq.sdk.replicas import format_time_us

    queue, sub = names
    records = admin_call(args, "sub parked", queue=queue, subscription=sub)["parked"]
    if wants_json(args):
        emit_json({"queue": queue, "subscription": sub, "parked": records})
    elif not records:
        print(f"nothing parked for {queue}/{sub}")
    else:
        table([{**r, "key": key_text(r.get("key")), "status": r.get("status", "parked"),
                "parked_at": format_time_us(r["parked_at_us"]), "error": r.get("reason") or r["error"]}
               for r in records],
              ["seq", "key", "status", "attempts", "parked_at", "parking_queue", "parked_seq", "error"])
    return 0


def key_text(key_hex: str | None) -> str | None:
    """A ledger key (hex) as ``--key`` takes it: its text when it is printable UTF-8 without
    spaces at either end, else ``hex:<hex>`` (for ``--key-hex``). JSON keeps the hex."""
    if key_hex is None:
        return None
    try:
        text = bytes.fromhex(key_hex).decode("utf-8")
    except ValueError:  # not hex (a record from elsewhere) or not UTF-8
        return f"hex:{key_hex}"
    if text and text.isprintable() and text == text.strip() and not text.startswith("hex:"):
        return text
    return f"hex:{key_hex}"


def _parked_action(args: argparse.Namespace) -> tuple[str, tuple[str, str]]:
    words = args.words
    if len(words) == 2:
        if args.seq is not None or args.key is not None or args.key_hex is not None or args.all or args.reason:
            raise ConfigError("--seq/--key/--key-hex/--all/--reason go with replay or drop: "
                              "ordq sub parked replay|drop Q SUB ...")
        return "list", (words[0], words[1])
    if len(words) == 3 and words[0] in ("replay", "drop"):
        return words[0], (words[1], words[2])
    raise ConfigError("usage: ordq sub parked Q SUB | ordq sub parked replay|drop Q SUB --seq N|--key K|--all")


def _cmd_resolve(args: argparse.Namespace, action: str, queue: str, sub: str) -> int:
    import getpass

    if args.reason is not None and action == "replay":
        raise ConfigError("--reason is for drop")
    key: bytes | None = None
    if args.key is not None:
        key = args.key.encode()
    elif args.key_hex is not None:
        try:
            key = bytes.fromhex(args.key_hex)
        except ValueError:
            raise ConfigError(f"bad --key-hex {args.key_hex!r}: hex digits, two per byte") from None
    try:
        operator = getpass.getuser()
    except (KeyError, OSError):
        operator = "unknown"
    seqs = admin_call(args, "sub parked resolve", queue=queue, subscription=sub, action=action, seq=args.seq,
                      key_hex=key.hex() if key is not None else None, all=args.all, reason=args.reason,
                      operator=operator)["seqs"]
    if wants_json(args):
        emit_json({"queue": queue, "subscription": sub, "action": action, "seqs": seqs})
    elif not seqs:
        print(f"nothing to {action} for {queue}/{sub}")
    elif action == "replay":
        print(f"{queue}/{sub}: {_seq_list(seqs)} asked to replay; the subscription's consumer hands "
              f"{'it' if len(seqs) == 1 else 'them'} to its handler")
    else:
        print(f"{queue}/{sub}: {_seq_list(seqs)} dropped: {args.reason}")
    return 0


def _seq_list(seqs: list[int]) -> str:
    shown = ", ".join(map(str, seqs[:10])) + (f" and {len(seqs) - 10} more" if len(seqs) > 10 else "")
    return f"seq {shown}" if len(seqs) == 1 else f"seqs {shown}"


def cmd_list(args: argparse.Namespace) -> int:
    doc = admin_call(args, "sub list", queue=args.queue)
    by_name = {s["subscription"]: s for s in doc["subscriptions"]}
    shown = page(by_name, args)
    rows = [by_name[name] for name in shown.names]
    if wants_json(args):
        emit_json({"queue": args.queue, "last_seq": doc["last_seq"], "subscriptions": rows})
    elif not rows and not by_name:
        print(f"queue {args.queue} has no subscriptions (a consumer creates one: ordq consume {args.queue} -s NAME)")
    elif not rows:
        print(f"no subscriptions of queue {args.queue} match")
    else:
        columns = ["subscription", "seg", "offset", "last_seq", "lag", "held_by", "state"]
        if any(r.get("delay_ms") for r in rows):
            columns.append("delay")
        if any(r.get("waiting") for r in rows):  # held for its time, not stuck: say until when
            columns.append("waiting")
        if any(r["blocked"] for r in rows):  # a consumer stuck on a message: say which, and why
            columns.append("blocked")
        table([{**r, "lag": "?" if r["lag"] is None else r["lag"], "blocked": blocked_text(r["blocked"]),
                "delay": delay_text(r.get("delay_ms") or 0), "waiting": waiting_text(r.get("waiting"))}
               for r in rows], columns)
    say_next(shown, "subscriptions")
    return 0


def waiting_text(waiting: dict[str, Any] | None) -> str | None:
    if not waiting:
        return None
    from ordq.sdk.replicas import format_time_us

    return f"seq {waiting.get('seq')} until {format_time_us(int(waiting['due_us']))}"


def blocked_text(blocked: dict[str, Any] | None) -> str | None:
    if blocked is None:
        return None
    return f"seq {blocked['seq']} after {blocked['attempts']} attempts: {blocked['error'][:80]}"


def cmd_reset(args: argparse.Namespace) -> int:
    from ordq.admin import parse_reset_target

    parse_reset_target(args.to)  # a usage error here, before any call
    doc = admin_call(args, "sub reset", queue=args.queue, subscription=args.subscription, to=args.to,
                     force=args.force)
    result, nxt = doc["result"], doc["next"]
    if wants_json(args):
        emit_json(result)
        return 0
    b, a = result["before"], result["after"]
    print(f"subscription {args.queue}/{args.subscription} reset to {result['target']}: "
          f"cursor seg {b['seg']} offset {b['offset']} last_seq {b['last_seq']} -> "
          f"seg {a['seg']} offset {a['offset']} last_seq {a['last_seq']}")
    print(f"next delivered: {nxt}")
    if result["forced"]:
        print(f"forced while held by {result['held_by']}: that consumer's next commit fails; restart it")
    return 0
