"""ordq coordinator run: the HA coordinator (several may run; one is elected): the daemon's
duties and the Coordinator gRPC service (coordinator/service.py), answered by the elected one."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ordq.commands import add_command, number, open_store, process_config, seconds
from ordq.common import addresses
from ordq.common.errors import ConfigError
from ordq.common.proc import announce, wait_for_stop
from ordq.common.security import Credentials

DEFAULT_LISTEN = "127.0.0.1:0"


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "coordinator", help="run the coordinator daemon")
    sub = parser.add_subparsers(dest="coordinator_command", metavar="ACTION")
    sub.required = True
    run = add_command(
        sub, "run", func=cmd_run, daemon=True,
        help="run a coordinator daemon until SIGTERM/SIGINT (start several for HA)",
        description="Run one coordinator process: it serves the Coordinator gRPC service on --listen "
        "(answered only while it is the elected one) and, while elected, does the duties. Prints "
        "'SERVING <address>' and 'READY coordinator <identifier>'. Settings come from the flags, else from "
        "--config FILE (TOML, docs/OPERATIONS.md), else the defaults.",
    )
    run.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help="TOML file of this process's settings (keys: zk, root, listen, advertise, metrics, "
                     "interval_s, session_timeout_s, prometheus_url, [tls] cert/key/ca/insecure); flags override it")
    run.add_argument("--listen", default=None, metavar="HOST:PORT",
                     help=f"address of the Coordinator service; port 0 picks a free one (default {DEFAULT_LISTEN})")
    run.add_argument("--advertise", default=None, metavar="HOST[:PORT]",
                     help="address named in the election, where clients find the elected coordinator "
                     "(default: the --listen host and the port bound; required when listening on 0.0.0.0)")
    run.add_argument("--metrics", default=None, metavar="HOST:PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any)")
    run.add_argument("--per-queue-series", dest="per_queue_series", type=_series_count, default=100, metavar="N|all",
                     help="queues with per-queue series on /metrics: the N that need looking at first (segments "
                     "on a group down, seals waiting, then the most recently written), 0 for none, 'all' for "
                     "every queue (default %(default)s; every queue's figures stay in ordq top and the status "
                     "page)")
    run.add_argument("--rebalance-moves-per-s", dest="rebalance_moves_per_s",
                     type=number(0.0, 10_000.0, allow_zero=True), default=None, metavar="N",
                     help="idle queues' heads moved a second, at most, to even the spread over the live groups "
                     "once a returning group has been live 10 s (0: only by `ordq group rebalance`; default "
                     "500)")
    run.add_argument("--away-grace", dest="away_grace", type=seconds(allow_zero=True, high=3600.0), default=10.0,
                     metavar="SECONDS",
                     help="how long an idle queue's head waits for its group to come back when the group's "
                     "processes vanish from ZooKeeper but do not refuse this coordinator's health probe (a lost "
                     "session on a slow machine); a written queue moves at once (default %(default)g)")
    run.add_argument("--prometheus-url", dest="prometheus_url", default=None, metavar="URL",
                     help="a Prometheus that scrapes this cluster (http://HOST:PORT): the status page's rate and "
                     "lag charts show the last hour from it, and this coordinator's own samples while it does "
                     "not answer (default: only those samples)")
    run.add_argument("--interval", type=seconds(), default=None, metavar="SECONDS",
                     help="duty round period when nothing wakes it (default 0.5)")
    run.add_argument("--session-timeout", dest="session_timeout", type=seconds(), default=None, metavar="SECONDS",
                     help="ZooKeeper session timeout: how fast a standby takes over when this one dies "
                     "(default 5)")
    tls = run.add_argument_group("TLS (mutual TLS unless --insecure; without --tls-* flags: the coordinator "
                                 "certificate beside the CA registered for --zk, made there if missing)")
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="the coordinator certificate (CN ordq-coordinator)")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="the key of --tls-cert")
    tls.add_argument("--tls-ca", type=Path, metavar="PEM", help="the cluster CA")
    tls.add_argument("--insecure", action="store_true", default=None,
                     help="serve plaintext gRPC: anyone on the network may call")
    tls.add_argument("--zk-tls", action="store_true", default=None,
                     help="reach ZooKeeper over TLS (its secure client port), presenting --tls-cert")


def resolve_settings(args: argparse.Namespace) -> None:
    """The flags over --config FILE over the defaults, resolved into ``args`` (ConfigError
    when the file is refused or the addresses are not dialable)."""
    file = (process_config.load(args.config, process_config.CoordinatorFile) if args.config
            else process_config.CoordinatorFile())
    process_config.apply_globals(args, file)
    process_config.tls_from(args, file)
    pick = functools.partial(process_config.pick, args)
    args.listen = pick("listen", file.listen, DEFAULT_LISTEN)
    args.advertise = pick("advertise", file.advertise, None)
    args.metrics = pick("metrics", file.metrics, None)
    args.interval = pick("interval", file.interval_s, 0.5)
    args.prometheus_url = pick("prometheus_url", file.prometheus_url, None)
    if args.prometheus_url is not None:
        from ordq.admin.prom_history import check_url

        args.prometheus_url = check_url(args.prometheus_url)
    args.zk_timeout = pick("session_timeout", file.session_timeout_s, 5.0)
    addresses.check(args.listen, args.advertise)


def coordinator_credentials(args: argparse.Namespace) -> Credentials:
    """What the service serves with and presents to brokers: the flags; else the coordinator
    certificate beside the CA registered for this cluster (ensure_coordinator_pki, which makes
    it when the CA key is there); plaintext when asked for, or when the cluster has no TLS."""
    from ordq.common.security import ensure_coordinator_pki, lookup

    zk_auth = os.environ.get("ORDQ_ZK_AUTH") or None
    registered = lookup(args.zk, args.root)
    # The cluster's token too: brokers that predate the coordinator certificate check it.
    token = registered.token
    files = (args.tls_cert, args.tls_key, args.tls_ca)
    if args.insecure:
        if any(files):
            raise ConfigError("--insecure and --tls-* contradict each other: give one")
        return Credentials(zk_auth=zk_auth, token=token)
    if any(files):
        if not all(files):
            raise ConfigError("give --tls-cert, --tls-key and --tls-ca together (or --insecure)")
        for f in files:
            if not f.is_file():
                raise ConfigError(f"TLS file {f} does not exist")
        return Credentials(ca_file=str(args.tls_ca), cert_file=str(args.tls_cert), key_file=str(args.tls_key),
                           zk_auth=zk_auth, token=token, zk_tls=bool(getattr(args, "zk_tls", None)))
    if registered.ca_file is None:
        return Credentials(zk_auth=zk_auth, token=token)
    folder = Path(registered.ca_file).parent
    creds = ensure_coordinator_pki(folder, create=(folder / "ca-key.pem").exists())
    if not Path(creds.cert_file or "").is_file():
        raise ConfigError(f"no coordinator certificate in {folder}: give --tls-cert, --tls-key and --tls-ca")
    return Credentials(ca_file=creds.ca_file, cert_file=creds.cert_file, key_file=creds.key_file, zk_auth=zk_auth,
                       token=token)


def cmd_run(args: argparse.Namespace) -> int:
    from ordq.coordinator.daemon import CoordinatorDaemon
    from ordq.coordinator.daemon_spread import REBALANCE_MOVES_PER_S
    from ordq.coordinator.pacing import RequestsFirst
    from ordq.coordinator.service import CoordinatorService
    from ordq.coordinator.session_log import SessionLog
    from ordq.coordinator.store import WATCH_SESSION_S
    from ordq.coordinator.store_base import close_all
    from ordq.coordinator.zk_retry import retry_zk

    resolve_settings(args)
    creds = coordinator_credentials(args)
    if creds.zk_tls:  # every ZooKeeper client of this process (ordq.common.security.zk_tls_options)
        from ordq.common.security import remember_zk_tls

        remember_zk_tls(args.zk, creds)
    # A transient ZooKeeper error at start (a restarting server, a busy machine) is ridden
    # out for a bounded time (coordinator/zk_retry.py); a refusal stops it with one line.
    store = retry_zk(lambda: open_store(args, daemon=True), f"coordinator: connect to ZooKeeper at {args.zk}")
    holder: list[Any] = []
    transport = _kept_transport(creds)
    processes = _process_sweep(creds, transport)
    # One process, one GIL: the daemon's idle work waits while a producer's FailOver or Claim
    # is served (coordinator/pacing.py).
    requests_first = RequestsFirst()
    # Leads only while elected and its election's session is connected: a coordinator cut off
    # from ZooKeeper renews no lease its successor may be about to grant (coordinator/leases.py).
    service = CoordinatorService(store, is_leader=lambda: bool(holder) and holder[0].stats.is_leader
                                 and bool(holder[0].store.client.connected),
                                 term=lambda: holder[0].stats.term if holder else 0,
                                 credentials=creds, subscriber=_subscriber(creds), requests_first=requests_first,
                                 admin=_admin_verbs(transport, processes,
                                                    known=lambda names: holder[0].known_queues(names)
                                                    if holder else {},
                                                    rebalance=lambda **kw: _rebalance(holder, **kw)))
    address = service.start(args.listen, advertise=args.advertise)
    # The election names where the service answers: clients find the leader from it.
    ident = f"{socket.gethostname()}-{os.getpid()}@{address}"
    # The duties on a ZooKeeper session of their own (issue 29): after a head master dies the
    # daemon fails over every queue it headed, and a producer's FailOver through the service
    # must not queue behind those requests on one session (ZooKeeper answers a session in order).
    duty_store = retry_zk(lambda: open_store(args, daemon=True), f"coordinator: connect to ZooKeeper at {args.zk}")
    duty_store.written = store.written  # the states either store wrote: what a listing needs not read again
    # The leading daemon's view reads and watches every queue on a third session, not the one
    # that holds its leadership (WATCH_SESSION_S, CoordinatorDaemon's ``watch_store`` say why).
    watch_store = retry_zk(lambda: open_store(args, daemon=True, session_timeout_s=WATCH_SESSION_S),
                           f"coordinator: connect to ZooKeeper at {args.zk} (the watch session)")
    # Each session's connection changes logged, named (issue 43: a 71 s silence of the leader at
    # 10^5 queues could not be told from a re-read of every queue after a dropped connection).
    session_logs = [SessionLog(kept.client, role).attach() for kept, role in (
        (store, "service"), (duty_store, "leadership and duties"), (watch_store, "view's watches"))]
    daemon = CoordinatorDaemon(duty_store, interval_s=args.interval, identifier=ident,
                               sealer=_sealer(duty_store, creds), prober=_prober(duty_store, creds),
                               batch_sealer=_batch_sealer(duty_store, creds),
                               requests_first=requests_first, per_queue_series=args.per_queue_series,
                               rebalance_moves_per_s=REBALANCE_MOVES_PER_S if args.rebalance_moves_per_s is None
                               else args.rebalance_moves_per_s,
                               pinger=_pinger(creds), away_grace_s=args.away_grace, watch_store=watch_store)
    holder.append(daemon)
    service.export_metrics(daemon.metrics.registry)
    if args.metrics:
        from ordq.admin.status_page import pages

        metrics_url = daemon.serve_metrics(args.metrics, pages=pages(daemon, prometheus_url=args.prometheus_url,
                                                                          processes=processes)).url
        announce(f"METRICS {metrics_url}")
        # ... and where its /health page is (beside /metrics), for `ordq status` of any cluster:
        # the election starts with the worker below, after this.
        # host-pid@metrics-url@address: what precedes the first '@' and follows the last stays as it was.
        daemon.identifier = ident = f"{socket.gethostname()}-{os.getpid()}@{metrics_url}@{address}"
    stop = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stop.set()
        daemon.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The root before READY, not at the daemon's first round a moment later: a command run as
    # soon as a new cluster's first coordinator said READY found no cluster there ("no ordq
    # cluster under --root": one of the default tier's CLI tests, once in its 2,700).
    retry_zk(store.ensure_queues_folder, f"coordinator: make {store.paths.queues} on ZooKeeper at {args.zk}")
    announce(f"SERVING {address}")
    announce(f"READY coordinator {ident}")
    worker = threading.Thread(target=_run_then_wake, args=(daemon, stop), name="coordinator", daemon=True)
    worker.start()
    wait_for_stop(stop)
    service.stop()
    daemon.stop()
    for session_log in session_logs:
        session_log.detach()
    close_all([duty_store, watch_store, store])
    worker.join(timeout=5)
    if daemon.failure is not None:  # never silently: a supervisor restarts a process that exits non-zero
        print(f"coordinator election thread died: {daemon.failure!r}", file=sys.stderr)
        return 1
    print("coordinator stopped", file=sys.stderr)
    return 0


def _series_count(raw: str) -> int | None:
    """``--per-queue-series``: a count, or ``all`` (None)."""
    if raw == "all":
        return None
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"a count or 'all', not {raw!r}")
    return int(raw)


def _run_then_wake(daemon: Any, stop: threading.Event) -> None:
    """The election thread: when it ends (stopped, or died of a bug) the main thread wakes."""
    try:
        daemon.run()
    finally:
        stop.set()


def _subscriber(creds: Credentials) -> Any:
    """Resolves a subscription's start target (latest, seq N, time T read from the brokers)."""
    def subscribe(store: Any, queue: str, sub: str, words: Sequence[str]) -> Any:
        from ordq.admin.subscriptions import create_subscription
        from ordq.sdk.positions import parse_reset_target
        from ordq.sdk.replicas import ReplicaReader
        from ordq.wire.client import GrpcTransport

        target = parse_reset_target(list(words))
        with ReplicaReader(store, GrpcTransport(rpc_timeout_s=1.0, credentials=creds)) as reader:
            cursor, at = create_subscription(store, reader, queue, sub, target)
        return cursor, (at.seq if at is not None else None)

    return subscribe


