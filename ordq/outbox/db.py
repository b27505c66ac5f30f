"""The relay's side of the outbox database: read one queue's pending rows in id order (which
``ordq.sdk.outbox`` makes commit order), and after their ack delete or mark them and record the
position, in one transaction.

Rules: this module knows SQL and the two drivers (sqlite3, psycopg 3), nothing of queues or
threads. Driver errors become ordq's (``OutboxUnavailable``, ``OutboxTableMissing``,
``OutboxError``) here, once, where they enter. Both connections run in autocommit; the only
multi-statement transaction is ``record_shipped``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import ConfigError, OutboxError, OutboxTableMissing, OutboxUnavailable
from ordq.sdk.outbox import (
    DEFAULT_TABLE,
    check_table,
    decode_headers,
    first_line,
    is_missing_table,
    schema,
)

AFTER_ACK = ("delete", "mark")  # what happens to a row once its ack came


@attrs.frozen
class Row:
    id: int
    key: bytes | None
    payload: bytes
    headers: tuple[tuple[str, bytes], ...]


@attrs.frozen
class Position:
    """The last row the relay got acked and recorded, and the queue seq it was stored at."""

    id: int
    seq: int


@attrs.frozen
class QueueBacklog:
    """One queue's rows in the outbox, for ``ordq outbox status``."""

    queue: str
    pending: int  # rows past the recorded position, not yet marked shipped
    oldest_pending_us: int | None  # created_us of the oldest of them
    position: Position | None


def is_postgres(database: str) -> bool:
    """A PostgreSQL URI or libpq ``key=value`` string; anything else is an SQLite file path."""
    return database.startswith(("postgresql://", "postgres://")) or (
        "=" in database and any(k in database for k in ("dbname", "host", "user", "port")))


def sqlite_path(database: str) -> Path:
    return Path(database.removeprefix("sqlite://") if database.startswith("sqlite://") else database)


