"""What every part of one broker process shares (broker_group/service.py wires the parts):
its configuration and counters, the segments it holds, the one lock that guards them, its
event loop and its ZooKeeper session.

Rules: shared state is guarded by ``cv`` (never waited on in the loop); ``changed()`` wakes
thread and loop waiters alike; ``lac_moved(segments)`` (a LAC moved, the most frequent
change) wakes them too, but of the waiters on one segment's LAC (readers, produce streams
owed acks) only those of the segments named. A segment's log file has its own ``io_lock``
(held across a sync, never together with ``cv`` waiting on it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import attrs

from ordq.broker_group import log as seglog
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.disk_room import DiskRoom
from ordq.broker_group.first_write import FirstWrite
from ordq.broker_group.replica import SegmentReplica
from ordq.broker_group.synced_watch import SyncedWatches
from ordq.common.errors import BrokerUnavailable, CorruptLog, OrdqError
from ordq.common.loop import LoopThread, Signal
from ordq.coordinator.store import ZkStore
from ordq.wire import ordq_pb2 as pb


@attrs.frozen
class SessionView:
    """What the session guard knows (``session_doubt``)."""

    silent_since: float | None  # ZooKeeper silent since (connection SUSPENDED or LOST)
    lost: bool  # the session expired and liveness is not registered again
    quorum_heard_at: float | None  # the last answered quorum probe was sent then
    timeout_s: float  # the session timeout


def session_doubt(now: float, v: SessionView) -> tuple[str | None, float | None]:
    """The session guard (DESIGN §6): why a master must take no write now (None: it may), and
    since when it has been in doubt. In doubt: the session lost; ZooKeeper silent for more
    than a third of the session (kazoo suspends a connection after two thirds of silence, so
    by then the session may be about to expire and a successor be made); or the quorum not
    heard for more than half a session. The last one covers a server cut from its ensemble:
    it keeps answering this broker's pings for up to syncLimit x tickTime while the leader,
    which no longer hears of this session, expires it after one session timeout. A quorum
    probe (a ``sync``, which goes through the leader) answered proves the session alive when
    it was sent, so it cannot expire before that time + the timeout."""
    if v.lost:
        return "the ZooKeeper session expired (liveness not registered again yet)", v.silent_since
    doubts: list[tuple[float, str]] = []
    if v.silent_since is not None and now - v.silent_since > v.timeout_s / 3:
        doubts.append((v.silent_since, f"ZooKeeper silent for {now - v.silent_since:.1f} s "
                                       "(the session may have expired)"))
    if v.quorum_heard_at is not None and now - v.quorum_heard_at > v.timeout_s / 2:
        doubts.append((v.quorum_heard_at + v.timeout_s / 2,
                       f"ZooKeeper's quorum not heard for {now - v.quorum_heard_at:.1f} s (the server "
                       "this broker talks to may be cut from its ensemble: the session may have expired)"))
    if not doubts:
        return None, None
    since, why = min(doubts)
    return why, since


def doubt_wait_until(now: float, v: SessionView, waiting_since: float) -> float:
    """Until when (monotonic) a write that began waiting at ``waiting_since`` may wait for a
    doubt (``session_doubt``) to clear before it is refused: two sessions after the doubt
    began; and, while kazoo is connected (only the quorum unheard) or the session is lost (its
    liveness being registered again), at least one session after the write began waiting. Why:
    after a quorum loss longer than two sessions the doubt began long ago, and a write that
    reached this master as the quorum came back was refused at once, before the next probe
    (every eighth of a session) could answer, or 137 ms before its liveness was registered
    again: its producer failed over a second time (default tier, test_failover_infra, quorum
    lost 7.5 s; stops 62 and 83). For liveness only: a write is taken only once the doubt
    clears. (The segments a master held when its session expired are frozen then and refused
    at once: ``WritePath.confirm_session``.)"""
    since = session_doubt(now, v)[1]
    until = (since if since is not None else 0.0) + 2 * v.timeout_s
    if v.silent_since is None or v.lost:
        until = max(until, waiting_since + v.timeout_s)
    return until


@attrs.define(eq=False)
class Segment:
    """One (queue, seg) on this replica: decisions in ``replica``, bytes in ``log``."""

    replica: SegmentReplica
    directory: Path
    log: seglog.SegmentLog | None  # None while corrupt (not served)
    corrupt: CorruptLog | None = None
    pending: list[bytes] = attrs.field(factory=list)  # accepted, not yet appended to the log
    syncing: int = 0  # commits under way (appended or being synced, verdict not yet known)
    io_lock: threading.Lock = attrs.field(factory=threading.Lock)
    reconciled: bool = False  # matches ZooKeeper's sealed end (or nothing to reconcile yet)
    # Sealed empty with no folder: a record in the data folder's book (broker_group/sealed_book.py)
    # is all this replica keeps of it; its ``log`` is ``SegmentLog.absent``. The queue's
    # incarnation the record names; None: the segment has its folder.
    recorded: str | None = None
    first_write_ms: int = 0  # master: wall clock of the first batch it accepted (0: none yet)
    # The timing of the first write that created this segment here (first_write.py), until reported
    first_write: FirstWrite | None = None
    # Fired when its LAC moves (``Shared.lac_moved``): the produce streams owed its acks wait on
    # ``ack_signal``, its readers' long polls on ``lac_signal``. Made by the first that waits
    # (``Shared.segment_signals``); None: nobody waited yet.
    ack_signal: Signal | None = None
    lac_signal: Signal | None = None
    # Master: fired when this copy's own synced end moves (``WritePath.commit``), for the produce
    # streams whose acks say "synced here" (``ProduceStreamState.local_acks``). Made by the
    # first such stream that waits; None: no such stream waited, and a sync wakes nobody.
    synced_signal: Signal | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica.queue, self.replica.seg)

    def settled(self) -> bool:
        """Everything accepted so far has reached a commit's verdict (synced or dropped)."""
        return not self.pending and self.syncing == 0

    def end(self) -> pb.SegmentEnd:
        r = self.replica
        return pb.SegmentEnd(
            end=r.local_synced,
            first_seq=-1 if r.first_seq is None or r.local_synced == 0 else r.first_seq,
            last_seq=-1 if r.last_seq is None or r.local_synced == 0 else r.last_seq,
            sealed=r.sealed, fenced_epoch=r.fenced_epoch,
            bytes=self.log.synced_bytes if self.log is not None else 0, first_write_ms=self.first_write_ms,
            acked_bytes=self.log.bytes_before(r.lac) if self.log is not None else 0,
            # Why: a master restarted (or whose disk or slave stream failed) never writes this
            # segment again; the coordinator reads this to roll it with no producer around.
            frozen=not r.writable,
        )


