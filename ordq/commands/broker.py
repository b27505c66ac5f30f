"""ordq broker run: one broker process (the master or the slave of a broker group)."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ordq.commands import add_command, process_config, seconds
from ordq.common.errors import ConfigError
from ordq.common.heap import pad_heap
from ordq.common.proc import announce, wait_for_stop
from ordq.common.security import Credentials, remember_zk_tls
from ordq.common.steady_gc import freeze_startup_objects

DEFAULT_LISTEN = "127.0.0.1:0"
SWITCH_INTERVAL_S = 0.0005  # the broker process's GIL switch interval (Python's default: 5 ms)


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "broker", help="run a broker process")
    sub = parser.add_subparsers(dest="broker_command", metavar="ACTION")
    sub.required = True
    run = add_command(
        sub, "run", func=cmd_run, daemon=True,
        help="run the master or slave of a broker group until SIGTERM/SIGINT",
        description="Run one broker process. It recovers its data folder, serves the broker protocol, "
        "registers itself live in ZooKeeper and prints 'READY <address> <incarnation>' when it serves. "
        "Settings come from the flags, else from --config FILE (TOML, docs/OPERATIONS.md), else the defaults.",
    )
    run.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help="TOML file of this process's settings (keys: zk, root, group, role, listen, advertise, "
                     "link_listen, link_advertise, metrics, data, session_timeout_s, register_wait_s, disk_room_mib, "
                     "[tls] cert/key/ca/insecure); flags override it")
    run.add_argument("--group", default=None, help="broker group id (register it first: ordq group add G)")
    run.add_argument("--role", default=None, choices=["master", "slave"])
    run.add_argument("--listen", default=None, metavar="HOST:PORT",
                     help=f"address to serve on; port 0 picks a free one (default {DEFAULT_LISTEN})")
    run.add_argument("--advertise", default=None, metavar="HOST[:PORT]",
                     help="address registered in ZooKeeper, where clients and the peer dial this broker "
                     "(default: the --listen host and the port bound; required when listening on 0.0.0.0)")
    run.add_argument("--link-listen", default=None, metavar="HOST:PORT",
                     help="address the lean link serves on (a master's produce link, a slave's replication "
                     "link; port 0 picks a free one; default: the --listen host, its port + 1000)")
    run.add_argument("--link-advertise", default=None, metavar="HOST[:PORT]",
                     help="address registered for the lean link (default: the advertised host and the link's "
                     "port, or --advertise's port + 1000); clients that cannot reach it use gRPC")
    run.add_argument("--metrics", default=None, metavar="HOST:PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any); "
                     "prints 'METRICS <url>'")
    run.add_argument("--data", default=None, type=Path, help="data folder of this process")
    run.add_argument("--session-timeout", type=seconds(), default=None, metavar="SECONDS",
                     help="ZooKeeper session timeout: how fast a dead process is noticed (default 2)")
    run.add_argument("--disk-room", dest="disk_room_mib", type=float, default=None, metavar="MIB",
                     help="after a write failed for want of space, the group takes no writes until the data "
                     "folder's disk has this many MiB free again (default 64; docs/OPERATIONS.md, disk full)")
    run.add_argument("--register-wait", type=seconds(allow_zero=True), default=None, metavar="SECONDS",
                     help="when the role is still live in ZooKeeper (a killed predecessor's session not yet "
                     "expired), wait this long for it to go before giving up (default 30)")
    limits = run.add_argument_group("memory budget (docs/OPERATIONS.md, Sizing the memory budget)")
    limits.add_argument("--memory-budget", type=int, default=None, metavar="MIB",
                        help="bytes held for clients at once: Fetch/Read answers being built and sent, "
                        "produce requests being placed (default 256)")
    limits.add_argument("--connection-budget", type=int, default=None, metavar="MIB",
                        help="one connection's (and one token's) share of --memory-budget (default 32)")
    limits.add_argument("--write-reserve", type=int, default=None, metavar="MIB",
                        help="part of --memory-budget kept for produce requests: answers never take it "
                        "(default a quarter of the budget)")
    limits.add_argument("--read-rate", type=int, default=None, metavar="MIB",
                        help="Fetch/Read answer MiB per second one token may take, 0 for no limit "
                        "(default 16) while another tenant's token is active: one reader's huge reads cannot slow "
                        "a neighbour queue's writes")
    limits.add_argument("--tail-read-factor", type=float, default=None, metavar="X",
                        help="what a token reads of a queue is not held to --read-rate up to X times what was "
                        "written to that queue meanwhile, 0 for never (default 2): a consumer keeping up is "
                        "never paced, one reading back old data is")
    limits.add_argument("--request-share", type=float, default=None, metavar="FRACTION",
                        help="seconds of the broker's loop per second one token's calls may take, refused ones "
                        "included, 0 for no limit (default 0.2): a token over it is held, then refused "
                        "(ResourceExhausted, retriable)")
    limits.add_argument("--request-busy-share", type=float, default=None, metavar="FRACTION",
                        help="hold a token over its --request-share only while all tokens together took at "
                        "least this much of the loop lately (default 0.9: a loop nearly full; 0: whenever "
                        "another token is active)")
    limits.add_argument("--read-idle", type=seconds(), default=None, metavar="SECONDS",
                        help="close a Read stream whose reader takes nothing this long (default 30)")
    limits.add_argument("--calls-per-token", type=int, default=None, metavar="N",
                        help="calls one token may hold open at once; the next is refused (default 256)")
    limits.add_argument("--no-verify-reads", action="store_true",
                        help="do not CRC-check batches of sealed segments before serving them (benchmarks)")
    run.add_argument("--seal-syncfs", action="store_true",
                     help="make a batch of seals durable with one syncfs(2) of the data folder's file system "
                     "instead of a sync per file: twice as fast, but it also flushes every other process's "
                     "writes there and stalls their fsyncs, so only for a file system of the broker's own")
    tls = run.add_argument_group("TLS (every hop is mutual TLS unless --insecure)")
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="this broker's certificate, signed by --tls-ca")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="the key of --tls-cert")
    tls.add_argument("--tls-ca", type=Path, metavar="PEM",
                     help="the cluster CA: peers (brokers and clients) must show a certificate it signed")
    tls.add_argument("--insecure", action="store_true", default=None,
                     help="serve plaintext gRPC: anyone on the network may call")
    tls.add_argument("--zk-tls", action="store_true", default=None,
                     help="reach ZooKeeper over TLS (its secure client port), presenting --tls-cert")


def broker_credentials(args: argparse.Namespace) -> Credentials:
    """TLS files from the flags, plaintext only when asked for by name; the ZooKeeper credential
    from --zk-auth / ORDQ_ZK_AUTH (``ordq up`` passes the admin one in the environment)."""
    files = (args.tls_cert, args.tls_key, args.tls_ca)
    zk_auth = os.environ.get("ORDQ_ZK_AUTH") or None
    if args.insecure:
        if any(files):
            raise ConfigError("--insecure and --tls-* contradict each other: give one")
        return Credentials(zk_auth=zk_auth)
    if not all(files):
        raise ConfigError("a broker serves TLS: give --tls-cert, --tls-key and --tls-ca (or --insecure)")
    for f in files:
        if not f.is_file():
            raise ConfigError(f"TLS file {f} does not exist")
    return Credentials(ca_file=str(args.tls_ca), cert_file=str(args.tls_cert), key_file=str(args.tls_key),
                       zk_auth=zk_auth, zk_tls=bool(getattr(args, "zk_tls", None)))


def budget_config(args: argparse.Namespace) -> Any:
    """The memory budget the flags ask for (BudgetConfig's defaults for those not given)."""
    from ordq.broker_group.budget import BudgetConfig

    given: dict[str, Any] = {}
    if args.memory_budget is not None:
        given["total_bytes"] = args.memory_budget << 20
    if args.connection_budget is not None:
        given["holder_bytes"] = args.connection_budget << 20
    if args.write_reserve is not None:
        given["write_reserve_bytes"] = args.write_reserve << 20
    if args.read_rate is not None:
        given["read_rate_bytes"] = (args.read_rate << 20) or None
    if args.tail_read_factor is not None:
        given["tail_read_factor"] = args.tail_read_factor
    if args.read_idle is not None:
        given["idle_ms"] = int(args.read_idle * 1000)
    return BudgetConfig(**given)


def request_time_config(args: argparse.Namespace) -> Any:
    """Each token's share of the broker's loop the flags ask for (RequestTimeConfig's defaults)."""
    from ordq.broker_group.request_time import LOOP_BUSY_SHARE, broker_request_time

    share = 0.2 if args.request_share is None else args.request_share or None
    busy = LOOP_BUSY_SHARE if args.request_busy_share is None else args.request_busy_share
    return broker_request_time(share=share, busy_share=busy)


def broker_config(args: argparse.Namespace) -> Any:
    """The BrokerConfig of the flags over --config FILE over the defaults (ConfigError when
    the group, role or data folder is named by neither, or the file is refused). Settings
    outside BrokerConfig (ZooKeeper, TLS files, metrics) are resolved into ``args``."""
    from ordq.broker_group.config import BrokerConfig
    from ordq.broker_group.replica import Role

    file = process_config.load(args.config, process_config.BrokerFile) if args.config else process_config.BrokerFile()
    process_config.apply_globals(args, file)
    process_config.tls_from(args, file)
    pick = functools.partial(process_config.pick, args)
    args.metrics = pick("metrics", file.metrics, None)
    missing = [flag for flag, value in (("--group", pick("group", file.group, None)),
                                        ("--role", pick("role", file.role, None)),
                                        ("--data", pick("data", file.data, None))) if value is None]
    if missing:
        raise ConfigError(f"ordq broker run needs {', '.join(missing)} (a flag, or group/role/data in --config)")
    return BrokerConfig(gid=pick("group", file.group, None), role=Role(pick("role", file.role, None)),
                        data_dir=pick("data", file.data, None), zk_hosts=args.zk, root=args.root,
                        listen=pick("listen", file.listen, DEFAULT_LISTEN),
                        advertise=pick("advertise", file.advertise, None),
                        link_listen=pick("link_listen", file.link_listen, None),
                        link_advertise=pick("link_advertise", file.link_advertise, None),
                        zk_session_timeout_s=pick("session_timeout", file.session_timeout_s, 2.0),
                        register_wait_s=pick("register_wait", file.register_wait_s, 30.0),
                        disk_room_bytes=int(pick("disk_room_mib", file.disk_room_mib, 64) * (1 << 20)),
                        credentials=broker_credentials(args), budget=budget_config(args),
                        request_time=request_time_config(args), verify_sealed_reads=not args.no_verify_reads,
                        seal_syncfs=args.seal_syncfs,
                        **({} if args.calls_per_token is None else {"max_calls_per_token": args.calls_per_token}))


def cmd_run(args: argparse.Namespace) -> int:
    from ordq.broker_group.service import Broker

    # Before any thread of this process mallocs (common/heap.py): large buffers come and go per
    # batch, not from fresh pages each time, and one arena keeps the pad once.
    pad_heap()
    cfg = broker_config(args)
    if cfg.credentials.zk_tls:  # every ZooKeeper client of this process (ordq.common.security.zk_tls_options)
        remember_zk_tls(cfg.zk_hosts, cfg.credentials)
    # The GIL changes hands every 0.5 ms rather than 5: a worker building a huge answer for one
    # client must not keep the loop, and every other queue's produce and ack, waiting (issue 25).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    broker = Broker(cfg)
    if args.metrics:
        from ordq.common.metrics import serve

        announce(f"METRICS {serve(broker.metrics.registry, args.metrics).url}")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    # What the imports made lives as long as the process: out of the full collections, which
    # took up to 2.6 ms on the produce path (issue 39). Before start, not after: its collection
    # would hold a broker that already serves (and may be a failover's next head).
    freeze_startup_objects()
    address = broker.start()
    announce(f"READY {address} {broker.incarnation}")
    try:
        wait_for_stop(done)
    finally:
        broker.stop()
    print("STOPPED", file=sys.stderr, flush=True)
    return 0
