"""ordq queue create|update|add-group|remove-group|list|describe|roll|delete: queues and their settings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ordq.commands import (
    MAX_PAYLOAD_BYTES,
    add_command,
    admin_call,
    admin_call_with_text,
    byte_size,
    duration,
    int_in,
    wants_json,
)
from ordq.commands.paging import Page, add_paging, say_next
from ordq.common.errors import ConfigError
from ordq.common.units import format_duration, format_size
from ordq.coordinator.queue_defaults import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SEGMENT_AGE_S,
    DEFAULT_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
    ROLL_TO,
)
from ordq.output import emit_json, table

# ``queue list`` (issue 42: 0.25 s of CPU) needs neither attrs nor the queue's state and settings
# classes (nor uuid, which loads platform): the verbs that read them import them.
if TYPE_CHECKING:
    from ordq.coordinator.state import QueueState
    from ordq.coordinator.store_values import QueueConfig


def _state(doc: Any) -> QueueState:
    from ordq.coordinator.state import QueueState

    return QueueState.from_dict(doc)


def _config(**settings: Any) -> QueueConfig:
    from ordq.coordinator.store_values import QueueConfig

    return QueueConfig(**settings)


def _asdict(cfg: QueueConfig) -> dict[str, Any]:
    import attrs

    return attrs.asdict(cfg)


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "queue", help="create and inspect queues")
    sub = parser.add_subparsers(dest="queue_command", metavar="ACTION")
    sub.required = True
    create = add_command(sub, "create", help="create queues", func=cmd_create, admin=True,
                         description="Create one queue, or many at once (names given, or one a line in "
                         "--names-from): many are created in batched ZooKeeper transactions, and names that "
                         "already exist are left alone and named on stderr (exit code 1).")
    create.add_argument("queue", nargs="*", help="queue names, [A-Za-z0-9._-]{1,128}")
    create.add_argument("--names-from", dest="names_from", metavar="FILE",
                        help="more names, one a line ('-': standard input)")
    create.add_argument(
        "--groups", help="comma-separated broker groups serving it (default: every registered group)"
    )
    add_settings(create, defaults=True)
    update = add_command(
        sub, "update", func=cmd_update, help="change a queue's segment size and age, retention or message limit",
        description="Change the settings of an existing queue (only those given). Limits on segments apply from "
        "the coordinator's next round: a segment larger or older than the new limit rolls, sealed segments "
        "past a new retention limit are dropped, read or not.", admin=True)
    update.add_argument("queue")
    add_settings(update, defaults=False)
    ls = add_command(sub, "list", help="list queues with their send head, stored messages and last seq",
                     func=cmd_list)
    add_paging(ls, "queues")
    desc = add_command(
        sub, "describe", func=cmd_describe,
        help="send list, consume list with segments, per-group backlog, subscriptions and their lag",
        description="Show a queue: its send list, its consume list (each segment's group, status, readable "
        "messages and seq range; open and sealing segments are asked of their replicas, '?' when none "
        "answers), the backlog each group holds, and each subscription's cursor, lag and holder.")
    desc.add_argument("queue")
    add = add_command(sub, "add-group", func=cmd_add_group, admin=True, help="let a broker group serve a queue",
                      description="Add a registered group to a queue's groups; it joins the end of the send "
                      "list at once if it is live, holds no segment of the queue and is not drained, else later "
                      "(the coordinator admits it).")
    add.add_argument("queue")
    add.add_argument("group")
    remove = add_command(sub, "remove-group", func=cmd_remove_group, help="stop a broker group serving a queue",
                         description="Take a group out of the queue's send list (a head is failed over: "
                         "producers continue on the next group) and remove it from the queue once no "
                         "subscription needs its segments; until then this says which segments it still "
                         "holds (run it again later).", admin=True)
    remove.add_argument("queue")
    remove.add_argument("group")
    remove.add_argument("--force", action="store_true", help="even if it is the only group taking writes")
    roll = add_command(
        sub, "roll", func=cmd_roll, admin=True, help="seal the open segment and continue on a new one",
        description="Seal the queue's open segment and open the next one, in one conditional write: on the "
        "same send head, or on the next group when the queue's --roll-to is 'next'; then seal the old one on "
        "its replicas. Producers continue on the new segment with "
        "the next seq (what was in flight is resent; consumers drop duplicates by seq). Once every "
        "subscription has read the old segment it can be popped and its disk freed.")
    roll.add_argument("queue")
    delete = add_command(sub, "delete", help="delete a queue: its metadata, and its data on every replica",
                         func=cmd_delete, admin=True)
    delete.add_argument("queue")


SETTINGS = ("max_message_bytes", "segment_bytes", "segment_age_s", "roll_to", "retention_time_s",
            "retention_bytes", "retention_segments")


def add_settings(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The queue settings, for create (with their defaults) and update (only those given)."""
    def default(value: Any) -> Any:
        return value if defaults else None

    parser.add_argument("--max-message-bytes", type=byte_size(1, MAX_PAYLOAD_BYTES),
                        default=default(DEFAULT_MAX_MESSAGE_BYTES), metavar="SIZE",
                        help="largest message accepted (default 1MiB)")
    parser.add_argument("--segment-bytes", dest="segment_bytes", type=byte_size(MIN_SEGMENT_BYTES, 1 << 40),
                        default=default(DEFAULT_SEGMENT_BYTES), metavar="SIZE",
                        help="roll the open segment once it holds this much (default 256MiB)")
    parser.add_argument("--segment-age", dest="segment_age_s", type=duration(1, 10**8),
                        default=default(DEFAULT_SEGMENT_AGE_S), metavar="DURATION",
                        help="roll the open segment once its first message is this old (default 1h)")
    parser.add_argument("--roll-to", dest="roll_to", choices=ROLL_TO, default=default("same"),
                        help="where a roll opens the next segment: 'same' head (default), or 'next' group of "
                        "the send list, which spreads the backlog over the groups (the old head rejoins the "
                        "send list once its segments are consumed)")
    parser.add_argument("--retention-time", dest="retention_time_s", type=duration(1, 10**9), default=None,
                        metavar="DURATION", help="drop sealed segments this long after they were sealed, read or "
                        "not (such as 7d; default: keep until every subscription has read them)")
    parser.add_argument("--retention-bytes", dest="retention_bytes", type=byte_size(MIN_SEGMENT_BYTES, 1 << 60),
                        default=None, metavar="SIZE", help="drop the oldest sealed segments, read or not, while "
                        "the sealed ones take more than this (such as 10GiB; default: no limit)")
    parser.add_argument("--retention-segments", type=int_in(1, 10**6), default=None,
                        help="keep at most this many sealed segments (default: all until consumed)")


