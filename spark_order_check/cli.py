"""Command line of the verifier, shared by ``python -m ordq.spark_order_check`` and ``ordq verify``.

Exit codes: 0 clean, 1 violations found, 2 could not verify (bad input, Spark failure).
Importing this module does not import PySpark.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Sequence

from ordq.common.errors import ConfigError, OrdqError

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_ERROR = 0, 1, 2

DESCRIPTION = (
    "Verify an ordq run from its audit files with Spark: nothing acked was lost, nothing was "
    "reordered, duplicated or corrupted (docs/VERIFIER.md). Exit 0 only when clean, 1 on "
    "violations, 2 when the run could not be verified."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("audit_dirs", nargs="*", metavar="AUDIT_DIR",
                        help="a run's audit directory, holding acks/ and deliveries/ (repeatable)")
    parser.add_argument("--acks", action="append", default=[], metavar="PATH",
                        help="producer ack files: a directory, file or glob (repeatable)")
    parser.add_argument("--deliveries", action="append", default=[], metavar="PATH",
                        help="consumer delivery files: a directory, file or glob (repeatable)")
    parser.add_argument("--skips", action="append", default=[], metavar="PATH",
                        help="skip records of parked messages (an AUDIT_DIR's skips/ is read when it exists): "
                             "a parked seq with its record is skipped, not lost")
    parser.add_argument("--starts", action="append", default=[], metavar="PATH",
                        help="start records of consumers (an AUDIT_DIR's starts/ is read when it exists): a "
                             "subscription is judged from where its first consumer began")
    parser.add_argument("--segments", action="append", default=[], metavar="DIR",
                        help="broker data directory <data>/<queue>/<seg>/segment.log, one per replica "
                             "(repeatable): also check the stored order and replica agreement")
    parser.add_argument("--keyed", action="append", default=[], metavar="SUB",
                        help="subscription consumed with per-key order, SUB or QUEUE/SUB (repeatable)")
    parser.add_argument("--topic", action="append", default=[], dest="topics", metavar="TOPIC",
                        help="a keyed topic in the run (repeatable): its partitions' subscriptions are checked "
                             "per key, and no key may be in two of its partitions")
    parser.add_argument("--copy-of", default=None, metavar="SOURCE_AUDIT_DIR",
                        help="check the copy AUDIT_DIR (a mirror's target: its deliveries/, else acks/) against this "
                             "source run's acks/: nothing lost, no duplicate, order kept; names the first divergence "
                             "(no Spark)")
    parser.add_argument("--master", default=None,
                        help="Spark master URL: local[N], spark://HOST:7077, yarn, k8s://... (default local[*], or "
                             "what spark-submit set); on a cluster ordq's code goes to the executors as a zip "
                             "(docs/SPARK.md, \"On a Spark cluster\")")
    parser.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                        help="Spark Connect: refused with the reason (the verifier needs the JVM of a classic "
                             "session); use --master")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="one line per finished Spark stage on stderr (default: on for a cluster master)")
    parser.add_argument("--driver-memory", default=None, metavar="SIZE",
                        help="spark.driver.memory for a session this command starts, e.g. 4g")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")
    parser.add_argument("--report", default=None, metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--plot", default=None, metavar="FILE", help="also write a latency histogram PNG here")


def _conf(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--conf wants KEY=VALUE, not {item!r}")
        out[key.strip()] = value.strip()
    return out


def side_dirs(audit_dirs: Sequence[str], kind: str) -> list[str]:
    """``AUDIT_DIR/<kind>`` (skips: a consumer parked; starts: where consumers began) of each
    audit folder holding such records, as given: a local path or a ``file://`` URL (looked at
    on this host; a ``file://`` folder read as a plain path missed them, and a parked seq was
    counted lost)."""
    out = []
    for d in audit_dirs:
        local = d[len("file://"):] if d.startswith("file://") else d
        if glob.glob(os.path.join(glob.escape(local), kind, "*.tsv*")):
            out.append(os.path.join(d, kind))
    return out


def run(args: argparse.Namespace, *, prog: str) -> int:
    """Run the verification the parsed ``args`` describe; print the summary or JSON."""
    if getattr(args, "copy_of", None):
        return run_copy(args, prog=prog)
    try:
        acks = list(args.acks) + [os.path.join(d, "acks") for d in args.audit_dirs]
        deliveries = list(args.deliveries) + [os.path.join(d, "deliveries") for d in args.audit_dirs]
        if not acks or not deliveries:
            raise ConfigError("give an AUDIT_DIR, or both --acks and --deliveries")
        skips = list(args.skips) + side_dirs(args.audit_dirs, "skips")
        starts = list(args.starts) + side_dirs(args.audit_dirs, "starts")
        conf = _conf(args.conf)
        refuse_remote(args.remote)
        from ordq.spark_order_check._verify import verify

        show = args.progress if args.progress is not None else is_cluster(args.master)

        report = verify(acks=acks, deliveries=deliveries, skips=skips or None, starts=starts or None,
                        segments=args.segments or None,
                        keyed=args.keyed, topics=args.topics,
                        master=args.master, conf=conf, driver_memory=args.driver_memory,
                        report_path=args.report, plot_path=args.plot, progress=sys.stderr if show else None)
    except Exception as exc:  # noqa: BLE001 - an OrdqError or a Spark/Java failure: one line
        return failed(prog, exc)
    if getattr(args, "json", False):
        json.dump(report.to_dict(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(report.summary())
    return EXIT_CLEAN if report.ok else EXIT_VIOLATIONS


def is_cluster(master: str | None) -> bool:
    """A master whose executors run in other processes (not ``local``, not unset)."""
    return master is not None and not master.startswith("local")


def refuse_remote(remote: str | None) -> None:
    """ConfigError for ``--remote``: the verifier persists and releases plans through the
    session's JVM, which a Spark Connect client has not."""
    if remote is not None:
        raise ConfigError(f"--remote {remote}: Spark Connect is not supported: the verifier needs a classic session "
                          "(it keeps and releases intermediate results through Spark's JVM); run it with "
                          "--master spark://HOST:7077 (or yarn, k8s://...) where Spark Connect's server runs")


