"""The cross-centre CDC drill (issue 40, JMQ's own use): a database replicated to another data
centre through two clusters. MariaDB in centre 1 -> ``ordq cdc mysql`` -> the queue in centre
1's cluster -> ``ordq mirror run`` -> the same queue in centre 2's cluster -> ``ordq cdc
apply`` -> PostgreSQL in centre 2, while an application commits inserts, updates and deletes.

Faults, each once, in the seed's random order: the shipper, the mirror and the applier killed
(-9) and started again (a supervisor's job), the queue's head master killed (-9) in each centre,
and the link between the centres cut for ``LINK_CUT_S`` and healed.

Guarantee checked: at the end centre 2's tables equal centre 1's row for row; every row change
the shipper got acked in centre 1 is in centre 2's queue at the same seq with the same payload
(the mirror copies each source message once, in order, into a queue that only it writes); and
the Spark verifier finds every acked seq delivered once, in order, to a reader of centre 2's
queue (the shipper's acks are centre 1's, the deliveries centre 2's).

Both centres run on this machine (centre 1 is the drill's cluster, centre 2 a second local
cluster with its own ZooKeeper in the run's folder). The link cut is real packet loss: the
mirror runs under a group id of its own and iptables drops every TCP packet it sends to centre
2's ports as centre 2 publishes them (``published_ports``: its ZooKeeper, coordinators, brokers
and their lean links) until the heal; centre 2's own processes and its applier are untouched,
as they would be in their own centre. Needs root and iptables
(``require_link``), and the database servers (``drills.cdc.require_servers``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import shutil
import subprocess
import time
from typing import Any

import attrs
from kazoo.hosts import collect_hosts

from ordq.cluster_config import ClusterConfig
from ordq.common.addresses import split_host_port
from ordq.common.errors import ConfigError, OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.common.security import registered_bootstrap
from ordq.coordinator.service_leases import coordinator_addresses
from ordq.coordinator.store import ZkStore
from ordq.drills.cdc import (
    APPLIER_SUBSCRIPTION,
    TABLES,
    WORKERS,
    Reader,
    _applied,
    _differences,
    _maria_rows,
    _pg_rows,
    drive_faults,
    require_servers,
)
from ordq.drills.dbservers.mariadb import MariaDbServer, ShopApp
from ordq.drills.dbservers.postgres import PostgresServer
from ordq.drills.runner import SUBSCRIPTION, DrillContext, DrillError
from ordq.local_cluster import LocalCluster

LINK_CUT_S = 10.0
VICTIMS = ("shipper", "mirror", "applier", "master-dc1", "master-dc2", "link")
MIRROR_LEASE_TTL_S = 2.0


def require_link() -> None:
    """ConfigError (one line) unless this process may cut a link with iptables (root)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("setpriv") is None:
        raise ConfigError("the cdc-mirror drill cuts the link between the centres with iptables: it needs root, "
                          "iptables and setpriv (make test-deps; run as root)")


def require_all() -> None:
    require_servers()
    require_link()