def _names(args: argparse.Namespace) -> list[str]:
    names = list(args.queue)
    if args.names_from:
        try:
            text = sys.stdin.read() if args.names_from == "-" else Path(args.names_from).read_text()
        except OSError as exc:
            raise ConfigError(f"--names-from {args.names_from}: {exc.strerror or exc}") from None
        names += [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise ConfigError("name at least one queue (or --names-from FILE) (see: ordq queue create --help)")
    return list(dict.fromkeys(names))


def cmd_create(args: argparse.Namespace) -> int:
    groups = [g for g in args.groups.split(",") if g] if args.groups else None
    cfg = _config(**{name: getattr(args, name) for name in SETTINGS})
    names = _names(args)
    if len(names) > 1 or args.names_from:
        return _create_many(args, names, groups, cfg)
    st = _state(admin_call(args, "queue create", queue=names[0], groups=groups, config=_asdict(cfg)))
    if wants_json(args):
        emit_json(st.to_dict())
    else:
        head = st.head or "none yet (no group has master and slave live)"
        print(f"queue {st.queue} created on groups {', '.join(st.groups)}; send head: {head}")
    return 0


def _create_many(args: argparse.Namespace, names: list[str], groups: list[str] | None, cfg: QueueConfig) -> int:
    """Many queues, ``MAX_CREATE_NAMES`` per admin request (each a few batched transactions)."""
    import uuid

    from ordq.admin.api import MAX_CREATE_NAMES

    created: list[dict[str, Any]] = []
    existing: list[str] = []
    for i in range(0, len(names), MAX_CREATE_NAMES):
        # the request's id: if its answer is lost and the call is sent again, what the first
        # attempt created is not reported as "already existed"
        doc = admin_call(args, "queue create-many", queues=names[i:i + MAX_CREATE_NAMES], groups=groups,
                         config=_asdict(cfg), request=uuid.uuid4().hex[:12])
        created += doc["created"]
        existing += doc["existing"]
    if wants_json(args):
        emit_json({"created": created, "existing": existing})
    else:
        heads: dict[str, int] = {}
        for row in created:
            heads[row["head"] or "none"] = heads.get(row["head"] or "none", 0) + 1
        spread = ", ".join(f"{g} {n}" for g, n in sorted(heads.items()))
        print(f"created {len(created)} queues" + (f"; send heads: {spread}" if created else ""))
    if existing:
        shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        print(f"ordq: error: {len(existing)} already existed (left as they are): {shown}", file=sys.stderr)
        return 1
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    changes = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    if not changes:
        raise ConfigError("nothing to change: give at least one setting (see ordq queue update --help)")
    doc = admin_call(args, "queue update", queue=args.queue, changes=changes)
    cfg = _config(**doc["config"])
    if wants_json(args):
        emit_json({"queue": args.queue, "config": _asdict(cfg)})
    else:
        print(f"queue {args.queue}: {settings_line(cfg)}")
    return 0


def settings_line(cfg: QueueConfig) -> str:
    """A queue's settings as one line for people."""
    kept = []
    if cfg.retention_time_s is not None:
        kept.append(f"for {format_duration(cfg.retention_time_s)} after sealed")
    if cfg.retention_bytes is not None:
        kept.append(f"within {format_size(cfg.retention_bytes)}")
    if cfg.retention_segments is not None:
        kept.append(f"at most {cfg.retention_segments} sealed segments")
    retention = "keep " + ", ".join(kept) if kept else "keep until consumed"
    return (f"max message {format_size(cfg.max_message_bytes)}, segments roll at {format_size(cfg.segment_bytes)} "
            f"or {format_duration(cfg.segment_age_s)}{' to the next group' if cfg.roll_to == 'next' else ''}, "
            f"{retention}")


def cmd_add_group(args: argparse.Namespace) -> int:
    st = _state(admin_call(args, "queue add-group", queue=args.queue, group=args.group))
    return _print_lists(args, st, f"group {args.group} serves queue {args.queue}")


def cmd_remove_group(args: argparse.Namespace) -> int:
    st = _state(admin_call(args, "queue remove-group", queue=args.queue, group=args.group, force=args.force))
    return _print_lists(args, st, f"group {args.group} removed from queue {args.queue}")


def _print_lists(args: argparse.Namespace, st: QueueState, what: str) -> int:
    if wants_json(args):
        emit_json(st.to_dict())
    else:
        print(f"{what}; groups: {', '.join(st.groups)}; send list: {' -> '.join(st.send) or '(empty)'}")
    return 0


def cmd_roll(args: argparse.Namespace) -> int:
    rolled = admin_call(args, "queue roll", queue=args.queue)
    if wants_json(args):
        emit_json(rolled)
    else:
        state = "sealed" if rolled["sealed"] else "sealing (completed later: no replica answered)"
        print(f"queue {rolled['queue']}: segment {rolled['sealing_seg']} {state}; segment {rolled['new_seg']} "
              f"open on {rolled['head']}")
    return 0


def unknown(value: Any) -> Any:
    """None read from a broker means 'no replica answered': show '?' (a table shows None as '-')."""
    return "?" if value is None else value


def cmd_list(args: argparse.Namespace) -> int:
    # Only the queues the caller's token has a role on (issue 42); each described by the
    # coordinator (its replicas read there), one page at a time.
    as_json = wants_json(args)
    # --json: the rows' text as the coordinator made it (json_text of them), apart from the
    # answer's JSON (issue 43: ~20 MB at 10^5 queues, escaped and parsed back when inside it);
    # a coordinator that predates text_apart sends it inside (rows_text), an older one the rows.
    doc, text = admin_call_with_text(args, "queue list", prefix=args.prefix, after=args.after, limit=args.limit,
                                     **({"rows_as_text": True, "text_apart": True} if as_json else {}))
    shown = Page(names=doc["names"], more=doc["more"])
    rows, corrupt = doc.get("rows"), doc["corrupt"]
    for line in corrupt:
        print(f"ordq: error: {line}", file=sys.stderr)
    if as_json and text:
        sys.stdout.write(text.decode())
    elif as_json and "rows_text" in doc:
        sys.stdout.write(doc["rows_text"])
    elif as_json:
        emit_json(rows)  # a coordinator that predates rows_as_text
    elif not rows and not corrupt:
        print("no queues (create one: ordq queue create NAME)" if not (args.prefix or args.after)
              else "no queues match")
    elif rows:
        table([{**r, "last_seq": unknown(r["last_seq"]), "stored": unknown(r["stored"])} for r in rows],
              ["queue", "head", "send", "open_segment", "segments", "stored", "last_seq", "epoch", "subscriptions"])
    say_next(shown, "queues")
    return 1 if corrupt else 0


def cmd_describe(args: argparse.Namespace) -> int:
    view = admin_call(args, "queue describe", queue=args.queue)
    if wants_json(args):
        emit_json(view)
        return 0
    cfg = _config(**view["config"])
    print(f"queue {view['queue']}  (producer epoch {view['producer_epoch']}, state version {view['version']})")
    print(f"settings: {settings_line(cfg)}")
    send = view["send"]
    print(f"send list: {' -> '.join(send) if send else '(empty: producers wait for a group)'}")
    print(f"last readable seq: {unknown(view['last_seq'])}   stored messages: {unknown(view['stored'])}")
    print("\nconsume list:")
    if view["consume"]:
        rows = []
        for e in view["consume"]:
            d = {**e, "bytes": unknown(e["bytes"])}
            if e["messages"] is None:  # no replica answered: the seq range is unknown, not empty
                d.update(messages="?", first_seq="?", last_seq="?", read_from="(no replica answered)")
            rows.append(d)
        table(rows, ["seg", "gid", "status", "messages", "bytes", "first_seq", "last_seq", "read_from"])
    else:
        print("(empty)")
    print("\ngroups:")
    table([{**g, "live": ",".join(g["live"]) or "down", "backlog": unknown(g["backlog"]), "bytes": unknown(g["bytes"])}
           for g in view["groups"]],
          ["group", "live", "drained", "in_send", "segments", "backlog", "bytes"])
    print("\nsubscriptions:")
    if view["subscriptions"]:
        table([{**s, "lag": unknown(s["lag"])} for s in view["subscriptions"]],
              ["subscription", "seg", "offset", "last_seq", "lag", "held_by"])
    else:
        print("(none)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    admin_call(args, "queue delete", queue=args.queue)
    if wants_json(args):
        emit_json({"deleted": args.queue})
    else:
        print(f"queue {args.queue} deleted")
    return 0