def failed(prog: str, exc: Exception) -> int:
    """EXIT_ERROR after one line on stderr for an OrdqError or a Spark/Java failure (never a
    Java stack); anything else is a bug and is raised again."""
    if isinstance(exc, OrdqError):
        print(f"{prog}: error: {exc}", file=sys.stderr)
    elif _is_spark_error(exc):
        print(f"{prog}: error: Spark failed: {_first_line(exc)}", file=sys.stderr)
    else:
        raise exc
    return EXIT_ERROR


def _is_spark_error(exc: BaseException) -> bool:
    names = {cls.__module__.split(".")[0] for cls in type(exc).__mro__}
    return bool(names & {"pyspark", "py4j"})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ordq.spark_order_check", description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    args = parser.parse_args(argv)
    return run(args, prog="spark_order_check")



def run_copy(args: argparse.Namespace, *, prog: str) -> int:
    """``--copy-of SOURCE COPY``: the copy check (ordq.spark_order_check.copy_check)."""
    from ordq.spark_order_check.copy_check import check_copy, copy_rows, source_acks

    try:
        if len(args.audit_dirs) != 1 or args.acks or args.deliveries:
            raise ConfigError("--copy-of SOURCE_AUDIT_DIR takes one AUDIT_DIR, the copy's")
        copy_dir = args.audit_dirs[0]
        deliveries = os.path.join(copy_dir, "deliveries")
        result = check_copy(source_acks([os.path.join(args.copy_of, "acks")]),
                            copy_rows([deliveries] if os.path.isdir(deliveries) else [],
                                      [os.path.join(copy_dir, "acks")]))
    except OrdqError as exc:
        return failed(prog, exc)
    report = result.to_dict()
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        print(f"{prog} --copy-of: {report['verdict']}")
        print(f"source: {result.source_messages:,} acked messages from seq {result.first_source_seq}; "
              f"copy: {result.copy_messages:,} messages")
        print("  ".join(f"{k} {result.counts[k]}" for k in ("lost", "duplicated", "reordered", "foreign")))
        if result.first_divergence is not None:
            print(f"first divergence: {result.first_divergence.describe()}")
    return EXIT_CLEAN if result.clean else EXIT_VIOLATIONS
