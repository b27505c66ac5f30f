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

``SPREAD`` is another ``Layout``: the control plane (ZooKeeper on h1-h3, the coordinators on
h1 and h2) apart from the brokers on h4-h6, clients on h7 and h8: a partition can then cut a
broker from ZooKeeper only, or a client from the coordinators only (issue 37: clients speak to
the coordinators, not to ZooKeeper).

Guarantees:
- Every server binds its host's lab address only, advertises it, and presents a certificate
  naming it; ZooKeeper is reached over TLS (``[tls] zookeeper = true``).
- The clients' credentials (the client certificate) are in the cluster's own credentials file
  (``<folder>/credentials.json``, ``ORDQ_CREDENTIALS`` of every command run by ``client_env``),
  never the user's.
- ``stop()`` stops the cluster's processes; the lab's ``down()`` removes everything else.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.common.security import Credentials, issue, make_ca, register, register_coordinators
from ordq.lab.lab import Lab

ROOT = "/ordq"
ZK_HOSTS = ("h1", "h2", "h3")
# group -> (master host, slave host)
GROUPS = {"g1": ("h1", "h2"), "g2": ("h2", "h3"), "g3": ("h3", "h1")}
COORDINATORS = ("h1", "h2")
PRODUCER_HOST, CONSUMER_HOST = "h4", "h5"
HOSTS = 5


@attrs.frozen
class Layout:
    """Which host runs what: ZooKeeper nodes, each group's (master, slave), coordinators, and
    the two client hosts (producers, consumers; each also runs the other role's standby)."""

    zk_hosts: tuple[str, ...] = ZK_HOSTS
    groups: dict[str, tuple[str, str]] = attrs.field(factory=lambda: dict(GROUPS))
    coordinators: tuple[str, ...] = COORDINATORS
    producer_host: str = PRODUCER_HOST
    consumer_host: str = CONSUMER_HOST

    @property
    def hosts(self) -> int:
        """How many hosts the lab needs (h1..hN)."""
        named = {*self.zk_hosts, *(h for pair in self.groups.values() for h in pair), *self.coordinators,
                 self.producer_host, self.consumer_host}
        return max(int(h[1:]) for h in named)

    @property
    def clients(self) -> tuple[str, str]:
        return (self.producer_host, self.consumer_host)


