"""The outbox relay: the queue's producer, shipping one queue's outbox rows in commit order.

Guarantee: every row that a committed transaction added for the queue (``ordq.sdk.outbox.add``) is
stored in the queue exactly once, in id order (which ``ordq.sdk.outbox`` makes commit order), with
its id in the ``x-ordq-outbox-id`` header. A row is deleted (or marked) only after its ack.
A relay killed at any point (kill -9) loses nothing and stores nothing twice: the producer
resends an unacked batch with the same seqs, which consumers drop as duplicates by seq, and a
new relay resumes right after the last row the queue stored.

How it resumes (``resume_point``, pure): the relay is the queue's producer leader, so after
its takeover ``Producer.last_committed()`` is the queue's true tail; the row id in that
message's header says where to go on, whatever the outbox database recorded (the last
acknowledged rows may not have been deleted yet: they are deleted now, not resent). The
database's own record of the position (``<table>_relay``: row id and seq, written with the
deletes) covers a tail message that cannot be read back, and catches a queue that is behind
the outbox (deleted and made again): then nothing is shipped and the error says so.

Only one relay per queue ships (the producer election); standbys wait in ``Producer.start``.
A deposed relay's sends are refused (fenced) and it stops; its late deletes only remove rows
that are stored, and the recorded position only moves forward.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import attrs

from ordq.common.errors import MessageTooLarge, OutboxError, OutboxPositionError
from ordq.outbox.db import AFTER_ACK, OutboxDb, Position, Row
from ordq.sdk import Producer, StoredMessage
from ordq.sdk._futures import SendFuture
from ordq.sdk.outbox import OUTBOX_ID_HEADER

log = logging.getLogger("ordq.outbox")


def _check_after_ack(_inst: object, _attr: object, value: str) -> None:
    if value not in AFTER_ACK:
        from ordq.common.errors import ConfigError

        raise ConfigError(f"after_ack must be one of {', '.join(AFTER_ACK)}, not {value!r}")


def _positive(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        from ordq.common.errors import ConfigError

        raise ConfigError(f"{attr.name} must be > 0, not {value!r}")


@attrs.frozen(kw_only=True)
class RelayConfig:
    """How the relay reads and what it does after an ack."""

    queue: str
    batch_rows: int = attrs.field(default=1000, validator=_positive)  # rows per read of the table
    poll_interval_s: float = attrs.field(default=0.05, validator=_positive)  # idle wait between reads
    after_ack: str = attrs.field(default="delete", validator=_check_after_ack)  # or "mark": set shipped_us
    resume_timeout_s: float = attrs.field(default=30.0, validator=_positive)  # to read the queue's tail
    until_empty: bool = False  # stop once everything committed so far is shipped (scripts, tests)


@attrs.define
class RelayStats:
    resumed_after: int = 0  # row id the relay started after
    shipped: int = 0  # rows acked and recorded by this relay
    position: Position | None = None  # the last recorded one
    records: int = 0  # transactions that deleted/marked rows


def header_row_id(message_headers: tuple[tuple[str, bytes], ...]) -> int | None:
    """The outbox row id a message carries, None when it has no such header."""
    for name, value in message_headers:
        if name == OUTBOX_ID_HEADER:
            return int(value)
    return None


def resume_point(queue: str, last: StoredMessage | None, recorded: Position | None) -> int | None:
    """The id of the last outbox row stored in the queue (the relay goes on after it), from
    the queue's tail ``last`` and the outbox's recorded position; None when the tail message
    cannot be read now and the record does not settle it (try again).

    Raises OutboxPositionError when the two cannot be matched (see the module docstring)."""
    behind = ("the queue is behind what the outbox recorded as shipped (row {rid}, seq {rseq}; the queue's "
              "last seq is {seq}): was the queue deleted and made again? Nothing is shipped; to ship into it "
              "anyway, delete the queue's row from the outbox's _relay table")
    if last is None:
        if recorded is None:
            return 0
        raise OutboxPositionError(queue, behind.format(rid=recorded.id, rseq=recorded.seq, seq="none"))
    if recorded is not None and last.seq < recorded.seq:
        raise OutboxPositionError(queue, behind.format(rid=recorded.id, rseq=recorded.seq, seq=last.seq))
    if last.message is None:
        if recorded is not None and recorded.seq == last.seq:
            return recorded.id
        return None
    try:
        row_id = header_row_id(last.message.headers)
    except ValueError:
        row_id = None
    if row_id is None:
        raise OutboxPositionError(queue, f"its last message (seq {last.seq}) carries no valid {OUTBOX_ID_HEADER} "
                                         "header: the relay must be the queue's only producer")
    if recorded is not None and row_id < recorded.id:
        raise OutboxPositionError(queue, behind.format(rid=recorded.id, rseq=recorded.seq, seq=last.seq))
    return row_id


class Relay:
    """Ships ``config.queue``'s rows of ``db`` through ``producer`` (started: the leader)."""

    def __init__(self, db: OutboxDb, producer: Producer, config: RelayConfig) -> None:
        self.db, self.producer, self.config = db, producer, config
        self._stats = RelayStats()
        self._lock = threading.Lock()
        self._recorded = 0  # id through which rows are deleted/marked

    def statistics(self) -> RelayStats:
        with self._lock:
            return attrs.evolve(self._stats)

    def resume(self) -> Position | None:
        """Find where to go on (waiting up to ``resume_timeout_s`` for an unreadable tail);
        delete or mark the rows the queue already holds. Returns the position resumed after."""
        cfg = self.config
        deadline = time.monotonic() + cfg.resume_timeout_s
        recorded = self.db.position(cfg.queue)
        while True:
            last = self.producer.last_committed()
            row_id = resume_point(cfg.queue, last, recorded)
            if row_id is not None:
                break
            assert last is not None
            if time.monotonic() > deadline:
                raise OutboxPositionError(cfg.queue, f"cannot read the queue's last message (seq {last.seq}) to "
                                                     f"find the last row shipped: {last.message_error}")
            time.sleep(0.2)
        self._recorded = recorded.id if recorded is not None else 0
        position = Position(row_id, last.seq) if last is not None else None
        if position is not None and row_id > self._recorded:
            # acked before the last relay stopped, not yet deleted: delete them, never resend
            self.db.record_shipped(cfg.queue, self._recorded, position, after_ack=cfg.after_ack)
            self._recorded = row_id
        with self._lock:
            self._stats.resumed_after = row_id
            self._stats.position = position or recorded
        log.info("outbox relay for %s resumes after row %d (queue tail %s)", cfg.queue, row_id,
                 f"seq {last.seq}" if last is not None else "empty")
        return position

    def run(self, stop: threading.Event) -> RelayStats:
        """Ship until ``stop`` is set (or, with ``until_empty``, until nothing is left), then
        flush and record what was acked. Raises FencedError when another relay took over, the
        producer's other fatal errors, and OutboxError from the database."""
        cfg = self.config
        sent = self._stats.resumed_after
        pending: collections.deque[tuple[int, SendFuture]] = collections.deque()
        while not stop.is_set():
            rows = self.db.fetch(cfg.queue, sent, cfg.batch_rows)
            try:
                for row in rows:
                    pending.append((row.id, self._send(row)))
            except OutboxError:  # a row that cannot be sent: record what went before it
                self.producer.flush()
                self._settle(pending)
                raise
            if rows:
                sent = rows[-1].id
                self._checkpoint("sent")
            self._settle(pending)
            if rows:
                continue
            if pending:
                try:
                    pending[0][1].exception(timeout=cfg.poll_interval_s)
                except TimeoutError:
                    pass
            elif cfg.until_empty:
                break
            else:
                self.db.wait_for_rows(cfg.poll_interval_s)
        self.producer.flush()
        self._settle(pending)
        return self.statistics()

    def _send(self, row: Row) -> SendFuture:
        try:
            return self.producer.send(row.payload, key=row.key,
                                      headers=(*row.headers, (OUTBOX_ID_HEADER, b"%d" % row.id)))
        except MessageTooLarge as exc:
            # Never skipped: order means nothing after it may go first. An operator removes
            # the row (or raises the queue's limit) and starts the relay again.
            raise OutboxError(f"row {row.id} of queue {self.config.queue!r} cannot be shipped: {exc}; nothing "
                              "after it is shipped until the row is removed or the queue's max_message_bytes "
                              "raised") from exc

    def _settle(self, pending: collections.deque[tuple[int, SendFuture]]) -> None:
        """Take the acked prefix of ``pending``; delete/mark those rows and record the last."""
        done: tuple[int, int] | None = None
        count = 0
        while pending and pending[0][1].done():
            row_id, fut = pending.popleft()
            done = (row_id, fut.result().seq)  # a failed send raises the producer's error
            count += 1
        if done is None:
            return
        self._checkpoint("acked")
        position = Position(*done)
        self.db.record_shipped(self.config.queue, self._recorded, position, after_ack=self.config.after_ack)
        self._recorded = position.id
        with self._lock:
            self._stats.shipped += count
            self._stats.position = position
            self._stats.records += 1

    def _checkpoint(self, name: str) -> None:
        """A named point in the loop ("sent": a read's rows were handed to the producer;
        "acked": acks taken, rows not yet deleted). Tests override it to crash there."""
