"""A real PostgreSQL server for tests: Debian's ``postgresql`` package, started in a fresh
folder with ``initdb`` and ``pg_ctl`` on a free loopback port, never a mock.

PostgreSQL refuses to run as root; when the tests run as root (CI does) the server runs as the
``postgres`` user the Debian package creates, in a folder of its own under /tmp (a pytest
tmp_path is private to root). ``stop()`` (``pg_ctl -m immediate``) and the folder's removal
are left to the caller's ``finally``.

    server = PostgresServer.start()
    try:
        dsn = server.create_database("t1")    # postgresql://postgres@127.0.0.1:PORT/t1
    finally:
        server.destroy()
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import attrs

from ordq.common.errors import ExternalProcessError
from ordq.drills.dbservers import server_folder


def bin_dir() -> Path:
    """The newest installed PostgreSQL server's bin folder (Debian keeps them per version)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise ExternalProcessError("PostgreSQL is not installed (Debian: apt-get install postgresql; make system-deps)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class PostgresServer:
    folder: Path
    port: int
    bindir: Path
    run_as: str | None  # user to run the server as (when we are root)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"

    @classmethod
    def start(cls, *, timeout_s: float = 60.0) -> PostgresServer:
        run_as = "postgres" if os.geteuid() == 0 else None
        server = cls(folder=server_folder("ordq-pg-", run_as), port=_free_port(), bindir=bin_dir(), run_as=run_as)
        try:
            server._run("initdb", "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--no-sync", timeout_s=timeout_s)
            server.restart(timeout_s=timeout_s)
        except BaseException:
            server.destroy()
            raise
        return server

    def restart(self, *, timeout_s: float = 60.0) -> None:
        """Start the server (again, after ``stop()``) on its data folder and port."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=on"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t",
                  str(int(timeout_s)), "-o", options, "start", timeout_s=timeout_s + 10)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, prefix: str = "t") -> str:
        """A new, empty database; its DSN."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(ExternalProcessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout_s=60)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *args: str, timeout_s: float) -> None:
        argv = [str(self.bindir / program), *args]
        if self.run_as is not None:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                                  cwd=self.folder)
        except subprocess.TimeoutExpired as exc:
            raise ExternalProcessError(f"{program} did not finish in {timeout_s:g}s\n{self.log_tail()}") from exc
        if proc.returncode != 0:
            raise ExternalProcessError(f"{program} failed (exit {proc.returncode}, {time.monotonic() - started:.1f}s): "
                                       f"{proc.stderr.strip() or proc.stdout.strip()}\n{self.log_tail()}")
