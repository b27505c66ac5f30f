"""Subcommands of the ordq CLI, one module each, each with ``register(subparsers)``.

Use :func:`add_command` to create a (sub)command parser: it adds the options every command
accepts after its name too (``--json``, ``--zk``, ``--root``), so ``ordq queue list --json``
and ``ordq --json queue list`` mean the same.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ordq.cli_args import Given
from ordq.common.errors import ConfigError
from ordq.common.units import format_duration, format_size, parse_duration, parse_size

# The commands that hold no ZooKeeper session (they ask the coordinator, clients and admin verbs
# alike): their help leaves out --zk-auth and --zk-auth-file, which they still take (issue 42:
# help lists only the flags a command uses). By the command's first word, but for the ones named
# in ``ZK_SESSION_UNDER`` (``topic group`` reads ZooKeeper).
NO_ZK_SESSION = frozenset({"queue", "sub", "topic", "auth", "peek", "find", "context", "produce", "consume", "verify",
                           "cdc", "outbox", "mirror"})
ZK_SESSION_UNDER = ("topic group",)
# The commands that reach no cluster at all (a CA, a certificate, the contexts file, a lab; the
# demo and the drills start clusters of their own): their help leaves out every cluster flag
# (--bootstrap, --zk, --root and the ZooKeeper credential), which they still take. By the
# command's path: a word names every command under it.
NO_CLUSTER = ("cert ca", "cert issue", "context list", "context use", "context show", "context remove", "lab",
              "demo", "drill")


def _command_path(subparsers: Any, name: str) -> list[str]:
    return [*str(getattr(subparsers, "_prog_prefix", "")).split()[1:], name]  # "ordq queue" + "list"


def _holds_no_zk_session(words: list[str]) -> bool:
    path = " ".join(words)
    return words[0] in NO_ZK_SESSION and not any(path.startswith(p) for p in ZK_SESSION_UNDER)


def _reaches_no_cluster(words: list[str]) -> bool:
    return any(words[:len(p.split())] == p.split() for p in NO_CLUSTER)


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    func: Callable[[argparse.Namespace], int] | None = None,
    description: str | None = None,
    daemon: bool = False,
    admin: bool = False,
    reads: bool = False,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help
    )
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    words = _command_path(subparsers, name)
    no_cluster = _reaches_no_cluster(words)

    def shown(text: str, hide: bool = False) -> str:
        return argparse.SUPPRESS if no_cluster or hide else text

    parser.add_argument("--bootstrap", default=argparse.SUPPRESS, metavar="HOST:PORT[,...]",
                        help=shown("the coordinators' addresses (env ORDQ_BOOTSTRAP)"))
    parser.add_argument("--zk", action=Given, default=argparse.SUPPRESS, help=shown("ZooKeeper connection string"))
    parser.add_argument("--root", action=Given, default=argparse.SUPPRESS, help=shown("ZooKeeper path prefix"))
    no_session = _holds_no_zk_session(words)
    parser.add_argument("--zk-auth", default=argparse.SUPPRESS, metavar="USER:PASSWORD",
                        help=shown("ZooKeeper digest credential (env ORDQ_ZK_AUTH)", no_session))
    parser.add_argument("--zk-auth-file", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help=shown("read the ZooKeeper credential from this file", no_session))
    if func is not None:
        # daemon: a long-running process (logs INFO); admin: needs the admin role; reads: a
        # valid token with any role on the queue(s) it shows (open_store checks both)
        parser.set_defaults(func=func, daemon=daemon, admin=admin, reads=reads)
    return parser


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a clear usage error otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, not {value}")
        return value
    parse.__name__ = "int"
    return parse


def seconds(*, allow_zero: bool = False, high: float = 10**7) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds > 0 (>= 0 with ``allow_zero``)."""
    return number(0.0, high, allow_zero=allow_zero)


