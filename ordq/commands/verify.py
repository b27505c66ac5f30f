"""ordq verify: check an ordq run from its audit files with Spark (spark_order_check), or
``--follow QUEUE``: run the ordering checks continuously on the live queue
(``ordq.spark_order_check.follow``).

Same options, output and exit codes as ``python -m ordq.spark_order_check``: 0 clean, 1 violations,
2 could not verify. PySpark is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from ordq.commands import add_command, duration, int_in, saying
from ordq.common.errors import ConfigError
from ordq.spark_order_check.cli import (
    DESCRIPTION,
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_VIOLATIONS,
    _conf,
    add_arguments,
    failed,
    run,
)

FOLLOW = (
    " With --follow QUEUE: read the live queue with the Spark streaming source and check every "
    "micro-batch (no duplicate, no gap, no reorder, within and across batches) until a violation "
    "(exit 1), --until / --until-seq or Ctrl-C (exit 0 when clean); docs/VERIFIER.md."
)


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "verify", help="verify a run from its audit files, or a live queue (Spark)",
                         func=cmd_verify, description=DESCRIPTION + FOLLOW)
    add_arguments(parser)
    live = parser.add_argument_group("live queue (--follow)")
    live.add_argument("--follow", default=None, metavar="QUEUE", help="check this queue continuously")
    live.add_argument("--start", default="earliest",
                      help="where to start: earliest (default), latest, 'seq N', 'time T' (as ordq sub reset)")
    live.add_argument("--until", type=duration(0.001, 10**7), default=None, metavar="DURATION",
                      help="stop after this long (90s, 15m; a bare number is seconds) with the verdict")
    live.add_argument("--until-seq", type=int_in(0), default=None, metavar="N",
                      help="stop once seq N has been checked")
    live.add_argument("--trigger", type=duration(0.05, 3600), default=1.0, metavar="DURATION",
                      help="micro-batch interval (default 1s)")
    live.add_argument("--max-rows-per-batch", type=int_in(1), default=200_000, metavar="N",
                      help="at most N messages per micro-batch (default 200000)")
    live.add_argument("--checkpoint", default=None, metavar="DIR",
                      help="Spark checkpoint directory: a later run with the same DIR resumes there "
                           "(default: a temporary one, start from --start)")


def cmd_verify(args: argparse.Namespace) -> int:
    if getattr(args, "copy_of", None):  # the copy check needs no Spark
        return run(args, prog="ordq verify")
    # PySpark is an optional extra: say so in one line instead of a ModuleNotFoundError
    # traceback from deep inside the verifier.
    if importlib.util.find_spec("pyspark") is None:
        return failed("ordq verify", ConfigError(
            "ordq verify needs PySpark and Java 17+: pip install 'ordq[spark]' (docs/VERIFIER.md)"))
    if args.follow is None:
        # Spark's start alone takes seconds: said once it is longer than one (issue 42)
        master = f" ({args.master})" if args.master else ""
        with saying(f"verifying with Spark{master}: starting it and reading the audit files"):
            return run(args, prog="ordq verify")
    return _follow(args)


def _follow(args: argparse.Namespace) -> int:
    prog = "ordq verify --follow"
    try:
        if args.audit_dirs or args.acks or args.deliveries or args.skips or args.segments or args.keyed or args.topics:
            raise ConfigError("--follow reads the live queue: give no AUDIT_DIR, --acks, --deliveries, --skips, "
                              "--segments, --keyed or --topic with it")
        from ordq.sdk.positions import parse_reset_target
        from ordq.spark_order_check.follow import FollowOptions, follow

        parse_reset_target(args.start.split())
        state = follow(FollowOptions(
            zk=args.zk, root=args.root, queue=args.follow, start=args.start, until_s=args.until,
            until_seq=args.until_seq, trigger_s=args.trigger, max_rows_per_batch=args.max_rows_per_batch,
            master=args.master, conf=_conf(args.conf), checkpoint=args.checkpoint,
            bootstrap=getattr(args, "bootstrap", None) or None,
            as_json=bool(getattr(args, "json", False))))
    except Exception as exc:  # noqa: BLE001 - an OrdqError or a Spark/Java failure: one line
        return failed(prog, exc)
    return {"clean": EXIT_CLEAN, "violations": EXIT_VIOLATIONS}.get(state.verdict, EXIT_ERROR)
