"""Launch Debian's ZooKeeper as a standalone server or a 3-node ensemble.

Used by ``ordq zk``, the local cluster, the tests and the drills. Guarantees:
- ``start()`` returns only when ZooKeeper serves: every node answers ``srvr`` with a ``Mode:``
  (an ensemble: every live node is leader or follower and exactly one is leader). It fails
  fast, with the node's log tail, if a node dies, and refuses to start a node whose port is
  taken, so a leftover server can never make a failed start look ready.
- Each node is a :class:`ordq.common.proc.ManagedProcess` with its own ``zoo.cfg``, ``data/myid``,
  log and pid file under ``<folder>/node<i>/``; ports are kept in ``<folder>/cluster.json``,
  so a restart keeps them and ``ZkServer.load(folder)`` in another process finds the servers.
- ``tickTime`` is 200 ms by default: ZooKeeper only grants sessions of 2–20 ticks unless told
  otherwise, and a 1 s session (an ephemeral node gone ~1 s after its process is killed) needs
  a tick of at most 500 ms (STACK-NOTES).

- ``super_digest`` (``user:base64(sha1(user:password))``, coordinator/acl.py ``digest_id``): the
  ZooKeeper super-user, who may read, repair and delete every node whatever its ACL. ``ordq up``
  gives it the admin identity's digest, so its protect walk can repair a node someone else made
  with an ACL that shuts everyone else out (issue 37). It reaches the JVM through an argument
  file in the node's folder (0600), never the command line (``ps`` shows argv to everyone, and
  each start is logged with its argv).

- Each node listens on its own address (``NodeSpec.host``: 127.0.0.1 unless told otherwise),
  for clients and for the quorum: an ensemble may span machines. This object runs the nodes
  in ``local`` (all by default); on a machine that runs one node of an ensemble it runs that
  one and only asks the others, over the network, how they serve (``ordq zk start --config``).

Nodes are numbered from 0 in this API (``kill(0)``); ZooKeeper's ``myid`` is that number + 1.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import socket
import ssl
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.common.proc import ManagedProcess

if TYPE_CHECKING:
    from ordq.common.security import Credentials

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_SIMPLE_JAR = "/usr/share/java/slf4j-simple.jar"
# ZooKeeper's TLS port needs its Netty connection factory (Debian: libnetty-java; netty-all.jar
# there is only a manifest, so the parts are named).
NETTY_JARS = tuple(f"/usr/share/java/netty-{part}.jar"
                   for part in ("common", "buffer", "codec", "handler", "transport", "resolver"))
JVM_ARGS_FILE = "jvm.args"  # java @file: the super-user's digest (0600), when there is one
SUPER_DIGEST_PROPERTY = "zookeeper.DigestAuthenticationProvider.superDigest"
KEYSTORE_FILE = "keystore.pem"  # the server's key and certificate, in a node's folder (0600)
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
APT_PACKAGES = "zookeeper libslf4j-java default-jre-headless"
HOST = "127.0.0.1"
CONFIG_FILE = "cluster.json"
# The heap: ~4 nodes and 2 watches a queue; 256 MiB ran out at ~50,000 queues (issue 43,
# docs/BENCHMARKS.md). At 10^5 queues 1 GiB was not enough either: the old generation at 96 %
# of it, one full collection stopped the server for 5.5 s, and every session expired at once,
# both coordinators' and every broker's (scale43f); with 2 GiB the same run had no full
# collection after creation. A maximum, not a reservation: an idle test server stays at tens
# of MiB. -Xms256m: the first heap (and so the young generation the collector sizes from it)
# as it was under the old maximum, not 1/64 of the machine's memory.
# The JIT compiler's threads at nice 19, every other thread as it was (nice 0): the JVM sets
# thread priorities only under ThreadPriorityPolicy=1, which would also raise its own service
# threads above the brokers (nice -3 to -5) unless their mappings are set back to 0. Why (stop
# 73): on two cores shared with the brokers, ZooKeeper's C2 compiler threads took up to a whole
# core for 100-300 ms at a time for a minute after a new kind of traffic (the control-plane
# drill's first rounds), and the drill queue's acks waited behind them (clusters of 100-800 acks
# of 50-400 ms, each with 5-27 compiler ticks in its 100 ms; docs/BENCHMARKS.md). At nice 19
# compiling takes only the CPU nobody else wants, among processes of one cgroup (the drills put
# these threads back in the root group for that: drills/cpu_isolation.py). Lowering a priority
# needs no privilege (a JVM not run as root says in its log that it may; it does).
JIT_AT_IDLE_PRIORITY = (
    "-XX:ThreadPriorityPolicy=1", "-XX:CompilerThreadPriority=19", "-XX:VMThreadPriority=0",
    *(f"-XX:JavaPriority{p}_To_OSPriority=0" for p in range(6, 11)),
)
JVM_OPTIONS = (
    "-Xms256m", "-Xmx2g", "-XX:+UseSerialGC", *JIT_AT_IDLE_PRIORITY, "-Djava.awt.headless=true",
    "-Dfile.encoding=UTF-8", "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
)
# ZooKeeper's own variable for extra server JVM flags (its zkServer.sh reads it): given after
# JVM_OPTIONS, so a flag there wins (a bigger -Xmx). The tests set -XX:TieredStopAtLevel=1
# (tests/conftest.py): their servers live seconds to minutes.
JVM_FLAGS_ENV = "SERVER_JVMFLAGS"
# Ports are chosen below the kernel's ephemeral range (32768+ on Linux): a port there may be
# taken as the source port of some outgoing connection between a node's stop and its restart.
_PORT_RANGE = (12000, 32000)


@attrs.frozen
class NodeSpec:
    """Where one node listens (kept in cluster.json): clients on ``host:client_port``, the
    other nodes on ``host:quorum_port`` and ``host:election_port``."""

    client_port: int
    quorum_port: int
    election_port: int
    host: str = HOST


@attrs.frozen
class NodeStatus:
    """One node as seen now: ``mode`` is standalone|leader|follower, or None when the node is
    down or not serving (e.g. an ensemble node without a quorum)."""

    node: int
    myid: int
    port: int
    pid: int | None
    mode: str | None
    host: str = HOST
    remote: bool = False  # run by another machine: only its answer is known

    @property
    def state(self) -> str:
        if self.remote:
            return self.mode or "not serving"  # (or unreachable: from here, the same)
        if self.pid is None:
            return "down"
        return self.mode or "not serving"


def four_letter_word(port: int, word: str = "srvr", *, timeout_s: float = 1.0,
                     tls: Credentials | None = None, host: str = HOST) -> str:
    """Send a ZooKeeper four-letter command to host:port and return the answer (OSError
    if nobody answers). ``tls``: the server listens on its TLS port only; these are the CA
    to trust and the certificate to show."""
    from ordq.common.tls_socket import wrap_owned

    with socket.create_connection((host, port), timeout=timeout_s) as raw, (
            wrap_owned(_tls_context(tls), raw, host) if tls is not None else raw) as sock:
        sock.sendall(word.encode())
        chunks = []
        while data := sock.recv(4096):
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def _tls_context(tls: Credentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def server_mode(port: int, tls: Credentials | None = None, *, host: str = HOST) -> str | None:
    """The ``Mode:`` a server on ``host:port`` reports, or None if it does not serve."""
    try:
        answer = four_letter_word(port, tls=tls, host=host)
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return None  # "This ZooKeeper instance is not currently serving requests"


def port_free(port: int, host: str = HOST) -> bool:
    """Can a server listen on host:port now? (SO_REUSEADDR as servers use it, so
    connections lingering in TIME_WAIT from a previous run do not count as taken.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, exclude: Collection[int] = (), *, host: str = HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` now, below the ephemeral range."""
    rng = random.SystemRandom()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(*_PORT_RANGE)
        if port not in exclude and port not in ports and port_free(port, host):
            ports.append(port)
    return ports


class ZkServer:
    """A local ZooKeeper (1 node, or an ensemble of 3) whose files live under ``folder``.

    Args:
        folder: holds ``cluster.json`` and one ``node<i>/`` per node; created if missing. If
            it already holds a cluster, its node count and ports are reused.
        nodes: 1 (standalone) or 3 (ensemble); None: as saved in ``folder``, else 1.
        client_port: client port of node 0 (node i gets client_port + i); None: as saved,
            else free ports are picked.
        tick_time_ms: ZooKeeper's tick (sessions may last 2 ticks to 60 s).
        java: the java executable; default ``$JAVA_HOME/bin/java`` or ``java`` on PATH.
        hosts: each node's address (clients and quorum), one per node; None: as saved, else
            127.0.0.1 for every node. Ports are picked free on each node's own address.
        specs: every node's address and ports, given whole (an ensemble across machines:
            ``ordq zk start --config``); None: as saved, else picked as above.
        local: the nodes this object runs (the others run elsewhere and are only asked how
            they serve); None: as saved, else all of them.
        super_digest: the digest id of ZooKeeper's super-user (module doc); None: none. It
            takes effect when a node (re)starts: set ``super_digest`` before ``start()``.

    Raises ConfigError when ``nodes``/``client_port``/``hosts``/``specs`` contradict what
    ``folder`` holds.
    """

    def __init__(
        self,
        folder: Path,
        *,
        nodes: int | None = None,
        client_port: int | None = None,
        tick_time_ms: int = 200,
        java: str | None = None,
        tls: Credentials | None = None,
        hosts: Sequence[str] | None = None,
        specs: Sequence[NodeSpec] | None = None,
        local: Collection[int] | None = None,
        super_digest: str | None = None,
    ) -> None:
        if specs is not None:
            nodes = nodes or len(specs)
            if len(specs) != nodes:
                raise ConfigError(f"{len(specs)} node specs for a {nodes}-node ZooKeeper")
        if nodes not in (None, 1, 3):
            raise ConfigError(f"a ZooKeeper has 1 or 3 nodes, not {nodes}")
        if hosts is not None and len(hosts) != (nodes or 1):
            raise ConfigError(f"give one host per node ({nodes or 1}), not {len(hosts)}")
        if not 10 <= tick_time_ms <= 10_000:
            raise ConfigError(f"tick_time_ms must be 10..10000, not {tick_time_ms}")
        self.folder = Path(folder).absolute()
        self.tick_time_ms = tick_time_ms
        self._java = java
        self.super_digest = super_digest
        saved = self._read_saved()
        # TLS: serve clients on a TLS port only (secureClientPort, same number), with this
        # certificate, and require theirs signed by the same CA. None: as saved, else plaintext.
        self.tls = tls if tls is not None else self._read_saved_tls()
        if saved is not None:
            given = list(specs) if specs is not None else None
            specs = saved
            if nodes is not None and nodes != len(specs):
                raise ConfigError(
                    f"{self.folder} holds a {len(specs)}-node ZooKeeper, not {nodes}: "
                    "use another folder, or remove this one"
                )
            if client_port is not None and client_port != specs[0].client_port:
                raise ConfigError(
                    f"{self.folder} holds a ZooKeeper on port {specs[0].client_port}, not {client_port}: "
                    "use another folder, or remove this one"
                )
            if (given is not None and given != specs) or (hosts is not None and list(hosts) != [s.host for s in specs]):
                raise ConfigError(f"{self.folder} holds a ZooKeeper at {_describe(specs)}, not "
                                  f"{_describe(given) if given else ','.join(hosts or ())}: "
                                  "use another folder, or remove this one")
        elif specs is None:
            specs = self._new_specs(nodes or 1, client_port, list(hosts) if hosts else [HOST] * (nodes or 1))
        self.specs: tuple[NodeSpec, ...] = tuple(specs)
        saved_local = self._read_saved_local()
        if local is not None and saved_local is not None and set(local) != set(saved_local):
            raise ConfigError(f"{self.folder} runs ZooKeeper node(s) {sorted(saved_local)}, not {sorted(local)}: "
                              "use another folder, or remove this one")
        chosen = local if local is not None else saved_local
        self.local: tuple[int, ...] = tuple(sorted(chosen)) if chosen is not None else tuple(range(len(self.specs)))
        if not self.local or not set(self.local) <= set(range(len(self.specs))):
            raise ConfigError(f"local nodes {sorted(self.local)} are not among nodes 0..{len(self.specs) - 1}")
        self.processes: tuple[ManagedProcess, ...] = tuple(
            ManagedProcess(f"zk{i + 1}", self._argv(i), run_dir=self._node_dir(i)) for i in range(len(self.specs))
        )

    @classmethod
    def load(cls, folder: Path) -> ZkServer:
        """The ZooKeeper set up in ``folder`` (e.g. by ``ordq zk start`` in another process)."""
        if not (Path(folder) / CONFIG_FILE).exists():
            raise ExternalProcessError(
                f"no ZooKeeper set up in {folder} (start one with: ordq zk start --dir {folder})"
            )
        return cls(folder)

    def __repr__(self) -> str:
        return f"<ZkServer {self.connection_string} in {self.folder}>"

    # -- facts -------------------------------------------------------------------------------

    @property
    def connection_string(self) -> str:
        """host:port,host:port,... for clients (kazoo ``hosts``)."""
        return ",".join(f"{s.host}:{s.client_port}" for s in self.specs)

    @property
    def ensemble(self) -> bool:
        return len(self.specs) > 1

    @property
    def runs_all(self) -> bool:
        """Does this object run every node (not one node of an ensemble across machines)?"""
        return len(self.local) == len(self.specs)

    def status(self) -> list[NodeStatus]:
        """Each node's pid (None: down) and mode (None: down or not serving); a node run
        elsewhere (not in ``local``) is only asked for its mode."""
        out = []
        for i, (spec, proc) in enumerate(zip(self.specs, self.processes, strict=True)):
            remote = i not in self.local
            pid = None if remote else proc.pid
            asked = remote or pid is not None
            out.append(NodeStatus(node=i, myid=i + 1, port=spec.client_port, pid=pid, host=spec.host, remote=remote,
                                  mode=server_mode(spec.client_port, self.tls, host=spec.host) if asked else None))
        return out

    def leader(self) -> int | None:
        """Index of the node that reports ``leader`` (a standalone server is its own leader)."""
        for st in self.status():
            if st.mode in ("leader", "standalone"):
                return st.node
        return None

    def log_tails(self, lines: int = 50) -> Iterator[tuple[str, str]]:
        """(node name, last log lines) of every node that has a log."""
        for i in self.local:
            proc = self.processes[i]
            tail = proc.log_tail(lines)
            if tail:
                yield proc.name, tail

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Start every node that is not running and wait until ZooKeeper serves.

        Raises ExternalProcessError if Java or the jars are missing, a port is taken, a node
        dies while starting, or it does not serve within ``timeout_s``.
        """
        self.start_nodes()
        self.wait_serving(timeout_s=timeout_s)

    def start_nodes(self) -> None:
        """Start every local node that is not running; do not wait for it to serve (a node
        of an ensemble across machines serves only once a majority of the nodes run, so the
        first machine's cannot wait for it: ``ordq zk start --no-wait``)."""
        todo = [i for i in self.local if not self.processes[i].alive()]
        if todo:
            self._check_installed()
            self._check_ports(todo)
            self._save()
            for i in todo:
                self._write_node_files(i)
            for i in todo:
                self.processes[i].start()

    def wait_serving(self, *, timeout_s: float = 30.0) -> None:
        """Wait until every running node serves (an ensemble: each live node is leader or
        follower and exactly one is leader, so after a leader dies this waits for a *new*
        one; when other machines run some of the nodes, each local one is leader or follower).
        ExternalProcessError if one of them dies meanwhile, or on timeout."""
        required = [i for i in self.local if self.processes[i].alive()]
        if not required:
            raise ExternalProcessError(f"no ZooKeeper node is running in {self.folder}")

        def serving() -> dict[int, str] | None:
            modes: dict[int, str] = {}
            for i in required:
                if not self.processes[i].alive():
                    raise self._died(i)
                mode = server_mode(self.specs[i].client_port, self.tls, host=self.specs[i].host)
                if mode is None:
                    return None
                modes[i] = mode
            roles = sorted(modes.values())
            if not self.ensemble:
                return modes if roles == ["standalone"] else None
            ok = set(roles) <= {"leader", "follower"} and (roles.count("leader") == 1 or not self.runs_all)
            return modes if ok else None

        what = f"ZooKeeper at {self.connection_string} to serve"
        self.processes[required[0]].wait_ready(serving, timeout_s=timeout_s, what=what)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every local node (SIGTERM, then SIGKILL); the data stays."""
        for i in self.local:
            self.processes[i].stop(timeout_s)

    def kill(self, i: int) -> None:
        """kill -9 node ``i`` (and reap it). Does not wait for the others to re-elect."""
        self.processes[i].kill()

    def restart(self, i: int, *, timeout_s: float = 60.0) -> None:
        """Stop node ``i`` if it runs, start it again (same port and data), wait until serving."""
        self.processes[i].stop()
        self._check_installed()
        self._check_ports([i])
        self._write_node_files(i)
        self.processes[i].start()
        self.wait_serving(timeout_s=timeout_s)

    def detach(self) -> None:
        """Leave the nodes running when this object goes away (``ordq zk start``)."""
        for i in self.local:
            self.processes[i].detach()

    def destroy(self) -> None:
        """Stop every local node and wipe its data, logs and ``cluster.json``."""
        self.stop()
        for i in self.local:
            shutil.rmtree(self._node_dir(i), ignore_errors=True)
        (self.folder / CONFIG_FILE).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass  # holds other files: not ours to remove

    # -- internals ---------------------------------------------------------------------------

    def _node_dir(self, i: int) -> Path:
        return self.folder / f"node{i}"

    def _java_path(self) -> str | None:
        if self._java:
            return self._java if os.path.isfile(self._java) else shutil.which(self._java)
        home = os.environ.get("JAVA_HOME")
        if home and os.path.isfile(os.path.join(home, "bin", "java")):
            return os.path.join(home, "bin", "java")
        return shutil.which("java")

    def _argv(self, i: int) -> list[str]:
        java = self._java_path() or self._java or "java"
        classpath = ":".join((ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR, *(NETTY_JARS if self.tls else ())))
        extra = shlex.split(os.environ.get(JVM_FLAGS_ENV, ""))
        secret = [f"@{self._node_dir(i) / JVM_ARGS_FILE}"] if self.super_digest else []
        return [java, *JVM_OPTIONS, *extra, *secret, "-cp", classpath, MAIN_CLASS, str(self._node_dir(i) / "zoo.cfg")]

    def _check_installed(self) -> None:
        hint = f"install Debian's packages: apt-get install {APT_PACKAGES} (or run: make system-deps)"
        if self._java_path() is None:
            raise ExternalProcessError(
                f"Java not found ({self._java or 'java on PATH or $JAVA_HOME/bin/java'}): {hint}"
            )
        for jar in (ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR, *(NETTY_JARS if self.tls else ())):
            if not os.path.isfile(jar):
                raise ExternalProcessError(f"{jar} not found: {hint} (TLS also needs libnetty-java)")

    def _check_ports(self, nodes: list[int]) -> None:
        for i in nodes:
            spec = self.specs[i]
            ports = [spec.client_port] + ([spec.quorum_port, spec.election_port] if self.ensemble else [])
            for port in ports:
                if not port_free(port, spec.host):
                    raise ExternalProcessError(
                        f"cannot start ZooKeeper node {i}: {spec.host}:{port} is already in use "
                        f"(another ZooKeeper still running? stop it, e.g. ordq zk stop --dir DIR, "
                        f"or choose another port)"
                    )

    def _died(self, i: int) -> ExternalProcessError:
        proc = self.processes[i]
        return ExternalProcessError(
            f"ZooKeeper node {i} ({proc.name}, port {self.specs[i].client_port}) exited "
            f"(code {proc.returncode}) while starting; last lines of {proc.log_path}:\n{proc.log_tail(30)}"
        )

    def _new_specs(self, nodes: int, client_port: int | None, hosts: list[str]) -> list[NodeSpec]:
        wanted = [client_port + i for i in range(nodes)] if client_port is not None else []
        specs: list[NodeSpec] = []
        for i, host in enumerate(hosts):
            # ports free on this node's own address, distinct from those of nodes on the same one
            taken = [p for s in specs if s.host == host for p in (s.client_port, s.quorum_port, s.election_port)]
            picked = iter(free_ports(2 if wanted else 3, [*wanted, *taken], host=host))
            client = wanted[i] if wanted else next(picked)
            specs.append(NodeSpec(client, next(picked), next(picked), host))
        return specs

    def _read_saved(self) -> list[NodeSpec] | None:
        try:
            doc = json.loads((self.folder / CONFIG_FILE).read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ConfigError(f"{self.folder / CONFIG_FILE} is not valid JSON: {exc}") from exc
        return [NodeSpec(**n) for n in doc["nodes"]]

    def _read_saved_local(self) -> list[int] | None:
        try:
            doc = json.loads((self.folder / CONFIG_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return list(doc.get("local", range(len(doc["nodes"]))))

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "connection_string": self.connection_string,
            "tick_time_ms": self.tick_time_ms,
            "nodes": [attrs.asdict(s) for s in self.specs],
        }
        if not self.runs_all:
            doc["local"] = list(self.local)
        if self.tls is not None:
            doc["tls"] = self.tls.to_dict()
        tmp = self.folder / f"{CONFIG_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.folder / CONFIG_FILE)

    def _read_saved_tls(self) -> Credentials | None:
        from ordq.common.security import Credentials

        try:
            doc = json.loads((self.folder / CONFIG_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return Credentials.from_dict(doc["tls"]) if doc.get("tls") else None

    def _client_lines(self, node_dir: Path, port: int, host: str) -> list[str]:
        """zoo.cfg lines of where clients connect: plaintext, or TLS only (a Netty
        secureClientPort on the same port number, client certificates required)."""
        if self.tls is None:
            return [f"clientPort={port}", f"clientPortAddress={host}"]
        assert self.tls.ca_file and self.tls.cert_file and self.tls.key_file
        keystore = node_dir / KEYSTORE_FILE  # ZooKeeper's PEM key store: key and certificate in one file
        fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(Path(self.tls.key_file).read_bytes() + Path(self.tls.cert_file).read_bytes())
        return [
            f"secureClientPort={port}",
            f"secureClientPortAddress={host}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.ca_file}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=need",
        ]

    def _write_node_files(self, i: int) -> None:
        node_dir = self._node_dir(i)
        data_dir = node_dir / "data"
        # Snapshots and transaction logs hold every node's data, the tokens' hashes and the
        # ACLs' digests: the service's user only (mkdir's mode passes through the umask; chmod
        # also tightens a folder made by an older version).
        for folder in (node_dir, data_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        (data_dir / "myid").write_text(f"{i + 1}\n")
        self._write_jvm_args(i)
        spec = self.specs[i]
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={data_dir}",
            *self._client_lines(node_dir, spec.client_port, spec.host),
            # ticks a follower may take to connect and sync with a leader / stay in sync
            f"initLimit={max(10, 10_000 // self.tick_time_ms)}",
            f"syncLimit={max(5, 5_000 // self.tick_time_ms)}",
            # clients may still ask for long sessions with a short tick (default max: 20 ticks)
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
            "admin.enableServer=false",  # else every node starts a web server on :8080
            # Only what readiness, status and benches ask (four_letter_word): cons, wchc, dump... list
            # every client and session to anyone who can connect.
            "4lw.commands.whitelist=ruok,srvr,mntr",  # mntr: counts only (bench/bench_queues.py)
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.ensemble:
            lines.append("standaloneEnabled=false")
            # each node binds its own quorum and election address (quorumListenOnAllIPs is false)
            lines += [f"server.{j + 1}={s.host}:{s.quorum_port}:{s.election_port}" for j, s in enumerate(self.specs)]
        (node_dir / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def _write_jvm_args(self, i: int) -> None:
        """The node's argument file (the super-user's digest, 0600) and its command line, as
        ``super_digest`` says now (a rotated admin credential takes effect at the restart)."""
        path = self._node_dir(i) / JVM_ARGS_FILE
        if self.super_digest:
            if any(c.isspace() or c in "\"'\\#" for c in self.super_digest) or ":" not in self.super_digest:
                raise ConfigError("super_digest must be a digest id, user:base64(sha1(user:password))")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"-D{SUPER_DIGEST_PROPERTY}={self.super_digest}\n")
        else:
            path.unlink(missing_ok=True)
        self.processes[i].argv = tuple(self._argv(i))


def _describe(specs: Sequence[NodeSpec]) -> str:
    return ",".join(f"{s.host}:{s.client_port}" for s in specs)