def _rebalance(holder: list[Any], **kw: Any) -> Any:
    """``ordq group rebalance`` on this coordinator's daemon (issue 43)."""
    from ordq.common.errors import CoordinationUnavailable

    if not holder:
        raise CoordinationUnavailable("this coordinator is starting")
    return holder[0].rebalance(**kw).to_dict()


def _kept_transport(creds: Credentials) -> Any:
    """One broker transport for every admin call and status page, its channels kept (as the
    prober's): a reader made per call had a channel made per call, so each ``queue list`` cost a
    TLS handshake with every group it asked, ~4.5 ms of the broker's CPU and ~5 ms of this
    process's (issue 42). Closed with the process, not by the reader of one call."""
    from ordq.wire.client import GrpcTransport

    class Kept(GrpcTransport):
        def close(self) -> None:
            pass

    return Kept(rpc_timeout_s=1.0, credentials=creds)


def _process_sweep(creds: Credentials, transport: Any) -> Any:
    """``processes(store)``: every process of the cluster asked by this coordinator, with its own
    credentials and over ``transport``'s kept channels: what ``ordq status`` (``cluster status``)
    and the status page's process list show (issue 42: no TLS handshake with a broker per status
    or per page)."""

    def processes(store: Any) -> list[dict[str, Any]]:
        from ordq.cluster_live import live_status

        return [s.to_dict() for s in live_status(store, store.hosts, creds, transport=transport)]

    return processes