@attrs.define
class BrokerStats:
    batches_in: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    duplicates: int = 0
    syncs: int = 0
    # Group commits made on the event loop: a lone small request's (a synchronous send's), with
    # no hand-off to a sync thread (write_path.py LOOP_SYNC_BYTES); the rest are the threads'
    loop_commits: int = 0
    slow_syncs: int = 0  # group commits over loop_sync.SLOW_SYNC_S: the loop commits none for a while
    batches_synced: int = 0
    acks: int = 0
    synced_watches: int = 0  # slave: producers' watches of a synced end served (synced_watch.py)
    # Stream messages written per kind (issue 39: each costs its loop a write): produce answers
    # (each carries every ack one LAC move released), master -> slave requests (batches, LACs),
    # the slave's answers and the requests with batches they answered.
    ack_writes: int = 0
    # A produce stream's handler woke (a LAC move of the segment of its first ack owed, its own
    # new batches, a broker-wide change, or its recheck); woke at its recheck with acks due
    # (a wake-up missed: 0 expected)
    produce_wakeups: int = 0
    produce_late_acks: int = 0
    replication_requests: int = 0
    replication_answers: int = 0
    replication_answered: int = 0
    fetches: int = 0
    # A waiting reader (a Fetch long poll, a Read stream's) woke: a LAC of its segment moved, a
    # broker-wide change (``Shared.changed``), or its deadline came (issue 39: it woke at every
    # LAC move of every queue on the broker)
    read_wakeups: int = 0
    # ZooKeeper reads of a segment's state for a reader of a segment this replica holds no copy
    # of (``ReadPath._fetch_absent``; one a second at most per segment open here and not written)
    absent_state_reads: int = 0
    read_link_streams: int = 0  # Read streams served on the lean link (broker_group/lean_produce.py)
    fetch_batches: int = 0
    fetch_messages: int = 0
    fetch_bytes: int = 0
    replication_breaks: int = 0
    replication_link_fallbacks: int = 0  # the slave's lean link could not be opened: gRPC instead
    torn_bytes_truncated: int = 0
    corrupt_segments: int = 0
    corrupt_reads: int = 0  # sealed copies found corrupt by a read (set aside, repaired from the peer)
    reconciled: int = 0
    held_back: int = 0  # produce requests that waited for syncs (max_inflight_bytes)
    refused_too_large: int = 0  # batches holding a message over the queue's max_message_bytes
    # produce requests that found ZooKeeper silent past a third of the session, waited, and were
    # taken once kazoo reconnected on the same session (the session guard; refusals: ``refused``)
    session_confirmed: int = 0
    # SealMany calls answered, segments they sealed, and the file system syncs that made them
    # durable (two a call with syncfs: ``durable.DurableBatch``; issue 43)
    seal_many_calls: int = 0
    seal_many_segments: int = 0
    seal_many_syncs: int = 0
    # calls refused because their token held max_calls_per_token open already (token_calls.py)
    token_calls_refused: int = 0
    refused: dict[str, int] = attrs.field(factory=dict)  # requests refused, by error kind (metrics)


