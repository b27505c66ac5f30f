"""What the elected coordinator daemon knows of the cluster, kept current by ZooKeeper watches,
so that a round costs what changed and not the number of queues (issue 29).

Guarantee: a queue whose state, settings or (while its head segment is sealed) subscription
cursors change, or whose group's liveness or drain mark changes, is marked dirty and handed to
the next round, which re-reads exactly the parts that changed. Nothing here decides anything:
the daemon plans on these copies with the pure ``duties.plan``, and every change it makes is a
conditional write (``ZkStore.apply``), so a copy that is stale only costs a lost CAS.

How (one-shot ZooKeeper watches, re-armed by the read that follows them):
- ``<root>/queues``: a child watch; a create or delete re-lists the names (at most once a round).
- each queue's config node and ``state`` node: a data watch, set by the read of it.
- each queue's ``subs`` children and cursors: watched only while its head segment is sealed (a
  pop or retention candidate); otherwise cursors decide nothing and are not read at all.
- ``<root>/groups``, each group's config (its drain mark) and its ``live`` children: a change
  re-reads the few group nodes and marks dirty every queue that uses a group that changed.
Watch callbacks run on kazoo's event thread and only mark (under a lock) and wake the daemon.
The reads and their watches go on the session the view is given: the daemon's watch session,
not the one that holds its leadership (``CoordinatorDaemon``'s ``watch_store`` says why).
Reads of many queues are sent together and then awaited (kazoo pipelines them on one
connection), ``READ_SLICE`` queues at a time, so a first load of 10,000 queues is 40 slices of
reads in flight, not 10,000 round trips; between two slices ``refresh`` calls its ``pause``
(the daemon's: wait while this process's coordinator service answers a producer's FailOver,
``coordinator/pacing.py``), so such a load never holds the GIL for seconds on end.

Rules: I/O (kazoo) and bookkeeping only; no policy. ``mark_all`` is the safety net the daemon
calls on a slow timer: should a watch ever be missed, a queue is re-read within that period.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType

from ordq.common.errors import CorruptState, OrdqError
from ordq.coordinator.pacing import in_slices
from ordq.coordinator.paths import ROLES
from ordq.coordinator.state import Cursor, Facts, QueueState, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import WrittenStates
from ordq.coordinator.store_values import LiveInfo, QueueConfig, StateVersion, json_value, live_info, parse_state

log = logging.getLogger("ordq.coordinator")
STATE, CONFIG, SUBS = "state", "config", "subs"
# Queues whose reads are in flight at once (see the module doc). Why 250: a slice's answers
# take this process ~30-50 ms of CPU (parsing states; more on a loaded box), the longest a
# producer's FailOver waits behind them; and 40 slices cost 10,000 queues 40 round trips.
READ_SLICE = 250


@attrs.define
class QueueEntry:
    """One queue as last read (with the watches those reads set)."""

    state: QueueState | None = None
    version: int = -1
    deletions: int = 0  # the deletion count read before the state (``StateVersion``)
    config: QueueConfig | None = None
    cursors: dict[str, Cursor] | None = None  # None: not read (the head segment is not sealed)
    stale: set[str] = attrs.field(factory=lambda: {STATE, CONFIG})
    # parts the sweep asks to read again (``sweep_share``): no sign of a change, so the copy is
    # still used meanwhile (``known_state``), unlike a stale part
    recheck: set[str] = attrs.field(factory=set)
    problem: BaseException | None = None  # why the state could not be used (CorruptState...)

    @property
    def at(self) -> StateVersion:
        """The version a write planned on this copy checks."""
        return StateVersion(self.version, self.deletions)


def known_state(entry: QueueEntry, mine: tuple[QueueState, StateVersion] | None
                ) -> tuple[QueueState, StateVersion] | None:
    """The queue's state and version as ZooKeeper holds them, if this process knows them: its
    copy when read and unchanged since, or ``mine`` (``store_base.WrittenStates``: what this
    process wrote) when written after the copy was read in this term; else None (not read yet,
    unusable, or changed by another writer and not read again).

    Why a write of this process counts: the elected coordinator is the one writer of the
    states, so what it wrote last is what ZooKeeper holds; its own writes (a dead group's
    moves, a returning group's ~33,000 admits at 10^5) fire the watches that make the copies
    stale. Not before this term's view read it: a write of an earlier term of this process
    may have been overtaken by another leader's. A creation of this process (version 0) is
    of this term (``WrittenStates`` keeps creations only while leading) and is taken while the
    copy has read nothing newer, taken unread included (``take_written``): at 10^5 queues a
    verdict took 17,621 creations unread, and a listing 15 s later read 10,247 of them from
    ZooKeeper, 15.0 s of its 25.1 s (scale43o, run 1). Either may be of a queue deleted since,
    and a write planned on it then fails its check (``StateVersion``)."""
    if mine is not None and ((entry.version >= 0 and mine[1].znode > entry.version)
                             or (mine[1].znode == 0 and entry.version <= 0)):
        return mine
    if entry.state is None or entry.problem is not None or STATE in entry.stale:
        return None
    return entry.state, entry.at


def latest_state(entry: QueueEntry, mine: tuple[QueueState, StateVersion] | None
                 ) -> tuple[QueueState, StateVersion] | None:
    """``known_state``, else the copy as last read even if a watch said it changed since (None
    when it has none, or it is unusable): for a write checked against that version, which a
    state changed by another writer fails (a lost CAS), as a dead group's moves are.

    Why this process's later writes first (issue 43): the moves planned on the view's copies
    alone, and a copy older than what this process wrote since (a spread pass's moves of the
    first names, 14-44 s before a verdict at 10^5 queues, not read back yet) failed its check;
    a move transaction of 200 with more such queues than its attempts was left whole (scale43r)."""
    known = known_state(entry, mine)
    if known is None and entry.state is not None and entry.problem is None:
        return entry.state, entry.at
    return known


class DaemonView:
    """The daemon's copy of queue and group records; ``refresh()`` brings the dirty ones up to
    date and returns them. Made per leadership term; ``close()`` silences its watches."""

    def __init__(self, store: ZkStore, wake: Callable[[], None], *, written: WrittenStates | None = None) -> None:
        """``store``: the session the reads and their watches go on; ``written``: what this
        process wrote and created (default: ``store``'s), which the view may take for a read."""
        self.store = store
        self.written = written if written is not None else store.written
        self._wake = wake
        self._lock = threading.Lock()
        self._closed = False
        self.entries: dict[str, QueueEntry] = {}
        self._dirty: set[str] = set()
        self._due: list[tuple[float, str]] = []  # (monotonic deadline, queue): a duty's timer
        self._queues_stale = True
        self._groups_stale = True
        self._rewatch = False  # the connection dropped: every queue's watches are gone (``_on_queue_node``)
        self.live: frozenset[str] = frozenset()
        self.drained: frozenset[str] = frozenset()
        self.disk_full: frozenset[str] = frozenset()  # groups a live process of which says its disk is full
        self.group_versions: dict[str, int] = {}
        self.masters: dict[str, str] = {}  # gid -> its live master's address (groups with both live)
        self.members: dict[str, dict[str, LiveInfo]] = {}  # gid -> role -> liveness node, of every live process
        self.reads = 0  # ZooKeeper reads sent (statistics, tests)
        self.queue_events = 0  # watches of a queue's nodes that fired (statistics: the moves' log line)
        self.list_changes = 0  # times the queue list was read (queues created or deleted)
        self.taken_unread = 0  # unread queues ``read_unread`` took as this process wrote them (statistics)
        # One more each time what ``known_state`` makes of the copies may have changed: a queue
        # listed or dropped, a state (or settings) watch fired, a state read at a new version,
        # taken unread, or found unusable. A spread pass that found the heads even is not run
        # again while it stays put (``daemon_spread``); the sweep's re-reads of unchanged
        # states do not move it.
        self.copy_changes = 0
        self._root = store.paths.queues + "/"
        # the sweep, a share each round (``sweep_share``)
        self._sweep_at: float | None = None
        self._sweep_order: list[str] = []
        self._sweep_pos = 0
        self._sweep_carry = 0.0
        self.sweep_passes = 0  # full passes begun after the first

    # -- watches (kazoo's event thread: mark and wake, nothing else) ---------------------------

    def _on_queues(self, _event: Any) -> None:
        with self._lock:
            self._queues_stale = True
        self._poke()

    def _on_groups(self, _event: Any) -> None:
        with self._lock:
            self._groups_stale = True
        self._poke()

    def _on_queue_node(self, event: Any) -> None:
        path = getattr(event, "path", "") or ""
        if getattr(event, "type", None) == EventType.NONE:
            # The connection dropped (the session kept): ZooKeeper forgot this connection's
            # watches, and kazoo fires each one so, once, with no path, and sets none again
            # (it sends no SetWatches). Every queue is read (and watched) again next round;
            # before (until 2026-11-30) such an event was ignored, and a change went unseen
            # until the sweep reached its queue: minutes at 10^5 queues. One flag, however
            # many watches fire (one callback per watched node).
            with self._lock:
                self._rewatch = True
            self._poke()
            return
        if not path.startswith(self._root):
            return
        parts = path[len(self._root):].split("/")
        part = CONFIG if len(parts) == 1 else STATE if parts[1] == STATE else SUBS
        with self._lock:
            self.queue_events += 1
            entry = self.entries.get(parts[0])
            if entry is None:
                return
            entry.stale.add(part)
            self._dirty.add(parts[0])
            if part != SUBS:  # (a cursor's change: no state's)
                self.copy_changes += 1
        self._poke()

    def _poke(self) -> None:
        if not self._closed:
            self._wake()

    def close(self) -> None:
        self._closed = True

    # -- what the daemon asks ------------------------------------------------------------------

    def mark_all(self) -> None:
        """The safety net: every queue and group is read again in the next round."""
        with self._lock:
            self._queues_stale = self._groups_stale = True
            self.copy_changes += 1
            for queue, entry in self.entries.items():
                entry.stale |= {STATE, CONFIG, SUBS}
                self._dirty.add(queue)

    def sweep_share(self, now: float, period_s: float, max_per_s: float) -> int:
        """The safety net spread over time: mark the next share of the queues (in name order,
        round and round) to be read again and planned, so that every queue is read once per
        ``period_s``, or at ``max_per_s`` queues a second when that is slower; the groups and
        the queue list too, once per pass. Returns how many it marked.

        Why a share each round, not ``mark_all`` once per period (until 2026-11-30): at 10^5
        queues reading every one is ~200,000 reads, ~3 min of the leader at ~1,000 reads/s; a
        kill during it waited for all of it, and the leader lost its ZooKeeper session
        (docs/BENCHMARKS.md, "10^5 queues on one cluster").

        The share is marked to be read again (``recheck``), not stale: nothing says it changed,
        so a listing and a spread pass keep using its copies until the read (scale43n: at 10^5
        queues the share after a 65 s round, ~12,900 queues, was read by a listing from
        ZooKeeper, 9.8 s, and held the spread back as "being read")."""
        with self._lock:
            if self._sweep_at is None:
                self._sweep_at = now
                return 0
            elapsed = max(0.0, now - self._sweep_at)
            self._sweep_at = now
            n = len(self.entries)
            share = min(n * elapsed / period_s, max_per_s * elapsed) + self._sweep_carry
            k = min(int(share), n)
            self._sweep_carry = share - k if k < n else 0.0
            for _ in range(k):
                if self._sweep_pos >= len(self._sweep_order):
                    if self._sweep_order:
                        self.sweep_passes += 1
                    self._sweep_order, self._sweep_pos = sorted(self.entries), 0
                    self._queues_stale = self._groups_stale = True
                q = self._sweep_order[self._sweep_pos]
                self._sweep_pos += 1
                entry = self.entries.get(q)
                if entry is not None:
                    entry.recheck |= {STATE, CONFIG, SUBS}
                    self._dirty.add(q)
            return k

    def mark(self, queues: Iterable[str]) -> None:
        """Plan these queues again next round (their copies are kept)."""
        with self._lock:
            self._dirty.update(q for q in queues if q in self.entries)

    def reread(self, queues: Iterable[str]) -> None:
        """Read these queues' states again and plan them next round (a batched write of them
        did not land: a copy may be stale, and no watch may fire)."""
        with self._lock:
            for queue in queues:
                entry = self.entries.get(queue)
                if entry is not None:
                    entry.stale.add(STATE)
                    self._dirty.add(queue)

    def schedule(self, queue: str, at: float) -> None:
        """Plan ``queue`` again once ``time.monotonic()`` reaches ``at`` (a duty's timer)."""
        with self._lock:
            heapq.heappush(self._due, (at, queue))

    def next_due(self) -> float | None:
        with self._lock:
            return self._due[0][0] if self._due else None

    @property
    def writable(self) -> frozenset[str]:
        """Groups that may take writes: both processes live, not drained, with disk space."""
        return self.live - self.drained - self.disk_full

    def facts(self, entry: QueueEntry, state: QueueState | None = None) -> Facts:
        """What a plan of ``state`` (default: the copy's) needs beside it: its groups' liveness
        and drain marks, the cursors as last read."""
        state = state if state is not None else entry.state
        assert state is not None
        groups = set(state.groups)
        return Facts(live_groups=self.live & groups, cursors=dict(entry.cursors or {}),
                     drained=self.drained & groups, disk_full=self.disk_full & groups)

    def refresh(self, now: float, pause: Callable[[], object] | None = None) -> list[str]:
        """Re-read what changed; return the queues to plan this round (dirty or due), sorted.
        ``pause``: called between two slices of reads (``READ_SLICE``). CoordinationUnavailable
        (ZooKeeper gone): what was not read stays marked."""
        with self._lock:
            rewatch, self._rewatch = self._rewatch, False
        if rewatch:
            self.mark_all()
            started, reads = time.monotonic(), self.reads
        self._reread_if_stale("_queues_stale", self._read_queue_list)
        self._reread_if_stale("_groups_stale", self._read_groups)
        with self._lock:
            todo = set(self._dirty)
            self._dirty.clear()
            while self._due and self._due[0][0] <= now:
                todo.add(heapq.heappop(self._due)[1])
            todo = {q for q in todo if q in self.entries}  # not a set of every queue: O(changed)
        try:
            for part in in_slices(sorted(todo), READ_SLICE, pause):
                self._read_queues(part)
        except BaseException:
            self.mark(todo)
            raise
        if rewatch:
            # (the time includes what ``pause`` did between the slices: moves, spreads)
            log.warning("the view's ZooKeeper connection dropped, its watches gone: %d queues read again "
                        "(%d reads) in %.1f s", len(todo), self.reads - reads, time.monotonic() - started)
        return sorted(q for q in todo if q in self.entries)

    def refresh_groups(self) -> None:
        """Read the groups again if their watch fired (a process came or went): between two
        slices of a long re-read, so a dead group is seen without waiting for all of it."""
        self._reread_if_stale("_groups_stale", self._read_groups)

    def read_unread(self, pause: Callable[[], object] | None = None) -> list[str]:
        """Read the queue list again if its watch fired, then every listed queue never read yet
        (``READ_SLICE`` queues at a time, ``pause`` between slices), except those this process
        created (or wrote): their state is taken as this process last wrote it
        (``WrittenStates.created``, ``note``), unread;
        the queues read or taken (they stay marked for the next round, which reads them). Once
        a group is judged dead: every queue it heads is then known (``daemon_away``). Only
        their states: the rest is read by the next round's refresh (half the reads, while a
        dead group's queues wait).

        Why a creation is taken unread (issue 43): at 10^5 queues, a kill 5 s after the mass
        creation left 7,600-12,800 of them unread at the verdict, read in 14-18 s beside the
        seals (scale43k). Safe for the moves planned on it: a state changed since (by another
        leader, or a producer's FailOver) only loses the move's version check (CAS), and the
        queue is read and planned again. A listing takes it as this process's creation
        (``known_state``); its STATE part stays stale, read by the next round."""
        self._reread_if_stale("_queues_stale", self._read_queue_list)
        with self._lock:
            unread = sorted(q for q, e in self.entries.items() if e.state is None and STATE in e.stale)
        self.take_written()
        to_read = [q for q in unread if (e := self.entries.get(q)) is not None and e.state is None]
        for part in in_slices(to_read, READ_SLICE, pause):
            self._read_queues(part, frozenset({STATE}))
        return unread

    def take_written(self) -> list[str]:
        """Without a read: give every queue the copy lacks the state this process created or
        wrote (``WrittenStates``), as ``read_unread`` says, unread (its STATE part stays stale:
        the next round reads it; a listing takes it as this process's creation); and add the
        queues this process created since the queue list was last read. The queues taken.

        Why at a verdict, before the moves (issue 43): taken after the known heads moved, with
        the queue list read again first, the leader's own creations moved in a second pass
        0.2-3.0 s later (2.9 s re-reading the 100,000 names; scale43l). A creation is listed
        once that list is read; one deleted meanwhile is dropped from the copy then (or by the
        read that finds no node), and its move loses its version check."""
        creations = self.written.creations()
        taken: list[str] = []
        with self._lock:
            for q, e in self.entries.items():
                if e.state is None and STATE in e.stale and (mine := self.written.get(q)) is not None:
                    e.state, e.version, e.deletions, e.problem = mine[0], mine[1].znode, mine[1].deletions, None
                    taken.append(q)
            for q, (st, at) in creations.items():
                if q not in self.entries:
                    self.entries[q] = QueueEntry(state=st, version=at.znode, deletions=at.deletions)
                    self._dirty.add(q)  # read (and watched) by the next round
                    taken.append(q)
            self.taken_unread += len(taken)
            if taken:
                self.copy_changes += 1
        return taken

    def _reread_if_stale(self, flag: str, read: Callable[[], None]) -> None:
        """Run ``read`` when the watch set ``flag``; a read that fails leaves it set (next round)."""
        with self._lock:
            stale = bool(getattr(self, flag))
            setattr(self, flag, False)
        if not stale:
            return
        try:
            read()
        except BaseException:
            setattr(self, flag, True)
            raise

    # -- reads ---------------------------------------------------------------------------------

    def _get(self, request: Any) -> Any:
        self.reads += 1
        return self.store._wait(request)

    def _read_queue_list(self) -> None:
        store = self.store
        with store._errors():
            try:
                names = set(self._get(store.client.get_children_async(store.paths.queues, watch=self._on_queues)))
            except NoNodeError:
                store.client.ensure_path(store.paths.queues)
                names = set(self._get(store.client.get_children_async(store.paths.queues, watch=self._on_queues)))
        with self._lock:
            gone, new = set(self.entries) - names, names - set(self.entries)
            for q in gone:
                del self.entries[q]
            for q in new:
                self.entries[q] = QueueEntry()
                self._dirty.add(q)
            self.list_changes += 1
            if gone or new:
                self.copy_changes += 1

    def _read_groups(self) -> None:
        """Every group's drain mark and live roles; queues of a group that changed get dirty."""
        store, p = self.store, self.store.paths
        with store._errors():
            try:
                gids = sorted(self._get(store.client.get_children_async(p.groups, watch=self._on_groups)))
            except NoNodeError:
                gids = []
            configs = {g: store.client.get_async(p.group(g), watch=self._on_groups) for g in gids}
            lives = {g: store.client.get_children_async(p.live(g), watch=self._on_groups) for g in gids}
            live, drained, versions = set(), set(), {}
            roles_of: dict[str, set[str]] = {}
            for g in gids:
                try:
                    data, stat = self._get(configs[g])
                except NoNodeError:
                    continue
                versions[g] = stat.version
                if json_value(data).get("drained"):
                    drained.add(g)
                try:
                    roles = set(self._get(lives[g]))
                except NoNodeError:
                    # ZooKeeper sets no child watch on a missing node: watch for its creation
                    # (``group add`` writes the group, then its live folder), else the group's
                    # processes registering later would go unseen until the sweep.
                    if self._get(store.client.exists_async(p.live(g), watch=self._on_groups)) is not None:
                        self._on_groups(None)  # created meanwhile: read the groups again
                    roles = set()
                roles_of[g] = roles & set(ROLES)
                if set(ROLES) <= roles:
                    live.add(g)
            # every live process's node (seals ask the replicas at these addresses), watched: a
            # broker rewrites its own when its disk runs out of space or has room again
            nodes = {(g, role): store.client.get_async(p.live(g, role), watch=self._on_groups) for g in gids
                     for role in sorted(roles_of.get(g, set()))}
            members: dict[str, dict[str, LiveInfo]] = {}
            for (g, role), request in nodes.items():
                try:
                    data, _ = self._get(request)
                except NoNodeError:
                    continue  # gone meanwhile: its children watch fired, read again next round
                members.setdefault(g, {})[role] = live_info(json_value(data))
            masters = {g: members[g]["master"].address for g in sorted(live) if "master" in members.get(g, {})}
            full = {g for g, roles in members.items() if any(info.disk_full for info in roles.values())}
        changed = (set(live) ^ set(self.live)) | (drained ^ set(self.drained)) | (full ^ set(self.disk_full)) | {
            g for g in set(masters) | set(self.masters) if masters.get(g) != self.masters.get(g)}
        self.live, self.drained, self.disk_full, self.group_versions, self.masters, self.members = (
            frozenset(live), frozenset(drained), frozenset(full), versions, masters, members)
        if changed:
            with self._lock:
                self._dirty.update(q for q, e in self.entries.items()
                                   if e.state is None or changed & set(e.state.groups))

    def _read_queues(self, queues: Sequence[str], only: frozenset[str] = frozenset({STATE, CONFIG, SUBS})) -> None:
        """Send every stale part's read at once (each re-arming its watch), then take answers.
        ``only``: those parts (the others stay stale, read by a later refresh)."""
        store, p = self.store, self.store.paths
        with self._lock:
            # (a queue deleted since it was listed is gone from the copy: the list is read again
            # between the slices of a long re-read, ``read_unread``)
            wanted = {q: (self.entries[q].stale | self.entries[q].recheck) & only
                      for q in queues if q in self.entries}
            for q, reading in wanted.items():
                self.entries[q].stale -= reading
                self.entries[q].recheck -= reading
        with store._errors():
            # sent first, so read before every state below (``StateVersion``)
            deletions = store._ask_deletions() if any(STATE in parts for parts in wanted.values()) else None
            sent: dict[tuple[str, str], Any] = {}
            for q, parts in wanted.items():
                if STATE in parts:
                    sent[(q, STATE)] = store.client.get_async(p.state(q), watch=self._on_queue_node)
                if CONFIG in parts:
                    sent[(q, CONFIG)] = store.client.get_async(p.queue(q), watch=self._on_queue_node)
            try:
                deleted_before = 0
                if deletions is not None:
                    self.reads += 1
                    deleted_before = store._deletions(deletions)
                for (q, part), request in sent.items():
                    self._take(q, part, request, deleted_before)
            except BaseException:
                with self._lock:  # what was not taken is read again next time
                    for q, parts in wanted.items():
                        if q in self.entries:
                            self.entries[q].stale |= parts
                raise
            cursors_of: list[str] = []
            for q, parts in wanted.items():
                entry = self.entries.get(q)
                if entry is None or entry.state is None:
                    continue
                head = entry.state.consume[0] if entry.state.consume else None
                if head is None or head.status is not SegStatus.SEALED:
                    entry.cursors = None  # a later fire of an old watch just marks it dirty once
                elif entry.cursors is None or SUBS in parts or STATE in parts:
                    # read after the state copy: a subscription created up to that version is
                    # in it (create_subscription writes the state in its transaction), so "no
                    # subscription" holds for that version (a pop of a segment sealed empty
                    # is written against it, coordinator/daemon_round.py); the subs watch may
                    # not have fired yet when the state's did
                    cursors_of.append(q)
            self._read_cursors(cursors_of)

    def _take(self, queue: str, part: str, request: Any, deletions: int) -> None:
        entry = self.entries.get(queue)
        try:
            data, stat = self._get(request)
        except NoNodeError:
            with self._lock:
                if self.entries.pop(queue, None) is not None:  # deleted: the queue list's watch says so too
                    self.copy_changes += 1
            return
        if entry is None:
            return
        was = (entry.version, entry.deletions, entry.state is None, entry.problem)
        if part == STATE:
            self.written.seen(queue, StateVersion(stat.version, deletions))
            entry.deletions = deletions
            try:
                entry.state, entry.version, entry.problem = parse_state(queue, data), stat.version, None
            except CorruptState as exc:
                entry.state, entry.problem = None, exc
        else:
            try:
                entry.config = QueueConfig(**json_value(data))
            except (OrdqError, TypeError, ValueError) as exc:
                entry.config, entry.problem = None, exc
        if (entry.version, entry.deletions, entry.state is None, entry.problem) != was:
            with self._lock:
                self.copy_changes += 1

    def _read_cursors(self, queues: Sequence[str]) -> None:
        """The cursors of ``queues`` (each re-arming its watches), every read of a kind sent
        before the first answer is awaited: the subscriptions' names of all, then their cursors.

        Why (issue 43): after a dead group's 33,333 segments were sealed at 10^5 queues, each
        queue's head is sealed and its cursors are read (a pop candidate); one queue after
        another, each a round trip, none of their pops was written within ~170 s (scale43h)."""
        store, p = self.store, self.store.paths
        children = {q: store.client.get_children_async(p.subs(q), watch=self._on_queue_node) for q in queues}
        names: dict[str, list[str]] = {}
        for q, request in children.items():
            try:
                names[q] = self._get(request)
            except NoNodeError:
                names[q] = []
        sent = {(q, sub): store.client.get_async(p.sub(q, sub), watch=self._on_queue_node)
                for q, subs in names.items() for sub in subs}
        cursors: dict[str, dict[str, Cursor]] = {q: {} for q in names}
        for (q, sub), request in sent.items():
            try:
                data, _ = self._get(request)
            except NoNodeError:
                continue  # deleted meanwhile
            cursors[q][sub] = Cursor.from_dict(json_value(data))
        for q, found in cursors.items():
            entry = self.entries.get(q)
            if entry is not None:
                entry.cursors = found
