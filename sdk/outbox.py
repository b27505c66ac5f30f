"""The transactional outbox: write a message in the same database transaction as the business
change it describes; ``ordq outbox relay`` ships it to the queue once that transaction commits.

    import sqlite3
    from ordq.sdk import outbox

    db = sqlite3.connect("app.db")
    outbox.create_tables(db)                         # once (or: ordq outbox init app.db)
    with db:                                         # your transaction
        db.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 7")
        outbox.add(db, "ledger", b"acct-7", b'{"debit": 5}', [("type", b"debit")])

Guarantee: a row added in a transaction that commits is shipped exactly once, in **commit
order** (per queue), with its id in the ``x-ordq-outbox-id`` header; a row of a transaction
that rolls back is never seen. ``add`` never commits: it is part of the caller's transaction.

Why the ids are commit order, which is what lets the relay read ``id > last shipped`` and never
skip a row:

- **SQLite** has one writer at a time: a transaction holds the write lock from its first write
  to its commit, so ``AUTOINCREMENT`` ids are handed out in commit order (and never reused
  after the relay deletes rows, which plain rowids would be).
- **PostgreSQL** runs writers concurrently, so a serial id alone is *not* commit order: a
  transaction that took id 5 may commit after the one that took id 6, and a relay that read
  6 would skip 5 for ever. So a trigger on the table takes a transaction-scoped advisory lock
  per queue before it draws the id: a second transaction adding to the same queue waits there
  until the first commits or rolls back, and PostgreSQL makes a commit visible before it
  releases the locks. Whatever a reader sees is then a prefix, in id order, of the queue's
  committed rows. The price: transactions that add to the same queue serialize from their
  ``add`` to their commit (call ``add`` late in the transaction; add to several queues in one
  fixed order, or PostgreSQL's deadlock detector will abort one). The trigger also covers rows
  inserted by hand or from other languages. Reading only rows older than every in-flight
  transaction (``pg_snapshot_xmin``) would not skip rows either, but it ships in transaction
  *start* order, which can put a change before the one it read (docs/INTEGRATIONS.md).
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ordq.common.errors import ConfigError, OutboxError, OutboxTableMissing

OUTBOX_ID_HEADER = "x-ordq-outbox-id"
DEFAULT_TABLE = "ordq_outbox"
_TABLE_RULE = r"[A-Za-z_][A-Za-z0-9_]{0,40}"
# The first key of PostgreSQL's two-key advisory locks the trigger takes (the second is a
# hash of the queue name): a fixed number, so an application's own advisory locks on
# single 64-bit keys never collide with it.
PG_LOCK_CLASS = 0x6F72_6471  # "ordq"

HeaderValue = bytes | str


def check_table(table: str) -> str:
    """The table name, if it is a plain SQL identifier (it is put into SQL text)."""
    if not re.fullmatch(_TABLE_RULE, table):
        raise ConfigError(f"invalid outbox table name {table!r}: must match {_TABLE_RULE}")
    return table


def dialect_of(conn: Any) -> str:
    """``"sqlite"`` for a ``sqlite3.Connection``, ``"postgres"`` for a psycopg 3 connection."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite"
    if type(conn).__module__.startswith("psycopg"):
        return "postgres"
    raise ConfigError(f"outbox: unsupported connection {type(conn).__name__} (sqlite3 or psycopg 3)")


def schema(dialect: str, table: str) -> list[str]:
    """The statements that create the outbox table ``table``, its relay's position table
    ``<table>_relay``, and on PostgreSQL the commit-order trigger. Each is idempotent."""
    t = check_table(table)
    if dialect == "sqlite":
        return [
            f"""CREATE TABLE IF NOT EXISTS {t} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                queue TEXT NOT NULL,
                key BLOB,
                payload BLOB NOT NULL,
                headers TEXT NOT NULL DEFAULT '[]',
                created_us INTEGER NOT NULL,
                shipped_us INTEGER)""",
            f"CREATE INDEX IF NOT EXISTS {t}_queue_id ON {t} (queue, id)",
            f"CREATE TABLE IF NOT EXISTS {t}_relay (queue TEXT PRIMARY KEY, id INTEGER NOT NULL, "
            "seq INTEGER NOT NULL)",
        ]
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {t}_id_seq",
        f"""CREATE TABLE IF NOT EXISTS {t} (
            id BIGINT PRIMARY KEY,
            queue TEXT NOT NULL,
            key BYTEA,
            payload BYTEA NOT NULL,
            headers JSONB NOT NULL DEFAULT '[]',
            created_us BIGINT NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
            shipped_us BIGINT)""",
        f"CREATE INDEX IF NOT EXISTS {t}_queue_id ON {t} (queue, id)",
        f"CREATE TABLE IF NOT EXISTS {t}_relay (queue TEXT PRIMARY KEY, id BIGINT NOT NULL, seq BIGINT NOT NULL)",
        # The id is drawn under a per-queue lock held to commit: ids are commit order (above).
        # The NOTIFY (folded to one per transaction and queue) wakes an idle relay at commit.
        f"""CREATE OR REPLACE FUNCTION {t}_commit_order() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_xact_lock({PG_LOCK_CLASS}, hashtext(NEW.queue));
                NEW.id := nextval('{t}_id_seq');
                PERFORM pg_notify('{t}', NEW.queue);
                RETURN NEW;
            END $$""",
        f"CREATE OR REPLACE TRIGGER {t}_commit_order BEFORE INSERT ON {t} "
        f"FOR EACH ROW EXECUTE FUNCTION {t}_commit_order()",
    ]


