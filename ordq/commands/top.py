"""ordq top: a live view of queues (send head, consume head, segments, produce rate) and
subscriptions (lag, consume rate, holder), redrawn every interval."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any, TextIO

from ordq.commands import INTERRUPTED, add_command, open_store, readable, seconds, wants_json
from ordq.commands.paging import Page, add_paging, page, say_next
from ordq.commands.sub import blocked_text
from ordq.output import emit_json, table

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen

QUEUE_COLUMNS = ["queue", "head", "send", "consume_head", "open_segment", "segments", "stored", "last_seq",
                 "produce_rate", "subscriptions", "max_lag"]
SUB_COLUMNS = ["queue", "subscription", "seg", "last_seq", "lag", "consume_rate", "held_by"]
MIRROR_COLUMNS = ["queue", "target", "copied_seq", "lag_messages", "lag_seconds", "held_by"]


def register(subparsers: Any) -> None:
    top = add_command(
        subparsers, "top", func=cmd_top, reads=True,
        help="live view of queues, lists, produce/consume rates and lag (Ctrl-C quits)",
        description="Redraw, every --interval seconds, each queue's send head and list, consume-list head, "
        "segments, stored messages, last readable seq and produce rate (msgs/s from seq progress), and "
        "each subscription's lag, consume rate (from committed cursors) and holder, and the message its "
        "consumer is blocked on, if any (failure policy block, past its attempts), and each mirror of a "
        "queue to another cluster (its subscription mirror.TARGET): the last source seq its copy holds and its "
        "lag in messages and seconds. '?' means no replica of an open or sealing segment answered. "
        "--once prints one frame, --json one JSON frame; both "
        "sample twice, --interval apart, to measure rates.",
    )
    top.add_argument("queues", nargs="*", metavar="QUEUE", help="only these queues (default: all)")
    top.add_argument("--interval", type=seconds(), default=1.0, metavar="SECONDS",
                     help="refresh period and rate window (default %(default)s)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    add_paging(top, "queues")


def render(frame: dict[str, Any], out: TextIO) -> None:
    def shown(rows: list[dict[str, Any]], unknown: tuple[str, ...]) -> list[dict[str, Any]]:
        # None from a broker read means "no replica answered": '?'; max_lag of a queue without
        # subscriptions is simply not applicable ('-').
        return [{**r, **{k: "?" for k in unknown if k in r and r[k] is None
                         and not (k == "max_lag" and not r.get("subscriptions"))}} for r in rows]

    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out.write(f"ordq top  {now}  (rates over {frame['interval_s']}s)\n\n")
    if frame["queues"]:
        table(shown(frame["queues"], ("stored", "last_seq", "max_lag")), QUEUE_COLUMNS, out)
    else:
        out.write("no queues\n")
    if frame["subscriptions"]:
        out.write("\n")
        columns = SUB_COLUMNS
        if any(r.get("blocked") for r in frame["subscriptions"]):  # a consumer stuck on a message: which, why
            columns = [*SUB_COLUMNS, "blocked"]
        table([{**r, "blocked": blocked_text(r.get("blocked"))} for r in shown(frame["subscriptions"], ("lag",))],
              columns, out)
    if frame.get("mirrors"):  # the source side of each mirror: how far its copy is behind
        out.write("\nmirrors\n")
        table(shown(frame["mirrors"], ("lag_messages", "lag_seconds")), MIRROR_COLUMNS, out)
    out.flush()


def cmd_top(args: argparse.Namespace) -> int:
    from ordq.admin import ReplicaReader, frames

    if args.interval <= 0:
        from ordq.common.errors import ConfigError

        raise ConfigError("--interval must be > 0")
    out = sys.stdout
    live = not (args.once or wants_json(args))
    with open_store(args) as store, ReplicaReader(store) as reader:
        pages: list[Page] = []

        may_read = readable(store)

        def select(names: list[str]) -> list[str]:
            # the page is chosen again at every frame (queues come and go while it runs); only
            # the queues the caller's token has a role on (issue 42: a one-queue token saw all)
            pages[:] = [page([n for n in names if may_read(n)], args)]
            return pages[0].names

        stream = frames(store, reader, args.queues or None, args.interval, select=select)
        try:
            for frame in stream:
                if INTERRUPTED.is_set():  # a KeyboardInterrupt swallowed on its way: stop all the same
                    return 0
                if wants_json(args):
                    emit_json(frame)
                    say_next(pages[0], "queues")
                    return 0
                if live and out.isatty():
                    out.write(CLEAR)
                elif live:
                    out.write("\n")
                render(frame, out)
                if not live:
                    say_next(pages[0], "queues")
                    return 0
        except KeyboardInterrupt:
            return 0
    return 0
