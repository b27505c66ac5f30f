"""``ordq``: the admin CLI. ``main(argv) -> exit code``; errors are one line on stderr.

Each subcommand lives in ``ordq/commands/<name>.py`` with ``register(subparsers)``; a command
function takes the parsed ``args`` and returns an exit code. Global options (the coordinators'
addresses, ZooKeeper address, root prefix, --json) are parsed here once.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
from pathlib import Path

from ordq import __version__
from ordq.cli_args import INTERRUPTED, Given

TYPE_CHECKING = False  # not typing's: see ordq/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

# What ``ordq --help`` imports is what ``python -m ordq.cli --help`` costs (issue 42: target
# 0.1 s of CPU on a quiet box): the command modules, ``ordq.commands`` and ordq's errors, logging
# and shutil are imported once a command is known (tests/test_cli.py checks ``sys.modules``).

# Each command module and the top-level commands it registers, in the order --help shows them
# (tests/test_cli.py checks the names against what each module registers).
COMMANDS: dict[str, tuple[str, ...]] = {
    "cluster": ("up", "down", "status"), "zk": ("zk",), "cert": ("cert",), "auth": ("auth",),
    "group": ("group",), "queue": ("queue",), "topic": ("topic",), "sub": ("sub",), "peek": ("peek",),
    "top": ("top",), "broker": ("broker",), "coordinator": ("coordinator",), "clients": ("produce", "consume"),
    "verify": ("verify",), "drill": ("drill",), "demo": ("demo",), "outbox": ("outbox",), "cdc": ("cdc",),
    "lab": ("lab",), "mirror": ("mirror",), "find": ("find",), "context": ("context",),
}
_MODULE_OF = {command: module for module, commands in COMMANDS.items() for command in commands}
# Each command's line in `ordq --help`, so that the top-level help imports no command module
# (issue 42: it imported all of them, grpc and the cluster health code among them, 0.35 s on
# a quiet box; tests/test_cli.py checks these against what each module registers).
COMMAND_HELP: dict[str, str] = {
    "up": "start a local cluster: ZooKeeper, broker groups (master + slave) and coordinators",
    "down": "stop the local cluster in --dir (data is kept unless --wipe)",
    "status": "every process of the local cluster with its health (exit 3 if one is unhealthy)",
    "zk": "run a local ZooKeeper for development and tests",
    "cert": "make a cluster CA and issue certificates from it",
    "auth": "create, list and revoke access tokens",
    "group": "register and inspect broker groups",
    "queue": "create and inspect queues",
    "topic": "create and inspect keyed topics (N ordered partitions)",
    "sub": "inspect subscriptions and reset their cursors",
    "peek": "show the message with a given seq (read from the master, or the slave when it is down)",
    "top": "live view of queues, lists, produce/consume rates and lag (Ctrl-C quits)",
    "broker": "run a broker process",
    "coordinator": "run the coordinator daemon",
    "produce": "send stdin lines (or generated messages) to a queue, in order",
    "consume": "read a queue in order through a subscription and print or count messages",
    "verify": "verify a run from its audit files, or a live queue (Spark)",
    "drill": "run failover drills (faults under load, verified with Spark)",
    "demo": "see it work: local cluster, ordered traffic, head master killed mid-run, Spark verdict",
    "outbox": "ship a database's outbox table to a queue, in commit order",
    "cdc": "change data capture: a database's binlog into a queue",
    "lab": "a lab of hosts on this machine: network namespaces (needs root)",
    "mirror": "copy a queue to another cluster, in order, each message once",
    "find": "find messages by key, or the first message at or after a time, without a scan",
    "context": "named clusters and the current one, which every client command uses",
}
# The modules whose commands find their cluster through the current context (ordq/contexts.py)
# when no flag or environment variable names one; not those that start local processes on
# --zk's port (up, zk, demo, drill, lab) or read config files (broker, coordinator).
_CONTEXT_MODULES = frozenset({"auth", "group", "queue", "topic", "sub", "peek", "top", "clients", "verify",
                              "outbox", "cdc", "find"})
# Global options that take a value: their value is not the command's name.
_VALUED_GLOBALS = frozenset({"--bootstrap", "--zk", "--root", "--zk-auth", "--zk-auth-file", "--token", "--token-file",
                             "--zk-timeout", "--context"})

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_ROOT = "/ordq"


@functools.cache
def _help_width() -> int:
    """What argparse's HelpFormatter takes: ``shutil.get_terminal_size().columns - 2``, without
    importing shutil (and with it fnmatch, bz2, lzma) into every command."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal's width read once per process: argparse makes a
    formatter for every ``add_argument`` (to check it), and each read the terminal size and
    the environment; that was half of building the parser (75 ms of every ``ordq`` command and
    of every in-process ``main()`` call of the tests, ~900 of them in tests/test_bad_input.py)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _help_width() if width is None else width)


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract (docs/CLI.md): a usage error is one line on
    stderr, ``ordq: error: ...``, and exit 1 (argparse prints its usage block and exits 2).
    Subcommand parsers are made of the same class (``add_subparsers`` uses ``type(self)``),
    and the same formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"ordq: error: {message} (see: {self.prog} --help)\n")


