"""ordq up | down | status: a complete local cluster (ZooKeeper, broker groups, coordinators).

Everything lives in one folder (``--dir``, default ./.ordq); the processes keep running after
``ordq up`` exits, and ``down``/``status`` find them through that folder
(``ordq.local_cluster.LocalCluster``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ordq.cluster_folder import DEFAULT_FOLDER, holds_cluster
from ordq.commands import add_command, int_in, local_zk_port, saying, seconds, wants_json
from ordq.output import emit_json, table

# ``ordq status`` of a running cluster is one admin call (issue 42: ≤ 0.25 s on a quiet box): it
# loads neither the local cluster's classes nor attrs, ZooKeeper's client or the certificate code
# (tests/test_cli_quick.py pins it); ``up``, ``down`` and the local view import them.
if TYPE_CHECKING:
    from ordq.cluster_config import ClusterConfig
    from ordq.local_cluster import LocalCluster

DEFAULT_ZK_PORT = 2181  # the CLI's default --zk: after `ordq up`, `ordq queue list` just works
EXIT_UNHEALTHY = 3


def register(subparsers: Any) -> None:
    up = add_command(
        subparsers, "up", func=cmd_up,
        help="start a local cluster: ZooKeeper, broker groups (master + slave) and coordinators",
        description="Start a complete local cluster under --dir and return once it serves; the processes keep "
        "running. Run it again after a crash to start only what is missing.",
    )
    _dir_option(up)
    up.add_argument("--groups", type=int_in(1, 26), default=None, metavar="N",
                    help="broker groups, a master and a slave process each (default: as before in --dir, else 3)")
    up.add_argument("--zk-nodes", type=int, choices=[1, 3], default=None,
                    help="1 (standalone) or 3 (ensemble) ZooKeeper nodes (default: as before, else 1)")
    up.add_argument("--zk-port", type=int_in(0, 65533), default=None, metavar="PORT",
                    help=f"ZooKeeper client port of the first node; 0: any free port (default: as before in --dir, "
                         f"else the port of --zk / ORDQ_ZK when it is 127.0.0.1:PORT, else {DEFAULT_ZK_PORT})")
    up.add_argument("--coordinators", type=int_in(0, 9), default=None, metavar="N",
                    help="coordinator daemons, one elected (default: as before, else 2)")
    up.add_argument("--insecure", action="store_true", default=None,
                    help="a new cluster without TLS and tokens: anyone on this machine may call it (docs/SECURITY.md)")
    up.add_argument("--no-zk-acl", action="store_true",
                    help="leave the ZooKeeper root open to any client (default: protected by ACLs, with admin, "
                         "coordinator and broker credentials generated into --dir/zk-auth, the admin ZooKeeper's "
                         "super-user; docs/SECURITY.md)")
    up.add_argument("--zk-tls", action=argparse.BooleanOptionalAction, default=None,
                    help="a new cluster's ZooKeeper serves TLS only, with a certificate of the cluster CA, and "
                         "requires the clients' (they find that in the credentials file); the default unless "
                         "--insecure; --no-zk-tls: plaintext ZooKeeper (docs/SECURITY.md)")
    up.add_argument("--repair-acls", action="store_true",
                    help="set every ZooKeeper node's ACL to the policy (otherwise done only on a first start, after "
                         "a rotation or a walk cut short: two requests a node, minutes at 10^5 queues)")
    up.add_argument("--prometheus-url", dest="prometheus_url", default=None, metavar="URL",
                    help="a Prometheus that scrapes this cluster (http://HOST:PORT): the status pages' charts show "
                         "the last hour from it (coordinators started from now on; default: as before, else none)")
    up.add_argument("--timeout", type=seconds(), default=120.0, metavar="SECONDS",
                    help="how long to wait for everything to serve (default %(default)s)")

    down = add_command(subparsers, "down", func=cmd_down,
                       help="stop the local cluster in --dir (data is kept unless --wipe)")
    down.add_argument("--dir", type=Path, default=None,
                      help=f"folder of the cluster (default {DEFAULT_FOLDER} when it holds one, else the current "
                           "context's, when ordq up made it: a cluster started with ordq up --dir elsewhere)")
    down.add_argument("--wipe", action="store_true", help="also delete its data, logs and configuration")

    status = add_command(
        subparsers, "status", func=cmd_status,
        help="every process of the local cluster with its health (exit 3 if one is unhealthy)",
        description="Every process of a cluster with where it listens, its health and version, and the elected "
        "coordinator; exit 3 if one is unhealthy. The local cluster in --dir, when there is one and neither "
        "--zk, --context nor ORDQ_ZK names another (with the pids of its processes, and the ones that do not "
        "run as down); else any cluster (deployed by hand too), from the processes registered in its ZooKeeper. "
        "Each is asked live (ZooKeeper srvr, broker Health, coordinator /health) by the elected coordinator, or "
        "by this command when none answers within --zk-timeout.")
    status.add_argument("--dir", type=Path, default=None,
                        help=f"folder of a local cluster (ordq up; default {DEFAULT_FOLDER} when it holds one)")


def _dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=DEFAULT_FOLDER,
                        help="folder of the cluster's configuration, data and logs (default %(default)s)")


def _config(args: argparse.Namespace) -> ClusterConfig | None:
    """The shape asked for on the command line; None: as saved in --dir (or the defaults)."""
    from ordq.cluster_config import ClusterConfig
    from ordq.common.errors import ConfigError
    from ordq.local_cluster import LocalCluster

    fresh = not LocalCluster.exists(args.dir)
    asked = any(v is not None for v in (args.groups, args.zk_nodes, args.zk_port, args.coordinators, args.insecure))
    asked = asked or args.no_zk_acl or args.zk_tls is not None or args.prometheus_url is not None
    if args.prometheus_url is not None:
        from ordq.admin.prom_history import check_url

        args.prometheus_url = check_url(args.prometheus_url)
    if args.zk_tls is not None and not fresh and LocalCluster(args.dir).config.zk_tls != args.zk_tls:
        had = "TLS" if not args.zk_tls else "a plaintext ZooKeeper"
        raise ConfigError(f"the cluster in {args.dir} was started with {had}: --{'' if args.zk_tls else 'no-'}zk-tls "
                          f"is for a new cluster (ordq down --wipe --dir {args.dir} first)")
    if fresh and args.zk_tls and args.insecure:
        raise ConfigError("--zk-tls needs the cluster's certificates: not with --insecure")
    if not fresh and not asked:
        return None
    saved = LocalCluster(args.dir).config if not fresh else ClusterConfig()
    port = args.zk_port if args.zk_port is not None else (local_zk_port(args.zk, DEFAULT_ZK_PORT) if fresh
                                                          else saved.zk_port)
    return ClusterConfig(
        groups=args.groups if args.groups is not None else saved.groups,
        zk_nodes=args.zk_nodes if args.zk_nodes is not None else saved.zk_nodes,
        zk_port=port or None,
        coordinators=args.coordinators if args.coordinators is not None else saved.coordinators,
        root=args.root if fresh else saved.root,
        tls=not args.insecure if fresh else saved.tls,
        tokens=not args.insecure if fresh else saved.tokens,
        zk_acl=saved.zk_acl and not args.no_zk_acl,
        # TLS to ZooKeeper: on for a new cluster with TLS unless --no-zk-tls; a cluster started
        # before keeps what it had (its ZooKeeper and its clients must agree).
        zk_tls=(args.zk_tls if args.zk_tls is not None else not args.insecure) if fresh else saved.zk_tls,
        prometheus_url=args.prometheus_url if args.prometheus_url is not None else saved.prometheus_url,
    )


def cmd_up(args: argparse.Namespace) -> int:
    from ordq.common.security import credentials_path
    from ordq.local_cluster import LocalCluster

    cluster = LocalCluster(args.dir, _config(args))
    with saying(f"starting the local cluster in {args.dir} and waiting until every process serves"):
        report = cluster.start(timeout_s=args.timeout, repair_acls=args.repair_acls)
    cluster.detach()  # they keep running after this command
    context = _select_context(cluster)
    statuses = [s.to_dict() for s in cluster.status()]
    if wants_json(args):
        emit_json({"dir": str(cluster.folder), "zk": cluster.zk_hosts, "root": cluster.root, "context": context,
                   "bootstrap": cluster.bootstrap, "started": list(report.started), "notes": list(report.notes),
                   "processes": statuses, "metrics": cluster.metrics_urls()})
        return 0
    for note in report.notes:
        print(f"note: {note}")
    total = len(cluster.processes())
    if len(report.started) == total:
        print(f"local cluster started: {total} processes in {cluster.folder}")
    else:
        print(f"local cluster in {cluster.folder}: started the {len(report.started)} of its {total} processes "
              f"that were not running ({', '.join(report.started)})")
    _print_table(statuses)
    print("\nPrometheus metrics (docs/OPERATIONS.md, Metrics):")
    urls = cluster.metrics_urls()
    table([{"process": name, "url": url} for name, url in urls.items()], ["process", "url"])
    pages = [url.rsplit("/", 1)[0] + "/status" for name, url in urls.items() if name.startswith("coordinator")]
    if pages:
        print(f"status page: {pages[0]} (every coordinator serves one)")
    print(f"\nZooKeeper: {cluster.zk_hosts}   root: {cluster.root}   logs: {cluster.folder}/*/")
    print(f"coordinators (bootstrap): {cluster.bootstrap or '-'}   (clients: --bootstrap, or bootstrap= in the SDK)")
    creds = cluster.credentials
    print(f"security: {'mutual TLS (CA ' + str(creds.ca_file) + ')' if creds.tls else 'plaintext (--insecure)'}"
          f"{', ZooKeeper over TLS' if creds.zk_tls else ''}, "
          f"{'an admin token' if creds.token else 'no tokens'}; registered for {cluster.zk_hosts}{cluster.root} "
          f"in {credentials_path()} (docs/SECURITY.md)")
    print(f"export ORDQ_ZK={cluster.zk_hosts}" + (f" ORDQ_ROOT={cluster.root}" if cluster.root != "/ordq" else ""))
    print(f"context: {context} (the current one: every command uses this cluster; ordq context list)")
    print("next: ordq queue create demo && ordq produce demo --count 1000 && "
          "ordq consume demo -s s1 --count 1000 --quiet")
    return 0


def _select_context(cluster: LocalCluster) -> str:
    """Add the cluster as a context and make it the current one (issue 42): ``local`` for the
    default folder, else the folder's name."""
    import re

    from ordq.contexts import Context, add

    name = "local" if cluster.folder.name == DEFAULT_FOLDER.name else (
        re.sub(r"[^A-Za-z0-9._-]", "-", cluster.folder.name.lstrip("."))[:64].strip("-.") or "local")
    add(Context(name=name, zk=cluster.zk_hosts, root=cluster.root, dir=str(cluster.folder.resolve())), select=True)
    return name


