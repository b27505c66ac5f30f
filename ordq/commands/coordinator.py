"""ordq coordinator run: the HA coordinator daemon (several may run; one is elected)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from typing import Any

from ordq.commands import add_command, open_store, seconds
from ordq.proc import announce


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "coordinator", help="run the coordinator daemon")
    sub = parser.add_subparsers(dest="coordinator_command", metavar="ACTION")
    sub.required = True
    run = add_command(
        sub, "run", func=cmd_run, daemon=True,
        help="run a coordinator daemon until SIGTERM/SIGINT (start several for HA)",
    )
    run.add_argument("--metrics", default=None, metavar="HOST:PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any)")
    run.add_argument("--interval", type=seconds(), default=0.5, metavar="SECONDS",
                     help="duty round period when nothing wakes it (default %(default)s)")


def cmd_run(args: argparse.Namespace) -> int:
    from coordinator.daemon import CoordinatorDaemon

    store = open_store(args)
    ident = f"{socket.gethostname()}-{os.getpid()}"
    daemon = CoordinatorDaemon(store, interval_s=args.interval, identifier=ident,
                               sealer=_sealer(store), prober=_prober(store))
    if args.metrics:
        announce(f"METRICS {daemon.serve_metrics(args.metrics).url}")
    stop = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        daemon.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    announce(f"READY coordinator {ident}")
    worker = threading.Thread(target=_run_then_wake, args=(daemon, stop), name="coordinator", daemon=True)
    worker.start()
    stop.wait()
    store.close()
    worker.join(timeout=5)
    if daemon.failure is not None:  # never silently: a supervisor restarts a process that exits non-zero
        print(f"coordinator election thread died: {daemon.failure!r}", file=sys.stderr)
        return 1
    print("coordinator stopped", file=sys.stderr)
    return 0


def _run_then_wake(daemon: Any, stop: threading.Event) -> None:
    """The election thread: when it ends (stopped, or died of a bug) the main thread wakes."""
    try:
        daemon.run()
    finally:
        stop.set()


def _prober(store: Any) -> Any:
    """Asks head masters of their open segment's size and age (rolling), when available."""
    try:
        from coordinator.seal import make_prober
    except ImportError:
        return None
    return make_prober(store)


def _sealer(store: Any) -> Any:
    """The Seal protocol runner, when the broker client is available."""
    try:
        from coordinator.seal import make_sealer
    except ImportError:
        return None
    return make_sealer(store)
