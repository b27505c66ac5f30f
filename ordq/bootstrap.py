"""How a client program finds its cluster: the coordinators' addresses (issue 37).

``--bootstrap HOST:PORT[,...]`` (env ORDQ_BOOTSTRAP) names them; without it, ``--zk``/``--root``
*name* a cluster whose coordinators ``ordq up`` (or a harness) registered in the credentials
file: a name looked up in a local file, never a ZooKeeper connection. The client commands
(produce, consume, cdc, outbox, the drills' workload programs) pass what this returns to their
SDK configs, and ask the coordinator (``Describe``) what they check before they start.

Rules: no kazoo, no ZkStore; the coordinator's answers are the only source of the cluster's state.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from ordq.common.client_tls import credentials_path, registered_bootstrap
from ordq.common.errors import ConfigError, CoordinationUnavailable

HINT = ("pass --bootstrap HOST:PORT[,HOST:PORT...] (the coordinators' addresses: `ordq status` prints them "
        "as 'coordinators (bootstrap)'; env ORDQ_BOOTSTRAP)")


def bootstrap_of(args: argparse.Namespace) -> str | None:
    """The bootstrap list the command was given (--bootstrap, else ORDQ_BOOTSTRAP), if any."""
    value = getattr(args, "bootstrap", None)
    return value.strip() if isinstance(value, str) and value.strip() else None


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options naming the cluster in an SDK config: ``bootstrap`` when given, else the
    registered (``zk_hosts``, ``root``). ConfigError (one line saying what to pass) when
    neither names coordinators."""
    bootstrap = _checked_bootstrap(args)
    if bootstrap is not None:
        return {"bootstrap": bootstrap, "credentials": credentials_for(args, bootstrap)}
    return {"zk_hosts": args.zk, "root": args.root}


def _checked_bootstrap(args: argparse.Namespace) -> str | None:
    """The bootstrap list given (ConfigError for a bad address), else None once --zk/--root name
    a cluster with registered coordinators (ConfigError, one line saying what to pass, if not)."""
    bootstrap = bootstrap_of(args)
    if bootstrap is not None:
        from ordq.coordinator.client import parse_bootstrap

        parse_bootstrap(bootstrap)  # ConfigError for a bad address
        return bootstrap
    if not getattr(args, "zk", None):
        raise ConfigError(f"no cluster named: {HINT}")
    if registered_bootstrap(args.zk, args.root) is None:
        from ordq.common.security import registration_problem

        problem = registration_problem(args.zk, args.root)
        where = f": {problem}" if problem else f" in {credentials_path()}"
        raise ConfigError(f"no coordinators are registered for the cluster {args.zk}{args.root}{where}: "
                          f"{HINT}, or start that cluster with ordq up")
    return None


def credentials_for(args: argparse.Namespace, bootstrap: str) -> Any:
    """What a client given ``bootstrap`` presents: the entry that registered those coordinators
    (``lookup_bootstrap``), else the one registered for --zk/--root (``ordq cert register``, as
    every CLI command's TLS files and token), with ORDQ_TOKEN over either."""
    from ordq.common.security import lookup, lookup_bootstrap

    found = lookup_bootstrap(bootstrap)
    if found != lookup_bootstrap("") or not getattr(args, "zk", None):  # an entry names them
        return found
    return lookup(args.zk, args.root)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--bootstrap, --zk and --root of a program outside the CLI (the drills' workload
    programs): the same meaning as the CLI's global options."""
    import os

    parser.add_argument("--bootstrap", default=os.environ.get("ORDQ_BOOTSTRAP") or None, metavar="HOST:PORT[,...]",
                        help="the coordinators' addresses (env ORDQ_BOOTSTRAP); else those registered for --zk/--root")
    parser.add_argument("--zk", default=None, help="the ZooKeeper address naming a registered cluster")
    parser.add_argument("--root", default="/ordq", help="its root (default %(default)s)")


def timeout_of(args: argparse.Namespace) -> float:
    return float(getattr(args, "zk_timeout", 5.0))


