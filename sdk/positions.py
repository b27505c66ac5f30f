"""Where a subscription starts or is reset to (``earliest | latest | seq N | time T``), as a
cursor: what ``ordq sub create/reset`` (ordq/admin/subscriptions.py writes it), a consumer's
start and the Spark source resolve. A cursor names the position of its target message *and*
``last_seq = target seq - 1``: the consumer's delivery filter drops seqs <= ``last_seq``, so
moving back must lower it, and moving forward must raise it to exactly the message before, or
the filter would raise a gap. Reads only (``QueueReads``): no ZooKeeper client here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs

from ordq.common.errors import BrokerUnavailable, ConfigError
from ordq.coordinator.state import Cursor, QueueState, SegStatus
from ordq.sdk.replicas import (
    SETTLE_MS,
    Location,
    QueueReads,
    ReplicaReader,
    SeqNotFound,
    format_time_us,
    last_readable_seq,
    locate_seq,
    locate_time,
    parse_time,
)


@attrs.frozen
class ResetTarget:
    kind: str  # earliest | latest | seq | time
    seq: int | None = None
    time_us: int | None = None

    def __str__(self) -> str:
        if self.kind == "seq":
            return f"seq {self.seq}"
        if self.kind == "time":
            assert self.time_us is not None
            return f"time {format_time_us(self.time_us)}"
        return self.kind


def parse_reset_target(words: Sequence[str], *, now_s: Callable[[], float] = time.time) -> ResetTarget:
    """``earliest`` | ``latest`` | ``seq N`` | ``time T`` (T as in ``parse_time``)."""
    usage = "a target is one of: earliest | latest | seq N | time T"
    if len(words) == 1 and words[0] in ("earliest", "latest"):
        return ResetTarget(words[0])
    if len(words) == 2 and words[0] == "seq":
        try:
            seq = int(words[1])
        except ValueError:
            raise ConfigError(f"bad seq {words[1]!r}: {usage}") from None
        if seq < 0:
            raise ConfigError(f"seq must be >= 0, not {seq}")
        return ResetTarget("seq", seq=seq)
    if len(words) == 2 and words[0] == "time":
        return ResetTarget("time", time_us=parse_time(words[1], now_s=now_s))
    raise ConfigError(f"bad reset target {' '.join(words)!r}: {usage}")


def latest_cursor(store: QueueReads, reader: ReplicaReader, st: QueueState) -> Cursor:
    """After the last readable message. Needs every segment that is not sealed readable: the
    cursor's ``last_seq`` must be exact or the consumer would see a gap. Every message acked
    before the call is counted (``SETTLE_MS``, sdk/replicas.py)."""
    extents = reader.extents(st, settle_ms=SETTLE_MS)
    last = last_readable_seq(st, extents)
    if last is None:
        bad = next(e for e in extents if e.end is None)
        raise BrokerUnavailable(f"group {bad.gid}", f"no replica answered for segment {bad.seg}")
    if not extents:
        return Cursor(seg=st.next_seg, offset=0, last_seq=last)
    tail = extents[-1]
    assert tail.end is not None
    if tail.status is SegStatus.SEALED:
        return Cursor(seg=tail.seg + 1, offset=0, last_seq=last)
    return Cursor(seg=tail.seg, offset=tail.end, last_seq=last)


def resolve_target(store: QueueReads, reader: ReplicaReader, st: QueueState,
                   target: ResetTarget) -> tuple[Cursor, Location | None]:
    """The cursor a target means in state ``st`` (and the message it starts at, if any)."""
    if target.kind == "earliest":
        return st.earliest_cursor(), None
    if target.kind == "latest":
        return latest_cursor(store, reader, st), None
    if target.kind == "seq":
        assert target.seq is not None
        try:
            loc = locate_seq(store, reader, st.queue, target.seq, state=st)
        except SeqNotFound:
            latest = latest_cursor(store, reader, st)
            if target.seq == latest.last_seq + 1:
                return latest, None  # the next message to be produced: same as latest
            raise
        return loc.cursor(), loc
    if target.kind == "time":
        assert target.time_us is not None
        found = locate_time(store, reader, st.queue, target.time_us, state=st)
        if found is None:
            return latest_cursor(store, reader, st), None
        return found.cursor(), found
    raise ConfigError(f"unknown reset target {target.kind!r}")
