"""Binlog change data capture: ship a MariaDB/MySQL binlog's row changes into a queue, in
binlog order, each row change exactly once (``ordq cdc mysql``).

Guarantee: every row of every insert, update and delete event the server writes to its
binlog after the starting point is stored in the queue once, in binlog order, keyed
``db.table:primary key``, with its position in the ``x-ordq-binlog`` header
(``file:transaction start:event end:row index``) and its GTID in ``x-ordq-gtid``. An update
that changes the primary key is two messages, a delete under the old key and an insert under
the new one (the second's position ends in ``.1``), so per-key order holds. A shipper
killed at any point resumes after the last row the queue stored: it is the queue's producer
leader, so ``Producer.last_committed()`` is the queue's tail, and it restarts the binlog at
the start of that row's transaction (a row event cannot be decoded without the table map
before it) and skips what the queue already holds.

Rules: the server must write row events with full metadata (``binlog_format=ROW``,
``binlog_row_metadata=FULL``, ``binlog_row_image=FULL``): column names and the primary key
come from the binlog itself. This module reads the binlog and sends; it never writes to the
source database.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from ordq.common.errors import BinlogUnavailable, ConfigError, OutboxPositionError
from ordq.sdk import Producer, StoredMessage
from ordq.sdk._futures import SendFuture

log = logging.getLogger("ordq.cdc")
BINLOG_HEADER = "x-ordq-binlog"
GTID_HEADER = "x-ordq-gtid"


@attrs.frozen(order=True)
class BinlogPos:
    """Where a row change is in the binlog: its file, where its transaction starts (where a
    reader restarts), the end of its row event, and its index among that event's rows."""

    file: str
    txn: int
    event: int
    row: int
    part: int = 0  # 1: the insert half of an update that changed the primary key (``.1`` encoded)

    def encode(self) -> bytes:
        return f"{self.file}:{self.txn}:{self.event}:{self.row}{f'.{self.part}' if self.part else ''}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> BinlogPos:
        file, txn, event, row = raw.decode().rsplit(":", 3)
        index, _, part = row.partition(".")
        return cls(file, int(txn), int(event), int(index), int(part or 0))


SHIPPER = "binlog shipper (ordq cdc mysql)"  # names this process in its errors


def resume_pos(queue: str, last: StoredMessage | None) -> BinlogPos | None:
    """The binlog position of the last row the queue stored (None: the queue is empty)."""
    if last is None:
        return None
    if last.message is None:
        raise OutboxPositionError(queue, f"cannot read the queue's last message (seq {last.seq}): "
                                         f"{last.message_error}", process=SHIPPER)
    for name, value in last.message.headers:
        if name == BINLOG_HEADER:
            return BinlogPos.decode(value)
    raise OutboxPositionError(queue, f"its last message (seq {last.seq}) carries no {BINLOG_HEADER} header: "
                                     "the binlog shipper must be the queue's only producer", process=SHIPPER)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, datetime.datetime | datetime.date | datetime.time | datetime.timedelta | decimal.Decimal):
        return str(value)
    if isinstance(value, set):
        return sorted(value)
    return value


def change_messages(event: Any, row: dict[str, Any], gtid: str | None) -> list[tuple[bytes, bytes]]:
    """The (key, payload) messages of one row change: one, or two for an update that changes
    the primary key — a delete under the old key, then an insert under the new one — so each
    key's changes stay in one key's order (a keyed applier runs keys in parallel)."""
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

    if isinstance(event, UpdateRowsEvent):
        before, after = row["before_values"], row["after_values"]
        if _pk(event, before) != _pk(event, after):
            return [_message(event, "delete", before, None, gtid), _message(event, "insert", None, after, gtid)]
        return [_message(event, "update", before, after, gtid)]
    if isinstance(event, DeleteRowsEvent):
        return [_message(event, "delete", row["values"], None, gtid)]
    return [_message(event, "insert", None, row["values"], gtid)]


def _pk(event: Any, image: dict[str, Any]) -> dict[str, Any]:
    names = event.primary_key if isinstance(event.primary_key, tuple) else (event.primary_key,)
    names = tuple(n for n in names if n) or tuple(image)  # no primary key: the whole row
    return {n: _json_value(image[n]) for n in names}


def _message(event: Any, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
             gtid: str | None) -> tuple[bytes, bytes]:
    """Key ``db.table:pk`` (pk values joined by ``,``), payload JSON ``{"op", "db", "table",
    "pk", "before", "after", "gtid"}``."""
    image = after if after is not None else before
    assert image is not None
    pk = _pk(event, image)
    key = f"{event.schema}.{event.table}:" + ",".join(str(v) for v in pk.values())
    payload = {"op": op, "db": event.schema, "table": event.table, "pk": pk, "gtid": gtid,
               "before": {k: _json_value(v) for k, v in before.items()} if before is not None else None,
               "after": {k: _json_value(v) for k, v in after.items()} if after is not None else None}
    return key.encode(), json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


