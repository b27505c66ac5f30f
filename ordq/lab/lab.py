"""A lab of hosts on one machine: network namespaces joined by a bridge, each host with its own
address, so that processes talk across addresses (and partitions cut them) as on machines.

Guarantees:
- ``Lab.create(folder, hosts=N)`` makes hosts ``h1``..``hN``: each a network namespace
  ``ordq-<id>-hK`` (``id``: 6 random hex digits) with loopback and one link, ``eth0``, a veth
  pair whose other end is a port of the bridge ``br0`` in the lab's switch namespace
  ``ordq-<id>-sw``. Host K has the address K of the lab's /24 subnet. The root namespace gets
  no link, address or route of the lab, no host has a default route, and IPv6 addresses are
  not even generated on the lab's links: packets of the lab reach lab hosts only.
- The subnet is ``10.X.Y.0/24``, X in 200..239 and Y derived from the id, so labs side by side
  differ; one overlapping any address or route of the machine (another lab's too) is never
  used: a given ``subnet`` is refused, a derived one is drawn again (then refused).
- It leaves nothing behind: ``down()`` kills every process inside the lab and deletes its
  namespaces, and with them its links, bridge and iptables rules. An owned lab (the default)
  also has a reaper, a detached process that waits on the owner's pidfd and does the same when
  the owner dies, by kill -9 too. Every lab is recorded in the registry
  (``$ORDQ_LAB_REGISTRY``, default ``/run/ordq-lab``), and ``Lab.create`` first sweeps labs
  whose owner and reaper are both dead. A lab made with ``owned=False`` (``ordq lab up``)
  lasts until ``ordq lab down`` — unless ``$ORDQ_OWNER`` names an owner (a test run), whose
  death then removes it as above.
- Needs root (namespaces, links, iptables): ``ConfigError`` says so.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.common.proc import OWNER_ENV, ManagedProcess, owner_token
from ordq.lab.nemesis import Nemesis
from ordq.lab.netns import (
    in_namespace,
    ip,
    lab_ids,
    list_namespaces,
    namespace,
    run,
    socket_in,
    taken_networks,
    teardown,
)
from ordq.lab.partition import LINK

REGISTRY_ENV = "ORDQ_LAB_REGISTRY"
DEFAULT_REGISTRY = Path("/run/ordq-lab")
STATE_FILE = "lab.json"
SWITCH = "sw"
BRIDGE = "br0"
MAX_HOSTS = 50
_DRAWS = 16  # derived subnets tried before refusing


def registry_dir() -> Path:
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY)


def derived_subnet(lab_id: str) -> ipaddress.IPv4Network:
    value = int(lab_id, 16)
    return ipaddress.IPv4Network(f"10.{200 + value % 40}.{(value >> 8) % 256}.0/24")


def require_root() -> None:
    """ConfigError unless this process can make namespaces: root, with ``ip`` (iproute2)."""
    if os.geteuid() != 0:
        raise ConfigError("the lab needs root (network namespaces, links and iptables)")
    if shutil.which("ip") is None:
        raise ConfigError("the lab needs iproute2's ip (apt-get install iproute2)")


def unavailable() -> str | None:
    """Why no lab can be made here (not root, no ``ip``/``iptables``, namespaces refused, or
    netfilter or veth links refused inside one: a container may allow one but not the
    others), or None. Tries a throwaway namespace, which it deletes."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install iproute2 iptables)"
    probe = f"ordqtest-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        for argv, what in ((["iptables", "-S"], "iptables"),
                           (["ip", "link", "add", "p0", "type", "veth", "peer", "p1"], "a veth link")):
            tried = subprocess.run(["ip", "netns", "exec", probe, *argv], capture_output=True, text=True, check=False)
            if tried.returncode != 0:
                return f"{what} inside a namespace failed: {tried.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], check=True)
    return None


def _alive(token: str | None) -> bool:
    if not token:
        return False
    pid, _, _ = token.partition(":")
    return pid.isdigit() and owner_token(int(pid)) == token


