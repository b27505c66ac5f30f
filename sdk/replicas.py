"""Reading a queue as stored: segment extents from ZooKeeper and the replicas, queue views
(backlog, lag, holders), locating a message by seq or by time, and reading it.

Guarantees: nothing here writes. What only a broker knows (how much of an open or sealing
segment is readable) is best effort: ``None`` when no replica answers. Replicas are read like a
consumer reads them: the master, or the slave when the master does not answer.

Positions (``latest``, a seq, a time) count every message acked before the call: a replica's
readable end (its LAC) may trail an ack by a moment, as the slave tells the producer its synced
end itself (broker_group/synced_watch.py) while the master learns it on the next step of its
link, and a slave learns the LAC from its master ``lac_push_ms`` later. So ``settle_ms`` waits,
up to that long, for what the replica stores of an open segment to become readable (a long
poll at its last stored offset; no wait when nothing is in between; a sealing segment's end is
the seal's to decide, not waited for).

``locate_seq`` is the one place that maps a seq to its (seg, offset). Within one segment seqs
are consecutive (a broker accepts a batch only if it continues the segment's last seq), so
``offset = seq - first_seq``; a seq can sit in two segments (a resend after failover) and
either copy is the same message.

Time search (``locate_time``) assumes message timestamps (producer wall clock at ``send()``,
microseconds) do not decrease along the queue; it binary-searches segments, then batches, then
scans one batch. With one producer host this finds the first message with timestamp >= T to
the microsecond; if producer clocks disagree after a failover, it finds *a* message at or after
T whose predecessor it probed was before T.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ordq.common.errors import BrokerUnavailable, ConfigError, NotFound, OrdqError, SegmentNotFound
from ordq.common.units import parse_duration
from ordq.coordinator.state import Cursor, QueueState, Segment, SegStatus
from ordq.wire.batch import BatchHeader, Message, decode_batch
from ordq.wire.transport import FetchResult

if TYPE_CHECKING:
    from ordq.coordinator.client import CoordinatorClient
    from ordq.coordinator.store_values import LiveInfo

# -- errors ------------------------------------------------------------------------------------


class SeqNotFound(NotFound):
    """No kept segment holds ``seq``: already popped, or not stored yet."""

    def __init__(self, queue: str, seq: int, reason: str) -> None:
        super().__init__(f"queue {queue!r}: seq {seq} {reason}")
        self.queue = queue
        self.seq = seq
        self.reason = reason


# -- reading replicas --------------------------------------------------------------------------


class QueueReads(Protocol):
    """What the reader asks of the cluster's records (ZooKeeper's store for an operator's tool;
    the coordinator's Describe for a consumer: sdk/parking.py): no ZooKeeper client here."""

    def load_state(self, queue: str) -> tuple[QueueState, int]: ...

    def live_members(self, gid: str) -> dict[str, Any]: ...


class AdminTransport(Protocol):
    """The broker calls admin needs (``ordq.wire.client.GrpcTransport`` implements them)."""

    def fetch(self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
              known_end: int | None = None) -> FetchResult: ...

    def segment_info(self, address: str, queue: str, seg: int) -> Any: ...

    def seal(self, address: str, queue: str, seg: int) -> Any: ...

    def copy_from_peer(self, address: str, queue: str, seg: int, peer: str, end: int) -> Any: ...

    def find(self, address: str, req: Any) -> Any: ...

    def close(self) -> None: ...


@attrs.frozen
class Extent:
    """How much of one segment is readable now, and the seqs it holds."""

    seg: int
    gid: str
    status: SegStatus
    end: int | None  # readable messages: a sealed end, else the LAC a replica serves; None: unknown
    first_seq: int | None  # None when empty or unknown
    last_seq: int | None  # seq of the last readable message
    source: str | None  # "zookeeper" (sealed), "master", "slave", or None when no replica answered

    def holds(self, seq: int) -> bool:
        return self.first_seq is not None and self.last_seq is not None and self.first_seq <= seq <= self.last_seq

    def to_dict(self) -> dict[str, Any]:
        return {"seg": self.seg, "gid": self.gid, "status": self.status.value, "messages": self.end,
                "first_seq": self.first_seq, "last_seq": self.last_seq, "read_from": self.source}