def build_parser(only: str | None = None, *, stubs: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser: every command, or only the commands of module ``only`` (of ``COMMANDS``);
    ``stubs``: every command by its name and help line only (``COMMAND_HELP``), no module
    imported: what ``ordq --help``, ``--version`` and a mistyped command need."""
    parser = _Parser(
        prog="ordq",
        # No abbreviations of the global options: argparse matches them against every later
        # argument too, so `sub reset ... --to` would be "ambiguous" (--token, --token-file).
        allow_abbrev=False,
        description="ordq: a strictly ordered, replicated message queue. "
        "Every command takes --json for machine-readable output.",
    )
    parser.add_argument("--version", action="version", version=f"ordq {__version__}")
    parser.add_argument(
        "--zk", action=Given,
        default=os.environ.get("ORDQ_ZK", DEFAULT_ZK),
        help="ZooKeeper connection string host:port[,host:port...] "
        "(env ORDQ_ZK; default %(default)s)",
    )
    parser.add_argument(
        "--root", action=Given,
        default=os.environ.get("ORDQ_ROOT", DEFAULT_ROOT),
        help="ZooKeeper path prefix of this cluster, so several can share one ZooKeeper "
        "(env ORDQ_ROOT; default %(default)s)",
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("ORDQ_BOOTSTRAP") or None, metavar="HOST:PORT[,...]",
        help="the coordinators' addresses, where client commands (produce, consume, cdc, outbox) find the "
        "cluster (env ORDQ_BOOTSTRAP; `ordq status` prints them); default: those registered for --zk/--root "
        "by ordq up",
    )
    parser.add_argument(
        "--zk-auth", default=None, metavar="USER:PASSWORD",
        help="ZooKeeper digest credential when the root is protected by ACLs (env ORDQ_ZK_AUTH; "
        "default: the one registered for --zk by ordq up, docs/SECURITY.md); prefer --zk-auth-file",
    )
    parser.add_argument(
        "--zk-auth-file", type=Path, default=None, metavar="PATH",
        help="read the ZooKeeper credential USER:PASSWORD from this file (keeps it off the command line)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--token", default=None,
        help="access token (env ORDQ_TOKEN; default: the one registered for --zk by ordq up, docs/SECURITY.md); "
        "prefer --token-file: a command line is readable by every local user",
    )
    parser.add_argument(
        "--token-file", type=Path, default=None, metavar="PATH",
        help="read the access token from this file (such as the admin.token ordq up wrote)",
    )
    parser.add_argument(
        "--zk-timeout", type=float, default=5.0, metavar="SECONDS",
        help="how long to try to reach ZooKeeper before giving up (default %(default)s)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log library messages too")
    parser.add_argument(
        "--context", default=None, metavar="NAME",  # ORDQ_CONTEXT is read when it applies (_apply_context)
        help="the cluster of this context (`ordq context list`; env ORDQ_CONTEXT; default: the current one), "
        "where --zk, --root and --bootstrap (or their env) say nothing")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    if stubs:
        for name in _MODULE_OF:
            sub.add_parser(name, help=COMMAND_HELP[name], add_help=False)
        return parser
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"ordq.commands.{name}").register(sub)
    return parser


def command_module(argv: Sequence[str]) -> str | None:
    """The module of the command ``argv`` names, or None when it names none (``--help``,
    ``--version``, a typo: the whole parser answers those)."""
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help", "--version"):
            return None
        if word in _VALUED_GLOBALS:
            next(words, None)
        elif not word.startswith("-"):
            return _MODULE_OF.get(word)
    return None


@functools.lru_cache(maxsize=8)
def _parser(zk_default: str | None, root_default: str | None, bootstrap_default: str | None,
            only: str | None) -> argparse.ArgumentParser:
    """``build_parser()`` once per process (per value of the variables its defaults come from): parsing leaves
    the parser as it was, and a process that calls ``main`` many times (the tests: ~1,100
    in-process commands) paid ~40 ms a call for building it again."""
    return build_parser(only, stubs=only is None)


# The modules whose commands only ask the coordinator and print (no file written, no process
# started, no thread left running): their process ends without the interpreter's teardown of
# every module (``_quick_exit``), a tenth of such a command's CPU (issue 42: ``ordq queue list``,
# 0.25 s on a quiet box; the teardown of grpc, asyncio and the rest cost ~37 M instructions).
_QUICK_EXIT_MODULES = frozenset({"queue", "sub", "topic", "group", "auth", "context", "peek", "find"})
# The same for single commands of a module whose other commands start processes (``cluster``:
# ``up`` and ``down`` do): ``ordq status`` only asks and prints (issue 42); so does ``ordq top``, an
# admin call a frame (its module, ``top``, is a command of its own).
_QUICK_EXIT_COMMANDS = frozenset({"status", "top"})


def _asks_only(argv: Sequence[str]) -> bool:
    """Whether the command ``argv`` names only asks and prints (``_QUICK_EXIT_MODULES``,
    ``_QUICK_EXIT_COMMANDS``)."""
    module = command_module(argv)
    return module in _QUICK_EXIT_MODULES or (module is not None and _command_word(argv) in _QUICK_EXIT_COMMANDS)


def _command_word(argv: Sequence[str]) -> str | None:
    """The command's name in ``argv`` (the first word that is no global option or its value)."""
    words = iter(argv)
    for word in words:
        if word in _VALUED_GLOBALS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    as_program = argv is None  # run as the ``ordq`` program, not called by a test or a library
    argv = sys.argv[1:] if argv is None else argv
    if as_program and _asks_only(argv):
        # asyncio and grpc.aio, which ``import grpc`` loads and one synchronous call never uses:
        # a third of such a command's CPU (ordq/common/deferred.py)
        from ordq.common.deferred import defer

        defer()
        # gRPC's C core logs each failed TLS handshake on stderr at INFO (a command given another
        # cluster's CA printed five such lines before its own one, issue 42); errors still show,
        # and a GRPC_VERBOSITY the user set wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # SIGINT is taken before anything is imported: one during the start-up of a command that was
    # started with SIGINT ignored (a background job) was lost (issue 42); a daemon gets the
    # previous handler back once its command is known.
    sigint = signal.getsignal(signal.SIGINT)
    try:
        # Inside the ``try``: a SIGINT that lands as soon as the handler is in place, while
        # ``signal.signal`` still returns, is an interrupt too (stop 88, the loaded tier).
        code = _main(argv, sigint if _take_sigint() else None)
    except KeyboardInterrupt:  # while the command's module was imported or its arguments parsed
        print("ordq: interrupted", file=sys.stderr)
        return 128 + int(signal.SIGINT)
    finally:
        _give_back_sigint(sigint)
    if as_program and _asks_only(argv):
        _quick_exit(code)
    return code


def _quick_exit(code: int) -> None:
    """End this process with ``code`` as ``sys.exit`` would, less the teardown of every module:
    the exit handlers run (logging's flush among them) and stdout and stderr are flushed, then
    ``os._exit``. Returns (the caller exits normally) when a thread that is not a daemon still
    runs: the interpreter would wait for it."""
    import atexit
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`ordq queue list | head`): nothing more to say
            if stream is sys.stdout:
                code = code or 141
    os._exit(code)


