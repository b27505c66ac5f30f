"""Broker processes for tests, drills and ``ordq up``: a real ``ordq broker run`` child each.

``BrokerProcess`` starts on port 0 and waits for the readiness line; ``stop()`` keeps the disk,
``kill()`` is SIGKILL, ``pause()``/``resume()`` are SIGSTOP/SIGCONT, ``destroy()`` wipes the
data folder. ``BrokerGroupProcesses`` is a master and a slave of one group.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials

READY_TIMEOUT_S = 30.0


class BrokerProcess:
    def __init__(self, *, gid: str, role: str, zk_hosts: str, root: str, data_dir: Path, run_dir: Path,
                 session_timeout_s: float = 1.0, tls: Credentials | None = None, host: str = "127.0.0.1",
                 advertise: str | None = None, extra_args: Sequence[str] = ()) -> None:
        """``host``: the address it binds (any free port) and serves metrics on; ``advertise``:
        the address it registers instead of ``host:port`` (``ordq broker run --advertise``);
        ``extra_args``: more ``ordq broker run`` options (``--link-listen ...``)."""
        self.gid, self.role = gid, role
        self.data_dir = data_dir
        self.address: str | None = None
        self.incarnation: str | None = None
        self.metrics_url: str | None = None
        argv = [sys.executable, "-m", "ordq.cli", "--zk", zk_hosts, "--root", root, "broker", "run",
                "--group", gid, "--role", role, "--data", str(data_dir),
                "--session-timeout", str(session_timeout_s), "--listen", f"{host}:0", "--metrics", f"{host}:0",
                *(["--advertise", advertise] if advertise else []), *tls_args(tls), *extra_args]
        self.proc = ManagedProcess(f"broker-{gid}-{role}", argv, run_dir=run_dir)

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Start and wait for 'READY <address> <incarnation>'; return the address (the
        metrics URL, announced before it, is ``metrics_url``)."""
        self.proc.start()
        line = self.proc.wait_for_line("READY ", timeout_s=timeout_s)
        self.address, self.incarnation = line.split()[:2]
        self.metrics_url = self.proc.wait_for_line("METRICS ", timeout_s=timeout_s)
        return self.address

    def stop(self) -> int | None:
        return self.proc.stop()

    def kill(self) -> None:
        self.proc.kill()

    def pause(self) -> None:
        self.proc.pause()

    def resume(self) -> None:
        self.proc.resume()

    def alive(self) -> bool:
        return self.proc.alive()

    def destroy(self) -> None:
        if self.proc.alive():
            self.proc.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return self.proc.log_tail(lines)


def tls_args(tls: Credentials | None) -> list[str]:
    """``ordq broker run`` options for these broker credentials; None: plaintext."""
    if tls is None or not tls.tls:
        return ["--insecure"]
    assert tls.ca_file and tls.cert_file and tls.key_file, "a broker needs its own certificate"
    return ["--tls-cert", tls.cert_file, "--tls-key", tls.key_file, "--tls-ca", tls.ca_file]


class BrokerGroupProcesses:
    """The master and the slave of one broker group, each with its own data folder."""

    def __init__(self, gid: str, *, zk_hosts: str, root: str, base_dir: Path, session_timeout_s: float = 1.0,
                 tls: Credentials | None = None, extra_args: Mapping[str, Sequence[str]] | None = None) -> None:
        """``extra_args``: more ``ordq broker run`` options by role ("master", "slave")."""
        self.gid = gid
        self.master, self.slave = (
            BrokerProcess(gid=gid, role=role, zk_hosts=zk_hosts, root=root, data_dir=base_dir / gid / role,
                          run_dir=base_dir / "run", session_timeout_s=session_timeout_s, tls=tls,
                          extra_args=(extra_args or {}).get(role, ()))
            for role in ("master", "slave"))

    @property
    def members(self) -> tuple[BrokerProcess, BrokerProcess]:
        return (self.master, self.slave)

    def start(self) -> None:
        # Slave first: the master can take writes only once its slave stream is up.
        self.slave.start()
        self.master.start()

    def stop(self) -> None:
        for p in self.members:
            if p.alive():
                p.stop()

    def kill(self) -> None:
        for p in self.members:
            if p.alive():
                p.kill()

    def destroy(self) -> None:
        for p in self.members:
            p.destroy()