def _down_folder(args: argparse.Namespace) -> tuple[Path, str | None]:
    """The folder ``ordq down`` stops, and the context it came from (None: not from one):
    --dir; else .ordq when it holds a cluster; else the current context's folder when ``ordq
    up`` made that context and a cluster is there (after ``ordq up --dir X``, which says every
    command uses that cluster, a bare ``ordq down`` elsewhere said "nothing to stop" and left
    it running); else .ordq. Never a context's folder with --wipe: deleting data takes a
    folder named on the command line (or the one here)."""
    import os

    from ordq.common.errors import ConfigError
    from ordq.contexts import selected

    if args.dir is not None:
        return args.dir, None
    if holds_cluster(DEFAULT_FOLDER):
        return DEFAULT_FOLDER, None
    context = selected(args.context or os.environ.get("ORDQ_CONTEXT") or None)
    if context is None or context.dir is None or not holds_cluster(Path(context.dir)):
        return DEFAULT_FOLDER, None
    if args.wipe:
        raise ConfigError(f"no local cluster in {DEFAULT_FOLDER}; the current context {context.name} is the one in "
                          f"{context.dir}: to delete its data, name it (ordq down --wipe --dir {context.dir})")
    return Path(context.dir), context.name


def cmd_down(args: argparse.Namespace) -> int:
    from ordq.local_cluster import LocalCluster

    args.dir, of_context = _down_folder(args)
    if not LocalCluster.exists(args.dir):
        # No state file: nothing of a cluster runs from here, but a start that failed in an
        # older version (or a crash) may have left its files; --wipe deletes those too.
        wiped = wipe_leftovers(args.dir) if args.wipe else []
        if wants_json(args):
            emit_json({"dir": str(args.dir), "stopped": [], "wiped": bool(wiped)})
        elif wiped:
            print(f"no local cluster in {args.dir}: nothing to stop; deleted what one left: {', '.join(wiped)}")
        else:
            print(f"no local cluster in {args.dir}: nothing to stop")
        return 0
    cluster = LocalCluster.load(args.dir)
    with saying(f"stopping the local cluster in {args.dir}"):
        stopped = cluster.stop()
    cluster.unregister()  # `ordq up` registers it again; another cluster's entry there stays
    if args.wipe:
        cluster.destroy()
        from ordq.contexts import remove_matching

        remove_matching(cluster.zk_hosts, cluster.root)  # it names nothing any more
    if wants_json(args):
        emit_json({"dir": str(cluster.folder), "stopped": stopped, "wiped": bool(args.wipe)})
    else:
        what = f"stopped {len(stopped)} processes" if stopped else "nothing was running"
        kept = "data wiped" if args.wipe else "data kept (ordq up resumes it; ordq down --wipe deletes it)"
        whose = f" (the current context, {of_context})" if of_context else ""
        print(f"local cluster in {cluster.folder}{whose}: {what}; {kept}")
    return 0


