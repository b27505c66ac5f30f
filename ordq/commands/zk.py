"""ordq zk start|stop|status: a local ZooKeeper (standalone or 3 nodes) for development.

The servers keep running after ``ordq zk start`` exits; ``stop`` and ``status`` find them
through the folder (``--dir``, default ./.ordq/zk), which also keeps their data.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ordq.commands import add_command, int_in, local_zk_port, seconds, wants_json
from ordq.common.errors import ConfigError
from ordq.output import emit_json, table
from ordq.zk_server import ZkServer

DEFAULT_DIR = Path(".ordq/zk")
DEFAULT_PORT = 2181  # the CLI's default --zk, so `ordq zk start` then `ordq queue list` just works


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "zk", help="run a local ZooKeeper for development and tests")
    sub = parser.add_subparsers(dest="zk_command", metavar="ACTION")
    sub.required = True
    start = add_command(sub, "start", func=cmd_start,
                        help="start a local ZooKeeper (returns once it serves; it keeps running)",
                        description="Start ZooKeeper: a standalone server or a 3-node ensemble on this machine, or "
                        "(--config FILE) this machine's node of an ensemble across machines. Returns once it "
                        "serves (--no-wait: once started).")
    start.add_argument("--dir", type=Path, default=None,
                       help=f"folder of its config, data and logs (default: dir in --config, else {DEFAULT_DIR})")
    start.add_argument("--config", type=Path, default=None, metavar="FILE",
                       help="TOML file naming every server of the ensemble ([[servers]] host, client_port, "
                       "quorum_port, election_port), which one this machine runs (myid), dir, tick_time_ms, "
                       "[tls] cert/key/ca (docs/OPERATIONS.md)")
    start.add_argument("--no-wait", action="store_true",
                       help="return once the node is started, without waiting for it to serve (an ensemble's "
                       "first node serves only once a majority runs)")
    start.add_argument("--nodes", type=int, choices=[1, 3], default=None,
                       help="1 (standalone) or 3 (ensemble); default: as before in --dir, else 1")
    start.add_argument("--port", type=int_in(0, 65533), default=None,
                       help=f"client port of the first node (others: +1, +2); default: as before in --dir, "
                            f"else the port of --zk / ORDQ_ZK when it is 127.0.0.1:PORT, else {DEFAULT_PORT}; "
                            f"0: any free port")
    start.add_argument("--timeout", type=seconds(), default=60.0, metavar="SECONDS",
                       help="how long to wait for it to serve (default %(default)s)")
    stop = add_command(sub, "stop", func=cmd_stop, help="stop the ZooKeeper started in --dir (data is kept)")
    _dir_option(stop)
    status = add_command(sub, "status", func=cmd_status,
                         help="pid, port and mode of each node (exit 3 if a node is not serving)")
    _dir_option(status)
    rotate = add_command(sub, "rotate-auth", func=cmd_rotate_auth,
                         help="new ZooKeeper admin, coordinator and broker credentials for the stopped local "
                              "cluster in --dir",
                         description="Generate new admin, coordinator and broker ZooKeeper credentials for the local "
                         "cluster in --dir (stopped: ordq down first), set every node's ACL to name them, and "
                         "replace <dir>/zk-auth/{admin,coordinator,broker} and the registered credentials; a "
                         "running ZooKeeper is restarted with the new admin as its super-user. The old ones are "
                         "refused from then on. Applications hold no ZooKeeper credential. docs/SECURITY.md.")
    rotate.add_argument("--dir", type=Path, default=Path(".ordq"),
                        help="folder of the local cluster (ordq up --dir; default %(default)s)")


def cmd_rotate_auth(args: argparse.Namespace) -> int:
    from ordq.local_cluster import LocalCluster

    cluster = LocalCluster.load(args.dir)
    cluster.rotate_zk_credentials()
    if wants_json(args):
        emit_json({"dir": str(cluster.folder), "rotated": True})
    else:
        print(f"ZooKeeper credentials of {cluster.folder} rotated; start it with: ordq up --dir {args.dir}")
    return 0


def _dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="folder of its config, data and logs (default %(default)s)")


def _rows(server: ZkServer) -> list[dict[str, Any]]:
    return [{"node": s.node, "myid": s.myid, "host": s.host, "port": s.port, "pid": s.pid, "mode": s.state}
            for s in server.status()]


def _from_config(args: argparse.Namespace) -> ZkServer:
    """This machine's node of the ensemble --config FILE describes (flags --nodes/--port
    contradict it)."""
    from ordq.commands import process_config
    from ordq.common.security import Credentials
    from ordq.zk_server import NodeSpec

    if args.nodes is not None or args.port is not None:
        raise ConfigError("--config names every server: give no --nodes or --port with it")
    file = process_config.load(args.config, process_config.ZkFile)
    specs = [NodeSpec(client_port=s.client_port, quorum_port=s.quorum_port, election_port=s.election_port,
                      host=s.host) for s in file.servers]
    tls = None
    if file.tls.cert or file.tls.key or file.tls.ca:
        tls = Credentials(ca_file=_opt(file.tls.ca), cert_file=_opt(file.tls.cert), key_file=_opt(file.tls.key))
    args.dir = args.dir or file.dir or DEFAULT_DIR
    return ZkServer(args.dir, specs=specs, local=[file.node], tick_time_ms=file.tick_time_ms, tls=tls)


def _opt(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def cmd_start(args: argparse.Namespace) -> int:
    if args.config is not None:
        server = _from_config(args)
    else:
        args.dir = args.dir or DEFAULT_DIR
        fresh = not (args.dir / "cluster.json").exists()
        port = args.port if args.port is not None or not fresh else local_zk_port(args.zk, DEFAULT_PORT)
        server = ZkServer(args.dir, nodes=args.nodes, client_port=port or None)  # 0: any free port
    was_running = all(server.processes[i].alive() for i in server.local)
    if args.no_wait:
        server.start_nodes()
    else:
        server.start(timeout_s=args.timeout)
    server.detach()  # keep serving after this command exits
    if wants_json(args):
        emit_json({"dir": str(server.folder), "connection_string": server.connection_string,
                   "already_running": was_running, "nodes": _rows(server)})
    else:
        how = "was already running" if was_running else "started"
        kind = f"{len(server.specs)}-node ensemble" if server.ensemble else "standalone"
        if not server.runs_all:
            kind = f"node {server.local[0] + 1} of a {kind}"
        serving = "not yet serving (--no-wait)" if args.no_wait else "serving"
        print(f"ZooKeeper ({kind}) {how}, {serving} at {server.connection_string} (files in {args.dir})")
        print(f"export ORDQ_ZK={server.connection_string}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    server = ZkServer.load(args.dir)
    running = [p.name for p in server.processes if p.alive()]
    server.stop()
    if wants_json(args):
        emit_json({"dir": str(server.folder), "stopped": running})
    elif running:
        print(f"ZooKeeper in {args.dir} stopped ({', '.join(running)}); data kept")
    else:
        print(f"ZooKeeper in {args.dir} was not running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    server = ZkServer.load(args.dir)
    rows = _rows(server)
    if wants_json(args):
        emit_json({"dir": str(server.folder), "connection_string": server.connection_string, "nodes": rows})
    else:
        print(f"ZooKeeper in {args.dir}: {server.connection_string}")
        spread = any(r["host"] != "127.0.0.1" for r in rows)  # an ensemble across machines
        table(rows, ["node", "myid", *(["host"] if spread else []), "port", "pid", "mode"])
    serving = all(r["mode"] in ("standalone", "leader", "follower") for r in rows)
    return 0 if serving else 3
