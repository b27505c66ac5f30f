"""ordq demo: a local cluster, ordered traffic, the head master killed mid-run, a Spark verdict.

The kill-head-master drill (``ordq.drills.catalog``) with a live display: acked, delivered, the
send head and the consume head, refreshed in place; then ``spark_order_check`` over the run's
audit files and its report. Everything it started is stopped in a ``finally`` (Ctrl-C too);
the files (logs, audit, report) stay in ``--dir``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ordq.commands import add_command, int_in, rate
from ordq.common.errors import ConfigError
from ordq.common.proc import load_stretched
from ordq.output import table

DEMO_MARKER = ".ordq-demo"


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "demo", func=cmd_demo,
        help="see it work: local cluster, ordered traffic, head master killed mid-run, Spark verdict",
        description="Start a local cluster, run ordered traffic from a producer process to a consumer process, "
        "kill -9 the head master mid-run and show the failover live, then verify every message with "
        "spark_order_check. Nothing is left running; logs, audit files and the report stay in --dir.",
    )
    parser.add_argument("--dir", type=Path, default=Path(".ordq-demo"),
                        help="folder of the demo's cluster and files, wiped at start (default %(default)s)")
    parser.add_argument("--messages", type=int_in(1, 10**9), default=None,
                        help="messages to send (default 40000; with --cdc: row changes, default 2000)")
    parser.add_argument("--rate", type=rate(), default=None,
                        help="messages per second (default 4000; with --cdc: row changes, default 500)")
    parser.add_argument("--cdc", action="store_true",
                        help="the CDC path instead: a MariaDB source -> ordq cdc mysql -> queue -> ordq cdc apply -> "
                             "a PostgreSQL target, the shipper, applier and head master killed mid-run, the tables "
                             "compared at the end (needs mariadb-server and postgresql: make test-deps)")
    parser.add_argument("--mirror", action="store_true",
                        help="the CDC path across two data centres: MariaDB in centre 1 -> ordq cdc mysql -> queue "
                             "-> ordq mirror -> queue in centre 2 -> ordq cdc apply -> PostgreSQL in centre 2 (two "
                             "local clusters), the shipper, mirror, applier and both head masters killed and the "
                             "link between the centres cut mid-run, the tables compared at the end (needs root, "
                             "iptables, mariadb-server and postgresql: make test-deps)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the moment of the kill (default: random)")
    parser.add_argument("--master", default=None, help="Spark master for the verification (default local[*])")


def cmd_demo(args: argparse.Namespace) -> int:
    from ordq.cluster_config import ClusterConfig
    from ordq.drills.catalog import DRILLS
    from ordq.drills.judge import TABLE_COLUMNS, judge_all
    from ordq.drills.runner import LoadConfig, execute_drill
    from ordq.drills.verdict import Verifier
    from ordq.local_cluster import LocalCluster

    out = sys.stdout
    if args.cdc and args.mirror:
        raise ConfigError("--cdc and --mirror are two demos: choose one")
    cdc = args.cdc or args.mirror
    drill = DRILLS["cdc-mirror" if args.mirror else "cdc" if args.cdc else "kill-head-master"]
    if drill.requires is not None:
        drill.requires()  # one line, before anything starts
    folder = _fresh_folder(args.dir)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(100_000)
    load = LoadConfig(messages=args.messages or (2_000 if cdc else 40_000),
                      rate=args.rate or (500.0 if cdc else 4_000.0))
    shape = ClusterConfig(groups=2, zk_nodes=1, coordinators=1) if args.mirror else ClusterConfig(
        groups=3, zk_nodes=1, coordinators=2)
    cluster = LocalCluster(folder, shape)
    display = LiveDisplay(out)
    started = time.monotonic()
    try:
        _step(out, "1/4", "starting centre 1's cluster: ZooKeeper, 2 broker groups (a master and a slave "
              "process each), 1 coordinator daemon (the drill starts centre 2's, of the same shape)" if args.mirror
              else "starting a local cluster: ZooKeeper, 3 broker groups (a master and a slave process each), "
              "2 coordinator daemons")
        cluster.start(timeout_s=load_stretched(120.0))  # slower on a loaded machine, not stuck
        rows = [{"process": s.name, "pid": s.pid, "listen": s.listen, "state": s.state} for s in cluster.status()]
        table(rows, ["process", "pid", "listen", "state"], out)
        out.write(f"ready in {time.monotonic() - started:.1f}s\n")
        if args.mirror:
            _step(out, "2/4", f"replication across data centres: an application commits {load.messages:,} row "
                  f"changes to MariaDB in centre 1 at ~{load.rate:,.0f}/s; ordq cdc mysql ships its binlog to the "
                  "queue in centre 1, ordq mirror copies the queue to centre 2, ordq cdc apply replays it into "
                  "PostgreSQL in centre 2; the shipper, the mirror, the applier and the head master of each centre "
                  "are killed (-9), and the link between the centres is cut and healed, at random moments")
            run = execute_drill(cluster, drill, seed=seed, load=load, out=display, queue="demo-mirror")
        elif args.cdc:
            _step(out, "2/4", f"change data capture: an application commits {load.messages:,} row changes "
                  f"(inserts, updates, deletes) to MariaDB at ~{load.rate:,.0f}/s; ordq cdc mysql ships its binlog "
                  "to the queue, ordq cdc apply replays the queue into PostgreSQL; the shipper, the applier and "
                  "the head master are killed (-9) at random moments")
            run = execute_drill(cluster, drill, seed=seed, load=load, out=display, queue="demo-cdc")
        else:
            _step(out, "2/4", f"ordered traffic: {load.messages:,} messages at {load.rate:,.0f}/s from a producer "
                  "process to a consumer process; the head group's master is killed (-9) mid-run")
            run = execute_drill(cluster, drill, seed=seed, load=load, out=display, queue="demo",
                                monitor=display.monitor)
        display.close()
        if run.error:
            out.write(f"the run failed: {run.error}\nlogs: {run.ctx.run_dir}\n")
            return 1
        _step(out, "3/4", "verifying every acked and delivered message with Spark (spark_order_check)")
        out.flush()
        with Verifier(master=args.master, log_path=folder / "spark.log") as verifier:
            result = judge_all([run], verifier, keep=True, report_path=folder / "report.json")[0]
        if result.report is not None:
            out.write(result.report.summary() + "\n")
        _step(out, "4/4", "result")
        table([result.row()], TABLE_COLUMNS, out)
        for what, ok in result.expectations:
            out.write(f"  {'ok' if ok else 'NOT MET'}: {what}\n")
        if result.ok and args.mirror:
            out.write(f"\nPASS: centre 2's tables equal centre 1's row for row, and all {result.acked:,} acked "
                      f"row changes reached centre 2 exactly once and in order through "
                      f"{sum(text.startswith('FAULT') for _, text in result.events)} faults "
                      f"({run.ctx.notes.get('rows_per_s', 0):,.0f} row changes/s end to end).\n")
        elif result.ok and args.cdc:
            out.write(f"\nPASS: the target's tables equal the source's row for row, and all {result.acked:,} acked "
                      f"row changes were delivered exactly once and in order through "
                      f"{sum(text.startswith('FAULT') for _, text in result.events)} kills "
                      f"({run.ctx.notes.get('rows_per_s', 0):,.0f} row changes/s end to end).\n")
        elif result.ok:
            fo = f"{result.failover_s * 1000:.0f} ms" if result.failover_s is not None else "-"
            out.write(f"\nPASS: all {result.acked:,} acked messages delivered exactly once and in order across "
                      f"the failover (kill -9 -> first ack on the next group: {fo}).\n")
        else:
            out.write(f"\nFAIL: {result.verdict}\n")
        out.write(f"files: {run.ctx.run_dir} (audit, logs), {(folder / 'report.json').absolute()}\n")
        return 0 if result.ok else 1
    finally:
        display.close()
        stopped = cluster.stop()
        out.write(f"demo over in {time.monotonic() - started:.0f}s: stopped {len(stopped)} cluster processes, "
                  "nothing left running\n")
        out.flush()


def _fresh_folder(folder: Path) -> Path:
    """Wipe a previous demo's folder (never a folder that is not a demo's)."""
    from ordq.local_cluster import LocalCluster

    if folder.exists() and any(folder.iterdir()):
        if not (folder / DEMO_MARKER).exists():
            raise ConfigError(f"{folder} exists and is not a demo folder: choose another --dir")
        if LocalCluster.exists(folder):
            LocalCluster.load(folder).destroy()
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DEMO_MARKER).write_text("made by ordq demo; wiped by the next one\n")
    return folder


def _step(out: TextIO, n: str, text: str) -> None:
    out.write(f"\n[{n}] {text}\n")
    out.flush()


class LiveDisplay:
    """Events as lines, plus one progress line refreshed in place (a terminal), or printed once
    a second (a pipe). ``write`` makes it usable as the drill's event stream."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._lock = threading.Lock()
        self._line = ""
        self._last_plain = 0.0
        self._closed = False

    def write(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.out.write(text)
            self._draw()

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self.tty and self._line:
                    self.out.write("\n")
                self.out.flush()

    def show(self, line: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._clear()
            self._line = line
            if self.tty:
                self._draw()
            elif time.monotonic() - self._last_plain >= 1.0:
                self.out.write(line + "\n")
                self._last_plain = time.monotonic()
            self.out.flush()

    def _clear(self) -> None:
        if self.tty and self._line and not self._closed:
            self.out.write("\r\x1b[2K")

    def _draw(self) -> None:
        if self.tty and self._line and not self._closed:
            self.out.write(self._line)
        self.out.flush()

    def monitor(self, ctx: Any, done: threading.Event) -> None:
        """The progress line of a drill run, from its status files and ZooKeeper."""
        from ordq.common.errors import OrdqError

        started = time.monotonic()
        try:
            store_cm = ctx.cluster.store()
            store = store_cm.__enter__()
        except OrdqError:
            return
        try:
            while not done.wait(0.2):
                try:
                    st, _ = store.load_state(ctx.queue)
                except OrdqError:
                    continue
                self.show(progress_line(ctx, st, time.monotonic() - started))
        finally:
            store_cm.__exit__(None, None, None)


def progress_line(ctx: Any, st: Any, elapsed_s: float) -> str:
    total = ctx.load.messages
    prod = [w.status() for w in ctx.producers]
    cons = [w.status() for w in ctx.consumers]
    acked = sum(p.get("acked", 0) for p in prod)
    delivered = max((c.get("last_seq", -1) for c in cons), default=-1) + 1
    open_seg = st.open_segment
    send = f"{open_seg.gid}/seg {open_seg.seg}" if open_seg is not None else "none: failing over"
    head = st.consume[0] if st.consume else None
    consume = f"{head.gid}/seg {head.seg} {head.status.value}" if head is not None else "-"
    line = (f"  {elapsed_s:5.1f}s | acked {acked:>6,}/{total:,} | delivered {delivered:>6,} | "
            f"send head {send} | consume head {consume}")
    if ctx.fault_us is not None and ctx.fault_seg is not None:
        firsts = [int(v) for p in prod for s, v in p.get("seg_first_ack_us", {}).items() if int(s) > ctx.fault_seg]
        if firsts:
            line += f" | failover {(min(firsts) - ctx.fault_us) / 1000:.0f} ms"
    return line