def wipe_leftovers(folder: Path) -> list[str]:
    """``wipe_files`` for a folder without a cluster state file, unless a ZooKeeper it holds
    still runs (then the caller stops it first: ordq zk stop)."""
    from ordq.common.errors import ExternalProcessError
    from ordq.local_cluster import wipe_files
    from ordq.zk_server import CONFIG_FILE, ZkServer

    zk = folder / "zk"
    if (zk / CONFIG_FILE).exists() and any(p.alive() for p in ZkServer.load(zk).processes):
        raise ExternalProcessError(f"a ZooKeeper still runs from {zk}: stop it first (ordq zk stop --dir {zk})")
    return wipe_files(folder)


def cmd_status(args: argparse.Namespace) -> int:
    import os

    from ordq.bootstrap import bootstrap_of

    named = "zk" in getattr(args, "given", ()) or os.environ.get("ORDQ_ZK") or args.context \
        or os.environ.get("ORDQ_CONTEXT") or bootstrap_of(args)
    if named and args.dir is None and holds_cluster(DEFAULT_FOLDER):
        from ordq.local_cluster import LocalCluster

        local = LocalCluster.load(DEFAULT_FOLDER)
        if (local.zk_hosts, local.root) == (getattr(args, "zk", None), getattr(args, "root", None)):
            named = False  # it names the local cluster itself (ORDQ_ZK as `ordq up` printed it): its view
    if args.dir is None and (named or not holds_cluster(DEFAULT_FOLDER)):
        from ordq.contexts import selected

        if named or selected(None) is not None:
            return _live_status(args)
        # nothing names a cluster: "no local cluster in .ordq" (with what to do), as before
    args.dir = args.dir or DEFAULT_FOLDER
    view = _local_status_from_coordinator(args)
    if view is None:
        from ordq.local_cluster import LocalCluster

        cluster = LocalCluster.load(args.dir)
        view = {"dir": str(cluster.folder), "zk": cluster.zk_hosts, "root": cluster.root,
                "bootstrap": cluster.bootstrap, "processes": [s.to_dict() for s in cluster.status()],
                "asked_by": "this command"}
    statuses = view["processes"]
    healthy = all(s["healthy"] for s in statuses)
    if wants_json(args):
        emit_json({**view, "healthy": healthy})
    else:
        print(f"local cluster in {view['dir']}: ZooKeeper {view['zk']}, root {view['root']}")
        print(f"coordinators (bootstrap): {view['bootstrap'] or '-'}")
        _print_table(statuses)
        if not healthy:
            print("\nunhealthy: " + ", ".join(s["name"] for s in statuses if not s["healthy"])
                  + f" (logs in {view['dir']}; ordq up --dir {args.dir} starts what is down)")
    return 0 if healthy else EXIT_UNHEALTHY