class OutboxDb:
    """A connection to the outbox table ``table`` of one database (SQLite path or PostgreSQL
    DSN). ``open`` it; ``close`` it."""

    def __init__(self, conn: Any, dialect: str, *, table: str, database: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.table = table
        self.database = database  # printable: a path, or host:port/dbname without a password
        self._listening = False
        self._lock = threading.Lock()  # one statement at a time (status calls from other threads)

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, database: str, *, table: str = DEFAULT_TABLE, create: bool = False) -> OutboxDb:
        """Connect. ``create``: make the tables if missing (else OutboxTableMissing).

        Raises ConfigError (bad table name, psycopg missing), OutboxUnavailable (no such
        SQLite file, PostgreSQL unreachable or refusing us), OutboxTableMissing."""
        check_table(table)
        db = cls._connect_postgres(database, table) if is_postgres(database) else cls._connect_sqlite(database, table,
                                                                                                      create)
        try:
            if create:
                with db._statement("create the outbox tables"):
                    for stmt in schema(db.dialect, table):
                        db.conn.execute(stmt)
            db._check_tables()
        except BaseException:
            db.close()
            raise
        return db

    @classmethod
    def _connect_sqlite(cls, database: str, table: str, create: bool) -> OutboxDb:
        path = sqlite_path(database)
        shown = _shown(str(path))
        try:
            if not create and not path.is_file():
                raise OutboxUnavailable(shown, "no such file (create it with: ordq outbox init PATH)")
            uri = path.resolve().as_uri() + ("?mode=rwc" if create else "?mode=rw")
        except (OSError, ValueError) as exc:  # a name the file system refuses (too long, a NUL byte)
            raise OutboxUnavailable(shown, getattr(exc, "strerror", None) or str(exc)) from exc
        try:
            # autocommit (isolation_level None): transactions are explicit; wait up to 30 s
            # for the application's write transactions instead of failing with "locked".
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise OutboxUnavailable(shown, first_line(exc)) from exc
        return cls(conn, "sqlite", table=table, database=shown)

    @classmethod
    def _connect_postgres(cls, database: str, table: str) -> OutboxDb:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:
            raise ConfigError("PostgreSQL needs psycopg 3: pip install 'psycopg[binary]'") from exc
        try:
            info = conninfo_to_dict(database)
        except psycopg.Error as exc:
            raise OutboxUnavailable("(the connection string)", f"bad connection string: {first_line(exc)}") from exc
        where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', info.get('user', ''))}"
        try:
            conn = psycopg.connect(database, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise OutboxUnavailable(f"postgresql://{where}", first_line(exc)) from exc
        return cls(conn, "postgres", table=table, database=f"postgresql://{where}")

    def _check_tables(self) -> None:
        for name in (self.table, f"{self.table}_relay"):
            with self._statement(f"read {name}"):
                self.conn.execute(f"SELECT 1 FROM {name} LIMIT 0")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    # -- the relay's statements ----------------------------------------------------------------

    def fetch(self, queue: str, after: int, limit: int) -> list[Row]:
        """Up to ``limit`` rows of ``queue`` with id > ``after``, in id order."""
        with self._statement("read pending rows"):
            rows = self.conn.execute(self._sql(
                f"SELECT id, key, payload, {self._headers_text} FROM {self.table} WHERE queue = ? AND id > ? "
                "ORDER BY id LIMIT ?"),
                (queue, after, limit)).fetchall()
        return [Row(int(i), bytes(k) if k is not None else None, bytes(p), decode_headers(h)) for i, k, p, h in rows]

    def position(self, queue: str) -> Position | None:
        with self._statement("read the relay position"):
            row = self.conn.execute(self._sql(f"SELECT id, seq FROM {self.table}_relay WHERE queue = ?"),
                                    (queue,)).fetchone()
        return Position(int(row[0]), int(row[1])) if row else None

    def record_shipped(self, queue: str, after: int, through: Position, *, after_ack: str) -> None:
        """In one transaction: delete (or mark shipped) the rows of ``queue`` in
        (``after``, ``through.id``] and record ``through`` as the relay's position."""
        change: tuple[str, tuple[Any, ...]]
        if after_ack == "delete":
            change = (f"DELETE FROM {self.table} WHERE queue = ? AND id > ? AND id <= ?", (queue, after, through.id))
        else:
            change = (f"UPDATE {self.table} SET shipped_us = ? WHERE queue = ? AND id > ? AND id <= ? "
                      "AND shipped_us IS NULL", (time.time_ns() // 1000, queue, after, through.id))
        record = (f"INSERT INTO {self.table}_relay (queue, id, seq) VALUES (?, ?, ?) "
                  "ON CONFLICT (queue) DO UPDATE SET id = excluded.id, seq = excluded.seq "
                  f"WHERE excluded.seq > {self.table}_relay.seq",  # a deposed relay never moves it back
                  (queue, through.id, through.seq))
        with self._statement("record shipped rows"), self._transaction():
            for sql, params in (change, record):
                self.conn.execute(self._sql(sql), params)

    def backlog(self) -> list[QueueBacklog]:
        """Every queue with rows in the outbox or a recorded position, by name."""
        t = self.table
        with self._statement("read the backlog"):
            rows = self.conn.execute(
                f"SELECT q.queue, count(o.id), min(o.created_us), r.id, r.seq "
                f"FROM (SELECT queue FROM {t} UNION SELECT queue FROM {t}_relay) q "
                f"LEFT JOIN {t}_relay r ON r.queue = q.queue "
                f"LEFT JOIN {t} o ON o.queue = q.queue AND o.id > coalesce(r.id, 0) AND o.shipped_us IS NULL "
                f"GROUP BY q.queue, r.id, r.seq ORDER BY q.queue").fetchall()
        return [QueueBacklog(q, int(n), int(oldest) if oldest is not None else None,
                             Position(int(i), int(s)) if i is not None else None) for q, n, oldest, i, s in rows]

    def wait_for_rows(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a commit that may have added rows: PostgreSQL wakes us
        at once (the trigger's NOTIFY), SQLite has no such signal, so this just waits.
        Correctness never depends on the wake-up: the caller polls again either way."""
        if self.dialect != "postgres":
            time.sleep(timeout_s)
            return
        with self._statement("wait for new rows"):
            if not self._listening:
                self.conn.execute(f"LISTEN {self.table}")
                self._listening = True
            for _ in self.conn.notifies(timeout=timeout_s, stop_after=1):
                pass

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def _headers_text(self) -> str:
        return "headers::text" if self.dialect == "postgres" else "headers"

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.dialect == "postgres" else text

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        if self.dialect == "postgres":
            with self.conn.transaction():
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def _statement(self, what: str) -> Iterator[None]:
        """Run driver calls under the lock, translating their errors once."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise self._translate(what, exc) from exc
            except Exception as exc:
                if type(exc).__module__.split(".")[0] != "psycopg":
                    raise
                raise self._translate(what, exc) from exc

    def _translate(self, what: str, exc: BaseException) -> OutboxError:
        if is_missing_table(exc):
            return OutboxTableMissing(self.table, self.database)
        if self.dialect == "postgres" and _connection_lost(exc):
            return OutboxUnavailable(self.database, first_line(exc))
        return OutboxError(f"outbox database {self.database}: {what}: {first_line(exc)}")


def _shown(name: str, limit: int = 80) -> str:
    """A file name as it goes into a one-line message: quoted if it holds odd characters,
    cut if long."""
    text = name if name.isprintable() and name.strip() == name and name else repr(name)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _connection_lost(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
