"""A whole ordq cluster in a lab, deployed host by host the way docs/OPERATIONS.md ("Deploying
on three machines") does it: certificates of the cluster's CA naming each host's lab address
(``ordq cert issue``'s function), a config file per process, ``ordq zk start --config`` on each ZooKeeper
host, ``ordq broker run --config`` / ``ordq coordinator run --config`` inside their hosts.
Nothing reaches the cluster over loopback: every command that talks to it runs inside a host.

Layout (``LabCluster.start``; hosts of a 5-host lab):

    h1  ZooKeeper node 1, master of g1, slave of g3, coordinator
    h2  ZooKeeper node 2, master of g2, slave of g1, coordinator (standby)
    h3  ZooKeeper node 3, master of g3, slave of g2
    h4  clients (producers)
    h5  clients (consumers)

Guarantees:
- Every server binds its host's lab address only, advertises it, and presents a certificate
  naming it; ZooKeeper is reached over TLS (``[tls] zookeeper = true``).
- The clients' credentials (the client certificate) are in the cluster's own credentials file
  (``<folder>/credentials.json``, ``ORDQ_CREDENTIALS`` of every command run by ``client_env``),
  never the user's.
- ``stop()`` stops the cluster's processes; the lab's ``down()`` removes everything else.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials, issue, make_ca, register
from ordq.lab.lab import Lab

ROOT = "/ordq"
ZK_HOSTS = ("h1", "h2", "h3")
# group -> (master host, slave host)
GROUPS = {"g1": ("h1", "h2"), "g2": ("h2", "h3"), "g3": ("h3", "h1")}
COORDINATORS = ("h1", "h2")
PRODUCER_HOST, CONSUMER_HOST = "h4", "h5"
HOSTS = 5
BROKER_PORT, METRICS_PORT, COORDINATOR_PORT = 7000, 9100, 7100
SESSION_TIMEOUT_S = 2.0


def ordq_command() -> str:
    """The ``ordq`` console script of this Python (the one a machine's operator runs)."""
    return str(Path(sys.executable).parent / "ordq")


def _tls(name: str, *, zookeeper: bool = True) -> str:
    return (f'\n[tls]\ncert = "{name}.pem"\nkey = "{name}-key.pem"\nca = "ca.pem"\n'
            + ("zookeeper = true\n" if zookeeper else ""))


@attrs.define(eq=False)
class LabCluster:
    """A cluster running in ``lab``: ``zk_hosts`` is its connection string (lab addresses),
    ``brokers[(group, role)]`` and ``coordinators[host]`` its processes."""

    lab: Lab
    folder: Path
    zk_hosts: str
    credentials_file: Path
    brokers: dict[tuple[str, str], ManagedProcess] = attrs.field(factory=dict)
    coordinators: dict[str, ManagedProcess] = attrs.field(factory=dict)
    timings: dict[str, float] = attrs.field(factory=dict)

    # -- starting ---------------------------------------------------------------------------

    @classmethod
    def start(cls, lab: Lab, *, groups: Sequence[str] = tuple(GROUPS), coordinators: Sequence[str] = COORDINATORS,
              session_timeout_s: float = SESSION_TIMEOUT_S) -> LabCluster:
        """Deploy the cluster in ``lab`` (5 hosts at least), files under ``<lab folder>/cluster``.
        OrdqError (ExternalProcessError, ConfigError) when a step fails; what started is
        stopped with the lab."""
        if len(lab.hosts) < HOSTS:
            raise OrdqError(f"a lab cluster needs {HOSTS} hosts, the lab has {len(lab.hosts)}")
        t0 = time.monotonic()
        folder = lab.folder / "cluster"
        folder.mkdir()
        zk_hosts = ",".join(f"{lab.address(h)}:2181" for h in ZK_HOSTS)
        cluster = cls(lab, folder, zk_hosts, folder / "credentials.json")
        # ZooKeeper boots (seconds of JVM) while the other certificates are issued and the
        # coordinators start (each waits for ZooKeeper by itself); brokers need their group
        # registered first (GroupNotFound), which needs ZooKeeper serving.
        cluster._issue([(h, "zk", "zookeeper") for h in ZK_HOSTS], ca=True)
        cluster._zookeeper(wait=False)
        broker_hosts = sorted({h for gid in groups for h in GROUPS[gid]})
        cluster._issue([(h, "broker", "broker") for h in broker_hosts]
                       + [(h, "coordinator", "coordinator") for h in coordinators]
                       + [(h, "client", "client") for h in (PRODUCER_HOST, CONSUMER_HOST)])
        cluster.timings["certificates"] = time.monotonic() - t0
        for host in coordinators:
            cluster.coordinators[host] = cluster._coordinator(host, session_timeout_s)
        ca = str(folder / "ca" / "ca.pem")
        client = folder / CONSUMER_HOST
        register(zk_hosts, ROOT, Credentials(ca_file=ca, cert_file=str(client / "client.pem"),
                                             key_file=str(client / "client-key.pem"), zk_tls=True),
                 path=cluster.credentials_file)
        cluster._zookeeper(wait=True)
        cluster.timings["zookeeper"] = time.monotonic() - t0
        with ThreadPoolExecutor(len(groups)) as pool:
            list(pool.map(lambda gid: cluster.call(PRODUCER_HOST, ["group", "add", gid]), groups))
        cluster.timings["groups"] = time.monotonic() - t0
        for gid in groups:
            for role, host in zip(("master", "slave"), GROUPS[gid], strict=True):
                cluster.brokers[(gid, role)] = cluster._broker(gid, role, host, session_timeout_s)
        for proc in cluster.brokers.values():
            proc.wait_for_line("READY ", timeout_s=90)
        for proc in cluster.coordinators.values():
            proc.wait_for_line("SERVING ", timeout_s=90)
        cluster.timings["ready"] = time.monotonic() - t0
        return cluster

    def _host_dir(self, host: str) -> Path:
        path = self.folder / host
        path.mkdir(exist_ok=True)
        return path

    def _issue(self, wanted: Sequence[tuple[str, str, str]], *, ca: bool = False) -> None:
        """A certificate for each (host, name, role), naming the host's lab address (a
        client's names none), into the host's folder with the CA's certificate. Made by the
        functions ``ordq cert ca``/``ordq cert issue`` run (``ordq.common.security``), in this
        process: a dozen CLI starts cost 11-25 s of a 2-core machine at load 12."""
        ca_dir = self.folder / "ca"
        if ca:
            make_ca(ca_dir)
        for host, name, role in wanted:
            issue(ca_dir, self._host_dir(host), name, role=role,
                  ips=[] if role == "client" else [self.lab.address(host)])
            (self._host_dir(host) / "ca.pem").write_bytes((ca_dir / "ca.pem").read_bytes())

    def _zookeeper(self, *, wait: bool) -> None:
        """Start each node (``wait=False``: at once, none serves before a majority runs), or
        start node 1 again, which waits until it serves: a quorum is up (as OPERATIONS.md
        does on host1)."""
        configs = {h: self._host_dir(h) / "zk.toml" for h in ZK_HOSTS}
        if wait:
            self.lab.call(ZK_HOSTS[0], [ordq_command(), "zk", "start", "--config", str(configs[ZK_HOSTS[0]])],
                          timeout_s=120)
            return
        servers = "".join(f'\n[[servers]]\nhost = "{self.lab.address(h)}"\n' for h in ZK_HOSTS)
        for myid, host in enumerate(ZK_HOSTS, 1):
            configs[host].write_text(f'myid = {myid}\ndir = "zk"\ntick_time_ms = 200\n{servers}'
                                     + _tls("zk", zookeeper=False))
        with ThreadPoolExecutor(len(ZK_HOSTS)) as pool:
            list(pool.map(lambda h: self.lab.call(h, [ordq_command(), "zk", "start", "--config", str(configs[h]),
                                                      "--no-wait"], timeout_s=120), ZK_HOSTS))

    def _broker(self, gid: str, role: str, host: str, session_timeout_s: float) -> ManagedProcess:
        address = self.lab.address(host)
        port = list(GROUPS).index(gid)  # two brokers share a host: one port each
        config = self._host_dir(host) / f"broker-{gid}-{role}.toml"
        config.write_text(f'zk = "{self.zk_hosts}"\ngroup = "{gid}"\nrole = "{role}"\n'
                          f'listen = "{address}:{BROKER_PORT + port}"\nmetrics = "{address}:{METRICS_PORT + port}"\n'
                          f'data = "data-{gid}-{role}"\nsession_timeout_s = {session_timeout_s}\n' + _tls("broker"))
        return self.lab.run(host, [ordq_command(), "broker", "run", "--config", str(config)],
                            name=f"{host}-broker-{gid}-{role}")

    def _coordinator(self, host: str, session_timeout_s: float) -> ManagedProcess:
        address = self.lab.address(host)
        config = self._host_dir(host) / "coordinator.toml"
        config.write_text(f'zk = "{self.zk_hosts}"\nlisten = "{address}:{COORDINATOR_PORT}"\n'
                          f'metrics = "{address}:{METRICS_PORT + 10}"\nsession_timeout_s = {session_timeout_s}\n'
                          + _tls("coordinator"))
        return self.lab.run(host, [ordq_command(), "coordinator", "run", "--config", str(config)],
                            name=f"{host}-coordinator")

    # -- using it ---------------------------------------------------------------------------

    def client_env(self) -> dict[str, str]:
        """The environment of a client of this cluster (its credentials file, its ZooKeeper)."""
        return {"ORDQ_CREDENTIALS": str(self.credentials_file), "ORDQ_ZK": self.zk_hosts, "ORDQ_ROOT": ROOT}

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        """``ordq argv`` as a client of this cluster runs it (for ``lab.call``/``lab.run``)."""
        return ["env", *(f"{k}={v}" for k, v in self.client_env().items()), ordq_command(), *argv]

    def call(self, host: str, argv: Sequence[str], *, timeout_s: float = 120.0) -> str:
        """Run ``ordq argv`` in ``host`` as a client of this cluster; its stdout."""
        return self.lab.call(host, self.client_argv(argv), timeout_s=timeout_s)

    def elected_coordinator(self) -> str | None:
        """The host of the coordinator elected last (from their logs: each logs its election).
        The whole log: after a few drills the election line is far from the tail."""
        elected = [(line[:23], host) for host, proc in self.coordinators.items()
                   for line in _log_text(proc).splitlines() if line.endswith(" elected")]
        return max(elected)[1] if elected else None

    def host_of(self, gid: str, role: str) -> str:
        return GROUPS[gid][0 if role == "master" else 1]

    def stop(self) -> None:
        for proc in [*self.coordinators.values(), *self.brokers.values()]:
            proc.stop(timeout_s=5.0)


def _log_text(proc: ManagedProcess) -> str:
    try:
        return proc.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