def number(low: float, high: float, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in (low, high] ([low, high] with ``allow_zero``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value > high or value < low or (value == low and not allow_zero):
            op = ">=" if allow_zero else ">"
            raise argparse.ArgumentTypeError(f"must be {op} {low:g} and <= {high:g}, not {text}")
        return value
    parse.__name__ = "float"
    return parse


def rate() -> Callable[[str], float]:
    """An argparse type: messages per second, > 0."""
    return number(0.0, 1e9)


def duration(low_s: float, high_s: float) -> Callable[[str], float]:
    """An argparse type: a duration (``90s``, ``15m``, ``7d``; a bare number is seconds) in
    [low_s, high_s], as seconds."""
    def parse(text: str) -> float:
        try:
            value = parse_duration(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not low_s <= value <= high_s:
            raise argparse.ArgumentTypeError(
                f"must be from {format_duration(low_s)} to {format_duration(high_s)}, not {text}")
        return value
    parse.__name__ = "duration"
    return parse


def byte_size(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a size (``512``, ``64KiB``, ``10GiB``, ``10GB``) in [low, high] bytes."""
    def parse(text: str) -> int:
        try:
            value = parse_size(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {format_size(low)} to {format_size(high)}, not {text}")
        return value
    parse.__name__ = "size"
    return parse


MAX_PAYLOAD_BYTES = 64 << 20  # the largest message a queue may allow (QueueConfig)


def open_store(args: argparse.Namespace, *, daemon: bool = False, new_root: bool = False,
               session_timeout_s: float | None = None) -> Any:
    """Connect the ZooKeeper store named by --zk/--root (CoordinationUnavailable if down);
    ``daemon``: see ``ZkStore.connect``; ``session_timeout_s``: the session's (default
    --zk-timeout's). ConfigError when no cluster lives under --root (a
    mistyped root showed "no queues", exit 0), unless ``daemon`` or ``new_root`` (a command
    that may make the root: ``group add``); a ZooKeeper that accepts connections but makes no
    session says why it may not (no credentials registered for it), not "start one".
    For an admin command, PermissionDenied unless the caller's token has the admin role on
    ``args.queue`` (on every queue when it names none) while the cluster enforces tokens; for
    a reading one (``reads``), unless it is a valid token with a role on ``args.queue`` or each
    of ``args.queues`` (on some queue when it names none): ZooKeeper lets anyone read, so
    without this a refused caller would see a table of ``?`` and exit 0."""
    from ordq.common.errors import CoordinationUnavailable, ZkAccessDenied
    from ordq.common.security import lookup, registration_problem
    from ordq.coordinator.acl_client import check_identity
    from ordq.coordinator.store import ZkStore
    from ordq.coordinator.zk_retry import retry_zk

    auth = lookup(args.zk, args.root).zk_auth
    timeout_s = session_timeout_s if session_timeout_s is not None else float(getattr(args, "zk_timeout", 5.0))

    def checks() -> None:
        if not (daemon or new_root) and store.client.exists(store.paths.root) is None:
            raise ConfigError(f"no ordq cluster under --root {store.paths.root} on ZooKeeper {args.zk}"
                              f"{_roots_there(store)}")
        check_identity(store.client, store.paths.root, auth, required=False)
        if getattr(args, "admin", False):
            check_admin(store, getattr(args, "queue", None) or "*")
        elif getattr(args, "reads", False):
            for queue in getattr(args, "queues", None) or [getattr(args, "queue", None) or "*"]:
                check_token(store, queue)

    store: Any = None
    try:
        with saying(f"connecting to ZooKeeper at {args.zk}", after_s=None if daemon else SAY_AFTER_S):
            store = ZkStore.connect(args.zk, args.root, timeout_s=timeout_s, auth=auth, daemon=daemon)
            # A session expired or a connection lost under load is retried within --zk-timeout; it
            # was an uncaught kazoo traceback (test_refusals at load 10).
            retry_zk(checks, "check the caller's credentials", bound_s=timeout_s, hosts=args.zk)
    except (CoordinationUnavailable, ZkAccessDenied) as exc:
        if store is not None:
            store.close()
        # Issue 42: without the credentials `ordq up` registered, a TLS-only ZooKeeper reads as
        # down ("start one with: ordq zk start") and a protected root as a bad --zk-auth.
        problem = None if daemon or auth else registration_problem(args.zk, args.root)
        if isinstance(exc, ZkAccessDenied):
            if problem is None:
                raise
            raise ZkAccessDenied(f"no ZooKeeper credential is registered for {args.zk}{args.root} ({problem})"
                                 ) from exc
        if store is not None or daemon or not _accepts_connections(args.zk):
            raise
        why = (f"no credentials are registered for it ({problem})" if problem
               else "is it another service, or does it want other credentials (TLS)?")
        raise CoordinationUnavailable(
            f"ZooKeeper at {args.zk} accepts connections but made no session within {timeout_s:g}s: {why}") from exc
    except BaseException:
        if store is not None:
            store.close()
        raise
    return store


def _accepts_connections(zk: str) -> bool:
    """Whether the first address of the connection string ``zk`` accepts a TCP connection."""
    import socket

    host, _, port = zk.split(",")[0].strip().rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _roots_there(store: Any) -> str:
    """`` (clusters there: --root /a, /b)``: the top-level nodes holding a cluster's queues."""
    try:
        roots = [f"/{name}" for name in sorted(store.client.get_children("/"))
                 if store.client.exists(f"/{name}/queues") is not None]
    except Exception:  # noqa: BLE001 - only a hint: ACLs may hide them
        return ""
    return f" (clusters there: --root {', '.join(roots)})" if roots else ""


ADMIN_CALL_TIMEOUT_S = 300.0  # an admin verb's answer (a listing reads every shown queue's replicas)


def admin_call(args: argparse.Namespace, verb: str, **verb_args: Any) -> Any:
    """Run the admin verb ``verb`` on the cluster's elected coordinator (its admin API,
    coordinator/admin_api.py) and return its result: the admin CLI holds no ZooKeeper session
    (issue 37). The coordinators are found as clients find them: ``--bootstrap``, else the
    ones registered for ``--zk``/``--root`` (a name, never a connection). The caller's token
    (``--token``, ORDQ_TOKEN, the registered one) is checked by the coordinator.
    CoordinationUnavailable, naming the addresses tried, when none answers within
    ``--zk-timeout``."""
    return admin_call_with_text(args, verb, **verb_args)[0]


def admin_call_with_text(args: argparse.Namespace, verb: str, **verb_args: Any) -> tuple[Any, bytes]:
    """``admin_call``, and the text the verb sent apart from its result, to print as it is
    (``CoordinatorClient.admin_with_text``; b"" when none)."""
    from ordq.bootstrap import coordinator, timeout_of

    # One call: the request goes to the first coordinator known, and a follower's refusal names
    # the leader; asking who leads first cost a round trip, and the coordinator two ZooKeeper
    # reads, on every command (issue 42).
    with coordinator(args) as client, saying(f"waiting for the coordinators at {', '.join(client.coordinators)} "
                                             f"to answer {verb}"):
        return client.admin_with_text(verb, timeout_s=ADMIN_CALL_TIMEOUT_S, reach_s=timeout_of(args), **verb_args)


def coordinator_known(args: argparse.Namespace) -> bool:
    """Whether this command can find the cluster's coordinators (``--bootstrap``, or ones
    registered here for ``--zk``/``--root``): the reads that moved to the admin API (issue 42)
    read ZooKeeper themselves only for a hand-deployed cluster this machine knows no
    coordinator of."""
    from ordq.bootstrap import bootstrap_of
    from ordq.common.client_tls import registered_bootstrap

    return bootstrap_of(args) is not None or bool(args.zk and registered_bootstrap(args.zk, args.root) is not None)


def older_coordinator(exc: ConfigError) -> bool:
    """A coordinator that predates the verb asked (the command then does the read itself)."""
    return "unknown admin verb" in str(exc)


def admin_call_if_known(args: argparse.Namespace, verb: str, **verb_args: Any) -> Any | None:
    """``admin_call``, or None when no coordinator is known here or it predates ``verb``. A
    coordinator known but not answering, or a refusal, is the command's error."""
    if not coordinator_known(args):
        return None
    try:
        return admin_call(args, verb, **verb_args)
    except ConfigError as exc:
        if older_coordinator(exc):
            return None
        raise


def check_admin(store: Any, queue: str) -> None:
    """The CLI's side of the admin role: the command itself writes ZooKeeper, so it checks
    the token there (ZooKeeper's own ACLs are what stop a client that skips this)."""
    from ordq.common.security import of_store
    from ordq.coordinator.tokens import authorize

    records = tokens_in_force(store)
    if records is not None:
        authorize(records, of_store(store).token, queue, "admin")


def tokens_in_force(store: Any) -> dict[str, Any] | None:
    """The token records while the cluster enforces tokens, else None. A connection lost or a
    session moved under load is retried (bounded): it was a raw kazoo traceback from the verbs
    that check a token themselves (test_refusals beside busy loops, load 26)."""
    from ordq.coordinator.tokens import enforced, load_tokens
    from ordq.coordinator.zk_retry import retry_zk

    root = store.paths.root
    return retry_zk(lambda: load_tokens(store.client, root) if enforced(store.client, root) else None,
                    "read the access tokens")


def readable(store: Any) -> Callable[[str], bool]:
    """Whether the caller's token has a role on a queue (always, while tokens are not enforced):
    what a listing read from ZooKeeper shows, as the admin API's listings (``AdminCall.may_read``)."""
    from ordq.common.errors import PermissionDenied
    from ordq.common.security import of_store
    from ordq.coordinator.tokens import ANY, authorize

    records = tokens_in_force(store)
    if records is None:
        return lambda queue: True
    token = of_store(store).token

    def may_read(queue: str) -> bool:
        try:
            authorize(records, token, queue, ANY)
        except PermissionDenied:
            return False
        return True

    return may_read


def check_token(store: Any, queue: str = "*", role: str | None = None) -> None:
    """The CLI's side of tokens for commands the brokers serve: while the cluster enforces
    them, PermissionDenied unless the caller's token is a valid one with ``role`` (None: any
    role) on ``queue`` (``*``: on some queue). Without it the brokers refuse every call, and
    a reading command would print ``?`` in every column and exit 0, as if the replicas were
    down."""
    from ordq.common.errors import PermissionDenied
    from ordq.common.security import of_store
    from ordq.coordinator.tokens import ANY, authorize

    records = tokens_in_force(store)
    if records is None:
        return
    token = of_store(store).token
    scopes = [queue] if queue != "*" else ["*", *sorted({q for r in records.values() for q in r.grants})]
    first: PermissionDenied | None = None
    for scope in scopes:
        try:
            authorize(records, token, scope, role or ANY)
            return
        except PermissionDenied as exc:
            first = first or exc
    assert first is not None
    raise first


def local_zk_port(zk: str, default: int) -> int:
    """The port to start a local ZooKeeper on: the one ``--zk`` (env ``ORDQ_ZK``) names when
    it is a single address on this machine, so that after ``ordq up`` or ``ordq zk start``
    the other commands reach it with the same setting; else ``default``."""
    host, sep, port = zk.strip().partition(":")
    if "," in zk or not sep or host not in ("127.0.0.1", "localhost") or not port.isdigit():
        return default
    return int(port)


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


SAY_AFTER_S = 1.0  # a wait longer than this says what it waits for


@contextlib.contextmanager
def saying(what: str, after_s: float | None = SAY_AFTER_S) -> Iterator[None]:
    """Print ``ordq: WHAT ...`` on stderr once, if the block is still running after
    ``after_s`` (None: never): a command that waits says what for (issue 42: ``produce``
    waited 7-10 s on a busy machine without a word). Only to a terminal, or with
    ``ORDQ_PROGRESS=1``: a script reading the output is not given lines it never asked for."""
    stream = sys.stderr
    if after_s is None or not (os.environ.get("ORDQ_PROGRESS") == "1" or stream.isatty()):
        yield
        return
    done = threading.Event()

    def say() -> None:
        if not done.wait(after_s):
            print(f"ordq: {what} ...", file=stream, flush=True)

    threading.Thread(target=say, name="ordq-saying", daemon=True).start()
    try:
        yield
    finally:
        done.set()