@attrs.define
class CdcStats:
    resumed_after: BinlogPos | None = None
    shipped: int = 0
    last: BinlogPos | None = None


class BinlogShipper:
    """Reads the binlog from where the queue stops and sends each row change (started producer)."""

    def __init__(self, connection: dict[str, Any], producer: Producer, *, queue: str, server_id: int,
                 from_beginning: bool = False, until_end: bool = False) -> None:
        self.connection, self.producer, self.queue = connection, producer, queue
        self.server_id, self.from_beginning, self.until_end = server_id, from_beginning, until_end
        self.stats = CdcStats()

    def run(self, stop: threading.Event) -> CdcStats:
        resume = resume_pos(self.queue, self.producer.last_committed())
        self.stats.resumed_after = resume
        pending: list[SendFuture] = []
        for pos, key, payload, gtid in self._changes(resume, stop):
            headers = [(BINLOG_HEADER, pos.encode())] + ([(GTID_HEADER, gtid.encode())] if gtid else [])
            pending.append(self.producer.send(payload, key=key, headers=headers))
            self.stats.shipped += 1
            self.stats.last = pos
            if len(pending) >= 1024:
                for f in pending:
                    if f.done():
                        f.result()  # raise the producer's fatal error, if any
                pending = [f for f in pending if not f.done()]
        self.producer.flush()
        for f in pending:
            f.result()
        return self.stats

    def _changes(self, resume: BinlogPos | None, stop: threading.Event
                 ) -> Iterator[tuple[BinlogPos, bytes, bytes, str | None]]:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import GtidEvent, HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        if resume is not None:
            file, at = resume.file, resume.txn
        elif self.from_beginning:
            file, at = str(self._query("SHOW BINARY LOGS")[0][0]), 4
        else:  # a new queue starts with what is written from now on
            file, at = self._binlog_end()
        start = {"log_file": file, "log_pos": at, "resume_stream": True}
        # --until-end: the end as it is now. MariaDB 10.11 resets a non-blocking binlog dump
        # part-way (seen after ~280 rows: "Connection reset by peer"), so the stream always
        # blocks and the reader stops itself once past this point.
        until = self._binlog_end() if self.until_end else None
        if until is not None and (file, at) >= until:
            return
        try:
            stream = BinLogStreamReader(
                connection_settings=self.connection, server_id=self.server_id, blocking=True,
                only_events=[MariadbGtidEvent, GtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                             XidEvent, QueryEvent, HeartbeatLogEvent],  # to see where the stream is
                is_mariadb=True, slave_heartbeat=1.0, enable_logging=False, **start)
        except Exception as exc:  # noqa: BLE001 - pymysql raises its own tree; one line for the user
            raise BinlogUnavailable(self._where(), str(exc)) from exc
        txn, gtid = resume.txn if resume else 0, None
        try:
            for event in self._events(stream):
                if stop.is_set():
                    return
                end = event.packet.log_pos
                if isinstance(event, HeartbeatLogEvent):
                    if until is not None:
                        return  # the server had nothing more to send for a second: at its end
                    continue
                if isinstance(event, MariadbGtidEvent | GtidEvent):
                    txn, gtid = end - event.event_size, str(event.gtid)
                elif isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    for index, row in enumerate(event.rows):
                        for part, (key, payload) in enumerate(change_messages(event, row, gtid)):
                            pos = BinlogPos(stream.log_file, txn, end, index, part)
                            if resume is not None and (pos.file, pos.event, pos.row, pos.part) <= (
                                    resume.file, resume.event, resume.row, resume.part):
                                continue  # the queue holds it already
                            yield pos, key, payload, gtid
                if until is not None and (stream.log_file, end) >= until:
                    return
        finally:
            stream.close()

    def _binlog_end(self) -> tuple[str, int]:
        row = self._query("SHOW MASTER STATUS")[0]
        return str(row[0]), int(row[1])

    def _events(self, stream: Any) -> Iterator[Any]:
        """The stream's events, its driver errors translated once, here."""
        import pymysql

        try:
            yield from stream
        except pymysql.Error as exc:
            raise BinlogUnavailable(self._where(), str(exc)) from exc

    def _query(self, sql: str) -> list[Any]:
        import pymysql

        try:
            conn = pymysql.connect(**self.connection)
        except pymysql.Error as exc:
            raise BinlogUnavailable(self._where(), str(exc)) from exc
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                rows = list(cur.fetchall())
        finally:
            conn.close()
        if not rows:
            raise ConfigError(f"{self._where()} keeps no binlog (start it with --log-bin and binlog_format=ROW)")
        return rows

    def _where(self) -> str:
        c = self.connection
        return f"mysql://{c.get('user', '')}@{c.get('host', '')}:{c.get('port', 3306)}"
