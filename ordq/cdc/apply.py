"""Replay a CDC queue (``ordq cdc mysql``'s row changes) into a PostgreSQL or MariaDB/MySQL
target, idempotently, by primary key (``ordq cdc apply``).

Guarantee: every row change of the queue is applied to the target once, each row's changes
in queue order, through crashes of the applier at any point. Each change is applied in one
target transaction together with its position: the table ``ordq_apply`` keeps, per
subscription and queue key (``db.table:pk``, one row of the source), the seq of the last change
applied to that row. The transaction first raises that seq to the change's seq, and only if it
rose does it upsert (insert, update) or delete the row; a change whose seq is not above the
stored one is a replay and changes nothing. So the position is exact per row, and it commits
or rolls back with the row itself.

Why per key and not one position for the queue: keyed parallel workers (``run_keyed``) apply
different rows out of seq order, so "everything up to seq N is applied" is never a single
number the workers could write with their changes. The subscription's cursor (ZooKeeper) only
ever covers the contiguous prefix of finished changes, so a restarted applier starts at or
before the first change not applied, and the per-row seqs turn every redelivered change that
was applied already into a no-op.

Rules: this module reads deliveries and writes the target; it never writes the queue. The
target tables are the operator's (same database/schema and table names as the source, the
columns matched by name); only ``ordq_apply`` is created here.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs

from ordq.common.errors import ApplyTargetError, ApplyTargetUnavailable, ConfigError
from ordq.sdk import Delivered

POSITION_TABLE = "ordq_apply"


@attrs.frozen
class Change:
    """One row change as ``ordq cdc mysql`` ships it."""

    seq: int
    key: str
    op: str  # insert | update | delete
    db: str
    table: str
    pk: dict[str, Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @classmethod
    def from_delivery(cls, m: Delivered) -> Change:
        try:
            d = json.loads(m.payload)
            return cls(m.seq, (m.key or b"").decode(), d["op"], d["db"], d["table"], d["pk"], d["before"], d["after"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ApplyTargetError(f"of key {m.key!r}", m.seq, f"not a row change of ordq cdc mysql ({exc!r})") from exc


@attrs.frozen
class Target:
    """Where to apply: a parsed ``postgresql://`` or ``mysql://`` DSN and its SQL dialect."""

    dsn: str
    kind: str  # postgresql | mysql
    mysql: dict[str, Any] = attrs.field(factory=dict)  # pymysql.connect arguments

    @classmethod
    def parse(cls, dsn: str) -> Target:
        url = urllib.parse.urlsplit(dsn)
        if url.scheme in ("postgresql", "postgres") and url.hostname:
            return cls(dsn, "postgresql")
        if url.scheme in ("mysql", "mariadb") and url.hostname and url.path.strip("/"):
            try:
                port = url.port or 3306
            except ValueError:
                raise ConfigError(f"bad target {dsn!r}: the port is not a number") from None
            return cls(dsn, "mysql", {"host": url.hostname, "port": port, "user": urllib.parse.unquote(url.username or
                                      "root"), "password": urllib.parse.unquote(url.password or ""),
                                      "database": url.path.strip("/")})
        raise ConfigError(f"bad target {dsn!r}: expected postgresql://user@host[:port]/dbname or "
                          "mysql://user[:password]@host[:port]/dbname")

    @property
    def where(self) -> str:
        url = urllib.parse.urlsplit(self.dsn)
        return f"{url.scheme}://{url.hostname}:{url.port or ''}{url.path}"  # no password in messages

    def connect(self) -> Any:
        try:
            if self.kind == "postgresql":
                import psycopg

                return psycopg.connect(self.dsn, autocommit=False, connect_timeout=10)
            import pymysql

            return pymysql.connect(**self.mysql, autocommit=False, connect_timeout=10)
        except ImportError as exc:
            extra = "'psycopg[binary]'" if self.kind == "postgresql" else "pymysql"
            raise ConfigError(f"ordq cdc apply to {self.kind} needs {exc.name}: pip install {extra}") from None
        except Exception as exc:  # noqa: BLE001 - each driver has its own tree; translated once, here
            raise ApplyTargetUnavailable(self.where, _one_line(exc)) from exc

    def quote(self, name: str) -> str:
        if self.kind == "postgresql":
            return '"' + name.replace('"', '""') + '"'
        return "`" + name.replace("`", "``") + "`"

    def create_position_table(self) -> str:
        return (f"CREATE TABLE IF NOT EXISTS {POSITION_TABLE} (subscription VARCHAR(200) NOT NULL, "
                "k VARCHAR(500) NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (subscription, k))")

    def raise_position(self) -> str:
        """SQL that stores (subscription, key, seq) if seq is above the stored one; it changes
        one row exactly when the change is new (rowcount > 0), and locks the key's row."""
        if self.kind == "postgresql":
            return (f"INSERT INTO {POSITION_TABLE} (subscription, k, seq) VALUES (%s, %s, %s) "
                    f"ON CONFLICT (subscription, k) DO UPDATE SET seq = EXCLUDED.seq "
                    f"WHERE {POSITION_TABLE}.seq < EXCLUDED.seq")
        # pymysql does not set CLIENT_FOUND_ROWS: an update that keeps the value counts 0 rows
        return (f"INSERT INTO {POSITION_TABLE} (subscription, k, seq) VALUES (%s, %s, %s) "
                "ON DUPLICATE KEY UPDATE seq = GREATEST(seq, VALUES(seq))")

    def upsert(self, table: str, columns: list[str], pk: list[str]) -> str:
        cols = ", ".join(self.quote(c) for c in columns)
        values = ", ".join(["%s"] * len(columns))
        rest = [c for c in columns if c not in pk] or pk[:1]
        if self.kind == "postgresql":
            keys = ", ".join(self.quote(c) for c in pk)
            sets = ", ".join(f"{self.quote(c)} = EXCLUDED.{self.quote(c)}" for c in rest)
            return f"INSERT INTO {table} ({cols}) VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {sets}"
        sets = ", ".join(f"{self.quote(c)} = VALUES({self.quote(c)})" for c in rest)
        return f"INSERT INTO {table} ({cols}) VALUES ({values}) ON DUPLICATE KEY UPDATE {sets}"

    def delete(self, table: str, pk: list[str]) -> str:
        return f"DELETE FROM {table} WHERE " + " AND ".join(f"{self.quote(c)} = %s" for c in pk)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _is_connection_error(exc: BaseException) -> bool:
    import importlib

    for module, name in (("psycopg", "OperationalError"), ("pymysql", "OperationalError")):
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            continue
        # pymysql reports an unknown table/column as ProgrammingError, a lost server as OperationalError
        if isinstance(exc, cls) and not (module == "pymysql" and exc.args and exc.args[0] in (1054, 1146)):
            return True
    return False


