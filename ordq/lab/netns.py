"""Network namespaces by name: create a lab's, find them, tear them down, open a socket in one.

Guarantees:
- A lab's namespaces are all named ``ordq-<lab id>-<name>`` (``namespace()``), and nothing of a
  lab lives outside them: its links are created inside them (``ip link add ... netns``), so
  deleting them deletes the links, the bridge and every iptables rule with them.
- ``teardown(lab_id)`` kills every process inside those namespaces (and any command still
  naming one, such as an ``ip`` of an interrupted setup), then deletes the namespaces, and
  repeats until a pass finds nothing. It is idempotent and needs no state but the id, so the
  owner, the reaper and ``ordq lab down`` all use it.
- ``taken_networks()`` lists every IPv4 network on the machine (addresses in the root and every
  named namespace, the root's routes except the default one), to refuse a subnet in use.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from ordq.common.errors import ExternalProcessError
from ordq.common.pid_file import pid_running

NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its names (bind mounts of each namespace)
PREFIX = "ordq-"
_CLONE_NEWNET = 0x40000000
_COMMAND_TIMEOUT_S = 30.0


def namespace(lab_id: str, name: str) -> str:
    return f"{PREFIX}{lab_id}-{name}"


def lab_ids() -> set[str]:
    """The ids of every lab with a namespace on this machine (``ordq-<id>-*``)."""
    return {n[len(PREFIX):].partition("-")[0] for n in list_namespaces() if n.startswith(PREFIX)}


def list_namespaces() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def ip(*args: str, batch: Sequence[str] = (), namespace: str | None = None) -> str:
    """Run ``ip [-n NS] ARGS`` (or ``ip [-n NS] -batch -`` with ``batch`` lines); its stdout.
    ExternalProcessError with its stderr when it fails."""
    argv = ["ip", *(["-n", namespace] if namespace else []), *(["-batch", "-"] if batch else args)]
    return run(argv, stdin="\n".join(batch) + "\n" if batch else None)


def run(argv: Sequence[str], *, stdin: str | None = None, timeout_s: float = _COMMAND_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExternalProcessError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise ExternalProcessError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def in_namespace(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``ns`` (``ip netns exec`` execs it: the pid stays the program's)."""
    return ["ip", "netns", "exec", ns, *argv]


def taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine uses: the root's addresses and routes (not the default
    route, which covers everything and collides with nothing), and every named namespace's
    addresses (other labs' among them)."""
    found: list[ipaddress.IPv4Network] = []
    for ns in [None, *list_namespaces()]:
        try:
            links = json.loads(ip("-j", "-4", "addr", "show", namespace=ns) or "[]")
        except ExternalProcessError:
            continue  # a namespace deleted meanwhile
        for link in links:
            for a in link.get("addr_info", []):
                found.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "")
        if dst in ("default", ""):
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False)
            if net.prefixlen > 0:
                found.append(net)
    return found


def processes_of(lab_id: str) -> list[int]:
    """Pids of the lab's processes: those inside one of its namespaces, and those whose command
    line names one (an ``ip`` command of its setup, an ``ip netns exec`` not yet exec'd)."""
    mark = f"{PREFIX}{lab_id}-"
    inodes = set()
    for ns in list_namespaces():
        if ns.startswith(mark):
            with contextlib.suppress(OSError):
                st = os.stat(NETNS_DIR / ns)
                inodes.add((st.st_dev, st.st_ino))
    me = os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/net")
            inside = (st.st_dev, st.st_ino) in inodes
            named = not inside and mark.encode() in Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a zombie (it holds no namespace)
        if inside or named:
            pids.append(int(name))
    return pids


def teardown(lab_id: str, *, timeout_s: float = 10.0) -> list[str]:
    """Remove everything of lab ``lab_id``: kill its processes, delete its namespaces (and with
    them its links, bridge and rules). Returns the namespaces deleted. ExternalProcessError if
    something remains after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    mark = f"{PREFIX}{lab_id}-"
    deleted: list[str] = []
    failure = ""
    while True:
        pids = processes_of(lab_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, deadline)
        names = [n for n in list_namespaces() if n.startswith(mark)]
        for ns in names:
            try:
                ip("netns", "delete", ns)
                deleted.append(ns)
            except ExternalProcessError as exc:  # deleted by someone else meanwhile, or busy: next pass
                failure = str(exc)
        if not pids and not names:
            return deleted
        if time.monotonic() > deadline:
            left = processes_of(lab_id), [n for n in list_namespaces() if n.startswith(mark)]
            raise ExternalProcessError(f"lab {lab_id}: still there after {timeout_s:g}s: processes {left[0]}, "
                                       f"namespaces {left[1]} (last error: {failure or 'none'})")
        time.sleep(0.01)


def _wait_gone(pids: Iterable[int], deadline: float) -> None:
    for pid in pids:
        while pid_running(pid) and time.monotonic() < deadline:
            time.sleep(0.005)


def socket_in(ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket created inside namespace ``ns``: it sends and receives there, whichever thread
    uses it later. Made by a short-lived thread that enters the namespace (``setns`` changes
    only the calling thread's network namespace), so this process stays where it is."""
    box: dict[str, object] = {}

    def inside() -> None:
        try:
            fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            box["socket"] = socket.socket(family, kind)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=inside, name=f"netns-{ns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise ExternalProcessError(f"cannot open a socket in namespace {ns}: {box['error']}")
    sock = box["socket"]
    assert isinstance(sock, socket.socket)
    return sock


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
