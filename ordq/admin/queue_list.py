"""``ordq queue list`` at 10^5 queues (issue 43): one read of the states, not a describe per queue.

A listing of every queue used to describe each one (its state, settings, subscriptions,
each group's liveness and drain mark from ZooKeeper, and each open segment's extent from its
replicas, one call at a time): 23.6 s at 10^3 queues, more than 300 s at 10^4. Now:

- the states (and the subscriptions' names where it keeps their cursors) come from the elected
  coordinator's copy, which watches keep current, or, for a queue whose state it wrote since,
  the state as it wrote it (``CoordinatorDaemon.known_queues``, ``store_base.WrittenStates``);
  only the queues it does not hold, once asked again after the others' rows, are read from
  ZooKeeper, pipelined (``ZkStore.load_states``), with their subscriptions while at most
  ``SUBS_READ_LIMIT`` of them are unknown (else a row says ``subscriptions: null``: ``ordq sub
  list Q`` names them);
- the extents of the segments not sealed in ZooKeeper come from one ``OpenSegments`` call per
  group that holds one (its master, else its slave: every segment not sealed on that replica,
  and those sealing in ZooKeeper it has sealed already, with its durable end and seqs), never
  one call per segment; sealed segments' from their states.

What a row says of an open segment is what its replica holds durably when asked (``describe``
asks for the readable end, which trails it only by the batches in flight).

Rules: read-only; no policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from ordq.common.errors import CorruptState, OrdqError
from ordq.coordinator.state import QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import StateVersion
from ordq.sdk.replicas import ReplicaReader

# Known of a queue: (state, its version, its subscriptions' names or None when not read)
KnownQueue = tuple[QueueState, StateVersion, "list[str] | None"]
Known = Callable[[Iterable[str]], Mapping[str, KnownQueue]]
# Above this many queues whose subscriptions the coordinator's copy does not hold, a listing
# does not read them (two ZooKeeper reads a queue instead of one; at 10^5 queues ~3 minutes).
SUBS_READ_LIMIT = 1000
SEALED, OPEN = SegStatus.SEALED, SegStatus.OPEN  # looked up once, not per segment


class Phases:
    """Wall seconds of a call's phases, in order, and what each counted: one line for the log
    when the call was long (issue 43: at 10^5 queues a listing's 13 s could not be told apart
    into its reads, its rows and its answer's way out)."""

    def __init__(self) -> None:
        self.started = self._at = time.monotonic()
        self.parts: list[tuple[str, float]] = []
        self.counts: dict[str, int] = {}

    def done(self, phase: str, **counts: int) -> None:
        """``phase`` ended now (it began where the last one ended); ``counts``: what it counted."""
        now = time.monotonic()
        self.parts.append((phase, now - self._at))
        self._at = now
        self.counts.update(counts)

    @property
    def total_s(self) -> float:
        return self._at - self.started

    def line(self) -> str:
        return (", ".join(f"{phase} {s:.2f} s" for phase, s in self.parts)
                + "".join(f"; {k} {v:,}" for k, v in self.counts.items()))


def to_read(names: Iterable[str], have: Mapping[str, KnownQueue], with_subs: bool) -> list[str]:
    """Of ``names``: those the copy lacks (not in ``have``), and those whose subscriptions it
    lacks when ``with_subs``."""
    return [q for q in names if q not in have or (with_subs and have[q][2] is None)]


def take_read(have: dict[str, KnownQueue], read: Mapping[str, KnownQueue | CorruptState]) -> list[str]:
    """What was read, into ``have`` (a state that does not parse: not taken; the copy's stays,
    without its subscriptions); one line per queue whose state does not parse and the copy
    lacks. A queue deleted meanwhile is not in ``read``."""
    corrupt = []
    for q, got in read.items():
        if not isinstance(got, CorruptState):
            have[q] = got
        elif q not in have:
            corrupt.append(str(got))
    return corrupt


@attrs.frozen
class GroupEnds:
    """What one replica of a group answered ``OpenSegments``: each segment's SegmentEnd, and
    whether it named every segment asked for that it holds (``included``: one it does not name
    it holds no copy of; False from a broker that predates the question)."""

    ends: Mapping[tuple[str, int], Any]
    included: bool


def open_ends(store: ZkStore, reader: ReplicaReader,
              sealing: Mapping[str, Sequence[tuple[str, int]]]) -> dict[str, GroupEnds]:
    """gid -> the ends of every segment not sealed on one replica of the group (its master,
    else its slave), and of its segments of ``sealing`` (gid -> segments sealing in ZooKeeper)
    that replica holds sealed (issue 43: right after a group died, thousands of them, each
    asked in calls of its own); a group none of whose replicas answered is left out."""
    out: dict[str, GroupEnds] = {}
    transport: Any = reader.transport
    for gid in sorted(sealing):
        try:
            members = store.live_members(gid)
        except OrdqError:
            continue
        for role in ("master", "slave"):
            info = members.get(role)
            if info is None:
                continue
            try:
                answer = transport.open_segments(info.address, include=sealing[gid])
            except OrdqError:
                continue
            out[gid] = GroupEnds({(s.queue, int(s.seg)): s.end for s in answer.segments}, bool(answer.included))
            break
    return out


def readable_of(st: QueueState, ends: Mapping[str, GroupEnds], reader: ReplicaReader) -> tuple[int | None, int | None]:
    """The queue's highest readable seq and the messages it stores (``last_readable_seq`` of its
    segments' extents, and the sum of their ends), or (None, None) when a segment's is unknown
    (its group did not answer). Sealed segments from the state, the others from their group's
    answer (``open_ends``); one the answer does not name is empty (nothing written there yet),
    except a sealing one a broker that predates ``include`` did not name: asked of its
    replicas (that replica sealed it already).

    Why no ``Extent`` per segment: at 10^5 queues making them was ~40 % of the listing's CPU
    (a micro-bench of 10^5 synthetic rows, docs/BENCHMARKS.md; issue 43)."""
    last, stored = st.trimmed_seq, 0
    for s in st.consume:
        status = s.status
        if status is SEALED:
            end, seg_last = s.end, s.last_seq
        else:
            group = ends.get(s.gid)
            if group is None:
                return None, None
            found = group.ends.get((st.queue, s.seg))
            if found is not None:
                end = int(found.end)
                seg_last = int(found.last_seq) if found.last_seq >= 0 and end > 0 else None
            elif status is OPEN or group.included:
                end, seg_last = 0, None
            else:
                extent = reader.extent(st.queue, s)
                end, seg_last = extent.end, extent.last_seq
        if end is None:
            return None, None
        stored += end
        if seg_last is not None and seg_last > last:
            last = seg_last
    return last, stored


Row = TypeVar("Row")
# (state, subscriptions' names or None, last readable seq, stored messages) -> a row
RowOf = Callable[[QueueState, "list[str] | None", "int | None", "int | None"], Row]


def sealing_of(states: Iterable[QueueState]) -> dict[str, list[tuple[str, int]]]:
    """gid -> the segments of ``states`` sealing on it, for every group holding a segment of
    them not sealed (the groups ``open_ends`` asks)."""
    sealing: dict[str, list[tuple[str, int]]] = {}
    for st in states:
        for s in st.consume:
            if s.status is not SEALED:
                asked = sealing.setdefault(s.gid, [])
                if s.status is SegStatus.SEALING:
                    asked.append((st.queue, s.seg))
    return sealing


def list_rows(store: ZkStore, reader: ReplicaReader, names: Sequence[str], known: Known | None,
              row_of: RowOf[Row], phases: Phases | None = None) -> tuple[list[Row], list[str]]:
    """The rows of ``queue list`` for ``names``, in that order (``row_of`` makes a row: a dict,
    or its JSON text), and the lines of queues whose state does not parse; ``phases``: timed.

    First the rows of the queues the copy holds (``known``); then the copy is asked again for
    the others, and only those it still lacks are read from ZooKeeper, in one pipelined pass
    (with their subscriptions' names while few are). Why (issue 43): 15 s after a group's
    failure at 10^5 queues, reading the states the copy lacked took 2.4-9.8 s from a busy
    ZooKeeper; the copy re-reads them meanwhile (scale43n's run 1: 12,088 lacked, 1,000 known
    2.5 s later; ``known_queues`` logs why it lacks them). The queues taken late get their
    groups asked only for what the first answers could not name (a group not asked, a sealing
    segment not asked about)."""
    have: dict[str, KnownQueue] = dict(known(names)) if known is not None else {}
    with_subs = len(to_read(names, have, True)) <= SUBS_READ_LIMIT
    later = set(to_read(names, have, with_subs))
    if phases is not None:
        phases.done("the copy's states", copy=len(have) - len(later & set(have)))
    sealing = sealing_of(st for q, (st, _, _) in have.items() if q not in later)
    ends = open_ends(store, reader, sealing)
    rows = {q: row_of(st, subs, *readable_of(st, ends, reader)) for q, (st, _, subs) in have.items()
            if q not in later}
    if phases is not None:
        phases.done("open ends and their rows", groups=len(ends))
    corrupt: list[str] = []
    if later:
        if known is not None:
            have.update(known(sorted(later)))
        reading = to_read(sorted(later), have, with_subs)
        if phases is not None:
            phases.done("the copy asked again", copy_later=len(later) - len(reading))
        corrupt = take_read(have, store.load_states(reading, with_subs=with_subs))
        if phases is not None:
            phases.done("states read", read=len(reading))
        fresh = [q for q in later if q in have]
        more = {}
        for gid, asked in sealing_of(have[q][0] for q in fresh).items():
            if gid not in sealing or not set(asked) <= set(sealing[gid]):
                more[gid] = asked
        for gid, answer in open_ends(store, reader, more).items():
            before = ends.get(gid)  # the second answer is the later: it wins
            ends[gid] = answer if before is None else GroupEnds({**before.ends, **answer.ends},
                                                               before.included and answer.included)
        for q in fresh:
            st, _, subs = have[q]
            rows[q] = row_of(st, subs, *readable_of(st, ends, reader))
        if phases is not None:
            phases.done("their rows", groups_asked_again=len(more))
    return [rows[q] for q in names if q in rows], corrupt