@attrs.define
class ApplyStats:
    applied: int = 0  # changes written to the target
    skipped: int = 0  # replays of changes applied before (the per-row seq was at or above them)
    last_seq: int = -1


class Applier:
    """The ``run_keyed`` handler: applies each change in a transaction of its own on the
    calling worker thread's connection (one per worker)."""

    def __init__(self, target: Target, subscription: str) -> None:
        self.target, self.subscription = target, subscription
        self.stats = ApplyStats()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[Any] = []

    def prepare(self) -> None:
        """Open a first connection (a bad DSN fails here, before the consumer starts) and create
        the position table."""
        conn = self._connection()
        self._run(conn, POSITION_TABLE, None, lambda cur: cur.execute(self.target.create_position_table()))

    def __call__(self, m: Delivered) -> None:
        change = Change.from_delivery(m)
        conn = self._connection()
        table = f"{self.target.quote(change.db)}.{self.target.quote(change.table)}"
        applied = self._run(conn, f"{change.db}.{change.table}", m.seq, lambda cur: self._apply(cur, table, change))
        with self._lock:
            if applied:
                self.stats.applied += 1
            else:
                self.stats.skipped += 1
            self.stats.last_seq = max(self.stats.last_seq, m.seq)

    def _apply(self, cur: Any, table: str, c: Change) -> bool:
        cur.execute(self.target.raise_position(), (self.subscription, c.key, c.seq))
        if cur.rowcount <= 0:
            return False  # applied before: a replay
        pk = list(c.pk)
        if c.before is not None and (c.after is None or any(c.before.get(k) != c.after.get(k) for k in pk)):
            # a delete, or an update that changed the primary key (queues shipped before such
            # updates were split into delete + insert): the old row goes
            cur.execute(self.target.delete(table, pk), [c.before.get(k, c.pk.get(k)) for k in pk])
        if c.after is not None:
            columns = list(c.after)
            cur.execute(self.target.upsert(table, columns, pk), [c.after[k] for k in columns])
        return True

    def _run(self, conn: Any, table: str, seq: int | None, work: Callable[[Any], bool | None]) -> bool:
        """``work(cursor)`` in one transaction; driver errors translated once, here."""
        try:
            with conn.cursor() as cur:
                done = work(cur)
            conn.commit()
            return bool(done)
        except Exception as exc:  # noqa: BLE001 - psycopg and pymysql errors, translated here
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001, S110 - the connection may be gone; the first error is the one to report
                pass
            if _is_connection_error(exc):
                raise ApplyTargetUnavailable(self.target.where, _one_line(exc)) from exc
            raise ApplyTargetError(table, seq, _one_line(exc)) from exc

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.target.connect()
            with self._lock:
                self._connections.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001, S110 - closing what may already be broken
                    pass
            self._connections.clear()
