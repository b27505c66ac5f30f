"""What the ZooKeeper store keeps, as values: a queue's settings, a live process's node, the
queue state read from its node's bytes, and the JSON the store writes.

Rules: values and pure functions only (no kazoo, no I/O); the store (coordinator/store.py and
its parts) reads and writes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from ordq.common.errors import ConfigError, CorruptState, InvariantViolation
from ordq.coordinator import state as sm

# also named here, where QueueConfig uses them
from ordq.coordinator.queue_defaults import DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES
from ordq.coordinator.queue_defaults import DEFAULT_SEGMENT_AGE_S as DEFAULT_SEGMENT_AGE_S
from ordq.coordinator.queue_defaults import DEFAULT_SEGMENT_BYTES as DEFAULT_SEGMENT_BYTES
from ordq.coordinator.queue_defaults import MIN_SEGMENT_BYTES as MIN_SEGMENT_BYTES
from ordq.coordinator.queue_defaults import ROLL_TO as ROLL_TO
from ordq.coordinator.state import Facts, QueueState


@attrs.frozen
class LiveInfo:
    """Content of a process's ephemeral liveness node."""

    address: str
    incarnation: str
    pid: int
    produce: str = ""  # a master's lean produce link (HOST:PORT; ordq/wire/lean_produce.py), "" for none
    replication: str = ""  # a slave's lean replication link (HOST:PORT; broker_group/lean_link.py), "" for none
    # The process's disk refused a write for want of space and has not had room again since
    # (broker_group/disk_room.py): its group is admitted to no send list meanwhile (Facts.disk_full).
    disk_full: bool = False


def live_info(d: Any) -> LiveInfo:
    """A liveness node's JSON, parsed (``register_live`` and ``set_disk_full`` write it)."""
    return LiveInfo(address=d["address"], incarnation=d["incarnation"], pid=d["pid"],
                    produce=str(d.get("produce", "")), replication=str(d.get("replication", "")),
                    disk_full=bool(d.get("disk_full", False)))



@attrs.frozen
class QueueConfig:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    retention_segments: int | None = None  # keep at most this many sealed segments (None: all)
    # The open segment is rolled (sealed, the next one opened on the same head) once it holds
    # this many bytes or its first message is this old: segments stay small enough to free.
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_age_s: float = DEFAULT_SEGMENT_AGE_S
    # Sealed segments are dropped, read or not, once older than this (since sealed) or while
    # the sealed ones take more than this many bytes (None: kept until every subscription read them).
    retention_time_s: float | None = None
    retention_bytes: int | None = None
    # Where a roll opens the next segment: "same" (the head keeps taking writes) or "next"
    # (writes move to the next group of the send list; the old head rejoins once drained).
    roll_to: str = "same"
    # The topic this queue is a partition of (coordinator/topics.py), None for a plain queue: a
    # partition is created and deleted with its topic only (``ordq queue delete`` refuses it).
    topic: str | None = None

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.max_message_bytes <= 64 << 20:
            raise ConfigError(f"max_message_bytes must be 1..{64 << 20}, not {self.max_message_bytes}")
        if self.retention_segments is not None and self.retention_segments < 1:
            raise ConfigError("retention_segments must be >= 1")
        if not MIN_SEGMENT_BYTES <= self.segment_bytes <= 1 << 40:
            raise ConfigError(f"segment_bytes must be {MIN_SEGMENT_BYTES}..{1 << 40}, not {self.segment_bytes}")
        if not 1.0 <= self.segment_age_s <= 10**8:
            raise ConfigError(f"segment_age_s must be 1..{10**8} seconds, not {self.segment_age_s}")
        if self.retention_time_s is not None and not 1.0 <= self.retention_time_s <= 10**9:
            raise ConfigError(f"retention_time_s must be 1..{10**9} seconds, not {self.retention_time_s}")
        if self.roll_to not in ROLL_TO:
            raise ConfigError(f"roll_to must be one of {', '.join(ROLL_TO)}, not {self.roll_to!r}")
        if self.retention_bytes is not None and self.retention_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"retention_bytes must be >= {MIN_SEGMENT_BYTES}, not {self.retention_bytes}")


Transition = Callable[[QueueState, Facts], QueueState]


def roll_transition(cfg: QueueConfig, gid: str, seg: int) -> Transition:
    """The roll of ``gid``'s open segment ``seg`` as the queue's ``roll_to`` policy says (one
    definition for the coordinator, the producer and ``ordq queue roll``)."""
    to_next = cfg.roll_to == "next"
    return lambda s, f: sm.roll(s, gid, seg, f, to_next=to_next)


