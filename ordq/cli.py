"""``ordq``: the admin CLI. ``main(argv) -> exit code``; errors are one line on stderr.

Each subcommand lives in ``ordq/commands/<name>.py`` with ``register(subparsers)``; a command
function takes the parsed ``args`` and returns an exit code. Global options (ZooKeeper address,
root prefix, --json) are parsed here once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from ordq import __version__
from ordq.errors import OrdqError

# Order is the order shown in --help.
COMMAND_MODULES = (
    "cluster", "zk", "auth", "group", "queue", "sub", "peek", "top", "broker", "coordinator", "clients", "verify",
    "drill", "demo", "outbox", "cdc",
)

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_ROOT = "/ordq"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ordq",
        description="ordq: a strictly ordered, replicated message queue. "
        "Every command takes --json for machine-readable output.",
    )
    parser.add_argument("--version", action="version", version=f"ordq {__version__}")
    parser.add_argument(
        "--zk",
        default=os.environ.get("ORDQ_ZK", DEFAULT_ZK),
        help="ZooKeeper connection string host:port[,host:port...] "
        "(env ORDQ_ZK; default %(default)s)",
    )
    parser.add_argument(
        "--root",
        default=os.environ.get("ORDQ_ROOT", DEFAULT_ROOT),
        help="ZooKeeper path prefix of this cluster, so several can share one ZooKeeper "
        "(env ORDQ_ROOT; default %(default)s)",
    )
    parser.add_argument(
        "--zk-auth", default=None, metavar="USER:PASSWORD",
        help="ZooKeeper digest credential when the root is protected by ACLs (env ORDQ_ZK_AUTH; "
        "default: the one registered for --zk by ordq up, docs/SECURITY.md)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--token", default=None,
        help="access token (env ORDQ_TOKEN; default: the one registered for --zk by ordq up, docs/SECURITY.md)",
    )
    parser.add_argument(
        "--zk-timeout", type=float, default=5.0, metavar="SECONDS",
        help="how long to try to reach ZooKeeper before giving up (default %(default)s)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log library messages too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"ordq.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ordq.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # kazoo logs every failed connection attempt; the CLI reports one clear line instead.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.verbose:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    if getattr(args, "daemon", False):
        # A long-running process's log is its operator's record: ordq's own INFO lines
        # (failovers, seals, reconciles, re-registrations) always go in, library chatter not.
        logging.getLogger("ordq").setLevel(logging.INFO)
    # --token / --zk-auth: the env every credentials lookup of this command sees
    # (ordq/security.py), restored after it (main() also runs inside tests).
    given = {env: value for env, value in (("ORDQ_TOKEN", args.token), ("ORDQ_ZK_AUTH", args.zk_auth)) if value}
    previous = {env: os.environ.get(env) for env in given}
    os.environ.update(given)
    try:
        return int(args.func(args) or 0)
    except OrdqError as exc:
        print(f"ordq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ordq: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`ordq ... | head`): stop quietly, as Unix tools do, and keep
        # Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        for env, value in previous.items():
            if value is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = value

if __name__ == "__main__":
    sys.exit(main())
