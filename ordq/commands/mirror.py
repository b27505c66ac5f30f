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
from ordq.output import emit_json, table

END_HELP = "ZK_HOSTS/ROOT/QUEUE: a cluster as registered by ordq up (its --zk and --root), and a queue of it"


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
    from ordq.mirror.runner import Mirror

    cfg = _config(args)
    logging.getLogger("ordq").setLevel(logging.INFO)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    mirror = Mirror(cfg, on_state=lambda state: _status(f"{state.upper()} mirror {cfg.source} -> {cfg.target}"))
    watch = LagWatch(SourceProbe(cfg.source, cfg.sub),
                     lambda: mirror.statistics().last_source_seq if mirror.statistics().leaderships else None)
    metrics = None
    if cfg.metrics_listen is not None:
        def snapshot() -> MirrorSnapshot:
            st = mirror.statistics()
            return MirrorSnapshot(st.state, st.copied, st.skipped, st.retries, st.leaderships, watch.latest)

        metrics = MirrorMetrics({"source": str(cfg.source), "target": str(cfg.target)}, snapshot,
                                listen=cfg.metrics_listen)
        assert metrics.server is not None
        _status(f"METRICS {metrics.server.url}")
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _status(f"STARTED mirror {cfg.source} -> {cfg.target} (subscription {cfg.sub})")
        stats = mirror.run(stop)
    except KeyboardInterrupt:
        stats = mirror.statistics()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics is not None:
            metrics.close()
        watch.close()
    if wants_json(args):
        emit_json({"source": str(cfg.source), "target": str(cfg.target), "copied": stats.copied,
                   "skipped": stats.skipped, "retries": stats.retries, "leaderships": stats.leaderships,
                   "last_source_seq": stats.last_source_seq})
    else:
        print(f"mirror {cfg.source} -> {cfg.target}: copied {stats.copied} messages ({stats.skipped} held already), "
              f"last source seq {stats.last_source_seq if stats.last_source_seq is not None else '-'}",
              file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ordq.mirror.lag import SourceProbe
    from ordq.mirror.status import target_holds

    cfg = _config(args)
    held = target_holds(cfg.target, cfg.source.identity)
    probe = SourceProbe(cfg.source, cfg.sub)
    try:
        lag = probe.lag(held)
    finally:
        probe.close()
    row = {"source": str(cfg.source), "target": str(cfg.target), "subscription": cfg.sub,
           "source_last_seq": lag.source_last_seq, "copied_seq": lag.copied_seq, "lag_messages": lag.messages,
           "lag_seconds": round(lag.seconds, 3) if lag.seconds is not None else None}
    if wants_json(args):
        emit_json(row)
    else:
        table([row], ["source", "target", "source_last_seq", "copied_seq", "lag_messages", "lag_seconds"])
    return 0