@attrs.define
class LinkCut:
    """Drops every TCP packet processes of group ``gid`` send to ``ports`` (iptables OUTPUT
    rules naming only that group, so nothing else on the machine is touched), until ``heal``."""

    gid: int
    rules: list[list[str]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        sweep_leftover_cuts()

    def cut(self, ports: list[int]) -> None:
        for port in sorted(set(ports)):
            rule = ["OUTPUT", "-p", "tcp", "-m", "owner", "--gid-owner", str(self.gid), "--dport", str(port),
                    "-m", "comment", "--comment", f"{CUT_TAG}{os.getpid()}", "-j", "DROP"]
            _iptables("-I", rule)
            self.rules.append(rule)

    def heal(self) -> None:
        while self.rules:
            rule = self.rules.pop()
            with contextlib.suppress(OrdqError):
                _iptables("-D", rule)


CUT_TAG = "ordq-cdc-mirror-pid-"  # each rule names the drill process that cut: a leftover is known


def sweep_leftover_cuts() -> list[str]:
    """Delete the cut rules of drill processes no longer alive (a drill killed -9 mid-cut cannot
    heal its own); returns the rules deleted, as ``iptables -S`` printed them."""
    listing = subprocess.run(["iptables", "-w", "5", "-S", "OUTPUT"], capture_output=True, text=True, timeout=30,
                             check=False)
    deleted = []
    for line in listing.stdout.splitlines():
        found = re.search(rf"{CUT_TAG}(\d+)", line)
        if not line.startswith("-A OUTPUT ") or not found or os.path.exists(f"/proc/{found.group(1)}"):
            continue
        with contextlib.suppress(OrdqError):
            _iptables("-D", shlex.split(line)[1:])
            deleted.append(line)
    return deleted


def _iptables(action: str, rule: list[str]) -> None:
    proc = subprocess.run(["iptables", "-w", "5", action, *rule], capture_output=True, text=True, timeout=30,
                          check=False)
    if proc.returncode != 0:
        raise OrdqError(f"iptables {action} {' '.join(rule)}: {proc.stderr.strip() or proc.returncode}")


def published_ports(store: ZkStore) -> list[int]:
    """Every port a client of the cluster behind ``store`` may dial, as the cluster publishes
    them: its ZooKeeper's (the connection string), its coordinators' (registered for clients,
    and in their election), and each live broker's gRPC address and lean link (a master's
    produce link, a slave's replication link: issue 39, on by default). What a port-based cut
    must drop, read when it cuts (a restarted broker may listen elsewhere)."""
    addresses = [f"{host}:{port}" for host, port in collect_hosts(store.hosts)[0]]
    addresses += (registered_bootstrap(store.hosts, store.paths.root) or "").split(",")
    addresses += coordinator_addresses(store.client, store.paths.coordinator_leader)
    for gid in store.list_groups():
        for member in store.live_members(gid).values():
            addresses += [member.address, member.produce, member.replication]
    return sorted({port for a in addresses if a and (port := split_host_port(a)[1])})


def _end(cluster: LocalCluster, queue: str) -> str:
    return f"{cluster.zk_hosts}{cluster.root}/{queue}"


class Centres:
    """The run's databases and processes across the two centres; ``supervise()`` starts again a
    shipper, mirror or applier that exited (a supervisor's job)."""

    def __init__(self, ctx: DrillContext, dc2: LocalCluster, source: MariaDbServer, target_dsn: str) -> None:
        self.ctx, self.dc2, self.source, self.target_dsn = ctx, dc2, source, target_dsn
        self.procs: dict[str, ManagedProcess] = {}
        self.spawned = 0
        self.link = LinkCut(gid=random.SystemRandom().randrange(40_000, 60_000))

    def spawn(self, what: str) -> None:
        ctx, dc1, dc2 = self.ctx, self.ctx.cluster, self.dc2
        self.spawned += 1
        prefix: list[str] = []
        if what == "shipper":
            cluster, args = dc1, ["cdc", "mysql", self.source.source, ctx.queue, "--from-beginning",
                                  "--send-timeout", str(ctx.load.send_timeout_s),
                                  "--audit-dir", str(ctx.run_dir / "audit")]
        elif what == "mirror":
            # Its own group id: the link cut drops only its packets (LinkCut).
            prefix = ["setpriv", f"--regid={self.link.gid}", "--clear-groups", "--"]
            cluster, args = dc1, ["mirror", "run", "--from", _end(dc1, ctx.queue), "--to", _end(dc2, ctx.queue),
                                  "--instance", f"mirror-{self.spawned}", "--lease-ttl", f"{MIRROR_LEASE_TTL_S:g}",
                                  "--send-timeout", "1", "--retry-max", "1"]
        else:
            cluster, args = dc2, ["cdc", "apply", ctx.queue, "-s", APPLIER_SUBSCRIPTION, "--target",
                                  self.target_dsn, "--workers", WORKERS]
        proc = ManagedProcess(f"{what}-{self.spawned}", [*prefix, cluster.python, "-m", "ordq.cli", "--zk",
                                                         cluster.zk_hosts, "--root", cluster.root, *args],
                              run_dir=ctx.run_dir)
        proc.start()
        self.procs[what] = proc

    def supervise(self) -> None:
        for what, proc in list(self.procs.items()):
            if not proc.alive():
                self.ctx.event(f"{proc.name} exited {proc.returncode}: started again")
                self.spawn(what)

    def head(self, cluster: LocalCluster) -> tuple[str, int]:
        with cluster.store() as store:
            st = store.wait_state(self.ctx.queue, lambda s: s.open_segment is not None, timeout_s=30)
        seg = st.open_segment
        assert seg is not None
        return seg.gid, seg.seg

    def stop(self) -> None:
        self.link.heal()
        for proc in self.procs.values():
            if proc.alive():
                code = proc.stop(timeout_s=30)
                self.ctx.event(f"{proc.name} stopped (exit {code})")


def run_cdc_mirror(ctx: DrillContext) -> None:
    """The drill's whole run: centre 2's cluster and both databases are started for it."""
    import psycopg
    import pymysql

    require_all()
    dc2 = LocalCluster(ctx.run_dir / "dc2", ClusterConfig(groups=2, zk_nodes=1, coordinators=1))
    try:
        dc2.start(timeout_s=load_stretched(120.0))  # slower on a loaded machine, not stuck
        ctx.event(f"centre 1: the drill's cluster (ZooKeeper {ctx.cluster.zk_hosts}); centre 2: a cluster of "
                  f"{len(dc2.gids)} groups (ZooKeeper {dc2.zk_hosts})")
        source = MariaDbServer.start()
        try:
            target = PostgresServer.start()
            try:
                _run(ctx, dc2, source, target)
            except (pymysql.Error, psycopg.Error) as exc:  # the drill's own statements: its error, one line
                raise DrillError(f"cdc-mirror drill: {type(exc).__name__}: {exc}") from exc
            finally:
                target.destroy()
        finally:
            source.destroy()
    finally:
        dc2.destroy()


def _run(ctx: DrillContext, dc2: LocalCluster, source: MariaDbServer, target: PostgresServer) -> None:
    import psycopg

    source.fresh_shop()
    conn: Any = source.connect(autocommit=True)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE shop.drill_end ({TABLES['drill_end']})")
    dsn = target.create_database("replica")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("CREATE SCHEMA shop")
        for table, columns in TABLES.items():
            pg.execute(f"CREATE TABLE shop.{table} ({columns})")
    with dc2.store() as store:  # centre 2's copy, read from seq 0 by the applier and the audited reader
        store.create_queue(ctx.queue)
        for sub in (SUBSCRIPTION, APPLIER_SUBSCRIPTION):
            store.create_subscription(ctx.queue, sub)
    ctx.event(f"MariaDB source (centre 1) on port {source.port}, PostgreSQL target (centre 2) {dsn}")
    reader = Reader(ctx)
    reader.cfg = attrs.evolve(reader.cfg, zk_hosts=dc2.zk_hosts, root=dc2.root)  # centre 2's copy
    run = Centres(ctx, dc2, source, dsn)
    app = ShopApp(source, rate=max(ctx.load.rate / 2.5, 1.0), seed=ctx.rng.randrange(1 << 30))
    try:
        run.spawn("mirror")  # first: its subscription on centre 1 holds the stream from seq 0
        run.procs["mirror"].wait_for_line("LEADING", timeout_s=120)
        reader.start()
        run.spawn("shipper")
        run.spawn("applier")
        app.start()
        began = time.monotonic()
        total = ctx.load.messages
        victims = list(VICTIMS)
        ctx.rng.shuffle(victims)
        moments = sorted(int(ctx.rng.uniform(0.1, 0.9) * total) for _ in victims)
        ctx.event(f"application running; faults at {moments} of {total} row changes: {', '.join(victims)}")
        budget = total / max(ctx.load.rate, 1.0) * 4 + 120

        def progress(at: int) -> bool:
            """Shipped, copied to centre 2, read and applied there through seq ``at``?"""
            run.supervise()
            if reader.error is not None or app.error is not None:
                raise OrdqError(f"cdc-mirror drill: reader or application failed: {reader.error or app.error}")
            return reader.last_seq >= at and _applied(dsn) >= at

        def moved() -> int:
            """How far the slower of reader and applier got (a loaded box is slow, not stuck)."""
            return min(reader.last_seq, _applied(dsn)) + _acked(ctx)

        drive_faults(ctx, list(zip(moments, victims, strict=True)), total=total, budget=budget,
                     progress=progress, moved=moved, fault=lambda victim: _fault(ctx, run, victim, reader),
                     what="row changes copied to centre 2 and applied")
        app.stop.set()
        app.join(timeout=30)
        cur.execute("INSERT INTO shop.drill_end VALUES (1, 'end')")  # the binlog's last change
        end = ctx.wait(lambda: progress(reader.last_seq) and reader.end_seq is not None and reader.end_seq + 1,
                       timeout_s=budget, progress=moved, what="the end marker read in centre 2")
        ctx.event(f"centre 2's queue holds the whole stream: seqs 0..{end - 1}")
        shipped_s = time.monotonic() - began
        expected = {t: _maria_rows(source, t) for t in TABLES}
        try:
            ctx.wait(lambda: progress(0) and all(_pg_rows(dsn, t) == rows for t, rows in expected.items()),
                     timeout_s=budget, what="centre 2's tables to equal centre 1's")
        finally:
            ctx.expect(f"centre 2's tables equal centre 1's row for row ({_differences(expected, dsn)})",
                       all(_pg_rows(dsn, t) == rows for t, rows in expected.items()))
        reader.stop.set()
        reader.join(timeout=30)
        _expect_copy(ctx, end)
        ctx.load = attrs.evolve(ctx.load, messages=end)  # the verdict's "stream completed": what was shipped
        ctx.notes.update(row_changes=end, rows=len(expected["items"]), rows_per_s=end / shipped_s,
                         reader_rejoined=reader.rejoined)
    finally:
        app.stop.set()
        run.stop()
        reader.stop.set()
        reader.join(timeout=30)
        conn.close()


def _acked(ctx: DrillContext) -> int:
    """Row changes the shipper got acked in centre 1 (its audit)."""
    from ordq.spark_order_check.copy_check import source_acks

    if not (ctx.run_dir / "audit" / "acks").exists():
        return 0
    with contextlib.suppress(OSError, ValueError, OrdqError):  # none written yet, a line being written
        return len(source_acks([str(ctx.run_dir / "audit" / "acks")]))
    return 0


def _fault(ctx: DrillContext, run: Centres, victim: str, reader: Reader) -> None:
    if victim in ("master-dc1", "master-dc2"):
        cluster, centre = (ctx.cluster, "centre 1") if victim == "master-dc1" else (run.dc2, "centre 2")
        gid, seg = run.head(cluster)
        cluster.broker(gid, "master").kill()
        if cluster is ctx.cluster:  # the shipper's failover is the one the verdict times
            ctx.fault(f"kill -9 master of {gid} in {centre} (head, segment {seg})", kind="segment", seg=seg)
        else:
            ctx.event(f"FAULT: kill -9 master of {gid} in {centre} (head, segment {seg}; the mirror writes it)")
        address = cluster.restart_broker(gid, "master")
        ctx.event(f"restarted {gid} master in {centre} at {address}")
    elif victim == "link":
        _cut_link(ctx, run, reader)
    else:
        proc = run.procs[victim]
        proc.kill()
        ctx.event(f"FAULT: kill -9 {proc.name}")
        run.spawn(victim)


def _cut_link(ctx: DrillContext, run: Centres, reader: Reader) -> None:
    """Cut the mirror off centre 2 for LINK_CUT_S: centre 1 goes on taking the binlog, centre 2
    falls behind; after the heal the copy catches up (the waits after this one)."""
    acked, copied = _acked(ctx), reader.last_seq
    with run.dc2.store() as store:
        run.link.cut(published_ports(store))
    ctx.event(f"FAULT: the link between the centres cut (the mirror's packets to centre 2 dropped) for at "
              f"least {LINK_CUT_S:g}s; centre 2 holds up to seq {copied}")
    try:
        # At least LINK_CUT_S, and until centre 1 took row changes meanwhile (a shipper killed
        # just before waits out its predecessor's lease first).
        cut_at = time.monotonic()
        ctx.wait(lambda: time.monotonic() - cut_at >= LINK_CUT_S and _acked(ctx) > acked,
                 timeout_s=ctx.load.messages / max(ctx.load.rate, 1.0) * 4 + 120,
                 what="the cut's time to pass and centre 1 to take row changes meanwhile")
        took = _acked(ctx) - acked
        behind = _acked(ctx) - 1 - reader.last_seq
    finally:
        run.link.heal()
    waited = any(w in run.procs["mirror"].log_tail(200) for w in ("WAITING", "trying again"))
    ctx.event(f"link healed after {time.monotonic() - cut_at:.1f}s: centre 1 took {took} row changes during the "
              f"cut; centre 2 {behind} behind"
              + ("; the mirror said it waits" if waited else ""))
    ctx.expect("centre 1 went on while the link was cut and centre 2 fell behind", took > 0 and behind > 0)
    healed, target = time.monotonic(), _acked(ctx) - 1
    ctx.wait(lambda: reader.last_seq >= target, timeout_s=ctx.load.messages / max(ctx.load.rate, 1.0) * 4 + 120,
             progress=lambda: reader.last_seq, what=f"centre 2 to catch up to seq {target} after the heal")
    ctx.event(f"centre 2 caught up with what centre 1 held at the heal (seq {target}) "
              f"{time.monotonic() - healed:.1f}s after it")


def _expect_copy(ctx: DrillContext, end: int) -> None:
    """Every row change acked in centre 1 is in centre 2's queue at its seq, same payload."""
    from ordq.spark_order_check.copy_check import copy_rows, source_acks

    audit = ctx.run_dir / "audit"
    acks, copy = source_acks([str(audit / "acks")]), copy_rows([str(audit / "deliveries")], [])
    wrong = [s for s, crc in sorted(acks.items()) if copy.get(s) != crc]
    first_wrong = f" (first wrong or missing seq: {wrong[0]})" if wrong else ""
    ctx.expect(f"centre 2's copy holds each of the {len(acks)} row changes centre 1 acked at its seq with its "
               f"payload, and seqs 0 to {end - 1} once{first_wrong}", not wrong and sorted(copy) == list(range(end)))


__all__ = ["LINK_CUT_S", "VICTIMS", "require_all", "run_cdc_mirror"]