def _main(argv: Sequence[str], sigint: Any) -> int:
    # Only the named command's module is imported: importing every command's (grpc, kazoo, the
    # broker, Spark's report) cost each ``ordq`` process ~0.6 s of CPU before it did anything.
    parser = _parser(os.environ.get("ORDQ_ZK"), os.environ.get("ORDQ_ROOT"), os.environ.get("ORDQ_BOOTSTRAP"),
                     command_module(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (1, one line printed)
        if exc.code in (0, None):
            raise
        return int(exc.code) if isinstance(exc.code, int) else 1
    if not hasattr(args, "func"):  # a command name argparse took where the CLI saw none
        parser.error("give a COMMAND")
    import logging

    from ordq.common.errors import OrdqError

    INTERRUPTED.clear()  # a SIGINT until here raised KeyboardInterrupt (main() returned 130)
    if command_module(argv) in _CONTEXT_MODULES:
        try:
            _apply_context(args)
        except OrdqError as exc:
            print(f"ordq: error: {exc}", file=sys.stderr)
            return 1
    # kazoo logs every failed connection attempt; the CLI reports one clear line instead.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.verbose:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    if getattr(args, "daemon", False):
        if sigint is not None:  # a daemon handles its signals itself
            signal.signal(signal.SIGINT, sigint)
        # A long-running process's log is its operator's record: ordq's own INFO lines
        # (failovers, seals, reconciles, re-registrations) always go in, library chatter not.
        logging.getLogger("ordq").setLevel(logging.INFO)
    # --token[-file] / --zk-auth[-file]: the env every credentials lookup of this command sees
    # (ordq/common/security.py), restored after it (main() also runs inside tests).
    try:
        token = _secret(args.token, args.token_file, "--token-file")
        zk_auth = _secret(args.zk_auth, getattr(args, "zk_auth_file", None), "--zk-auth-file")
    except OrdqError as exc:
        print(f"ordq: error: {exc}", file=sys.stderr)
        return 1
    given = {env: value for env, value in (("ORDQ_TOKEN", token), ("ORDQ_ZK_AUTH", zk_auth)) if value}
    previous = {env: os.environ.get(env) for env in given}
    os.environ.update(given)
    try:
        return int(args.func(args) or 0)
    except OrdqError as exc:
        print(f"ordq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)  # ordq.common.proc.Terminated: SIGTERM or SIGHUP
        print("ordq: interrupted" if signum == signal.SIGINT else f"ordq: terminated ({signal.Signals(signum).name})",
              file=sys.stderr)
        return 128 + int(signum)
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


def _apply_context(args: argparse.Namespace) -> None:
    """--zk, --root and --bootstrap from the context (--context, ORDQ_CONTEXT, else the current
    one) where neither the command line nor the environment gives them (issue 42: after
    ``ordq up --zk-port 0``, ``ordq queue create`` tried 127.0.0.1:2181)."""
    from ordq.contexts import apply

    apply(args)


def _on_sigint(signum: int, frame: object) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def _take_sigint() -> bool:
    """A command stops on SIGINT, even when it was started with SIGINT ignored (a shell's
    background job: ``ordq produce ... &`` ran on until it was elected, issue 42), and notes it
    in ``INTERRUPTED``. False when nothing was changed (not the main thread: signals are the
    main thread's)."""
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: signals are the main thread's
        return False
    return True


def _give_back_sigint(previous: Any) -> None:
    """The handler from before ``_take_sigint`` put back (main() also runs inside tests and
    libraries), however far taking it got before an interrupt; None: one not set from Python,
    which cannot be put back."""
    if previous is not None:
        try:
            signal.signal(signal.SIGINT, previous)
        except ValueError:  # not the main thread: nothing was taken
            pass


def _secret(value: str | None, path: Path | None, flag: str) -> str | None:
    """A secret given on the command line, or read from a file (first line, stripped): files
    and the environment keep secrets out of /proc/<pid>/cmdline."""
    from ordq.common.errors import ConfigError

    if path is None:
        return value
    if value is not None:
        raise ConfigError(f"give {flag.removesuffix('-file')} or {flag}, not both")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None
    secret = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise ConfigError(f"{flag} {path} is empty")
    return secret


if __name__ == "__main__":
    sys.exit(main())