@contextlib.contextmanager
def coordinator(args: argparse.Namespace) -> Iterator[Any]:
    """A client of the cluster's coordinators, with the credentials registered for them (as
    ``sdk._cluster.open_coordinator`` finds them; not imported from there: the SDK package
    still loads kazoo), closed on exit. A call none answers within --zk-timeout is one line
    naming the addresses tried."""
    from ordq.common.client_tls import ClientCredentials, entry, entry_for_bootstrap
    from ordq.coordinator.client import CoordinatorClient

    # The credentials as ``credentials_for`` and ``security.lookup`` find them, without attrs
    # (ClientCredentials: TLS files and token; issue 42, an admin command's CPU).
    bootstrap = _checked_bootstrap(args)
    if bootstrap is not None:
        addresses = bootstrap
        found = entry_for_bootstrap(bootstrap)
        if not found and getattr(args, "zk", None):
            found = entry(args.zk, args.root)
    else:
        addresses = registered_bootstrap(args.zk, args.root) or ""
        found = entry(args.zk, args.root)
    credentials = ClientCredentials.from_entry(found)
    client = CoordinatorClient(bootstrap=addresses, credentials=credentials)
    try:
        yield client
    except CoordinationUnavailable as exc:
        given = "given" if bootstrap is not None else f"registered for {args.zk}{args.root}"
        mismatch = tls_mismatch(addresses, credentials)
        if mismatch is not None:  # issue 42: errors name the real cause
            raise CoordinationUnavailable(f"no coordinator of the cluster answered at {addresses} ({given}): "
                                          f"{mismatch}") from exc
        raise CoordinationUnavailable(
            f"no coordinator of the cluster answered at {addresses} ({given}) within {timeout_of(args):g}s "
            "(--zk-timeout): is the cluster running, and are these its coordinators? `ordq status` prints them "
            "as 'coordinators (bootstrap)'") from exc
    finally:
        client.close()


def tls_mismatch(addresses: str, credentials: Any, *, timeout_s: float = 1.0) -> str | None:
    """Why the coordinators at ``addresses`` cannot have answered a client holding ``credentials``
    (``ClientCredentials``), when it is TLS: the first one that accepts a connection speaks TLS
    and the client has no TLS credentials for the cluster, or it speaks plaintext and the client
    TLS, or its certificate is not signed by the CA the client trusts. None when none accepts a
    connection or none of these holds (then it is down, hung or busy). Asked only after a call
    failed: one TCP connection and one TLS handshake."""
    import socket
    import ssl

    from ordq.common.tls_socket import wrap_owned

    for address in addresses.split(","):
        host, _, port = address.strip().rpartition(":")
        if not port.isdigit():
            continue
        try:
            raw = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s)
        except OSError:
            continue  # nobody listens there: not a question of TLS
        context = ssl.create_default_context(cafile=credentials.ca_file) if credentials.tls else ssl.SSLContext(
            ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        if not credentials.tls:
            context.verify_mode = ssl.CERT_NONE
        verdict = "accepted"
        with raw:
            try:
                with wrap_owned(context, raw, host or "127.0.0.1"):
                    pass
            except ssl.SSLCertVerificationError:
                verdict = "unverified"
            except ssl.SSLError as exc:
                # a TLS server's alert (it wants a client certificate, ...) vs bytes that are no TLS
                verdict = "accepted" if "ALERT" in str(exc.reason or "").upper() else "plaintext"
            except TimeoutError:
                return None  # accepted and silent: hung (SIGSTOP) or busy, not a question of TLS
            except OSError:
                verdict = "plaintext"  # closed on a ClientHello: an HTTP/2 server without TLS
        if verdict == "accepted" and not credentials.tls:
            return (f"the coordinator at {address.strip()} speaks TLS and this command has no TLS credentials for "
                    f"the cluster (none registered in {credentials_path()} for it: run it where `ordq up` "
                    "registered the cluster, or `ordq cert register`, docs/SECURITY.md)")
        if verdict == "plaintext" and credentials.tls:
            return (f"the coordinator at {address.strip()} does not speak TLS (a cluster started with --insecure?) "
                    "and this command's credentials are TLS")
        if verdict == "unverified":
            return (f"the coordinator at {address.strip()} shows a certificate not signed by the CA this command "
                    f"trusts ({credentials.ca_file}): the credentials of another cluster?")
        return None
    return None


def check_queue(args: argparse.Namespace, queue: str) -> None:
    """QueueNotFound, PermissionDenied (a token with no role on it) or CoordinationUnavailable,
    as the coordinator answers, before a client starts: one line at once, where the SDK would
    wait for longer. The role the client needs is checked when it asks for its lease."""
    with coordinator(args) as client:
        client.describe(queue, timeout_s=timeout_of(args), reach_s=timeout_of(args))  # one call, as admin_call


def topic_partitions(args: argparse.Namespace, topic: str) -> int:
    """How many partitions ``topic`` has (TopicNotFound), as the coordinator answers."""
    with coordinator(args) as client:
        return int(client.describe_topic(topic, timeout_s=timeout_of(args)).partitions)