def _local_status_from_coordinator(args: argparse.Namespace) -> dict[str, Any] | None:
    """The local cluster in ``args.dir`` as its elected coordinator asks its processes (one admin
    call, as ``ordq status`` of any cluster: the local sweep below cost a ZooKeeper session and a
    TLS handshake with every process, 711 M instructions, issue 42), with what only the folder
    knows (pids, what does not run: ``LocalFolder``). None when the folder's own sweep must say
    it: no coordinator of it runs, none answers, or the folder predates this view."""
    from ordq.cluster_folder import LocalFolder
    from ordq.common.errors import OrdqError

    local = LocalFolder.read(args.dir)
    if local is None:
        return None
    running = local.running()
    if not any(pid for name, pid in running.items() if name in local.coordinator_addresses):
        return None  # none would answer: the sweep says at once what is down
    args.zk, args.root = local.zk, local.root  # the admin call finds its coordinators by these
    try:
        doc, _why = _status_from_coordinator(args)
    except OrdqError:
        return None  # a refusal (the credentials registered here are not this folder's): its own
    if doc is None:
        return None
    return {"dir": str(local.folder), "zk": local.zk, "root": local.root, "bootstrap": local.bootstrap,
            "processes": local.rows(doc["processes"], running), "asked_by": "coordinator"}