def _admin_verbs(transport: Any, processes: Any, known: Any = None, rebalance: Any = None) -> Any:
    """The admin API's verbs (ordq/admin/api.py), reading replicas over ``transport`` (this
    coordinator's credentials): the admin CLI holds no ZooKeeper session (issue 37). ``known``:
    the queues the daemon's copies hold (a listing reads no ZooKeeper node for them, issue 43)."""
    from ordq.admin.api import admin_verbs
    from ordq.sdk.replicas import ReplicaReader

    return admin_verbs(lambda store: ReplicaReader(store, transport), known=known, rebalance=rebalance,
                       processes=processes)


def _prober(store: Any, creds: Credentials) -> Any:
    """Asks head masters of their open segment's size and age (rolling), when available."""
    try:
        from ordq.coordinator.seal import make_prober
    except ImportError:
        return None
    return make_prober(store, creds)


def _pinger(creds: Credentials) -> Any:
    """The Health probe of an absent group's processes (issue 43), when the broker client is available."""
    from ordq.coordinator.group_probe import make_pinger

    return make_pinger(creds)


def _batch_sealer(store: Any, creds: Credentials) -> Any:
    """The batched Seal runner (issue 43), when the broker client is available."""
    try:
        from ordq.coordinator.seal import make_batch_sealer
    except ImportError:
        return None
    return make_batch_sealer(store, creds)


def _sealer(store: Any, creds: Credentials) -> Any:
    """The Seal protocol runner, when the broker client is available."""
    try:
        from ordq.coordinator.seal import make_sealer
    except ImportError:
        return None
    return make_sealer(store, creds)
