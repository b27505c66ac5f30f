"""ordq drill NAME... | all | list | partitions: failover drills verified with Spark.

Each drill runs a producer and a consumer under steady load, injects its fault at a random
(seeded) moment, lets the run finish and asks ``spark_order_check`` for the verdict
(docs/OPERATIONS.md). The drills of processes and disks run on a local cluster; the partition
drills (``part-*``, ``ordq.drills.partitions``) on a cluster deployed in a lab of network
namespaces (root only: skipped with one line elsewhere). ``partitions`` mixes partitions, kills
and pauses at random for ``--rounds`` faults on one lab cluster and reports, per kind, the time
from each fault to the next acknowledged send. The exit code is 1 when any drill fails.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from ordq.commands import add_command, int_in, rate, wants_json
from ordq.output import emit_json, table, wrapped_table

EXIT_FAILED = 1


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "drill", func=cmd_drill,
        help="run failover drills (faults under load, verified with Spark)",
        description="Run failover drills: a producer and a consumer under steady load, one fault at a random "
        "moment, the verdict from spark_order_check over the audit files. NAME is a drill, 'all', or 'list'. "
        "Without --dir a local cluster is started for the run in a temporary folder and removed after it "
        "(kept when a drill fails); a cluster running in --dir is used and left running; a stopped or new one "
        "there is started and stopped again, its files kept.",
    )
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help="drill name(s), 'all', 'list', or 'partitions' (random partitions, kills and pauses "
                        "in a lab: --rounds faults)")
    parser.add_argument("--rounds", type=int_in(1, 1000), default=1, help="run each drill this many times (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault moments and choices "
                        "(default: random, printed)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="local cluster to use (used as is if running there, else started there and stopped "
                             "after)")
    parser.add_argument("--zk-nodes", type=int, choices=[1, 3], default=None,
                        help="ZooKeeper nodes of a cluster started for the run (default: 3 if a drill needs an "
                             "ensemble, else 1)")
    parser.add_argument("--messages", type=int_in(1, 10**9), default=20_000,
                        help="messages per drill (default %(default)s)")
    parser.add_argument("--rate", type=rate(), default=None,
                        help="messages per second (default 4000; 100 for 'partitions')")
    parser.add_argument("--master", default=None, help="Spark master for the verifier (default local[*])")
    parser.add_argument("--spark-cluster", action="store_true",
                        help="verify the lab drills (part-*) on a Spark standalone cluster started in their lab "
                             "(master h1, workers h2 and h3; the driver in a client host), not in this process; "
                             "docs/SPARK.md")
    parser.add_argument("--link-cut", type=int_in(1, 3600), default=None, metavar="SECONDS",
                        help="how long the mirror drill cuts the link between its two centres (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep every drill's files (audit, logs, report)")
    # A testing knob, hidden from --help (issue 42): make each run lose or reorder one delivery
    # before the verdict, so that the drill must FAIL (tests/test_drills.py).
    parser.add_argument("--test-hook", choices=["lose", "reorder"], default=None, help=argparse.SUPPRESS)


def cmd_drill(args: argparse.Namespace) -> int:
    from ordq.drills.catalog import CENTRES, DRILLS, ON_SPARK_CLUSTER
    from ordq.drills.partitions import PARTITIONS

    if args.names == ["list"]:
        rows = [{"drill": d.name, "fault": d.fault, "must_happen": d.must} for d in DRILLS.values()]
        rows += [{"drill": f.name, "fault": f.fault, "must_happen": f.must} for f in PARTITIONS.values()]
        rows += [{"drill": n, "fault": fault, "must_happen": must} for n, (fault, must) in CENTRES.items()]
        rows += [{"drill": n, "fault": fault, "must_happen": must}
                 for n, (_lab, fault, must) in ON_SPARK_CLUSTER.items()]
        if wants_json(args):
            emit_json(rows)
        else:
            import shutil

            wrapped_table(rows, "drill", [("fault", "fault"), ("must_happen", "must happen")],
                          width=min(100, shutil.get_terminal_size().columns))
        return 0
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    if args.names == ["partitions"]:
        if getattr(args, "spark_cluster", False):
            from ordq.common.errors import ConfigError

            raise ConfigError("--spark-cluster verifies named lab drills (part-*), not the randomized run")
        return run_randomized(args, seed)
    names = [*DRILLS, *PARTITIONS, *CENTRES] if args.names == ["all"] else list(args.names)
    for name, (lab_drill, _fault, _must) in ON_SPARK_CLUSTER.items():  # a lab drill, verified on the lab's Spark
        if name in names:
            names = [n for n in names if n != name] + ([lab_drill] if lab_drill not in names else [])
            args.spark_cluster = True
    unknown = [n for n in names if n not in DRILLS and n not in PARTITIONS and n not in CENTRES]
    if unknown:
        from ordq.common.errors import ConfigError

        raise ConfigError(f"unknown drill(s) {', '.join(unknown)}; see: ordq drill list")
    if args.rounds < 1:
        from ordq.common.errors import ConfigError

        raise ConfigError("--rounds must be >= 1")
    if getattr(args, "spark_cluster", False):
        from ordq.common.errors import ConfigError

        if args.master is not None:
            raise ConfigError("--spark-cluster starts the Spark cluster the lab drills are verified on: "
                              "give no --master")
        if not any(n in PARTITIONS for n in names):
            raise ConfigError("--spark-cluster verifies the lab drills (part-*, ordq drill list) on the lab's Spark "
                              "cluster: name one")
    drills = [DRILLS[n] for n in names if n in DRILLS]
    for drill in drills:
        if drill.requires is not None:
            drill.requires()  # e.g. the cdc drill's database servers: one line before any cluster starts
    return run_drills(args, drills, [n for n in names if n in PARTITIONS], seed,
                      centres=[n for n in names if n in CENTRES])


def run_drills(args: argparse.Namespace, drills: list[Any], lab_drills: list[str], seed: int, *,
               centres: list[str] | None = None) -> int:
    from ordq.common.proc import owning_children
    from ordq.drills.judge import TABLE_COLUMNS, summarize
    from ordq.drills.verdict import Verifier

    out = sys.stderr if wants_json(args) else sys.stdout
    started = time.monotonic()
    results: list[Any] = []
    with Verifier(master=args.master) as verifier:
        if drills:
            results += _run_local(args, drills, seed, verifier, out)
        if lab_drills:
            from ordq.drills.partitions import run_lab_drills

            # Killed or interrupted, the lab goes with this process (its reaper removes it).
            with owning_children(die_with_parent=True):
                folder = Path(tempfile.mkdtemp(prefix="ordq-lab-drills-"))
                out.write(f"partition drills: a lab cluster in {folder}\n")
                out.flush()
                lab_results = run_lab_drills(folder, lab_drills, verify=verifier, rounds=args.rounds, seed=seed,
                                             keep=args.keep, out=out,
                                             spark_cluster=bool(getattr(args, "spark_cluster", False)))
                if all(r.ok for r in lab_results) and not args.keep:
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    out.write(f"partition drills: files kept in {folder}\n")
                for verdict in {r.verdict for r in lab_results if r.skipped}:  # one clear line, not one per drill
                    out.write(f"partition drills: {verdict}\n")
            results += lab_results
        if centres:
            results += _run_centres(args, seed, out)
    total = time.monotonic() - started
    ok = all(r.ok for r in results)
    if wants_json(args):
        emit_json({"ok": ok, "seed": seed, "seconds": round(total, 1), "drills": [r.to_dict() for r in results]})
    else:
        print()
        table(summarize(results), TABLE_COLUMNS)
        passed = sum(r.ok and not r.skipped for r in results)
        skipped = sum(r.skipped for r in results)
        print(f"\n{passed} passed, {len(results) - passed - skipped} failed"
              + (f", {skipped} skipped" if skipped else "") + f" in {total:.0f}s (seed {seed})")
        for r in results:
            if not r.ok:
                with contextlib.suppress(Exception):
                    print(f"\n{r.name} round {r.round}: {r.verdict}; files: {r.run_dir}")
                    if r.report is not None and not r.report.ok:
                        print(r.report.summary())
    return 0 if ok else EXIT_FAILED


def _run_centres(args: argparse.Namespace, seed: int, out: Any) -> list[Any]:
    """The drill across data centres (``mirror``): two lab clusters, its own lab."""
    from ordq.common.proc import owning_children
    from ordq.drills.mirror_lab import LINK_CUT_S, run_mirror_drill

    results = []
    with owning_children(die_with_parent=True):  # killed or interrupted, the lab goes with this process
        for r in range(1, args.rounds + 1):
            folder = Path(tempfile.mkdtemp(prefix="ordq-mirror-drill-"))
            out.write(f"== drill mirror round {r}/{args.rounds}: two data centres in a lab in {folder}\n")
            out.flush()
            res = run_mirror_drill(folder, seed=seed + r - 1, out=out,
                                   link_cut_s=float(args.link_cut) if args.link_cut else LINK_CUT_S)
            res = attrs.evolve(res, round=r)
            if res.ok and not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
            elif not res.skipped:
                out.write(f"drill mirror: files kept in {folder}\n")
            results.append(res)
    return results


def _run_local(args: argparse.Namespace, drills: list[Any], seed: int, verifier: Any, out: Any) -> list[Any]:
    """The drills of processes and disks, on a local cluster (see the command's description)."""
    from ordq.cluster_config import ClusterConfig
    from ordq.common.proc import owning_children
    from ordq.drills.judge import run_series
    from ordq.drills.runner import LoadConfig
    from ordq.local_cluster import LocalCluster

    load = LoadConfig(messages=args.messages, rate=args.rate or 4_000.0)
    # A running cluster in --dir is used as it is and left running; a stopped one is started
    # and stopped again (its data kept); only a folder made for this run is deleted after it.
    own = True
    temporary = args.dir is None
    folder = args.dir or Path(tempfile.mkdtemp(prefix="ordq-drills-"))
    if LocalCluster.exists(folder):
        cluster = LocalCluster.load(folder)
        own = not cluster.running()
        out.write(f"{'starting' if own else 'using'} the local cluster in {cluster.folder}\n")
    else:
        zk_nodes = args.zk_nodes or (3 if any(d.needs_ensemble for d in drills) else 1)
        cluster = LocalCluster(folder, ClusterConfig(zk_nodes=zk_nodes))
        out.write(f"starting a local cluster in {cluster.folder} ({zk_nodes} ZooKeeper node(s), "
                  f"{cluster.config.groups} groups, {cluster.config.coordinators} coordinators)\n")
    out.flush()
    results = []
    # Killed or interrupted, the drill stops what it started: SIGTERM unwinds like Ctrl-C
    # (the finally below), and kill -9 takes its own cluster's processes with it.
    with owning_children(die_with_parent=own):
        try:
            if own:
                cluster.start()
            out.write(f"seed {seed}; {len(drills)} drill(s) x {args.rounds} round(s); {load.messages} messages at "
                      f"{load.rate:g}/s each\n")
            results = run_series(cluster, drills, verify=verifier, rounds=args.rounds, seed=seed, load=load,
                                 tamper=args.test_hook, keep=args.keep, out=out,
                                 report_path=cluster.folder / "drills" / f"report-seed{seed}.json")
        finally:
            if own:
                failed = any(not r.ok for r in results) or not results
                if temporary and not failed and not args.keep:
                    cluster.destroy()
                else:
                    cluster.stop()
                    out.write(f"cluster stopped; files kept in {cluster.folder}\n")
    return results


def run_randomized(args: argparse.Namespace, seed: int) -> int:
    """``ordq drill partitions``: random partitions, kills and pauses on one lab cluster."""
    from ordq.common.errors import ConfigError
    from ordq.common.proc import owning_children
    from ordq.drills.judge import TABLE_COLUMNS, summarize
    from ordq.drills.partitions import randomized
    from ordq.drills.verdict import Verifier
    from ordq.lab.lab import unavailable

    why = unavailable()
    if why is not None:
        raise ConfigError(f"ordq drill partitions needs a lab (root, ip netns, iptables): {why}")
    out = sys.stderr if wants_json(args) else sys.stdout
    folder = args.dir or Path(tempfile.mkdtemp(prefix="ordq-partitions-"))
    from ordq.drills.partitions import FAULTS_PER_STREAM

    args.rate = args.rate or 100.0
    load = f"{args.rounds} faults, a stream at {args.rate:g} msgs/s, a new stream every {FAULTS_PER_STREAM} faults"
    out.write(f"seed {seed}; {load}; files in {folder}\n")
    out.flush()
    with owning_children(die_with_parent=True), Verifier(master=args.master) as verifier:
        run = randomized(folder, rounds=args.rounds, seed=seed, verify=verifier, rate=args.rate, out=out)
    if wants_json(args):
        emit_json({"ok": run.ok, "seed": seed, "rounds": run.rounds, "seconds": round(run.seconds, 1),
                   "per_kind": run.per_kind(), "streams": [r.to_dict() for r in run.results]})
    else:
        print()
        table(run.per_kind(), ["kind", "faults", "no_effect", "next_ack_p50_s", "next_ack_p99_s", "next_ack_max_s"])
        print()
        table(summarize(run.results), TABLE_COLUMNS)
        verdict = "PASS" if run.ok else "FAIL"
        print(f"\n{verdict}: {run.rounds} faults on {len(run.results)} stream(s) in {run.seconds:.0f}s (seed {seed})")
    if run.ok and not args.keep and args.dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if run.ok else EXIT_FAILED