def create_tables(conn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Create the outbox tables if they do not exist, and commit (a setup step, run once).

    Raises ConfigError (bad table name or connection), OutboxError (the database refused)."""
    dialect = dialect_of(conn)
    try:
        if dialect == "sqlite":
            conn.commit()
            for stmt in schema(dialect, table):
                conn.execute(stmt)
            conn.commit()
        else:
            with conn.cursor() as cur:
                for stmt in schema(dialect, table):
                    cur.execute(stmt)
            conn.commit()
    except (sqlite3.Error, _pg_error()) as exc:
        raise OutboxError(f"cannot create outbox table {table!r}: {first_line(exc)}") from exc


def add(
    conn: Any,
    queue: str,
    key: bytes | str | None,
    payload: bytes | str,
    headers: Iterable[tuple[str, HeaderValue]] = (),
    *,
    table: str = DEFAULT_TABLE,
) -> int:
    """Add one message for ``queue`` to the outbox, inside the caller's open transaction
    (``conn`` is a ``sqlite3.Connection`` or a psycopg 3 connection). Nothing is committed
    here: the message exists if and when the caller's transaction commits, and the relay
    then ships it in commit order. Returns the row id (the ``x-ordq-outbox-id`` header).

    ``str`` keys, payloads and header values are UTF-8 encoded; header values must be UTF-8
    text (they are kept as JSON). Raises ConfigError for a bad argument, OutboxTableMissing
    when the table was never created, OutboxError for another database error (the caller's
    transaction is then to be rolled back, as after any failed statement)."""
    from ordq.coordinator.paths import check_name

    check_name("queue", queue)
    dialect = dialect_of(conn)
    t = check_table(table)
    key_b = key.encode() if isinstance(key, str) else key
    payload_b = payload.encode() if isinstance(payload, str) else payload
    if not isinstance(payload_b, bytes) or (key_b is not None and not isinstance(key_b, bytes)):
        raise ConfigError("outbox.add: key and payload must be bytes or str")
    encoded = encode_headers(headers)
    try:
        if dialect == "sqlite":
            cur = conn.execute(f"INSERT INTO {t} (queue, key, payload, headers, created_us) VALUES (?, ?, ?, ?, ?)",
                               (queue, key_b, payload_b, encoded, time.time_ns() // 1000))
            return int(cur.lastrowid)
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {t} (queue, key, payload, headers) VALUES (%s, %s, %s, %s) RETURNING id",
                        (queue, key_b, payload_b, encoded))
            row = cur.fetchone()
            return int(row[0])
    except (sqlite3.Error, _pg_error()) as exc:
        if is_missing_table(exc):
            raise OutboxTableMissing(t) from exc
        raise OutboxError(f"outbox.add to {t!r}: {first_line(exc)}") from exc


def encode_headers(headers: Iterable[tuple[str, HeaderValue]]) -> str:
    pairs = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise ConfigError(f"outbox.add: a header must be a (name, value) pair, not {item!r}") from None
        if not isinstance(name, str) or not isinstance(value, bytes | str):
            raise ConfigError(f"outbox.add: header {item!r} must be (str, bytes or str)")
        if name == OUTBOX_ID_HEADER:
            raise ConfigError(f"outbox.add: header {OUTBOX_ID_HEADER!r} is set by the relay")
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                raise ConfigError(f"outbox.add: header {name!r}: its value must be UTF-8 text") from None
        pairs.append([name, value])
    return json.dumps(pairs, separators=(",", ":"))


def decode_headers(stored: Any) -> tuple[tuple[str, bytes], ...]:
    """Headers as stored: JSON text (the relay reads PostgreSQL's JSONB as text too), or a
    list psycopg decoded. Most applications write a few distinct header sets, so decoded text
    is cached: JSON decoding was ~17 % of the relay's CPU per row (profiled)."""
    if isinstance(stored, bytes):
        stored = stored.decode()
    if isinstance(stored, str):
        return _decode_text(stored)
    return _pairs(stored)


@functools.lru_cache(maxsize=4096)
def _decode_text(text: str) -> tuple[tuple[str, bytes], ...]:
    return _pairs(json.loads(text))


def _pairs(pairs: Sequence[Any]) -> tuple[tuple[str, bytes], ...]:
    return tuple((str(name), str(value).encode()) for name, value in pairs)


def is_missing_table(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        return "no such table" in str(exc)
    return getattr(exc, "sqlstate", None) == "42P01"  # undefined_table


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pg_error() -> type[BaseException]:
    """psycopg's error root, or a class nothing raises when psycopg is not installed."""
    try:
        import psycopg
    except ImportError:
        return _NoSuchError
    return psycopg.Error


class _NoSuchError(Exception):
    pass
