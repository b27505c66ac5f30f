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
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ordq.broker_group.process import BrokerGroupProcesses, BrokerProcess
from ordq.cluster_config import (
    COORDINATOR_HOST,
    OWN_CREDENTIALS,
    STATE_FILE,
    ClusterConfig,
    check_coordinator_port,
    coordinator_addresses,
    describe,
    shape,
    with_coordinator_ports,
)
from ordq.cluster_credentials import ClusterCredentials
from ordq.cluster_folder import holds_cluster
from ordq.cluster_health import ROLES, ClusterHealth, ProcessStatus
from ordq.common.errors import AlreadyExists, ConfigError, ExternalProcessError, OrdqError
from ordq.common.pid_file import program
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials, ensure_coordinator_pki, ensure_pki, remember_zk_tls
from ordq.coordinator.acl_client import AUTH_DIR
from ordq.coordinator.store import ZkStore
from ordq.coordinator.zk_retry import START_BOUND_S, retry_zk
from ordq.zk_server import ZkServer, free_ports, port_free

T = TypeVar("T")

CLUSTER_DIRS = ("brokers", "coordinators", "zk", "drills", "tls", AUTH_DIR)
_STARTUP_TIMEOUT_S = 120.0


@attrs.frozen
class StartReport:
    started: tuple[str, ...]
    notes: tuple[str, ...]


class LocalCluster(ClusterCredentials):
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
            if config is not None and shape(config) != shape(saved_cfg):
                raise ConfigError(
                    f"{self.folder} holds a local cluster of another shape ({describe(saved_cfg)}), "
                    f"not {describe(config)}: stop and wipe it first (ordq down --wipe --dir {folder})"
                )
            if config is not None and config.prometheus_url is not None:  # not part of the shape: a new one is taken
                saved_cfg = attrs.evolve(saved_cfg, prometheus_url=config.prometheus_url)
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
        # The coordinators' ports, fixed at the first start (kept in the state file's config).
        zk_ports = {p for spec in self.zk.specs for p in (spec.client_port, spec.quorum_port, spec.election_port)}
        self.config = with_coordinator_ports(self.config, zk_ports)
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
        self.coordinators = [ManagedProcess(f"coordinator-{i + 1}", self._coordinator_argv(port),
                                            run_dir=self.folder / "coordinators")
                             for i, port in enumerate(self.config.coordinator_ports)]

        self._use_credentials()

    def _coordinator_argv(self, port: int) -> list[str]:
        coord_tls = ensure_coordinator_pki(self.folder / "tls", create=False)
        tls_args = (["--tls-cert", str(coord_tls.cert_file), "--tls-key", str(coord_tls.key_file),
                     "--tls-ca", str(coord_tls.ca_file)] if self.config.tls else ["--insecure"])
        return [self.python, "-m", "ordq.cli", "--zk", self.zk.connection_string, "--root", self.config.root,
                "coordinator", "run", "--listen", f"{COORDINATOR_HOST}:{port}", "--metrics", "127.0.0.1:0", *tls_args,
                *(["--prometheus-url", self.config.prometheus_url] if self.config.prometheus_url else [])]

    @classmethod
    def load(cls, folder: Path) -> LocalCluster:
        """The cluster set up in ``folder`` (by ``ordq up`` in another process, say)."""
        if not cls.exists(folder):
            raise ExternalProcessError(f"no local cluster in {folder} (start one with: ordq up --dir {folder})")
        return cls(folder)

    @staticmethod
    def exists(folder: Path) -> bool:
        return holds_cluster(folder)

    def __repr__(self) -> str:
        return f"<LocalCluster {self.folder} zk={self.zk_hosts} root={self.root}>"

    # -- facts -------------------------------------------------------------------------------

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

    def broker_processes(self) -> list[ManagedProcess]:
        return [b.proc for _, b in self.brokers()]

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
        out.update({p.name: self.metrics_url(p.name) for p in self.coordinators})
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

    def start(self, *, timeout_s: float = _STARTUP_TIMEOUT_S, repair_acls: bool = False) -> StartReport:
        """Start every process that is not running and wait until the cluster serves.
        ``repair_acls``: set every ZooKeeper node's ACL to the policy (``ordq up --repair-acls``;
        otherwise only when the tree's ACL record asks for it: ``ClusterCredentials._protect``).

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
        if fresh:
            self._repick_taken_coordinator_ports()
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
            self._ensure_zk_credentials()  # ZooKeeper starts with the admin as its super-user
            self._start_zk(deadline)
            # ZooKeeper steps ride out transient errors (a server still settling, a busy
            # machine) within the start's deadline (coordinator/zk_retry.py). Each is safe to
            # repeat; the admin token's create, if it landed unseen, leaves one unused token.
            self._zk(lambda: self._protect(walk=repair_acls), "protect the root", deadline)
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
        self._register_user()
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
        return self.metrics_url(name) or ""

    # -- health ------------------------------------------------------------------------------

    def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        """Wait until everything serves (``ClusterHealth.wait_healthy``)."""
        ClusterHealth(self).wait_healthy(timeout_s=timeout_s)

    def coordinator_leader(self) -> str | None:
        return ClusterHealth(self).coordinator_leader()

    def status(self, *, rpc_timeout_s: float = 1.0) -> list[ProcessStatus]:
        """Every process, asked live (ordq/cluster_health.py)."""
        return ClusterHealth(self).status(rpc_timeout_s=rpc_timeout_s)

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

    def _repick_taken_coordinator_ports(self) -> None:
        """Before a new cluster first serves, a port taken since it was picked is picked again
        (once served, the ports never move: ``check_coordinator_port``)."""
        ports = list(self.config.coordinator_ports)
        for i, port in enumerate(ports):
            if not port_free(port, COORDINATOR_HOST):
                ports[i] = free_ports(1, ports, host=COORDINATOR_HOST)[0]
                self.coordinators[i].argv = tuple(self._coordinator_argv(ports[i]))
        self.config = attrs.evolve(self.config, coordinator_ports=tuple(ports))

    def _start_coordinators(self, deadline: float) -> None:
        todo = [p for p in self.coordinators if not p.alive()]
        for proc, port in zip(self.coordinators, self.config.coordinator_ports, strict=True):
            if proc in todo:
                check_coordinator_port(proc.name, port, self.folder)

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

    def metrics_url(self, name: str) -> str | None:
        url = self._saved.get("coordinator_metrics", {}).get(name)
        return str(url) if url else None

    def saved_address(self, name: str) -> str | None:
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
            # What ``ordq status`` reads to tell which processes run, with no class of this
            # module loaded (ordq.cluster_folder.LocalFolder; issue 42).
            "bootstrap": self.bootstrap,
            "processes": {name: {"pid_file": str(proc.pid_path), "program": program(proc.argv)}
                          for name, proc in self.processes()},
            "coordinator_addresses": dict(zip([p.name for p in self.coordinators],
                                              coordinator_addresses(self.config), strict=True)),
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


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


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