# The module docstring's layout: ZooKeeper shares hosts with brokers (5 hosts).
SHARED = Layout()
# The control plane (ZooKeeper, the coordinators) on hosts of its own (8 hosts): a partition can
# cut a broker from ZooKeeper or a client from the coordinators alone, the brokers and the
# other clients still reachable (the partition drills).
SPREAD = Layout(zk_hosts=("h1", "h2", "h3"), groups={"g1": ("h4", "h5"), "g2": ("h5", "h6"), "g3": ("h6", "h4")},
                coordinators=("h1", "h2"), producer_host="h7", consumer_host="h8")
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
    layout: Layout = SHARED
    brokers: dict[tuple[str, str], ManagedProcess] = attrs.field(factory=dict)
    coordinators: dict[str, ManagedProcess] = attrs.field(factory=dict)
    timings: dict[str, float] = attrs.field(factory=dict)

    # -- starting ---------------------------------------------------------------------------

    @classmethod
    def start(cls, lab: Lab, *, groups: Sequence[str] | None = None, coordinators: Sequence[str] | None = None,
              session_timeout_s: float = SESSION_TIMEOUT_S, layout: Layout = SHARED,
              name: str = "cluster") -> LabCluster:
        """Deploy the cluster in ``lab`` (``layout.hosts`` hosts at least), files under
        ``<lab folder>/<name>`` (two clusters of one lab, on hosts of their own: two names).
        OrdqError (ExternalProcessError, ConfigError) when a step fails; what started is
        stopped with the lab."""
        if len(lab.hosts) < layout.hosts:
            raise OrdqError(f"a lab cluster needs {layout.hosts} hosts, the lab has {len(lab.hosts)}")
        groups = tuple(layout.groups) if groups is None else groups
        coordinators = layout.coordinators if coordinators is None else coordinators
        t0 = time.monotonic()
        folder = lab.folder / name
        folder.mkdir()
        zk_hosts = ",".join(f"{lab.address(h)}:2181" for h in layout.zk_hosts)
        cluster = cls(lab, folder, zk_hosts, folder / "credentials.json", layout)
        # ZooKeeper boots (seconds of JVM) while the other certificates are issued; the
        # coordinators start once it serves (a coordinator rides out an unreachable ZooKeeper
        # for 30 s at start, then exits: at load 37 a quorum took longer than that), beside the
        # groups' registration, which brokers need first (GroupNotFound).
        cluster._issue([(h, "zk", "zookeeper") for h in layout.zk_hosts], ca=True)
        cluster._zookeeper(wait=False)
        broker_hosts = sorted({h for gid in groups for h in layout.groups[gid]})
        cluster._issue([(h, "broker", "broker") for h in broker_hosts]
                       + [(h, "coordinator", "coordinator") for h in coordinators]
                       + [(h, "client", "client") for h in layout.clients])
        cluster.timings["certificates"] = time.monotonic() - t0
        ca = str(folder / "ca" / "ca.pem")
        client = folder / layout.consumer_host
        register(zk_hosts, ROOT, Credentials(ca_file=ca, cert_file=str(client / "client.pem"),
                                             key_file=str(client / "client-key.pem"), zk_tls=True),
                 path=cluster.credentials_file)
        # Clients find the coordinators by these addresses (issue 37), named by (zk_hosts, ROOT).
        register_coordinators(zk_hosts, ROOT, [cluster.coordinator_address(h) for h in coordinators],
                              path=cluster.credentials_file)
        cluster._zookeeper(wait=True)
        cluster.timings["zookeeper"] = time.monotonic() - t0
        for host in coordinators:
            cluster.coordinators[host] = cluster._coordinator(host, session_timeout_s)
        with ThreadPoolExecutor(len(groups)) as pool:
            # a ZooKeeper session over TLS at load 20 took longer than the CLI's 5 s: stretched
            zk_timeout = f"{load_stretched(5.0):.0f}"
            list(pool.map(lambda gid: cluster.call(layout.producer_host, ["--zk-timeout", zk_timeout, "group", "add",
                                                                          gid]), groups))
        cluster.timings["groups"] = time.monotonic() - t0
        for gid in groups:
            for role, host in zip(("master", "slave"), layout.groups[gid], strict=True):
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
        zk = self.layout.zk_hosts
        configs = {h: self._host_dir(h) / "zk.toml" for h in zk}
        if wait:
            # Stretched by the load: at load 40 on two cores a JVM took 45 s to open its port.
            serve_s = load_stretched(60.0)
            self.lab.call(zk[0], [ordq_command(), "zk", "start", "--config", str(configs[zk[0]]),
                                  "--timeout", f"{serve_s:.0f}"], timeout_s=serve_s + 60)
            return
        servers = "".join(f'\n[[servers]]\nhost = "{self.lab.address(h)}"\n' for h in zk)
        for myid, host in enumerate(zk, 1):
            configs[host].write_text(f'myid = {myid}\ndir = "zk"\ntick_time_ms = 200\n{servers}'
                                     + _tls("zk", zookeeper=False))
        with ThreadPoolExecutor(len(zk)) as pool:
            list(pool.map(lambda h: self.lab.call(h, [ordq_command(), "zk", "start", "--config", str(configs[h]),
                                                      "--no-wait"], timeout_s=120), zk))

    def _broker(self, gid: str, role: str, host: str, session_timeout_s: float) -> ManagedProcess:
        address = self.lab.address(host)
        port = list(self.layout.groups).index(gid)  # two brokers share a host: one port each
        config = self._host_dir(host) / f"broker-{gid}-{role}.toml"
        config.write_text(f'zk = "{self.zk_hosts}"\ngroup = "{gid}"\nrole = "{role}"\n'
                          f'listen = "{address}:{BROKER_PORT + port}"\nmetrics = "{address}:{METRICS_PORT + port}"\n'
                          f'data = "data-{gid}-{role}"\nsession_timeout_s = {session_timeout_s}\n' + _tls("broker"))
        return self.lab.run(host, [ordq_command(), "broker", "run", "--config", str(config)],
                            name=f"{host}-broker-{gid}-{role}")

    def coordinator_address(self, host: str) -> str:
        """Where the coordinator of ``host`` answers (its lab address)."""
        return f"{self.lab.address(host)}:{COORDINATOR_PORT}"

    @property
    def bootstrap(self) -> str:
        """The coordinators' addresses (``host:port,...``), as the cluster's clients are given them."""
        return ",".join(self.coordinator_address(h) for h in self.coordinators)

    def _coordinator(self, host: str, session_timeout_s: float) -> ManagedProcess:
        address = self.lab.address(host)
        config = self._host_dir(host) / "coordinator.toml"
        config.write_text(f'zk = "{self.zk_hosts}"\nlisten = "{self.coordinator_address(host)}"\n'
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

    def groups(self) -> list[dict[str, Any]]:
        """``ordq group list --json`` as a client host sees it."""
        doc = json.loads(self.call(self.layout.producer_host, ["group", "list", "--json"]))
        return list(doc if isinstance(doc, list) else doc.get("groups", doc))

    def whole(self) -> bool:
        """Every group healthy, with a master and a slave registered (False while ZooKeeper or
        the CLI does not answer)."""
        try:
            groups = self.groups()
        except (OrdqError, ValueError):
            return False
        return len(groups) == len({gid for gid, _role in self.brokers}) and all(
            g.get("healthy") in (True, "yes") and g.get("master") and g.get("slave") for g in groups)

    def elected_coordinator(self) -> str | None:
        """The host of the coordinator elected last (from their logs: each logs its election).
        The whole log: after a few drills the election line is far from the tail."""
        elected = [(line[:23], host) for host, proc in self.coordinators.items()
                   for line in _log_text(proc).splitlines() if line.endswith(" elected")]
        return max(elected)[1] if elected else None

    def host_of(self, gid: str, role: str) -> str:
        return self.layout.groups[gid][0 if role == "master" else 1]

    def restart_broker(self, gid: str, role: str) -> ManagedProcess:
        """Start ``gid``'s ``role`` again in its host (after a kill), from its config file and
        data folder, and wait until it serves."""
        proc = self.brokers[(gid, role)]
        proc.stop(timeout_s=5.0)
        proc.start()
        proc.wait_for_line("READY ", timeout_s=90)
        return proc

    def stop(self) -> None:
        for proc in [*self.coordinators.values(), *self.brokers.values()]:
            proc.stop(timeout_s=5.0)


def _log_text(proc: ManagedProcess) -> str:
    try:
        return proc.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