def json_bytes(obj: Any) -> bytes:
    """How the store writes a JSON node (keys sorted, compact)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def json_value(data: bytes) -> Any:
    """A JSON node's value ({} for an empty node)."""
    return json.loads(data.decode()) if data else {}


def parse_state(queue: str, data: bytes) -> QueueState:
    """The queue's state from its node's bytes; CorruptState when they are not a valid state
    (garbage, not UTF-8, not JSON, a missing or mistyped field, broken invariants). Why: one
    queue's bad node must fail only that queue, never the reader's thread (issue 23: garbage
    killed both coordinators' election threads)."""
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        for key, kind in (("groups", list), ("send", list), ("consume", list)):
            if not isinstance(doc.get(key), kind):
                raise TypeError(f"field {key!r} is not a list")
        if not all(isinstance(c, dict) for c in doc["consume"]):
            raise TypeError("a consume-list entry is not an object")
        st = QueueState.from_dict(doc)
        sm.check_invariants(st)
    except UnicodeDecodeError as exc:
        raise CorruptState(queue, f"not UTF-8 at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise CorruptState(queue, f"not JSON: {exc.msg} at {exc.pos}") from exc
    except KeyError as exc:
        raise CorruptState(queue, f"field {exc.args[0]!r} missing") from exc
    except InvariantViolation as exc:
        raise CorruptState(queue, str(exc)) from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptState(queue, f"{type(exc).__name__}: {exc}") from exc
    if st.queue != queue:
        raise CorruptState(queue, f"it names queue {st.queue!r}")
    return st


@attrs.frozen
class StateVersion:
    """What a write of a queue's state checks: its node's version as read (``znode``), and the
    queues' deletion count (``deletions``, the data version of the queues folder) read before
    that state was.

    Why both: a queue deleted and created again under its name has a new state node, whose
    version starts at 0 again; a move planned on a copy of the old queue (read, or kept by
    ``WrittenStates``) would pass a check of ``znode`` alone and write the old queue's segments
    and groups over the new queue's, hiding what was acked there. Every deletion bumps the
    count in the transaction that deletes the state (``store_base.ZkBase._delete_queue``), and every state
    write checks it (``store_base.ZkBase._check_deletions``): no queue deleted since the copy was read
    means the copy's queue is still the one under that name. A write that fails it because
    other queues were deleted is checked again at once against the recent deletions
    (``DeletionLog``), not read again."""

    znode: int
    deletions: int

    def next(self) -> StateVersion:
        """The version a write checked against this one leaves."""
        return StateVersion(self.znode + 1, self.deletions)


# How many of the latest queue deletions the queues folder names (``DeletionLog``): a write
# planned on a copy older than that many deletions is read again instead. Why not more: each
# deletion rewrites the list (~2 KB at 64 names of ~25 bytes; a topic's deletion once per
# partition), and only the deletions between a copy's read and its write matter.
DELETION_LOG = 64


@attrs.frozen
class DeletionLog:
    """The latest queue deletions, as the queues folder's data holds them: ``(count, queue)``,
    the oldest first, ``count`` the deletion count each made; ``count``: the folder's data
    version, the deletions so far (``StateVersion``). What lets a write planned on a copy read
    before other queues were deleted keep its copy: at 10^5 queues a verdict's moves are
    planned on copies read minutes before, and one deletion meanwhile would otherwise send
    every move back to be read again."""

    count: int
    recent: tuple[tuple[int, str], ...] = ()

    @classmethod
    def parse(cls, data: bytes, count: int) -> DeletionLog:
        """From the folder's data and version; data that is not such a log (a folder written
        before, or damaged) names nothing: every older copy is then read again."""
        try:
            recent = tuple((int(c), str(q)) for c, q in json_value(data).get("deleted", []))
        except (AttributeError, TypeError, ValueError):
            recent = ()
        return cls(count, recent)

    def with_deletion(self, queue: str) -> bytes:
        """The folder's data once ``queue`` is deleted (written with a check of ``count``)."""
        recent = [*self.recent, (self.count + 1, queue)][-DELETION_LOG:]
        return json_bytes({"deleted": [list(d) for d in recent]})

    def kept(self, queue: str, since: int) -> bool:
        """Whether ``queue`` was not deleted after the count ``since`` (so a copy of it read
        then is still of the queue under that name); False too when the log no longer reaches
        back to ``since``."""
        if since >= self.count:
            return True
        oldest = self.recent[0][0] if self.recent else self.count + 1
        return since + 1 >= oldest and not any(c > since and q == queue for c, q in self.recent)


# One queue's planned write: (queue, the version its state was read at, the new state).
StateWrite = tuple[str, StateVersion, QueueState]
