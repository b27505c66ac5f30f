"""ordq lab up|down|status|exec, ordq lab spark up|down|status: a lab of hosts on this machine
(network namespaces; needs root), and a Spark standalone cluster inside it.

``up`` makes a lab that lasts until ``down`` (no owner process: nothing reaps it); the lab
library's owned labs (tests, drills) are removed when their process dies. docs/OPERATIONS.md,
"A lab of hosts on one machine".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ordq.commands import add_command, int_in, wants_json
from ordq.output import emit_json, table

DEFAULT_DIR = Path(".ordq/lab")


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "lab", help="a lab of hosts on this machine: network namespaces (needs root)")
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION")
    sub.required = True
    up = add_command(sub, "up", func=cmd_up,
                     help="make a lab of N hosts (namespaces on a bridge, one address each); it lasts until down",
                     description="Make a lab of N hosts h1..hN: each a network namespace with one link to a "
                     "bridge in a switch namespace, and one address on a private /24 subnet that nothing routes "
                     "out of the machine. Refuses a subnet already in use. Needs root. Run a command in a host "
                     "with: ip netns exec NAMESPACE COMMAND.")
    _dir_option(up)
    up.add_argument("--hosts", type=int_in(1, 50), default=3, help="how many hosts (default %(default)s)")
    up.add_argument("--subnet", default=None, metavar="CIDR",
                    help="the lab's private IPv4 subnet (default: a 10.200-239.Y.0/24 derived from the lab's id)")
    down = add_command(sub, "down", func=cmd_down,
                       help="remove the lab in --dir (or --id): its processes, namespaces, links and rules")
    _dir_option(down)
    down.add_argument("--id", default=None, metavar="LAB",
                      help="remove the lab with this id instead (one left behind; ids: ordq lab status)")
    run = add_command(sub, "exec", func=cmd_exec, help="run a command inside a host of the lab in --dir",
                      description="Run COMMAND inside HOST of the lab in --dir (ip netns exec): it sees the "
                      "host's link and address only. Exits with the command's exit code.")
    _dir_option(run)
    run.add_argument("host", help="h1, h2, ...")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    add_command(sub, "status", func=cmd_status, help="every lab on this machine: id, subnet, hosts, owner, folder")
    _register_spark(sub)


def _register_spark(sub: Any) -> None:
    parser = add_command(sub, "spark", help="a Spark standalone cluster inside the lab in --dir (up, down, status)",
                         description="A Spark standalone cluster in the lab: a master on one host, a worker on each "
                         "of others, started with PySpark's own launcher (bin/spark-class); each binds its host's "
                         "lab address only. Their logs: <dir>/run/<host>-spark-*.log; work and scratch folders: "
                         "<dir>/spark/. The lab's down removes them too. docs/SPARK.md, \"On a Spark cluster\".")
    actions = parser.add_subparsers(dest="spark_command", metavar="ACTION")
    actions.required = True
    up = add_command(actions, "up", func=cmd_spark_up,
                     help="start the master and the workers; print the master URL once every worker registered")
    _dir_option(up)
    up.add_argument("--master-host", default="h1", metavar="HOST", help="the master's host (default %(default)s)")
    up.add_argument("--workers", default="h2,h3", metavar="HOST,...",
                    help="one worker on each of these hosts (default %(default)s)")
    up.add_argument("--worker-cores", type=int_in(1, 64), default=1, metavar="N",
                    help="cores each worker offers (default %(default)s)")
    up.add_argument("--worker-memory", default="1g", metavar="SIZE",
                    help="memory each worker offers its executors, 512m or 1g (default %(default)s)")
    up.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help="how long to wait for every worker to register (default 120, stretched by the "
                         "machine's load)")
    down = add_command(actions, "down", func=cmd_spark_down,
                       help="stop the workers (their executors with them) and the master; remove <dir>/spark")
    _dir_option(down)
    status = add_command(actions, "status", func=cmd_spark_status, help="the master URL and each daemon's host and pid")
    _dir_option(status)


def _dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="folder of the lab's record and its processes' logs (default %(default)s)")


def cmd_up(args: argparse.Namespace) -> int:
    from ordq.lab import Lab

    started = time.monotonic()
    lab = Lab.create(args.dir, hosts=args.hosts, subnet=args.subnet, owned=False)
    took = time.monotonic() - started
    lab.detach()  # it lasts after this command
    info = lab.describe()
    if wants_json(args):
        emit_json({**info, "seconds": round(took, 3)})
        return 0
    print(f"lab {lab.id} up in {took:.2f}s: {len(lab.hosts)} hosts on {lab.subnet} (record in {lab.folder})")
    table(info["hosts"], ["host", "address", "namespace"])
    print(f"remove it with: ordq lab down --dir {args.dir}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from ordq.lab import Lab
    from ordq.lab.lab import remove, require_root

    require_root()
    if args.id is not None:
        started = time.monotonic()
        deleted = remove(args.id)
        took = time.monotonic() - started
        if wants_json(args):
            emit_json({"removed": args.id, "namespaces": deleted, "seconds": round(took, 3)})
        else:
            print(f"lab {args.id} removed in {took:.2f}s ({len(deleted)} namespaces)")
        return 0
    if not (args.dir / "lab.json").exists():
        if wants_json(args):
            emit_json({"dir": str(args.dir), "removed": None})
        else:
            print(f"no lab in {args.dir}: nothing to remove")
        return 0
    lab = Lab.load(args.dir)
    started = time.monotonic()
    deleted = lab.down()
    took = time.monotonic() - started
    if wants_json(args):
        emit_json({"dir": str(lab.folder), "removed": lab.id, "namespaces": deleted, "seconds": round(took, 3)})
    else:
        print(f"lab {lab.id} removed in {took:.2f}s ({len(deleted)} namespaces)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ordq.lab import status

    rows = status()
    if wants_json(args):
        emit_json({"labs": rows})
    elif not rows:
        print("no lab on this machine")
    else:
        table(rows, ["id", "subnet", "hosts", "up", "owner", "dir"])
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    import subprocess

    from ordq.common.errors import ConfigError
    from ordq.lab import Lab
    from ordq.lab.netns import in_namespace

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ConfigError("name the command to run: ordq lab exec HOST -- COMMAND")
    lab = Lab.load(args.dir)
    # A child, not exec: main() also runs inside other programs (the tests).
    return subprocess.run(in_namespace(lab.namespace(args.host), argv), check=False).returncode


def cmd_spark_up(args: argparse.Namespace) -> int:
    from ordq.lab import Lab
    from ordq.lab.lab import require_root
    from ordq.lab.spark import LabSpark, SparkLayout

    require_root()
    lab = Lab.load(args.dir)
    layout = SparkLayout(master=args.master_host, workers=tuple(h for h in args.workers.split(",") if h),
                         cores=args.worker_cores, memory=args.worker_memory)
    started = time.monotonic()
    spark = LabSpark.start(lab, layout, timeout_s=args.timeout, die_with_parent=False)
    took = time.monotonic() - started
    spark.detach()  # it lasts after this command, until `ordq lab spark down` or the lab's down
    info = spark.describe()
    if wants_json(args):
        emit_json({**info, "seconds": round(took, 3)})
        return 0
    print(f"Spark master {spark.master_url} up in {took:.1f}s with {len(layout.workers)} workers")
    table(info["hosts"], ["host", "role", "address", "pid", "cores", "memory"])
    print(f"verify on it from a host of the lab: ordq lab exec --dir {args.dir} h4 -- ordq verify --master "
          f"{spark.master_url} AUDIT_DIR")
    return 0


def cmd_spark_down(args: argparse.Namespace) -> int:
    from ordq.common.errors import ConfigError
    from ordq.lab import Lab
    from ordq.lab.lab import require_root
    from ordq.lab.spark import LabSpark

    require_root()
    lab = Lab.load(args.dir)
    try:
        spark = LabSpark.load(lab)
    except ConfigError:
        if wants_json(args):
            emit_json({"dir": str(args.dir), "stopped": None})
        else:
            print(f"no Spark cluster in lab {lab.id}: nothing to stop")
        return 0
    started = time.monotonic()
    url = spark.master_url
    spark.stop()
    took = time.monotonic() - started
    if wants_json(args):
        emit_json({"dir": str(lab.folder), "stopped": url, "seconds": round(took, 3)})
    else:
        print(f"Spark cluster {url} stopped in {took:.1f}s")
    return 0


def cmd_spark_status(args: argparse.Namespace) -> int:
    from ordq.lab import Lab
    from ordq.lab.spark import LabSpark

    spark = LabSpark.load(Lab.load(args.dir))
    info = spark.describe()
    if wants_json(args):
        emit_json(info)
    else:
        print(f"Spark master {spark.master_url}")
        table(info["hosts"], ["host", "role", "address", "pid", "cores", "memory"])
    return 0