class Lab:
    """A lab that exists: its hosts, their addresses and namespaces. ``Lab.create`` makes one,
    ``Lab.load`` finds the one in a folder; ``down()`` removes it. A context manager (downs it)."""

    def __init__(self, folder: Path, record: Mapping[str, Any]) -> None:
        self.folder = folder
        self.id: str = record["id"]
        self.subnet = ipaddress.IPv4Network(record["subnet"])
        self.addresses: dict[str, str] = dict(record["hosts"])
        self.owner: str | None = record.get("owner")
        self.reaper_token: str | None = record.get("reaper")
        self._processes: list[ManagedProcess] = []
        self._reaper: ManagedProcess | None = None
        self._nemesis: Nemesis | None = None

    # -- making and removing ----------------------------------------------------------------

    @classmethod
    def create(cls, folder: Path | str, *, hosts: int = 3, subnet: str | None = None, owned: bool = True) -> Lab:
        """Make a lab of ``hosts`` hosts, recorded in ``folder`` (its logs and processes' files
        go there too). ``owned``: it is removed when this process ends, even by kill -9; not
        owned, it lasts until ``down()``, or until the process ``$ORDQ_OWNER`` names ends when
        that is set (a test run's ``ordq lab up``).
        ConfigError: not root, a lab already in ``folder``, the subnet taken, bad ``hosts``;
        ExternalProcessError: a command failed (what was made is removed again)."""
        require_root()
        if not 1 <= hosts <= MAX_HOSTS:
            raise ConfigError(f"a lab has 1 to {MAX_HOSTS} hosts, not {hosts}")
        folder = Path(folder).resolve()
        if (folder / STATE_FILE).exists():
            old = cls.load(folder)
            if old.exists():
                raise ConfigError(f"a lab already runs in {folder} (lab {old.id}); remove it first: "
                                  f"ordq lab down --dir {folder}")
        sweep()
        lab_id, net = _choose_subnet(subnet)
        if net.num_addresses - 2 < hosts:
            raise ConfigError(f"subnet {net} has room for {net.num_addresses - 2} hosts, not {hosts}")
        record: dict[str, Any] = {
            "id": lab_id, "subnet": str(net), "dir": str(folder),
            "hosts": {f"h{k}": str(net.network_address + k) for k in range(1, hosts + 1)},
            # Not owned: the lab lasts until `down` — unless it is made under an owner that
            # owns everything started under it (ORDQ_OWNER: a test run), as ManagedProcess does.
            "owner": owner_token() if owned else os.environ.get(OWNER_ENV) or None, "reaper": None,
        }
        folder.mkdir(parents=True, exist_ok=True)
        lab = cls(folder, record)
        lab._save(record)  # recorded before anything exists: a sweep can then always find it
        try:
            if lab.owner is not None:
                lab._start_reaper()
            lab._build()
            if lab._reaper is not None:
                # Waited for only now: once spawned it checks the owner whenever that dies (at
                # once if already dead), so the build need not wait for Python to start.
                lab._reaper.wait_for_line("READY", timeout_s=60.0)
        except BaseException:
            lab.down()
            raise
        return lab

    @classmethod
    def load(cls, folder: Path | str) -> Lab:
        folder = Path(folder).resolve()
        try:
            record = json.loads((folder / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no lab in {folder} (ordq lab up --dir {folder} makes one)") from None
        return cls(folder, record)

    def down(self, timeout_s: float = 10.0) -> list[str]:
        """Remove the lab: stop its processes, kill whatever else runs inside it, delete its
        namespaces (links, bridge, rules with them), stop the reaper, drop the records.
        Idempotent. Returns the namespaces deleted."""
        for process in self._processes:
            with contextlib.suppress(ExternalProcessError):
                process.stop(timeout_s=2.0)  # a chance to exit cleanly; teardown kills the rest
        deleted = teardown(self.id, timeout_s=timeout_s)
        if self._reaper is not None:
            self._reaper.stop(timeout_s=5.0)
        elif _alive(self.reaper_token):
            assert self.reaper_token is not None
            pid = int(self.reaper_token.partition(":")[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(ChildProcessError):  # ours (detached by this process): reap it
                os.waitpid(pid, 0)
        forget(self.id, self.folder)
        return deleted

    def detach(self) -> None:
        """Leave the lab, its reaper and its processes as they are after this object is gone
        (``ordq lab up`` exits): ``Lab.load(folder).down()`` removes them later."""
        for process in [*self._processes, *([self._reaper] if self._reaper else [])]:
            process.detach()
        self._processes, self._reaper = [], None

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- using it ---------------------------------------------------------------------------

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted(self.addresses, key=lambda h: int(h[1:])))

    def address(self, host: str) -> str:
        return self.addresses[self._known(host)]

    def namespace(self, host: str) -> str:
        return namespace(self.id, self._known(host))

    def exists(self) -> bool:
        return any(n.startswith(namespace(self.id, "")) for n in list_namespaces())

    def run(self, host: str, argv: Sequence[str], *, name: str | None = None, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, die_with_parent: bool | None = None) -> ManagedProcess:
        """Start ``argv`` inside ``host`` as a ``ManagedProcess`` (log and pid file in
        ``<folder>/run``, named ``name``, default ``<host>-<program>``); ``down()`` stops it."""
        process = ManagedProcess(name or f"{host}-{Path(argv[0]).name}", in_namespace(self.namespace(host), argv),
                                 run_dir=self.folder / "run", env=env, cwd=cwd, die_with_parent=die_with_parent)
        process.start()
        self._processes.append(process)
        return process

    def call(self, host: str, argv: Sequence[str], *, timeout_s: float = 60.0, stdin: str | None = None) -> str:
        """Run ``argv`` inside ``host`` to completion and return its stdout (a command that
        starts a server and returns, as ``ordq zk start`` does: the server stays in the host).
        ExternalProcessError with its stderr when it fails or outlasts ``timeout_s``."""
        return run(in_namespace(self.namespace(host), argv), stdin=stdin, timeout_s=timeout_s)

    def socket(self, host: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """An IPv4 socket inside ``host`` (this process stays where it is): to probe the lab."""
        return socket_in(self.namespace(host), socket.AF_INET, kind)

    @property
    def nemesis(self) -> Nemesis:
        """The partition nemesis of this lab (``ordq.lab.partition`` describes partitions)."""
        if self._nemesis is None:
            self._nemesis = Nemesis({h: self.namespace(h) for h in self.hosts}, self.addresses)
        return self._nemesis

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "subnet": str(self.subnet), "dir": str(self.folder), "owner": self.owner,
                "up": self.exists(),
                "hosts": [{"host": h, "address": self.addresses[h], "namespace": self.namespace(h)}
                          for h in self.hosts]}

    # -- internals --------------------------------------------------------------------------

    def _known(self, host: str) -> str:
        if host not in self.addresses:
            raise ConfigError(f"no host {host!r} in lab {self.id} (hosts: {', '.join(self.hosts)})")
        return host

    def _save(self, record: Mapping[str, Any]) -> None:
        for path in (registry_dir() / f"{self.id}.json", self.folder / STATE_FILE):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            tmp.replace(path)

    def _record(self) -> dict[str, Any]:
        return {"id": self.id, "subnet": str(self.subnet), "dir": str(self.folder), "hosts": self.addresses,
                "owner": self.owner, "reaper": self.reaper_token}

    def _start_reaper(self) -> None:
        assert self.owner is not None
        reaper = ManagedProcess("reaper", [sys.executable, "-m", "ordq.lab.reaper", "--lab", self.id,
                                           "--owner", self.owner, "--registry", str(registry_dir())],
                                run_dir=self.folder, die_with_parent=False)
        reaper.start()
        self._reaper = reaper
        pid = reaper.pid
        assert pid is not None
        self.reaper_token = owner_token(pid)
        self._save(self._record())

    def _build(self) -> None:
        switch = namespace(self.id, SWITCH)
        ip(batch=[f"netns add {n}" for n in (switch, *map(self.namespace, self.hosts))]
               + [f"link add {LINK} netns {self.namespace(h)} type veth peer name {h} netns {switch}"
                  for h in self.hosts])
        # addrgenmode none: no IPv6 link-local address, so not even neighbour discovery is sent.
        ports = [line for h in self.hosts
                 for line in (f"link set {h} addrgenmode none", f"link set {h} master {BRIDGE}", f"link set {h} up")]
        ip(namespace=switch, batch=["link set lo up", f"link add {BRIDGE} type bridge",
                                    f"link set {BRIDGE} addrgenmode none", *ports, f"link set {BRIDGE} up"])
        for h in self.hosts:
            ip(namespace=self.namespace(h), batch=[
                "link set lo up", f"link set {LINK} addrgenmode none",
                f"addr add {self.addresses[h]}/{self.subnet.prefixlen} dev {LINK}", f"link set {LINK} up"])


def _choose_subnet(subnet: str | None) -> tuple[str, ipaddress.IPv4Network]:
    taken = taken_networks() + [ipaddress.IPv4Network(r["subnet"]) for r in registered()]
    if subnet is not None:
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError as exc:
            raise ConfigError(f"not a subnet: {subnet!r} ({exc})") from None
        if not net.is_private or net.is_loopback:
            raise ConfigError(f"a lab's subnet must be private (such as 10.0.0.0/8), not {net}")
        clash = sorted({str(t) for t in taken if t.overlaps(net)})
        if clash:
            raise ConfigError(f"subnet {net} is already in use on this machine ({', '.join(clash)})")
        return secrets.token_hex(3), net
    for _ in range(_DRAWS):
        lab_id = secrets.token_hex(3)
        net = derived_subnet(lab_id)
        if lab_id not in lab_ids() and not any(t.overlaps(net) for t in taken):
            return lab_id, net
    raise ConfigError(f"no free lab subnet in 10.200.0.0/13 after {_DRAWS} draws; this machine's networks overlap "
                      "it: give one with --subnet")


def registered() -> list[dict[str, Any]]:
    """The labs of the registry (unreadable entries skipped)."""
    found = []
    for path in sorted(registry_dir().glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def forget(lab_id: str, folder: Path | None) -> None:
    """Drop the records of a removed lab: its registry entry, and ``folder``'s state file when
    it names this lab (not a newer one made there since)."""
    with contextlib.suppress(FileNotFoundError):
        (registry_dir() / f"{lab_id}.json").unlink()
    if folder is not None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads((folder / STATE_FILE).read_text())["id"] == lab_id:
                (folder / STATE_FILE).unlink()


def remove(lab_id: str) -> list[str]:
    """Remove lab ``lab_id`` by its id alone (a lab whose folder is gone): as ``Lab.down``
    when the registry knows it, else its namespaces and processes. Returns the namespaces
    deleted."""
    record = next((r for r in registered() if r.get("id") == lab_id), None)
    if record is not None:
        return Lab(Path(record.get("dir") or "."), record).down()
    return teardown(lab_id)


def sweep() -> list[str]:
    """Remove the labs whose owner and reaper are both dead (a reaper killed with its owner,
    a reboot's leftovers of the registry). Labs without an owner (``ordq lab up``) and labs of
    live owners are left alone. Returns the ids removed."""
    removed = []
    for record in registered():
        if record.get("owner") is None or _alive(record["owner"]) or _alive(record.get("reaper")):
            continue
        remove(record["id"])
        removed.append(record["id"])
    return removed


def status() -> list[dict[str, Any]]:
    """Every lab on this machine: the registry's, and namespaces of labs it does not know."""
    rows = []
    seen = set()
    live = lab_ids()
    for record in registered():
        seen.add(record["id"])
        owner = record.get("owner")
        rows.append({"id": record["id"], "subnet": record["subnet"], "hosts": len(record["hosts"]),
                     "dir": record.get("dir"), "up": record["id"] in live,
                     "owner": "none (ordq lab up)" if owner is None else ("alive" if _alive(owner) else "dead")})
    for lab_id in sorted(live - seen):
        rows.append({"id": lab_id, "subnet": None, "hosts": None, "dir": None, "up": True, "owner": "unknown"})
    return rows