class DescribedQueues:
    """What ``ReplicaReader`` and the locating functions read of a store (a queue's state, a
    group's live processes), answered by the coordinator's Describe: a client holds no
    ZooKeeper session (issue 37). The live processes are those of the last Describe, asked
    again once older than ``live_max_age_s`` (a failover moves them; unanswered: the last
    known)."""

    def __init__(self, coord: CoordinatorClient, *, live_max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._coord = coord
        self._max_age_s = live_max_age_s
        self._clock = clock
        self._live: dict[str, dict[str, LiveInfo]] = {}
        self._queue: str | None = None  # of the last Describe
        self._at = float("-inf")

    def load_state(self, queue: str) -> tuple[QueueState, int]:
        got = self._coord.describe(queue, with_live=True)
        live = got.live or {}
        self._live.update({gid: dict(live.get(gid, {})) for gid in {*got.state.groups, *live}})
        self._queue, self._at = queue, self._clock()
        return got.state, got.version

    def live_members(self, gid: str) -> dict[str, LiveInfo]:
        if self._queue is not None and self._clock() - self._at > self._max_age_s:
            try:
                self.load_state(self._queue)
            except OrdqError:
                pass  # no coordinator answers now: the last known
        return dict(self._live.get(gid, {}))


# How long a position waits for what a replica stores to become readable (module doc): a step of
# the master's link, or a slave's ``lac_push_ms``, with room for a loaded box.
SETTLE_MS = 1000


class ReplicaReader:
    """Reads segments from their group's master, or its slave when the master does not answer."""

    def __init__(self, store: QueueReads, transport: AdminTransport | None = None, *,
                 rpc_timeout_s: float = 1.0) -> None:
        self.store = store
        if transport is None:
            from ordq.common.security import of_store
            from ordq.wire.client import GrpcTransport

            transport = GrpcTransport(rpc_timeout_s=rpc_timeout_s, credentials=of_store(store))
        self.transport: AdminTransport = transport

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> ReplicaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _replicas(self, gid: str) -> list[tuple[str, str]]:
        members = self.store.live_members(gid)
        return [(role, members[role].address) for role in ("master", "slave") if role in members]

    def _first_answer(self, gid: str, what: str, call: Callable[[str, str], Any]) -> Any:
        errors = []
        for role, address in self._replicas(gid):
            try:
                return call(role, address)
            except OrdqError as exc:
                errors.append(f"{role}: {exc}")
        raise BrokerUnavailable(f"group {gid}", f"no replica answered {what} ({'; '.join(errors) or 'none is live'})")

    def first_answer(self, gid: str, what: str, call: Callable[[str, str], Any]) -> Any:
        """``call(role, address)`` on the group's master, else its slave: the first answer.
        BrokerUnavailable, naming each replica's error, when none answers."""
        return self._first_answer(gid, what, call)

    def fetch(self, queue: str, segment: Segment, offset: int, *, max_bytes: int = 1) -> tuple[FetchResult, str]:
        """Whole batches from the one holding ``offset`` (at least one if readable), and the
        role that served them. BrokerUnavailable when no replica answers."""
        known_end = segment.end if segment.status is SegStatus.SEALED else None

        def call(role: str, address: str) -> tuple[FetchResult, str]:
            res = self.transport.fetch(address, queue, segment.seg, offset, max_bytes=max_bytes, max_wait_ms=0,
                                       known_end=known_end)
            return res, role

        result: tuple[FetchResult, str] = self._first_answer(segment.gid, f"segment {segment.seg}", call)
        return result

    def extent(self, queue: str, segment: Segment, *, settle_ms: int = 0) -> Extent:
        """The readable extent of ``segment`` (no broker call for a sealed one); with
        ``settle_ms``, once what the replica stores is readable, waited that long at most
        (module doc: what was acked before the call counts)."""
        if segment.status is SegStatus.SEALED:
            return Extent(segment.seg, segment.gid, segment.status, segment.end, segment.first_seq,
                          segment.last_seq, "zookeeper")

        def call(role: str, address: str) -> Extent:
            try:
                info = self.transport.segment_info(address, queue, segment.seg)
                first = None if info.first_seq < 0 else int(info.first_seq)
                stored = int(info.end)
            except SegmentNotFound:
                first, stored = None, 0  # nothing written to this replica yet
            # Only the LAC is readable (the replica may hold more): a fetch at what it stores
            # returns the readable end without reading any batch.
            res = self.transport.fetch(address, queue, segment.seg, stored, max_bytes=1, max_wait_ms=0)
            end = int(res.readable_end)
            if settle_ms and end < stored and segment.status is SegStatus.OPEN:
                # a long poll at the last stored offset returns once the LAC covers it
                res = self.transport.fetch(address, queue, segment.seg, stored - 1, max_bytes=1,
                                           max_wait_ms=settle_ms)
                end = int(res.readable_end)
            if end > 0 and first is None:
                head = self.transport.fetch(address, queue, segment.seg, 0, max_bytes=1, max_wait_ms=0)
                first = decode_batch(head.batches[0])[0].first_seq if head.batches else None
            last = first + end - 1 if first is not None and end > 0 else None
            return Extent(segment.seg, segment.gid, segment.status, end, first if end > 0 else None, last, role)

        try:
            result: Extent = self._first_answer(segment.gid, f"segment {segment.seg}", call)
            return result
        except BrokerUnavailable:
            return Extent(segment.seg, segment.gid, segment.status, None, None, None, None)

    def extents(self, st: QueueState, *, settle_ms: int = 0) -> list[Extent]:
        return [self.extent(st.queue, s, settle_ms=settle_ms) for s in st.consume]

    def stored_bytes(self, queue: str, segment: Segment) -> int | None:
        """Bytes the segment takes on disk on one replica (the first that answers; both hold
        the same once synced); None when no replica answered."""
        def call(role: str, address: str) -> int:
            try:
                return int(self.transport.segment_info(address, queue, segment.seg).bytes)
            except SegmentNotFound:
                return 0  # nothing written to this replica yet

        try:
            size: int = self._first_answer(segment.gid, f"segment {segment.seg}", call)
            return size
        except BrokerUnavailable:
            return None


def last_readable_seq(st: QueueState, extents: Sequence[Extent]) -> int | None:
    """The highest readable seq of the queue (``trimmed_seq`` when nothing is kept), or None
    when a segment that is not sealed could not be read."""
    last = st.trimmed_seq
    for e in extents:
        if e.end is None:
            return None
        if e.last_seq is not None:
            last = max(last, e.last_seq)
    return last


def lag(cursor: Cursor, last_seq: int | None) -> int | None:
    """Messages between a cursor and the readable end of the queue, by seq (None: unknown)."""
    return None if last_seq is None else max(0, last_seq - cursor.last_seq)


# -- locating messages -------------------------------------------------------------------------


@attrs.frozen
class Location:
    """Where one message is stored."""

    queue: str
    seq: int
    seg: int
    offset: int
    gid: str

    def cursor(self) -> Cursor:
        """The cursor that makes a consumer deliver this message next."""
        return Cursor(seg=self.seg, offset=self.offset, last_seq=self.seq - 1)


def locate_seq(store: QueueReads, reader: ReplicaReader, queue: str, seq: int, *,
               state: QueueState | None = None) -> Location:
    """The (seg, offset) holding ``seq`` in the kept segments (the earliest readable copy).

    Raises SeqNotFound (already popped, or not stored yet), BrokerUnavailable (the segment
    that may hold it has no replica answering), QueueNotFound, ConfigError (negative seq)."""
    if seq < 0:
        raise ConfigError(f"seq must be >= 0, not {seq}")
    st = state if state is not None else store.load_state(queue)[0]
    unreadable: list[Segment] = []
    oldest: int | None = None
    last = st.trimmed_seq
    for segment in st.consume:
        e = reader.extent(queue, segment, settle_ms=SETTLE_MS)
        if e.end is None:
            unreadable.append(segment)
            continue
        if e.holds(seq):
            assert e.first_seq is not None
            return Location(queue, seq, segment.seg, seq - e.first_seq, segment.gid)
        if e.first_seq is not None and oldest is None:
            oldest = e.first_seq
        if e.last_seq is not None:
            last = max(last, e.last_seq)
    if unreadable:
        s = unreadable[0]
        raise BrokerUnavailable(f"group {s.gid}", f"no replica answered for segment {s.seg}, which may hold seq {seq}")
    if seq <= st.trimmed_seq:
        kept = f"the oldest kept seq is {oldest}" if oldest is not None else "no message is kept"
        raise SeqNotFound(queue, seq, f"was already popped (read by every subscription and dropped; {kept})")
    raise SeqNotFound(queue, seq, f"is not stored (yet): the last readable seq is {last}")


def _batch_at(
    reader: ReplicaReader, queue: str, segment: Segment, offset: int
) -> tuple[BatchHeader, list[Message], str]:
    res, role = reader.fetch(queue, segment, offset, max_bytes=1)
    for raw in res.batches:
        header, messages = decode_batch(raw)
        if header.first_offset <= offset < header.end_offset:
            return header, messages, role
    raise NotFound(f"queue {queue!r}: segment {segment.seg} offset {offset} is not readable (popped meanwhile?)")


@attrs.frozen
class PeekedMessage:
    location: Location
    message: Message
    read_from: str  # "master" | "slave"

    def to_dict(self, *, full: bool = False, limit: int = 256) -> dict[str, Any]:
        m = self.message
        return {
            "queue": self.location.queue, "seq": self.location.seq, "seg": self.location.seg,
            "offset": self.location.offset, "gid": self.location.gid, "read_from": self.read_from,
            "timestamp_us": m.timestamp_us, "timestamp": format_time_us(m.timestamp_us),
            "key": render_bytes(m.key, full=full, limit=limit) if m.key is not None else None,
            "headers": [{"name": name, **render_bytes(value, full=full, limit=limit)} for name, value in m.headers],
            "payload_bytes": len(m.payload),
            "payload": render_bytes(m.payload, full=full, limit=limit),
        }


def read_message(store: QueueReads, reader: ReplicaReader, queue: str, seq: int) -> PeekedMessage:
    """The message with ``seq``, from the master of its segment or the slave when the master
    does not answer. Errors as ``locate_seq``."""
    st, _ = store.load_state(queue)
    loc = locate_seq(store, reader, queue, seq, state=st)
    segment = st.segment(loc.seg)
    assert segment is not None
    header, messages, role = _batch_at(reader, queue, segment, loc.offset)
    i = loc.offset - header.first_offset
    if header.first_seq + i != seq:
        raise OrdqError(f"queue {queue!r} segment {loc.seg} offset {loc.offset} holds seq {header.first_seq + i}, "
                        f"not {seq}: segment metadata and data disagree")
    return PeekedMessage(loc, messages[i], role)


def read_messages(store: QueueReads, reader: ReplicaReader, queue: str, seqs: Sequence[int]) -> dict[int, Message]:
    """The messages with these seqs (``read_message`` for many): located once, then read
    forward in large fetches. A seq not found is missing from the result; errors as
    ``locate_seq`` for the first one."""
    want = sorted(set(seqs))
    if not want:
        return {}
    st, _ = store.load_state(queue)
    loc = locate_seq(store, reader, queue, want[0], state=st)
    out: dict[int, Message] = {}
    for segment in st.consume:
        if segment.seg < loc.seg:
            continue
        offset = loc.offset if segment.seg == loc.seg else 0
        while True:
            res, _role = reader.fetch(queue, segment, offset, max_bytes=1 << 20)
            if not res.batches:
                break
            for raw in res.batches:
                header, messages = decode_batch(raw)
                for i, m in enumerate(messages):
                    if header.first_offset + i >= offset:
                        out.setdefault(header.first_seq + i, m)
                offset = max(offset, header.end_offset)
            if len(out) >= len(want) and all(s in out for s in want):
                return {s: out[s] for s in want}
    return {s: out[s] for s in want if s in out}


def render_bytes(data: bytes, *, full: bool = False, limit: int = 256) -> dict[str, Any]:
    """Bytes for humans: text when printable UTF-8, else hex; cut at ``limit`` bytes unless full."""
    shown = data if full else data[:limit]
    try:
        text = shown.decode("utf-8")
        printable = all(ch.isprintable() or ch in "\t\n\r" for ch in text)
    except UnicodeDecodeError:
        printable = False  # a multi-byte character cut at the limit is shown as hex too
    return {"encoding": "text" if printable else "hex", "value": text if printable else shown.hex(),
            "truncated": len(shown) < len(data)}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def format_time_us(us: int) -> str:
    """ISO 8601 in UTC, exact to the microsecond (``parse_time`` reads it back exactly)."""
    return (_EPOCH + us * _US).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- time search -------------------------------------------------------------------------------


def locate_time(store: QueueReads, reader: ReplicaReader, queue: str, t_us: int, *,
                state: QueueState | None = None) -> Location | None:
    """The first message with ``timestamp_us >= t_us`` (see the module docstring for the
    precision), or None when every readable message is older. BrokerUnavailable when a
    segment that is not sealed cannot be read."""
    st = state if state is not None else store.load_state(queue)[0]
    extents = reader.extents(st, settle_ms=SETTLE_MS)
    for e in extents:
        if e.end is None:
            raise BrokerUnavailable(f"group {e.gid}", f"no replica answered for segment {e.seg}")
    segs = [(st.segment(e.seg), e) for e in extents if e.end]

    def first_ts(i: int) -> int:
        segment, _ = segs[i]
        assert segment is not None
        return _batch_at(reader, queue, segment, 0)[1][0].timestamp_us

    # The first segment whose first message is at or after T; the answer is in the one
    # before it (past its first message), or is that segment's first message.
    lo, hi = 0, len(segs)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_ts(mid) >= t_us:
            hi = mid
        else:
            lo = mid + 1
    if lo > 0:
        segment, e = segs[lo - 1]
        assert segment is not None and e.end is not None
        found = _first_at_or_after(reader, queue, segment, e.end, t_us)
        if found is not None:
            return found
    if lo < len(segs):
        segment, e = segs[lo]
        assert segment is not None and e.first_seq is not None
        return Location(queue, e.first_seq, segment.seg, 0, segment.gid)
    return None


def _first_at_or_after(reader: ReplicaReader, queue: str, segment: Segment, end: int, t_us: int) -> Location | None:
    """Binary search over one segment's batches, then a scan of one batch."""
    lo, hi = 0, end  # the answer is in [lo, hi]; hi == end means none
    while lo < hi:
        header, messages, _ = _batch_at(reader, queue, segment, (lo + hi) // 2)
        count = min(header.end_offset, end) - header.first_offset
        stamps = [m.timestamp_us for m in messages[:count]]
        if stamps[-1] < t_us:
            lo = header.first_offset + count
        elif stamps[0] >= t_us:
            hi = header.first_offset
        else:
            i = next(i for i, ts in enumerate(stamps) if ts >= t_us)
            return Location(queue, header.first_seq + i, segment.seg, header.first_offset + i, segment.gid)
    if lo >= end:
        return None
    header, _, _ = _batch_at(reader, queue, segment, lo)
    seq = header.first_seq + (lo - header.first_offset)
    return Location(queue, seq, segment.seg, lo, segment.gid)


_RELATIVE = re.compile(r"-?\d+(?:\.\d+)?(ms|s|m|h|d|w)")  # a duration ago (a bare number is Unix seconds)


def parse_time(text: str, *, now_s: Callable[[], float] = time.time) -> int:
    """A point in time as microseconds since the epoch, from ISO 8601 (``2026-11-22T19:30:00Z``;
    without a zone it is UTC), Unix seconds (``1795462200.5``), or a duration ago (``90s``,
    ``15m``, ``2h``, ``1d``, ``500ms``; a leading ``-`` is allowed)."""
    text = text.strip()
    if _RELATIVE.fullmatch(text):
        return int((now_s() - parse_duration(text.removeprefix("-"))) * 1e6)
    try:
        return int(decimal.Decimal(text) * 1_000_000)
    except (decimal.InvalidOperation, ValueError):
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"bad time {text!r}: use ISO 8601 (2026-11-22T19:30:00Z), Unix seconds, "
                          "or a duration ago (15m, 2h)") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - _EPOCH) // _US  # exact: no float on the way


