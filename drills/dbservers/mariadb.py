"""A real MariaDB server for tests: Debian's ``mariadb-server``, initialised in a fresh folder
with ``mariadb-install-db`` and started on a free loopback port with a row-based binlog
(``binlog_format=ROW``, ``binlog_row_metadata=FULL``, GTIDs), never a mock. As root it runs
as the package's ``mysql`` user. A user ``ordq`` with every privilege and no password can
connect over TCP. ``destroy()`` kills it and removes the folder.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import ExternalProcessError
from ordq.drills.dbservers import server_folder
from ordq.drills.dbservers.postgres import _free_port

MARIADBD = Path("/usr/sbin/mariadbd")


@attrs.define
class MariaDbServer:
    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def source(self) -> str:
        return f"mysql://ordq@127.0.0.1:{self.port}"

    def connect(self, **options: object) -> object:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="ordq", password="", **options)

    @classmethod
    def start(cls, *, timeout_s: float = 60.0) -> MariaDbServer:
        if not MARIADBD.exists() or shutil.which("mariadb-install-db") is None:
            raise ExternalProcessError("MariaDB is not installed (Debian: apt-get install mariadb-server)")
        run_as = "mysql" if os.geteuid() == 0 else None
        folder = server_folder("ordq-maria-", run_as)
        server = cls(folder=folder, port=_free_port())
        # --tmpdir: mariadbd would use $TMPDIR, which its user may not reach
        user = [f"--user={run_as}"] if run_as else []
        try:
            made = subprocess.run(["mariadb-install-db", f"--datadir={folder / 'data'}", *user, f"--tmpdir={folder}",
                                   "--skip-test-db", "--auth-root-authentication-method=normal"],
                                  capture_output=True, timeout=timeout_s)
            if made.returncode != 0:
                raise ExternalProcessError(f"mariadb-install-db failed (exit {made.returncode}): "
                                           f"{made.stderr.decode(errors='replace').strip()[-800:]}")
            with open(folder / "server.log", "wb") as log:  # the child keeps its own descriptor
                server.process = subprocess.Popen(
                    [str(MARIADBD), "--no-defaults", f"--datadir={folder / 'data'}", *user, f"--tmpdir={folder}",
                     f"--socket={folder}/sock", f"--port={server.port}", "--bind-address=127.0.0.1",
                     f"--log-bin={folder / 'data' / 'binlog'}", "--binlog-format=ROW", "--binlog-row-metadata=FULL",
                     "--server-id=1", f"--pid-file={folder / 'pid'}", f"--log-error={folder / 'error.log'}"],
                    stdout=log, stderr=subprocess.STDOUT)
            server._wait_ready(timeout_s)
        except BaseException:
            server.destroy()
            raise
        return server

    def _wait_ready(self, timeout_s: float) -> None:
        import pymysql

        deadline = time.monotonic() + timeout_s
        while "ready for connections" not in self.log_tail(5):
            assert self.process is not None
            if self.process.poll() is not None:
                raise ExternalProcessError(f"mariadbd exited {self.process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise ExternalProcessError(f"mariadbd not ready in {timeout_s:g}s: {self.log_tail()}")
            time.sleep(0.05)
        conn = pymysql.connect(unix_socket=str(self.folder / "sock"), user="root", password="")
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE USER 'ordq'@'%'")
                cur.execute("GRANT ALL ON *.* TO 'ordq'@'%'")
        finally:
            conn.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.folder / "error.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def fresh_shop(self) -> None:
        """shop.items, empty, and a binlog that starts after it was made (tests ship it
        ``--from-beginning``)."""
        conn: Any = self.connect(autocommit=True)
        with conn.cursor() as cur:
            for sql in ("DROP DATABASE IF EXISTS shop", "RESET MASTER", "CREATE DATABASE shop",
                        "CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(20), qty INT NOT NULL)"):
                cur.execute(sql)
        conn.close()

    def destroy(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


class ShopApp(threading.Thread):
    """An application on the server: transactions of 1-4 inserts, updates and deletes on shop.items, paced."""

    def __init__(self, maria: MariaDbServer, rate: float, *, seed: int = 16) -> None:
        super().__init__(name="cdc-app", daemon=True)
        self.maria, self.rate, self.seed = maria, rate, seed
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn: Any = self.maria.connect(autocommit=False)
            rng, next_id = random.Random(self.seed), 1
            live: list[int] = []
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    for _ in range(rng.randint(1, 4)):
                        op = rng.random()
                        if op < 0.5 or len(live) < 5:
                            cur.execute("INSERT INTO shop.items VALUES (%s, %s, %s)", (next_id, f"n{next_id}", 0))
                            live.append(next_id)
                            next_id += 1
                        elif op < 0.8:
                            cur.execute("UPDATE shop.items SET qty = qty + 1 WHERE id = %s", (rng.choice(live),))
                        else:
                            cur.execute("DELETE FROM shop.items WHERE id = %s", (live.pop(rng.randrange(len(live))),))
                    conn.commit()
                    self.stop.wait(1 / self.rate)  # pacing the load, not waiting for a condition
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc
