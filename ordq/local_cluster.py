"""A complete local cluster under one folder: ZooKeeper, N broker groups, coordinator daemons.

Used by ``ordq up|down|status``, the drills, the demo, the failover bench and the tests: one
way to start, find, heal and stop a cluster. Guarantees:

- ``start()`` returns only when everything serves: ZooKeeper answers, every group is
  registered in ZooKeeper *before* its processes start, every broker printed its readiness
  line and registered itself live, and one coordinator daemon is elected. If anything fails
  on the way, what this call started is stopped again and the error says what and why (with
  the log tail of the process that failed).
- What it started is kept in ``<folder>/ordq-cluster.json``; every process keeps a pid file
  and a log under the folder, so ``LocalCluster.load(folder)`` in another process (``ordq
  status``, ``ordq down``) finds, checks and stops the same processes.
- Starting twice is refused (``AlreadyExists``) while everything runs; when only some
  processes run (a drill killed one, the machine rebooted) ``start()`` starts the rest. Stale
  pid files are replaced and reported; a port in use is reported with what to do.
- ``stop()`` keeps the data (a later ``start()`` resumes the same cluster); ``destroy()``
  wipes the folder.

Layout::

    <folder>/ordq-cluster.json            what was started, how, and where it listens
    <folder>/zk/                          ZooKeeper (ordq.zk_server.ZkServer)
    <folder>/brokers/<gid>/master|slave   broker data folders
    <folder>/brokers/run/                 broker logs and pid files
    <folder>/coordinators/                coordinator logs and pid files
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ordq.broker_group.process import BrokerGroupProcesses, BrokerProcess
from ordq.common.errors import AlreadyExists, ConfigError, ExternalProcessError, OrdqError
from ordq.common.metrics import scrape
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials, ensure_coordinator_pki, ensure_pki, register, remember_zk_tls, unregister
from ordq.coordinator.acl_client import AUTH_DIR, AUTH_USERS, read_credential, write_credential
from ordq.coordinator.store import ZkStore
from ordq.coordinator.zk_retry import START_BOUND_S, retry_zk
from ordq.zk_server import ZkServer

T = TypeVar("T")

STATE_FILE = "ordq-cluster.json"
OWN_CREDENTIALS = "credentials.json"  # the cluster's own entry, for its own processes
CLUSTER_DIRS = ("brokers", "coordinators", "zk", "drills", "tls", AUTH_DIR)
DEFAULT_FOLDER = Path(".ordq")
ROLES = ("master", "slave")
_STARTUP_TIMEOUT_S = 120.0


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """Shape of a local cluster. ``zk_port`` None picks free ports (tests, drills)."""

    groups: int = 3
    zk_nodes: int = 1
    zk_port: int | None = None
    coordinators: int = 2
    root: str = "/ordq"
    session_timeout_s: float = 1.0  # broker ZooKeeper sessions: how fast a dead process is noticed
    tls: bool = True  # mutual TLS on every gRPC hop, with a CA made in <folder>/tls (ordq/common/security.py)
    tokens: bool = True  # enforce access tokens; start() makes an admin token (<folder>/admin.token)
    # ZooKeeper ACLs on the root (docs/SECURITY.md): admin and client digest credentials are
    # generated into <folder>/zk-auth/; brokers and coordinators act as admin.
    zk_acl: bool = True
    # ZooKeeper serves clients over TLS only (its secureClientPort), with a certificate of the
    # cluster CA, and requires theirs; every ordq client finds this in the credentials file and
    # connects with one SSL context per process (coordinator/zk_tls.py: a handshake, ~10-30 ms
    # on a quiet machine, where kazoo's own connect loaded the system CA bundle at every attempt).
    # On in `ordq up` unless --no-zk-tls or --insecure; off here, for the clusters tests and
    # drills build themselves.
    zk_tls: bool = False

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.groups <= 26:
            raise ConfigError(f"groups must be 1..26, not {self.groups}")
        if self.zk_nodes not in (1, 3):
            raise ConfigError(f"a local ZooKeeper has 1 or 3 nodes, not {self.zk_nodes}")
        if not 0 <= self.coordinators <= 5:
            raise ConfigError(f"coordinators must be 0..5, not {self.coordinators}")
        if self.zk_port is not None and not 1 <= self.zk_port <= 65533:
            raise ConfigError(f"zk_port must be 1..65533, not {self.zk_port}")
        if self.session_timeout_s <= 0:
            raise ConfigError("session_timeout_s must be > 0")
        if self.zk_tls and not self.tls:
            raise ConfigError("TLS to ZooKeeper needs the cluster's certificates (tls)")

    @property
    def gids(self) -> tuple[str, ...]:
        return tuple(f"g{i + 1}" for i in range(self.groups))


@attrs.frozen
class ProcessStatus:
    """One process of the cluster as seen now."""

    name: str  # zk1 | g1/master | coordinator-1
    kind: str  # zookeeper | broker | coordinator
    pid: int | None
    listen: str | None
    state: str  # e.g. standalone, leader, live, standby, down
    healthy: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class StartReport:
    started: tuple[str, ...]
    notes: tuple[str, ...]


class LocalCluster:
    """A local cluster in ``folder`` (created if missing).

    Args:
        folder: holds everything (see the module doc).
        config: the cluster's shape. None: as saved in ``folder``, else the defaults. A config
            that contradicts what ``folder`` holds raises ConfigError (``destroy()`` first).
        python: interpreter for the broker and coordinator processes (default: this one; a
            saved cluster keeps the one it was started with, so pid files stay recognisable).
    """

    def __init__(self, folder: Path, config: ClusterConfig | None = None, *, python: str | None = None) -> None:
        self.folder = Path(folder).absolute()
        saved = self._read_state()
        if saved is not None:
            saved_cfg = ClusterConfig(**saved["config"])
            if config is not None and _shape(config) != _shape(saved_cfg):
                raise ConfigError(
                    f"{self.folder} holds a local cluster of another shape ({_describe(saved_cfg)}), "
                    f"not {_describe(config)}: stop and wipe it first (ordq down --wipe --dir {folder})"
                )
            config = saved_cfg
            python = python or saved.get("python")
        self.config = config or ClusterConfig()
        self.python = python or sys.executable
        self._saved: dict[str, Any] = saved or {}
        # Where the certificates are (made by start()); what clients of this cluster present.
        broker_tls, client_tls = ensure_pki(self.folder / "tls", create=False)
        self.zk = ZkServer(self.folder / "zk", nodes=self.config.zk_nodes, client_port=self.config.zk_port,
                           tls=broker_tls if self.config.zk_tls else None)
        hosts = self.zk.connection_string
        self.broker_credentials = broker_tls if self.config.tls else Credentials()
        self.credentials = client_tls if self.config.tls else Credentials()
        if self.config.zk_tls:
            self.credentials = attrs.evolve(self.credentials, zk_tls=True)
            remember_zk_tls(hosts, self.credentials)  # this process connects before anything is registered
        if self.config.tokens and self._token_file.exists():
            self.credentials = attrs.evolve(self.credentials, token=self._token_file.read_text().strip())
        if self.admin_auth is not None:  # this cluster's own clients act as its operator
            self.credentials = attrs.evolve(self.credentials, zk_auth=self.admin_auth)
        self.groups: dict[str, BrokerGroupProcesses] = {}
        for gid in self.config.gids:
            group = BrokerGroupProcesses(gid, zk_hosts=hosts, root=self.config.root, base_dir=self.folder / "brokers",
                                         session_timeout_s=self.config.session_timeout_s,
                                         tls=self.broker_credentials)
            for member in group.members:  # same interpreter as the one that started them
                member.proc.argv = (self.python, *member.proc.argv[1:])
            self.groups[gid] = group
        # Coordinators serve the Coordinator service and call brokers with their own certificate.
        coord_tls = ensure_coordinator_pki(self.folder / "tls", create=False)
        tls_args = (["--tls-cert", str(coord_tls.cert_file), "--tls-key", str(coord_tls.key_file),
                     "--tls-ca", str(coord_tls.ca_file)] if self.config.tls else ["--insecure"])
        self.coordinators = [
            ManagedProcess(
                f"coordinator-{i + 1}",
                [self.python, "-m", "ordq.cli", "--zk", hosts, "--root", self.config.root,
                 "coordinator", "run", "--metrics", "127.0.0.1:0", *tls_args],
                run_dir=self.folder / "coordinators",
            )
            for i in range(self.config.coordinators)
        ]

        self._use_credentials()

    @property
    def admin_auth(self) -> str | None:
        """The admin ZooKeeper credential (None: ACLs off, or not generated yet)."""
        return read_credential(self.folder, "admin") if self.config.zk_acl else None

    @property
    def client_auth(self) -> str | None:
        """The credential producers and consumers of this cluster use."""
        return read_credential(self.folder, "client") if self.config.zk_acl else None

    def _use_credentials(self) -> None:
        """Brokers and coordinators act as admin (passed in their environment, never argv),
        and find the cluster's credentials in its own file."""
        env = {"ORDQ_CREDENTIALS": str(self.own_credentials_file)}
        admin = self.admin_auth
        if admin is not None:
            env["ORDQ_ZK_AUTH"] = admin
        for _, proc in self.processes():
            if proc not in self.zk.processes:
                proc.env = {**(proc.env or {}), **env}

    def _protect(self) -> None:
        """Generate the credentials (once) and protect the root: a tree from before (ACLs off,
        or an older ordq) is upgraded in place (coordinator/acl_client.py)."""
        if not self.config.zk_acl:
            return
        from ordq.coordinator.acl import ACL_NODE, AclIds
        from ordq.coordinator.acl_client import protect

        running = [name for name, proc in self.processes() if proc.alive() and proc not in self.zk.processes]
        if running:
            with self.store() as store:
                protected = store.client.exists(f"{self.root}/{ACL_NODE}") is not None
            if not protected:
                raise ConfigError(
                    f"the ZooKeeper root {self.root} of the cluster in {self.folder} is not protected yet, and "
                    f"{', '.join(running)} run without credentials (they could not write to it once protected): "
                    f"stop them first (ordq down --dir {self.folder}), then ordq up protects it")
        for role in AUTH_USERS:
            write_credential(self.folder, role)
        self._use_credentials()
        admin, client = self.admin_auth, self.client_auth
        assert admin is not None and client is not None
        self.credentials = attrs.evolve(self.credentials, zk_auth=admin)
        self._register_own()
        with self.store() as store:
            protect(store.client, self.root, AclIds.of(admin, client))

    def rotate_zk_credentials(self, *, timeout_s: float = 60.0) -> None:
        """Replace the admin and client ZooKeeper credentials of this stopped cluster: new ones
        are generated (``<dir>/zk-auth/*.new`` until done), every node's ACL is set to name them
        (``protect``, as the old admin, which loses every right), then they replace the files
        and the credentials registered for the cluster. ZooKeeper is started for it when it
        is not running and stopped again. A rotation cut short is finished by running it again
        (the client also presents the new admin credential). ConfigError while a broker or
        coordinator runs (it would lose its rights), or without ZooKeeper ACLs."""
        from ordq.coordinator.acl import AclIds
        from ordq.coordinator.acl_client import protect

        if not self.config.zk_acl or self.admin_auth is None:
            raise ConfigError(f"the cluster in {self.folder} has no ZooKeeper credentials to rotate (--no-zk-acl)")
        running = [name for name, proc in self.processes() if proc.alive() and proc not in self.zk.processes]
        if running:
            raise ConfigError(f"{', '.join(running)} still run with the current credential: stop the cluster first "
                              f"(ordq down --dir {self.folder})")
        auth = self.folder / AUTH_DIR
        for role in AUTH_USERS:
            write_credential(self.folder, f"{role}.new")
        new = {role: read_credential(self.folder, f"{role}.new") for role in AUTH_USERS}
        assert new["admin"] is not None and new["client"] is not None
        started_zk = not any(p.alive() for p in self.zk.processes)
        if started_zk:
            self._start_zk(time.monotonic() + timeout_s)
        try:
            with self.store() as store:
                store.client.add_auth("digest", new["admin"])  # a second run, after the ACLs changed
                protect(store.client, self.root, AclIds.of(new["admin"], new["client"]))
        finally:
            if started_zk:
                self.zk.stop()
        for role in AUTH_USERS:
            os.replace(auth / f"{role}.new", auth / role)
        self.credentials = attrs.evolve(self.credentials, zk_auth=new["admin"])
        self._use_credentials()
        self._register_own()
        register(self.zk_hosts, self.root, self.credentials, cluster=self.cluster_id)

    @classmethod
    def load(cls, folder: Path) -> LocalCluster:
        """The cluster set up in ``folder`` (by ``ordq up`` in another process, say)."""
        if not cls.exists(folder):
            raise ExternalProcessError(f"no local cluster in {folder} (start one with: ordq up --dir {folder})")
        return cls(folder)

    @staticmethod
    def exists(folder: Path) -> bool:
        return (Path(folder) / STATE_FILE).exists()

    def __repr__(self) -> str:
        return f"<LocalCluster {self.folder} zk={self.zk_hosts} root={self.root}>"

    # -- facts -------------------------------------------------------------------------------

    @property
    def zk_hosts(self) -> str:
        return self.zk.connection_string

    @property
    def root(self) -> str:
        return self.config.root

    @property
    def gids(self) -> tuple[str, ...]:
        return self.config.gids

    def broker(self, gid: str, role: str) -> BrokerProcess:
        group = self.groups[gid]
        return group.master if role == "master" else group.slave

    def brokers(self) -> Iterator[tuple[str, BrokerProcess]]:
        """("g1/master", process), ... in group order."""
        for gid, group in self.groups.items():
            for role, member in zip(ROLES, group.members, strict=True):
                yield f"{gid}/{role}", member

    def processes(self) -> list[tuple[str, ManagedProcess]]:
        """Every process of the cluster, by name, in start order."""
        out = [(p.name, p) for p in self.zk.processes]
        out += [(name, b.proc) for name, b in self.brokers()]
        out += [(p.name, p) for p in self.coordinators]
        return out

    def metrics_urls(self) -> dict[str, str]:
        """Process name -> its Prometheus endpoint, for every broker and coordinator started
        (by this object or, as saved, by another ``ordq up``)."""
        saved = self._saved.get("brokers", {})
        out = {name: b.metrics_url or saved.get(name, {}).get("metrics") for name, b in self.brokers()}
        out.update({p.name: self._metrics_url(p.name) for p in self.coordinators})
        return {name: url for name, url in out.items() if url}

    def running(self) -> list[str]:
        return [name for name, proc in self.processes() if proc.alive()]

    def all_running(self) -> bool:
        return all(proc.alive() for _, proc in self.processes())

    @contextlib.contextmanager
    def store(self, timeout_s: float = 10.0) -> Iterator[ZkStore]:
        """A ZooKeeper store of this cluster, closed on exit."""
        store = ZkStore.connect(self.zk_hosts, self.root, timeout_s=timeout_s, auth=self.admin_auth)
        try:
            yield store
        finally:
            store.close()

    def log_paths(self) -> dict[str, Path]:
        return {name: proc.log_path for name, proc in self.processes()}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, timeout_s: float = _STARTUP_TIMEOUT_S) -> StartReport:
        """Start every process that is not running and wait until the cluster serves.

        Raises AlreadyExists when everything already runs, ExternalProcessError when a process
        cannot start (Java missing, port in use, a process died: the message says which and
        quotes its log), ConfigError for a bad configuration. On failure, the processes this
        call started are stopped again.
        """
        procs = self.processes()
        if all(p.alive() for _, p in procs):
            raise AlreadyExists(
                f"a local cluster is already running in {self.folder} ({len(procs)} processes, ZooKeeper at "
                f"{self.zk_hosts}); see it with: ordq status --dir {self.folder}; stop it with: ordq down "
                f"--dir {self.folder}"
            )
        notes = [f"replaced stale pid file {p.pid_path} (process {_read_pid(p.pid_path)} is not running)"
                 for _, p in procs if not p.alive() and p.pid_path.exists()]
        todo = [name for name, p in procs if not p.alive()]
        deadline = time.monotonic() + timeout_s
        fresh = not self.exists(self.folder)
        self._save()
        if self.config.tls:
            ensure_pki(self.folder / "tls")
            ensure_coordinator_pki(self.folder / "tls")  # a folder from before coordinators had one: made now
        # The cluster's own processes find its credentials in the folder's file from the start
        # (ORDQ_CREDENTIALS in their environment); the user's file gets the entry only once
        # everything serves, so a start that fails (a port another cluster holds) never
        # replaces the entry of the cluster that works there.
        self._register_own()
        try:
            self._start_zk(deadline)
            # ZooKeeper steps ride out transient errors (a server still settling, a busy
            # machine) within the start's deadline (coordinator/zk_retry.py). Each is safe to
            # repeat; the admin token's create, if it landed unseen, leaves one unused token.
            self._zk(self._protect, "protect the root", deadline)
            self._zk(self._register_groups, "register the groups", deadline)
            if self.config.tokens:
                self._zk(self._ensure_admin_token, "make the admin token", deadline)
            self._start_brokers(deadline)
            self._start_coordinators(deadline)
            self.wait_healthy(timeout_s=max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self._stop_named(set(todo))
            if fresh:  # never served: leave no half-made cluster behind (the error quotes the logs)
                wipe_files(self.folder)
            raise
        self._save()
        register(self.zk_hosts, self.root, self.credentials, cluster=self.cluster_id)
        return StartReport(started=tuple(todo), notes=tuple(notes))

    def heal(self, *, timeout_s: float = _STARTUP_TIMEOUT_S) -> list[str]:
        """Start whatever is not running (after a drill) and wait until healthy; returns the
        names started (empty if everything ran). Unlike ``start()`` it never refuses."""
        for _, proc in self.processes():  # a paused process is alive but useless
            with contextlib.suppress(OrdqError):
                if proc.alive():
                    proc.resume()
        if self.all_running():
            self.wait_healthy(timeout_s=timeout_s)
            return []
        return list(self.start(timeout_s=timeout_s).started)

    def stop(self, *, timeout_s: float = 10.0) -> list[str]:
        """Stop every process (coordinators, brokers, then ZooKeeper); the data stays.
        Returns the names of the processes that were running."""
        was = self.running()
        self._stop_named(set(was), timeout_s=timeout_s)
        return was

    def detach(self) -> None:
        """Leave the processes running when this object goes away (``ordq up`` exits; a later
        ``LocalCluster.load`` finds and stops them)."""
        for _, proc in self.processes():
            proc.detach()

    def destroy(self) -> None:
        """Stop everything and wipe the folder's cluster files."""
        self.stop()
        self.zk.destroy()
        self.unregister()
        wipe_files(self.folder)

    def unregister(self) -> bool:
        """Remove this cluster's entry from the user's credentials file; an entry another
        cluster registered at the same address stays. True when removed."""
        return unregister(self.zk_hosts, self.root, cluster=self.cluster_id)

    @property
    def cluster_id(self) -> str:
        """This cluster's identity (made at its first start, kept in the state file): what its
        credentials entry is registered under besides its address."""
        cid = self._saved.get("cluster_id")
        if not cid:
            cid = self._saved["cluster_id"] = uuid.uuid4().hex
        return str(cid)

    @property
    def own_credentials_file(self) -> Path:
        """The folder's credentials file, holding only this cluster (mode 0600): its own
        processes read it (ORDQ_CREDENTIALS), never the user's."""
        return self.folder / OWN_CREDENTIALS

    def _register_own(self) -> None:
        register(self.zk_hosts, self.root, self.credentials, cluster=self.cluster_id,
                 path=self.own_credentials_file)

    def restart_broker(self, gid: str, role: str, *, timeout_s: float = 30.0) -> str:
        """Start a stopped/killed broker again (same data folder); wait until it is live in
        ZooKeeper. Returns its new address."""
        member = self.broker(gid, role)
        if member.alive():
            member.stop()
        self._wait_previous_gone(gid, role, time.monotonic() + timeout_s)
        address = member.start(timeout_s=timeout_s)
        self._wait_live(gid, role, member, timeout_s)
        self._save()
        return address

    def restart_coordinator(self, name: str, *, timeout_s: float = 30.0) -> str:
        """Start a stopped/killed coordinator daemon again; returns its metrics URL."""
        proc = next(p for p in self.coordinators if p.name == name)
        if proc.alive():
            proc.stop()
        self._start_coordinators(time.monotonic() + timeout_s)
        self._save()
        return self._metrics_url(name) or ""

    # -- health ------------------------------------------------------------------------------

    def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        """Wait until every process runs, every group is live in ZooKeeper (both roles, with
        the incarnation that runs now) and one coordinator leads. ExternalProcessError naming
        what is not healthy on timeout, or at once when a process died."""
        deadline = time.monotonic() + timeout_s
        interval = 0.02
        while True:
            dead = [name for name, p in self.processes() if not p.alive()]
            if dead:
                name, proc = next((n, p) for n, p in self.processes() if n == dead[0])
                raise ExternalProcessError(
                    f"{name} is not running (pid file {proc.pid_path}); last lines of {proc.log_path}:\n"
                    f"{proc.log_tail(20)}"
                )
            problem = self._health_problem()
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise ExternalProcessError(
                    f"local cluster in {self.folder} not healthy after {timeout_s:g}s: {problem}"
                )
            time.sleep(interval)
            interval = min(interval * 1.5, 0.25)

    def _health_problem(self) -> str | None:
        try:
            with self.store(timeout_s=5.0) as store:
                for gid in self.gids:
                    live = store.live_members(gid)
                    for role in ROLES:
                        member = self.broker(gid, role)
                        info = live.get(role)
                        if info is None:
                            return f"{gid}/{role} is not live in ZooKeeper"
                        if member.incarnation is not None and info.incarnation != member.incarnation:
                            return f"{gid}/{role}: ZooKeeper still shows a previous incarnation"
        except OrdqError as exc:
            return f"ZooKeeper: {exc}"
        if self.coordinators and self.coordinator_leader() is None:
            return "no coordinator daemon leads yet"
        return None

    def coordinator_leader(self) -> str | None:
        """Name of the coordinator daemon that reports itself leader (via its metrics)."""
        for proc in self.coordinators:
            if proc.alive() and _coordinator_metrics(self._metrics_url(proc.name)).get("ordq_coordinator_leader") == 1:
                return proc.name
        return None

    def status(self, *, rpc_timeout_s: float = 1.0) -> list[ProcessStatus]:
        """Every process with its pid, where it listens and its health, asked live:
        ZooKeeper ``srvr``, each broker's liveness node and ``Health`` RPC, each coordinator's
        metrics."""
        out: list[ProcessStatus] = []
        for st, proc in zip(self.zk.status(), self.zk.processes, strict=True):
            mode = st.mode
            out.append(ProcessStatus(name=proc.name, kind="zookeeper", pid=st.pid, listen=f"127.0.0.1:{st.port}",
                                     state=st.state, healthy=mode in ("standalone", "leader", "follower")))
        live: dict[str, dict[str, Any]] = {}
        zk_error = None
        try:
            with self.store(timeout_s=2.0) as store:
                live = {gid: store.live_members(gid) for gid in self.gids}
        except OrdqError as exc:
            zk_error = str(exc)
        out += self._broker_status(live, zk_error, rpc_timeout_s)
        for proc in self.coordinators:
            pid = proc.pid
            url = self._metrics_url(proc.name)
            if pid is None:
                out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=None, listen=None, state="down",
                                         healthy=False))
                continue
            metrics = _coordinator_metrics(url, timeout_s=rpc_timeout_s)
            if not metrics:
                out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=pid, listen=url, state="no answer",
                                         healthy=False, detail="metrics endpoint does not answer"))
                continue
            leader = metrics.get("ordq_coordinator_leader") == 1
            detail = f"rounds {int(metrics.get('ordq_coordinator_rounds_total', 0))}"
            detail += f", errors {int(metrics.get('ordq_coordinator_errors_total', 0))}"
            out.append(ProcessStatus(name=proc.name, kind="coordinator", pid=pid, listen=url,
                                     state="leader" if leader else "standby", healthy=True, detail=detail))
        return _no_leader_unhealthy(out)

    def _broker_status(self, live: dict[str, dict[str, Any]], zk_error: str | None,
                       rpc_timeout_s: float) -> list[ProcessStatus]:
        from ordq.wire.client import GrpcTransport

        out = []
        transport = GrpcTransport(rpc_timeout_s=rpc_timeout_s, credentials=self.credentials)
        try:
            for name, member in self.brokers():
                gid, role = name.split("/")
                pid = member.proc.pid
                info = live.get(gid, {}).get(role)
                address = info.address if info is not None else self._saved_address(name)
                if pid is None:
                    out.append(ProcessStatus(name=name, kind="broker", pid=None, listen=address, state="down",
                                             healthy=False, detail="live in ZooKeeper (session not expired yet)"
                                             if info is not None else ""))
                    continue
                if info is None:
                    why = zk_error or "not registered live in ZooKeeper"
                    out.append(ProcessStatus(name=name, kind="broker", pid=pid, listen=address, state="not live",
                                             healthy=False, detail=why))
                    continue
                try:
                    health = transport.health(info.address)
                except OrdqError as exc:
                    out.append(ProcessStatus(name=name, kind="broker", pid=pid, listen=info.address,
                                             state="no answer", healthy=False, detail=str(exc)))
                    continue
                stats = json.loads(health.stats_json or "{}")
                problems = []
                if role == "master" and not health.slave_connected:
                    problems.append("slave not connected")
                if stats.get("corrupt"):
                    problems.append(f"corrupt segments {','.join(stats['corrupt'])}")
                detail = f"segments {stats.get('segments', 0)}"
                if stats.get("torn_bytes_truncated"):
                    detail += f", torn tail bytes truncated {stats['torn_bytes_truncated']}"
                if stats.get("reconciled"):
                    detail += f", reconciled {stats['reconciled']}"
                out.append(ProcessStatus(name=name, kind="broker", pid=pid, listen=info.address,
                                         state="live" if not problems else "degraded", healthy=not problems,
                                         detail="; ".join([*problems, detail])))
        finally:
            transport.close()
        return out

    # -- internals ---------------------------------------------------------------------------

    def _zk(self, call: Callable[[], T], what: str, deadline: float) -> T:
        """A ZooKeeper step of ``start``: transient errors retried until the start's deadline
        (at most START_BOUND_S)."""
        bound = max(min(START_BOUND_S, deadline - time.monotonic()), 1.0)
        return retry_zk(call, f"ordq up: {what}", bound_s=bound, hosts=self.zk_hosts)

    def _start_zk(self, deadline: float) -> None:
        try:
            self.zk.start(timeout_s=max(deadline - time.monotonic(), 1.0))
        except ExternalProcessError as exc:
            if "already in use" in str(exc):
                raise ExternalProcessError(
                    f"{exc}\nhint: another ZooKeeper (ordq zk start? another local cluster?) holds the port; "
                    "stop it, or start this cluster on another port: ordq up --zk-port PORT "
                    "(or --zk-port 0 for any free port)"
                ) from exc
            raise

    @property
    def _token_file(self) -> Path:
        return self.folder / "admin.token"

    def _ensure_admin_token(self) -> None:
        """An admin token on every queue for this cluster's own clients (the CLI after
        ``ordq up``, the tests, the drills), made once and kept in the folder (mode 0600)."""
        from ordq.coordinator.tokens import create_token, load_tokens, token_id, touch

        token = self.credentials.token
        with self.store() as store:
            if token is None or token_id(token) not in load_tokens(store.client, self.root):
                _, token = create_token(store.client, self.root, {"*": ["admin"]}, "ordq up")
                touch(store.client, self.root)
                fd = os.open(self._token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
        self.credentials = attrs.evolve(self.credentials, token=token)
        self._register_own()

    def _register_groups(self) -> None:
        # Groups exist in ZooKeeper before their processes start (a broker refuses to serve
        # an unregistered group).
        with self.store() as store:
            for gid in self.gids:
                with contextlib.suppress(AlreadyExists):
                    store.add_group(gid)

    def _start_brokers(self, deadline: float) -> None:
        todo = [(name, m) for name, m in self.brokers() if not m.alive()]
        if not todo:
            return

        def start_one(item: tuple[str, BrokerProcess]) -> None:
            name, member = item
            gid, role = name.split("/")
            self._zk(lambda: self._wait_previous_gone(gid, role, deadline), f"wait for {name} to be free", deadline)
            member.start(timeout_s=max(deadline - time.monotonic(), 1.0))
            self._zk(lambda: self._wait_live(gid, role, member, max(deadline - time.monotonic(), 1.0)),
                     f"wait for {name} to be live", deadline)

        _run_all(start_one, todo)

    def _wait_previous_gone(self, gid: str, role: str, deadline: float) -> None:
        """A killed broker's liveness node stays until its ZooKeeper session expires, and a
        new process cannot register the role meanwhile: wait for it to go."""
        limit = min(deadline, time.monotonic() + 4 * self.config.session_timeout_s + 10.0)
        with self.store() as store:
            while True:
                info = store.live_members(gid).get(role)
                if info is None:
                    return
                if time.monotonic() >= limit:
                    raise ExternalProcessError(
                        f"cannot start {gid}/{role}: ZooKeeper still shows a {role} of {gid} live at {info.address} "
                        f"(pid {info.pid}); stop that process first"
                    )
                time.sleep(0.05)

    def _wait_live(self, gid: str, role: str, member: BrokerProcess, timeout_s: float) -> None:
        """Wait until ZooKeeper shows this incarnation live (the previous one's session may
        still linger for up to a session timeout after a kill)."""
        with self.store() as store:
            def live_now() -> bool:
                info = store.live_members(gid).get(role)
                return info is not None and info.incarnation == member.incarnation

            member.proc.wait_ready(live_now, timeout_s=timeout_s, what=f"{gid}/{role} to be live in ZooKeeper")

    def _start_coordinators(self, deadline: float) -> None:
        todo = [p for p in self.coordinators if not p.alive()]

        def start_one(proc: ManagedProcess) -> None:
            proc.start()
            url = proc.wait_for_line("METRICS ", timeout_s=max(deadline - time.monotonic(), 1.0))
            proc.wait_for_line("READY ", timeout_s=max(deadline - time.monotonic(), 1.0))
            self._saved.setdefault("coordinator_metrics", {})[proc.name] = url

        _run_all(start_one, [(p.name, p) for p in todo], key=lambda item: item[1])

    def _stop_named(self, names: set[str], *, timeout_s: float = 10.0) -> None:
        if not names:
            return
        by_name = dict(self.processes())
        # Coordinators first (no failovers while brokers go), then brokers, then ZooKeeper.
        tiers = [
            [p.name for p in self.coordinators],
            [name for name, _ in self.brokers()],
            [p.name for p in self.zk.processes],
        ]
        # One grace period for all tiers, not one each: `ordq down` finishes within about
        # timeout_s plus the SIGKILL waits, whatever state the processes are in (issue 26).
        deadline = time.monotonic() + timeout_s
        for tier in tiers:
            todo = [(n, by_name[n]) for n in tier if n in names]
            grace = max(deadline - time.monotonic(), 0.5)
            _run_all(functools.partial(_stop_item, grace_s=grace), todo, swallow=True)

    def _metrics_url(self, name: str) -> str | None:
        url = self._saved.get("coordinator_metrics", {}).get(name)
        return str(url) if url else None

    def _saved_address(self, name: str) -> str | None:
        member = dict(self.brokers())[name]
        if member.address:
            return member.address
        return self._saved.get("brokers", {}).get(name, {}).get("address")

    def _read_state(self) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads((self.folder / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ConfigError(f"{self.folder / STATE_FILE} is not valid JSON: {exc}") from exc
        return doc

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        brokers = dict(self._saved.get("brokers", {}))
        for name, member in self.brokers():
            if member.address:
                brokers[name] = {"address": member.address, "incarnation": member.incarnation,
                                 "metrics": member.metrics_url}
        cfg = attrs.asdict(self.config)
        cfg["zk_port"] = self.zk.specs[0].client_port
        doc = {
            "cluster_id": self.cluster_id,
            "folder": str(self.folder),
            "saved_at": datetime.now().isoformat(timespec="seconds"),
            "python": self.python,
            "config": cfg,
            "zk": self.zk_hosts,
            "root": self.root,
            "brokers": brokers,
            "coordinator_metrics": self._saved.get("coordinator_metrics", {}),
        }
        self._saved = doc
        tmp = self.folder / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.folder / STATE_FILE)


def wipe_files(folder: Path) -> list[str]:
    """Delete what a local cluster keeps in ``folder`` (data, logs, certificates, credentials,
    the state file) and the folder when nothing else is left in it; other files stay. Returns
    the names deleted. The caller makes sure nothing of it runs."""
    folder = Path(folder)
    gone = []
    for sub in CLUSTER_DIRS:
        if (folder / sub).exists():
            shutil.rmtree(folder / sub, ignore_errors=True)
            gone.append(sub)
    for name in (STATE_FILE, f"{STATE_FILE}.tmp", "admin.token", OWN_CREDENTIALS, OWN_CREDENTIALS + ".lock"):
        if (folder / name).exists():
            (folder / name).unlink(missing_ok=True)
            gone.append(name)
    with contextlib.suppress(OSError):
        folder.rmdir()
    return gone


def _shape(cfg: ClusterConfig) -> tuple[Any, ...]:
    # zk_port None means "any": it does not contradict a saved port.
    return (cfg.groups, cfg.zk_nodes, cfg.coordinators, cfg.root)


def _describe(cfg: ClusterConfig) -> str:
    zk = "3-node ZooKeeper" if cfg.zk_nodes == 3 else "standalone ZooKeeper"
    return f"{cfg.groups} groups, {zk}, {cfg.coordinators} coordinators, root {cfg.root}"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _coordinator_metrics(url: str | None, *, timeout_s: float = 1.0) -> dict[str, float]:
    """Unlabelled gauges/counters of a coordinator's /metrics ({} when it does not answer)."""
    if not url:
        return {}
    try:
        samples = scrape(url, timeout_s=timeout_s)
    except (OSError, ValueError):
        return {}
    return {s.name: s.value for s in samples if not s.labels}


def _stop_item(item: tuple[str, ManagedProcess], *, grace_s: float) -> int | None:
    return item[1].stop(grace_s)


def _run_all(fn: Callable[[Any], Any], items: list[tuple[str, Any]], *, swallow: bool = False,
             key: Callable[[tuple[str, Any]], Any] | None = None) -> None:
    """Run ``fn`` on every item in parallel (processes start and stop concurrently); raise
    the first error after all finished, unless ``swallow``."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(fn, key(item) if key else item) for item in items]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None and not swallow:
        raise first


def _no_leader_unhealthy(statuses: list[ProcessStatus]) -> list[ProcessStatus]:
    """Coordinators all up but none leading (e.g. every election thread stuck) is not a
    healthy cluster: nobody fails heads over or seals (issue 23: both showed "standby yes")."""
    coordinators = [s for s in statuses if s.kind == "coordinator"]
    if not coordinators or any(s.state == "leader" for s in coordinators):
        return statuses
    return [attrs.evolve(s, healthy=False, detail="; ".join(filter(None, [s.detail, "no coordinator leads"])))
            if s.kind == "coordinator" else s for s in statuses]