class Shared:
    """The state the parts of one broker share, and the lock guarding it."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.incarnation = uuid.uuid4().hex[:12]
        self.address = ""  # set once the server is bound
        self.stats = BrokerStats()
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        self.segments: dict[tuple[str, int], Segment] = {}
        self.stopping = False
        # The loop every call runs on, and the signal its waiters wake on (ordq/common/loop.py):
        # fired at every change; readers and produce streams wait on ``changes`` and their
        # segment's ``lac_signal`` instead.
        self.loop = LoopThread("ordq-loop", workers=config.rpc_workers)
        self.signal = Signal(self.loop)
        # Every change but a LAC's move (``lac_moved``), which wakes only the waiters on its
        # segment. Issue 39: every reader and produce stream woke at every LAC move of every
        # queue (hundreds a second each, beside a producer at 2,000 msgs/s).
        self.changes = Signal(self.loop)
        self.store: ZkStore | None = None
        # The session free_space's state watches live on (``watch_store``); None: ``store``.
        self.watch_session: ZkStore | None = None
        # The session guard (DESIGN §6): since when this broker has not heard from ZooKeeper
        # (its connection SUSPENDED or its session LOST; None while connected and registered).
        self.zk_silent_since: float | None = None
        self.zk_session_lost = False  # the session expired and liveness is not registered again
        # When the last quorum probe that came back was sent (QuorumProbe; None: no probe yet)
        self.quorum_heard_at: float | None = None
        self.session_waiting = 0  # produce requests waiting for ZooKeeper to confirm the session
        # Slave: producers' watches of their segments' synced ends (synced_watch.py; on the loop)
        self.synced_watches = SyncedWatches()
        # Whether this broker's disk is full, said in its liveness node (disk_room.py)
        self.disk_room = DiskRoom(config.data_dir, config.disk_room_bytes, self._mark_disk_full)

    def session_doubtful(self, now: float) -> str | None:
        """Why a master must take no write now, or None (``session_doubt``)."""
        return session_doubt(now, self._session_view())[0]

    def session_wait_until(self, waiting_since: float) -> float:
        """Until when (monotonic) a doubtful master may wait for kazoo to resume its session,
        or the quorum to answer again, before it refuses a write begun waiting at
        ``waiting_since`` (``doubt_wait_until``). kazoo reconnects at once and waits up to a
        session for ZooKeeper's answer (one server; then again after at most a quarter of a
        session, ``coordinator/store_base.new_client``), so two sessions cover two attempts
        answered late. Measured at load 18-28 with 1 s sessions (the README's cluster, issue
        26): 25 suspensions, each resumed on the same session after 0.09-1.25 s (median 0.52).
        The bound is for liveness only: a write is taken after the wait only once kazoo resumed
        the same session, which ZooKeeper does only while it holds it, and the quorum answered."""
        return doubt_wait_until(time.monotonic(), self._session_view(), waiting_since)

    def quorum_heard(self, asked_at: float) -> None:
        """The quorum answered a probe sent at ``asked_at`` (``QuorumProbe``): wake writes
        waiting on a doubt it clears."""
        with self.cv:
            was = self.session_doubtful(time.monotonic())
            self.quorum_heard_at = max(asked_at, self.quorum_heard_at or asked_at)
            if was is not None:
                self.changed()

    def _session_view(self) -> SessionView:
        return SessionView(silent_since=self.zk_silent_since, lost=self.zk_session_lost,
                           quorum_heard_at=self.quorum_heard_at, timeout_s=self.config.zk_session_timeout_s)

    def changed(self) -> None:
        """Caller holds cv: state changed; wake every waiter (threads on ``cv``, the loop's
        tasks on ``signal`` and ``changes``)."""
        self.cv.notify_all()
        self.signal.fire()
        self.changes.fire()

    def lac_moved(self, segments: Iterable[Segment]) -> None:
        """Caller holds cv: the LAC of ``segments`` moved (and nothing else a reader waits for
        changed: a seal, a removal, a corrupt copy or a stop go through ``changed``); wake
        every waiter but those on other segments' LACs. The produce streams owed acks first:
        the loop runs woken waiters in the order they were woken, and a reader woken ahead
        of them read and sent its answer (~0.1 ms) before the ack went (issue 39: a
        synchronous send waits for that ack, a steady producer's next batch behind it)."""
        self.cv.notify_all()
        for s in segments:
            if s.ack_signal is not None:
                s.ack_signal.fire()
        for s in segments:
            if s.lac_signal is not None:
                s.lac_signal.fire()
        self.signal.fire()

    def segment_signals(self, s: Segment, *, acks: bool | str = False) -> tuple[Signal, Signal]:
        """Caller holds cv: what a waiter on ``s``'s LAC waits on (with ``Alarm.wait``): ``s``'s
        own signal, for its acks (a produce stream: ``acks``; ``acks="local"``: one whose acks
        wait for this copy's sync alone) or its readers (made here the first time: under cv, so
        no move is missed between a waiter's check and its wait), and the broker-wide
        ``changes``."""
        if acks == "local":
            if s.synced_signal is None:
                s.synced_signal = Signal(self.loop)
            return s.synced_signal, self.changes
        if acks:
            if s.ack_signal is None:
                s.ack_signal = Signal(self.loop)
            return s.ack_signal, self.changes
        if s.lac_signal is None:
            s.lac_signal = Signal(self.loop)
        return s.lac_signal, self.changes

    def _mark_disk_full(self, full: bool) -> bool:
        """DiskRoom's mark in this process's liveness node."""
        cfg = self.config
        return self.require_store().set_disk_full(cfg.gid, cfg.role.value, self.incarnation, full)

    def require_store(self) -> ZkStore:
        if self.store is None:
            raise BrokerUnavailable(self.address, "not started")
        return self.store

    def watch_store(self) -> ZkStore:
        """Where reads that leave a watch on a queue's state go: a session of their own once
        started (``Broker.start``, WATCH_SESSION_S), else the broker's one."""
        return self.watch_session if self.watch_session is not None else self.require_store()

    def count_refused(self, exc: OrdqError) -> None:
        with self.cv:
            self.stats.refused[type(exc).__name__] = self.stats.refused.get(type(exc).__name__, 0) + 1

    def settle(self, s: Segment) -> None:
        """Caller holds cv: wait until every accepted batch of ``s`` was synced or dropped."""
        while not s.settled():
            self.cv.wait(0.5)
