"""ordq mirror run|status: copy a queue to another cluster, in order, each message once
(ordq.mirror), and show how far the copy is behind."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ordq.commands import add_command, int_in, seconds, wants_json
from ordq.commands.outbox import _status
from ordq.common.proc import wait_for_stop
from ordq.output import emit_json, table

END_HELP = ("ZK_HOSTS/ROOT/QUEUE: a cluster as registered by ordq up (its --zk and --root), and a queue of it; "
            "ZK_HOSTS/ROOT/topic:TOPIC: every partition of a keyed topic, each to the same partition of the "
            "target's topic (the same partition count, or refused)")


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "mirror", help="copy a queue to another cluster, in order, each message once")
    sub = parser.add_subparsers(dest="mirror_command", metavar="ACTION")
    sub.required = True
    run = add_command(
        sub, "run", func=cmd_run,
        help="run a mirror (several instances: one copies, the others wait as standbys)",
        description="Copy every message of the source queue to the target queue, in the source's order, each "
        "once, with the source seq and the chain of clusters it came through in its x-ordq-mirror header. The "
        "target's producer lease elects one instance; after any restart or takeover the copy goes on after the "
        "target's last message. While a cluster cannot be reached it waits and tries again. Runs until "
        "SIGTERM/Ctrl-C.")
    for r in (run,):
        r.add_argument("--from", dest="source", required=True, metavar="SOURCE", help=f"the source, {END_HELP}")
        r.add_argument("--to", dest="target", required=True, metavar="TARGET", help=f"the target, {END_HELP}")
        r.add_argument("--subscription", "-s", default=None,
                       help="the source subscription (default: mirror.<target cluster id>)")
    run.add_argument("--start", default="earliest",
                     help="where a new subscription starts while the target is empty: earliest, latest, 'seq N' "
                     "(default %(default)s)")
    run.add_argument("--instance", default=None, help="this instance's name in leases and logs (default: host-pid)")
    run.add_argument("--max-batch", type=int_in(1, 100_000), default=2000, metavar="N",
                     help="messages copied per round (default %(default)s)")
    run.add_argument("--send-timeout", type=seconds(), default=2.0, metavar="SECONDS",
                     help="ack deadline on the target before its producer fails over (default %(default)s)")
    run.add_argument("--lease-ttl", type=seconds(), default=5.0, metavar="SECONDS",
                     help="the leases' ttl: how soon a standby takes over a dead leader (default %(default)s)")
    run.add_argument("--retry-max", type=seconds(), default=5.0, metavar="SECONDS",
                     help="the longest wait between attempts while a cluster is unreachable (default %(default)s)")
    run.add_argument("--metrics", default=None, metavar="HOST:PORT",
                     help="serve Prometheus series (ordq_mirror_*) here (port 0: any; printed as METRICS URL)")
    run.add_argument("--audit-dir", type=Path, default=None,
                     help="write the target producer's ack audit here (ordq verify --copy-of)")

    status = add_command(sub, "status", func=cmd_status, help="how far a mirror's copy is behind its source",
                         description="The source's last seq, the last source seq the target holds (its last "
                         "message's x-ordq-mirror chain), and the lag in messages and seconds. Exit 0.")
    status.add_argument("--from", dest="source", required=True, metavar="SOURCE", help=f"the source, {END_HELP}")
    status.add_argument("--to", dest="target", required=True, metavar="TARGET", help=f"the target, {END_HELP}")
    status.add_argument("--subscription", "-s", default=None,
                        help="the source subscription (default: mirror.<target cluster id>)")


def _config(args: argparse.Namespace) -> Any:
    from ordq.mirror.config import MirrorConfig, RetryPolicy, parse_end

    return MirrorConfig(source=parse_end(args.source), target=parse_end(args.target),
                        subscription=args.subscription, start=getattr(args, "start", "earliest"),
                        instance=getattr(args, "instance", None), max_batch=getattr(args, "max_batch", 2000),
                        send_timeout_s=getattr(args, "send_timeout", 2.0), lease_ttl_s=getattr(args, "lease_ttl", 5.0),
                        retry=RetryPolicy(max_s=max(getattr(args, "retry_max", 5.0), 0.2)),
                        audit_dir=getattr(args, "audit_dir", None), metrics_listen=getattr(args, "metrics", None))


def cmd_run(args: argparse.Namespace) -> int:
    from ordq.mirror.lag import LagWatch, MirrorMetrics, MirrorSnapshot, SourceProbe
    from ordq.mirror.runner import Mirror, MirrorStats
    from ordq.mirror.topic import partition_configs

    cfg = _config(args)
    configs = partition_configs(cfg)  # one mirror per partition of a topic
    logging.getLogger("ordq").setLevel(logging.INFO)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    def state_line(c: Any) -> Any:
        return lambda state: _status(f"{state.upper()} mirror {c.source} -> {c.target}")

    mirrors = [Mirror(c, on_state=state_line(c)) for c in configs]

    def copied(mirror: Mirror) -> Any:
        return lambda: mirror.statistics().last_source_seq if mirror.statistics().leaderships else None

    watches = [LagWatch(SourceProbe(c.source, c.sub), copied(m)) for c, m in zip(configs, mirrors, strict=True)]
    metrics = None
    if cfg.metrics_listen is not None:
        def snapshot(mirror: Mirror, watch: LagWatch) -> Any:
            def read() -> MirrorSnapshot:
                st = mirror.statistics()
                return MirrorSnapshot(st.state, st.copied, st.skipped, st.retries, st.leaderships, watch.latest)
            return read

        metrics = MirrorMetrics([({"source": str(c.source), "target": str(c.target)}, snapshot(m, w))
                                 for c, m, w in zip(configs, mirrors, watches, strict=True)],
                                listen=cfg.metrics_listen)
        assert metrics.server is not None
        _status(f"METRICS {metrics.server.url}")
    failures: list[BaseException] = []

    def run(mirror: Mirror) -> None:
        try:
            mirror.run(stop)
        except BaseException as exc:  # a final error of one partition stops them all, and is raised
            failures.append(exc)
            stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    threads = [threading.Thread(target=run, args=(m,), name=f"ordq-mirror-{i}", daemon=True)
               for i, m in enumerate(mirrors)]
    try:
        _status(f"STARTED mirror {cfg.source} -> {cfg.target} (subscription {cfg.sub}"
                + (f" on each of {len(configs)} partitions)" if cfg.source.topic else ")"))
        for t in threads:
            t.start()
        wait_for_stop(stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        stop.set()
        for t in threads:
            t.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics is not None:
            metrics.close()
        for w in watches:
            w.close()
    if failures:
        raise failures[0]
    all_stats = [m.statistics() for m in mirrors]
    stats = MirrorStats(copied=sum(s.copied for s in all_stats), skipped=sum(s.skipped for s in all_stats),
                        retries=sum(s.retries for s in all_stats), leaderships=sum(s.leaderships for s in all_stats),
                        last_source_seq=all_stats[0].last_source_seq if len(all_stats) == 1 else None)
    if wants_json(args):
        emit_json({"source": str(cfg.source), "target": str(cfg.target), "copied": stats.copied,
                   "skipped": stats.skipped, "retries": stats.retries, "leaderships": stats.leaderships,
                   "last_source_seq": stats.last_source_seq,
                   **({"partitions": [{"source": str(c.source), "copied": s.copied,
                                       "last_source_seq": s.last_source_seq}
                                      for c, s in zip(configs, all_stats, strict=True)]} if cfg.source.topic else {})})
    else:
        print(f"mirror {cfg.source} -> {cfg.target}: copied {stats.copied} messages ({stats.skipped} held already), "
              f"last source seq {stats.last_source_seq if stats.last_source_seq is not None else '-'}",
              file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ordq.mirror.lag import SourceProbe
    from ordq.mirror.status import target_holds
    from ordq.mirror.topic import partition_configs

    base = _config(args)
    rows = []
    for cfg in partition_configs(base):  # a topic: a row per partition
        held = target_holds(cfg.target, cfg.source.identity)
        probe = SourceProbe(cfg.source, cfg.sub)
        try:
            lag = probe.lag(held)
        finally:
            probe.close()
        rows.append({"source": str(cfg.source), "target": str(cfg.target), "subscription": cfg.sub,
                     "source_last_seq": lag.source_last_seq, "copied_seq": lag.copied_seq,
                     "lag_messages": lag.messages,
                     "lag_seconds": round(lag.seconds, 3) if lag.seconds is not None else None})
    if wants_json(args):
        emit_json({"partitions": rows} if base.source.topic else rows[0])
    else:
        table(rows, ["source", "target", "source_last_seq", "copied_seq", "lag_messages", "lag_seconds"])
    return 0