def _live_status(args: argparse.Namespace) -> int:
    """``ordq status`` of any cluster: every process its ZooKeeper registers, asked live. One
    admin call: the elected coordinator asks them (``cluster status``, ordq/admin/api.py), over
    the channels it keeps; when no coordinator answers (or none is known for the cluster, or it
    predates the verb), this command asks them itself, through ZooKeeper, as before."""
    from ordq.contexts import apply

    apply(args)  # the cluster named by --context, ORDQ_CONTEXT or the current context
    doc, why = _status_from_coordinator(args)
    if doc is None:
        if why is not None and _by_bootstrap_only(args):
            # --bootstrap alone names the cluster: no ZooKeeper to ask instead (not --zk's default)
            from ordq.common.errors import CoordinationUnavailable

            raise CoordinationUnavailable(why)
        doc = _status_from_zookeeper(args, why)
    statuses, leader, healthy = doc["processes"], doc["leader"], doc["healthy"]
    zk, root = doc.get("zk", args.zk), doc.get("root", args.root)  # the coordinator's: --bootstrap may name it
    if wants_json(args):
        emit_json({"zk": zk, "root": root, "healthy": healthy, "leader": leader,
                   "processes": statuses, "asked_by": doc["asked_by"]})
    else:
        print(f"cluster: ZooKeeper {zk}, root {root}; coordinator leader: {leader or '-'}")
        _print_table(statuses)
        if not healthy:
            print("\nunhealthy: " + ", ".join(s["name"] for s in statuses if not s["healthy"]))
        if doc["asked_by"] != "coordinator":
            print(f"\n(asked by this command: {doc['asked_by']})")
    return 0 if healthy else EXIT_UNHEALTHY


def _by_bootstrap_only(args: argparse.Namespace) -> bool:
    """Whether --bootstrap (or ORDQ_BOOTSTRAP) alone names the cluster: no --zk, ORDQ_ZK or context."""
    import os

    from ordq.bootstrap import bootstrap_of

    return bootstrap_of(args) is not None and not ("zk" in getattr(args, "given", ()) or os.environ.get("ORDQ_ZK")
                                                   or args.context or os.environ.get("ORDQ_CONTEXT"))


def _status_from_coordinator(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str | None]:
    """The elected coordinator's sweep, or (None, why) when none can give it: none is known for
    the cluster, none answered within --zk-timeout, or it does not know the verb. A
    refusal (a token without the admin role) is the command's error."""
    from ordq.bootstrap import coordinator, timeout_of
    from ordq.commands import ADMIN_CALL_TIMEOUT_S, coordinator_known, older_coordinator, saying
    from ordq.common.errors import ConfigError, CoordinationUnavailable

    if not coordinator_known(args):
        return None, None
    # Reached as every admin command reaches them, within --zk-timeout: a shorter bound made a
    # slow answer (a busy box: the command's own TLS handshake waits for a core) fall back to the
    # command's own sweep, three times the work (issue 42).
    try:
        with coordinator(args) as client, saying(f"waiting for the coordinators at {', '.join(client.coordinators)} "
                                                 "to answer cluster status"):
            doc = client.admin("cluster status", timeout_s=ADMIN_CALL_TIMEOUT_S, reach_s=timeout_of(args))
    except CoordinationUnavailable as exc:
        return None, str(exc)
    except ConfigError as exc:
        if older_coordinator(exc) or "does not sweep" in str(exc):
            return None, str(exc)  # a coordinator of an older version
        raise
    return {**doc, "asked_by": "coordinator"}, None


def _status_from_zookeeper(args: argparse.Namespace, why: str | None) -> dict[str, Any]:
    """This command's own sweep: what ZooKeeper registers (with the admin ZooKeeper credential),
    each process asked live. ``why``: why no coordinator gave it (None: none is known), named in
    the error when ZooKeeper does not answer either."""
    from ordq.cluster_live import live_status
    from ordq.commands import open_store
    from ordq.common.errors import CoordinationUnavailable, OrdqError
    from ordq.common.security import lookup

    try:
        store = open_store(args)
    except OrdqError as exc:
        if why is None:
            raise
        raise CoordinationUnavailable(f"{why}; and {exc}") from exc
    try:
        statuses = [s.to_dict() for s in live_status(store, args.zk, lookup(args.zk, args.root))]
    finally:
        store.close()
    leader = next((s["name"] for s in statuses if s["kind"] == "coordinator" and s["state"] == "leader"), None)
    return {"processes": statuses, "leader": leader, "healthy": all(s["healthy"] for s in statuses),
            "asked_by": "no coordinator answered: from ZooKeeper"}


def _print_table(statuses: list[dict[str, Any]]) -> None:
    rows = [{"process": s["name"], "pid": s["pid"], "listen": s["listen"], "state": s["state"],
             "healthy": s["healthy"], "version": s["version"] or None, "detail": s["detail"] or None}
            for s in statuses]
    table(rows, ["process", "pid", "listen", "state", "healthy", "version", "detail"])
