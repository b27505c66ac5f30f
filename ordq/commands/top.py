"""ordq top: a live view of queues (send head, consume head, segments, produce rate) and
subscriptions (lag, consume rate, holder), redrawn every interval."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from ordq.cli_args import INTERRUPTED
from ordq.commands import add_command, open_store, readable, seconds, wants_json
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


def with_rates(cur: dict[str, Any], prev: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The frame ``cur`` (a coordinator's ``top sample``, without rates) with the produce and
    consume rates over the ``seconds`` since ``prev``, as ``ordq.admin.top.top_frame`` takes them."""
    def rate(now: int | None, before: int | None) -> float | None:
        if now is None or before is None or seconds <= 0:
            return None
        return round(max(0, now - before) / seconds, 1)

    seqs = {q["queue"]: q["last_seq"] for q in prev["queues"]}
    cursors = {(r["queue"], r["subscription"]): r["last_seq"] for r in prev["subscriptions"]}
    return {**cur, "interval_s": round(seconds, 3),
            "queues": [{**q, "produce_rate": rate(q["last_seq"], seqs.get(q["queue"]))} for q in cur["queues"]],
            "subscriptions": [{**r, "consume_rate": rate(r["last_seq"], cursors.get((r["queue"], r["subscription"])))}
                              for r in cur["subscriptions"]]}


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        from ordq.common.errors import ConfigError

        raise ConfigError("--interval must be > 0")
    pages: list[Page] = []
    asked = _coordinator_frames(args, pages)
    if asked is not None:
        return _show(args, asked, pages)
    from ordq.admin import ReplicaReader, frames

    with open_store(args) as store, ReplicaReader(store) as reader:
        may_read = readable(store)

        def select(names: list[str]) -> list[str]:
            # the page is chosen again at every frame (queues come and go while it runs); only
            # the queues the caller's token has a role on (issue 42: a one-queue token saw all)
            pages[:] = [page([n for n in names if may_read(n)], args)]
            return pages[0].names

        return _show(args, frames(store, reader, args.queues or None, args.interval, select=select), pages)


def _coordinator_frames(args: argparse.Namespace, pages: list[Page]) -> Iterator[dict[str, Any]] | None:
    """Frames from the elected coordinator (``top sample``, ordq/admin/api.py: one admin call a
    frame, no ZooKeeper session; issue 42), the rates taken between two of them; None when no
    coordinator is known for the cluster or it predates the verb (this command then reads
    ZooKeeper and the replicas itself, as before)."""
    from ordq.bootstrap import coordinator, timeout_of
    from ordq.commands import ADMIN_CALL_TIMEOUT_S, coordinator_known, older_coordinator, saying
    from ordq.common.errors import ConfigError

    if not coordinator_known(args):
        return None
    context = coordinator(args)
    client = context.__enter__()

    def ask() -> dict[str, Any]:
        doc: dict[str, Any] = client.admin("top sample", timeout_s=ADMIN_CALL_TIMEOUT_S, reach_s=timeout_of(args),
                                           queues=args.queues or None, prefix=args.prefix, after=args.after,
                                           limit=args.limit)
        pages[:] = [Page(names=doc["names"], more=doc["more"])]
        return doc

    try:
        with saying(f"waiting for the coordinators at {', '.join(client.coordinators)} to answer top sample"):
            first = ask()
    except ConfigError as exc:
        context.__exit__(None, None, None)
        if older_coordinator(exc):
            return None  # a coordinator of an older version
        raise
    except BaseException as exc:
        if not context.__exit__(type(exc), exc, exc.__traceback__):
            raise
        raise

    def stream() -> Iterator[dict[str, Any]]:
        prev = first
        try:
            while True:
                time.sleep(max(0.0, args.interval - (time.time() - prev["at"])))
                cur = ask()
                yield with_rates(cur["frame"], prev["frame"], cur["at"] - prev["at"])
                prev = cur
        finally:
            context.__exit__(None, None, None)

    return stream()


def _show(args: argparse.Namespace, stream: Iterator[dict[str, Any]], pages: list[Page]) -> int:
    out = sys.stdout
    live = not (args.once or wants_json(args))
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
