"""Finding messages by key or by time, without a scan (issue 41).

    from ordq.sdk import find_messages

    found = find_messages("orders", key=b"order-1234", zk_hosts="127.0.0.1:2181")
    for m in found.matches:          # seq order
        print(m.seq, m.seg, m.timestamp, m.passed_by)   # passed_by: subscriptions past it

Guarantees: nothing here writes. Every match was read back from a replica's log (its key
compared, its timestamp read), from the group's master or, when it does not answer, its
slave; a sealed segment is answered only by a copy that holds its whole sealed end. A seq
stored twice (a resend after a failover) is reported once, at its earliest copy, as
``locate_seq`` does. "Passed" means the subscription's committed cursor is at or past the
message's seq: it was delivered and committed.

Each broker answers from the segment's key and time index (broker_group/finder.py,
broker_group/seg_index.py): one call per broker group for all its segments of the queue.
``find_in_queue`` is what the coordinator's admin verb runs (``ordq find``);
``find_messages`` is the SDK's call of that verb.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from ordq.common.errors import BrokerUnavailable, ConfigError, NotFound
from ordq.common.security import Credentials
from ordq.coordinator.state import Cursor, SegStatus
from ordq.sdk.replicas import QueueReads, ReplicaReader, format_time_us, parse_time, render_bytes

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


class NoMatch(NotFound):
    """The search ran over every kept segment and found nothing."""

    def __init__(self, queue: str, what: str) -> None:
        super().__init__(f"queue {queue!r}: no message {what}")
        self.queue = queue
        self.what = what


@attrs.frozen
class FoundMessage:
    """One message found: where it is, when it was sent, which subscriptions are past it."""

    queue: str
    seq: int
    seg: int
    offset: int
    gid: str
    timestamp_us: int
    passed_by: tuple[str, ...]  # subscriptions whose committed cursor is at or past seq
    waiting: tuple[str, ...]  # the other subscriptions: it is still ahead of them
    read_from: str  # "master" | "slave"

    @property
    def timestamp(self) -> str:
        return format_time_us(self.timestamp_us)

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "seq": self.seq, "seg": self.seg, "offset": self.offset, "gid": self.gid,
                "timestamp_us": self.timestamp_us, "timestamp": self.timestamp, "passed_by": list(self.passed_by),
                "waiting": list(self.waiting), "read_from": self.read_from}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FoundMessage:
        return cls(queue=d["queue"], seq=int(d["seq"]), seg=int(d["seg"]), offset=int(d["offset"]), gid=d["gid"],
                   timestamp_us=int(d["timestamp_us"]), passed_by=tuple(d["passed_by"]),
                   waiting=tuple(d["waiting"]), read_from=d["read_from"])


@attrs.frozen
class FindResult:
    queue: str
    matches: tuple[FoundMessage, ...]  # in seq order
    segments: int  # segments searched
    indexes: Mapping[str, int]  # how the brokers answered: "file", "rebuilt", "memory", ... -> segments
    searched_for: str = ""  # "with key 'K'", "at or after T": what a no-match message names

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "matches": [m.to_dict() for m in self.matches], "segments": self.segments,
                "indexes": dict(self.indexes), "searched_for": self.searched_for}

    def no_match(self) -> NoMatch:
        return NoMatch(self.queue, f"{self.searched_for} (searched {self.segments} segments)")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FindResult:
        return cls(queue=d["queue"], matches=tuple(FoundMessage.from_dict(m) for m in d["matches"]),
                   segments=int(d["segments"]), indexes=dict(d["indexes"]), searched_for=d.get("searched_for", ""))


def find_in_queue(store: QueueReads, reader: ReplicaReader, queue: str, *, key: bytes | None = None,
                  time_us: int | None = None, from_time_us: int = 0, limit: int = DEFAULT_LIMIT,
                  cursors: Mapping[str, Cursor] | None = None) -> FindResult:
    """By ``key``: the first ``limit`` messages with that key (at or after ``from_time_us``),
    in seq order. By ``time_us``: the first message with ``timestamp_us >= time_us``.
    ``cursors``: the subscriptions' committed cursors (for ``passed_by``).

    Raises ConfigError (neither or both of key and time; a bad limit), QueueNotFound,
    BrokerUnavailable (a group holding a segment of the queue has no replica that can answer
    for it). An empty ``matches`` is no match (the caller says so)."""
    if (key is None) == (time_us is None):
        raise ConfigError("find: give a key or a time (not both)")
    if not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"find: limit must be 1..{MAX_LIMIT}, not {limit}")
    from ordq.wire import ordq_pb2 as pb

    st, _ = store.load_state(queue)
    groups: dict[str, list[Any]] = {}
    for s in st.consume:
        groups.setdefault(s.gid, []).append(s)
    found: dict[int, FoundMessage] = {}  # seq -> earliest copy
    indexes: dict[str, int] = {}
    searched = 0
    subs = dict(cursors or {})
    for gid, segs in groups.items():
        known = {s.seg: s.end if s.status is SegStatus.SEALED and s.end is not None else -1 for s in segs}
        req = pb.FindRequest(queue=queue, limit=limit if key is not None else 1,
                             time_us=from_time_us if key is not None else int(time_us or 0),
                             segments=[pb.FindSegmentRef(seg=s.seg, known_end=known[s.seg]) for s in segs])
        if key is not None:
            req.key = key

        def call(role: str, address: str, req: Any = req, known: dict[int, int] = known) -> tuple[Any, str]:
            res = reader.transport.find(address, req)
            for r in res.segments:
                if known[r.seg] > r.readable_end:
                    raise BrokerUnavailable(address, f"its copy of segment {r.seg} holds {r.readable_end} of its "
                                                     f"{known[r.seg]} messages (not reconciled yet)")
            return res, role

        res, role = reader.first_answer(gid, f"find in {queue} segments {sorted(known)}", call)
        searched += len(res.segments)
        for r in res.segments:
            indexes[r.index] = indexes.get(r.index, 0) + 1
        for m in res.matches:
            prev = found.get(m.seq)
            if prev is None or m.seg < prev.seg:
                passed = tuple(sorted(n for n, c in subs.items() if c.last_seq >= m.seq))
                found[m.seq] = FoundMessage(queue=queue, seq=m.seq, seg=m.seg, offset=m.offset, gid=gid,
                                            timestamp_us=m.timestamp_us, passed_by=passed,
                                            waiting=tuple(sorted(set(subs) - set(passed))), read_from=role)
    matches = sorted(found.values(), key=lambda m: m.seq)
    if time_us is not None:
        matches = sorted(matches, key=lambda m: (m.seg, m.offset))[:1]
    return FindResult(queue=queue, matches=tuple(matches[:limit]), segments=searched, indexes=indexes,
                      searched_for=describe_search(key, time_us, from_time_us))


def describe_search(key: bytes | None, time_us: int | None, from_time_us: int) -> str:
    """``with key 'K' ...`` / ``at or after T``: what a NoMatch says was looked for."""
    if key is not None:
        shown = render_bytes(key, limit=64)
        text = repr(shown["value"]) if shown["encoding"] == "text" else f"(hex) {shown['value']}"
        return f"with key {text}" + (f" at or after {format_time_us(from_time_us)}" if from_time_us else "")
    return f"at or after {format_time_us(int(time_us or 0))}"


def _time_us(value: str | dt.datetime | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return parse_time(value)


def find_messages(queue: str | None = None, *, topic: str | None = None, key: bytes | str | None = None,
                  at_time: str | dt.datetime | None = None, from_time: str | dt.datetime | None = None,
                  limit: int = DEFAULT_LIMIT, bootstrap: str | None = None, zk_hosts: str | None = None,
                  root: str = "/ordq", credentials: Credentials | None = None,
                  timeout_s: float = 60.0) -> FindResult:
    """Find messages by key, or the first message at or after a time, in ``queue`` (or, with
    ``topic`` and ``key``, in the partition that key routes to), through the coordinator's
    admin API (the token needs the ``consume`` role on the queue).

    Args:
        key: bytes, or str (utf-8). With ``from_time``: only messages sent at or after it.
        at_time: instead of a key: the first message with a timestamp at or after it.
            Times are a ``datetime`` (naive = UTC) or text ``ordq`` accepts: ISO 8601,
            Unix seconds, or a duration ago (``15m``).
        limit: matches at most (by key), oldest first.
        bootstrap / zk_hosts / root / credentials: the cluster, as for ``ProducerConfig``.

    Returns a ``FindResult``: ``matches`` in seq order, empty when nothing matched
    (``result.no_match()`` is the NoMatch error that says what was searched, to raise).

    Raises ConfigError (bad arguments), QueueNotFound / NotFound (no such topic),
    PermissionDenied, BrokerUnavailable, CoordinationUnavailable.
    """
    from ordq.sdk._cluster import open_coordinator

    args = find_args(queue, topic=topic, key=key, at_time=_time_us(at_time), from_time=_time_us(from_time),
                     limit=limit)
    client, _ = open_coordinator(bootstrap, zk_hosts, root, credentials)
    with client:
        doc = client.admin("find topic" if topic is not None else "find", timeout_s=timeout_s, **args)
    return FindResult.from_dict(doc)


def find_args(queue: str | None, *, topic: str | None, key: bytes | str | None, at_time: int | None,
              from_time: int | None, limit: int) -> dict[str, Any]:
    """The admin verb's arguments (JSON): a key as text when it is UTF-8, else as hex."""
    if (queue is None) == (topic is None):
        raise ConfigError("find: give a queue or a topic (not both)")
    if topic is not None and key is None:
        raise ConfigError("find --topic needs a key: it searches the one partition the key routes to")
    if (key is None) == (at_time is None):
        raise ConfigError("find: give a key or a time to find the first message at or after (not both)")
    if from_time is not None and key is None:
        raise ConfigError("find: a from-time goes with a key (without one, give the time itself)")
    if not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"find: limit must be 1..{MAX_LIMIT}, not {limit}")
    args: dict[str, Any] = {"limit": limit}
    if topic is not None:
        args["topic"] = topic
    else:
        args["queue"] = queue
    if isinstance(key, str):
        key = key.encode()
    if key is not None:
        try:
            args["key"] = key.decode("utf-8")
        except UnicodeDecodeError:
            args["key_hex"] = key.hex()
    if at_time is not None:
        args["time_us"] = at_time
    if from_time is not None:
        args["from_time_us"] = from_time
    return args


def key_of(args: Mapping[str, Any]) -> bytes | None:
    """The key of ``find_args``' arguments (the admin verb's side)."""
    if "key_hex" in args:
        try:
            return bytes.fromhex(str(args["key_hex"]))
        except ValueError as exc:
            raise ConfigError(f"find: key_hex is not hex: {exc}") from None
    key = args.get("key")
    if key is None:
        return None
    if not isinstance(key, str):
        raise ConfigError("find: key must be text (or key_hex)")
    return key.encode()
