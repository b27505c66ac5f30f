"""The segments one broker holds: its data folder, recovery at start, creating and dropping
segments, and which segment a write, a control call or the slave's stream may use.

Guarantees (DESIGN §4): a segment held open before a restart is never appended to again; a
copy is created only where ZooKeeper places the segment on this group; a replica on a new
disk never answers for a segment opened before its folder existed (``vouches_for_absent``).
Fence and seal state is persisted (``write_meta``) before it is acted on.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kazoo.protocol.states import EventType

from ordq.broker_group import log as seglog
from ordq.broker_group.durable import DurableBatch
from ordq.broker_group.file_removal import remove_tree
from ordq.broker_group.first_write import FirstWrite
from ordq.broker_group.replica import SegmentReplica
from ordq.broker_group.sealed_book import Record, SealedBook
from ordq.broker_group.shared import Segment, Shared
from ordq.common.errors import (
    BrokerUnavailable,
    ConfigError,
    CorruptLog,
    CorruptState,
    OrdqError,
    QueueNotFound,
    SegmentNotFound,
)
from ordq.coordinator.state import QueueState, SegStatus
from ordq.wire.errors import SegmentNotWritable

log = logging.getLogger("ordq.broker")

META_FILE = "meta.json"
FOLDER_FILE = "folder.json"  # the data folder's birth record (see SegmentStore.load_folder)
INCARNATION_FILE = "incarnation"  # in a queue's folder: which creation of the queue its segments belong to


# Every queue folder is looked at again this often although no watch fired, and at once after
# the watches were lost: a dropped connection or a lost session (kazoo then fires each watch
# once with no path: ``_on_state``). Freeing a popped segment's files late costs nothing but the
# disk space meanwhile; a scan reads every folder's state (at 10^5 queues ~33,000 reads a
# broker: once a minute, until 2026-11-30, ~3,300 reads/s from six brokers, by count).
FULL_SCAN_S = 600.0
# Queue folders whose states ``free_space`` reads at once (pipelined on one connection).
FREE_READ_SLICE = 500
# Queue folders a repair round's ``free_space`` looks at, at most; the rest wait, in name order,
# for the next rounds (a round a second). Why (issue 43): after its master's return at 10^5
# queues a slave looked at ~33,334 folders in one go (the coordinator's 33,333 admits each fired
# a state watch; a blip that drops every watch asks for a full scan): about half a core for
# ~60 s on ZooKeeper reads, and a ZooKeeper stall meeting it lost the slave its 1 s session
# (scale43h; scale43i's py-spy). A popped segment's files then go up to ~30 s later: disk
# space only. A start looks at every folder before it serves (no bound).
FREE_PER_ROUND = 1_000


def take_share(pending: set[str], limit: int | None) -> list[str]:
    """Remove from ``pending`` and return (in name order) its first ``limit`` names, every one
    when ``limit`` is None. Pure: ``free_space``'s bound on the work of one round."""
    names = sorted(pending)
    if limit is not None:
        names = names[:max(0, limit)]
    pending.difference_update(names)
    return names


class SegmentStore:
    """The segments in ``shared.segments``: found on disk, created, dropped, looked up."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        # Per queue, the first segment opened after this data folder was created; the queues
        # whose older segments of this group still need copying from the peer (a new disk).
        self.born_at: dict[str, int] = {}
        self.refill: set[str] = set()
        # Held while a queue's folder changes hands between incarnations or loses segments,
        # so a segment of a re-created queue is never removed as the deleted queue's.
        self._folder_lock = threading.Lock()
        # free_space looks again only at the queues whose state changed (a ZooKeeper data watch
        # on each queue it holds files of, re-armed by that look) or that it never looked at,
        # and at every folder every FULL_SCAN_S: an idle queue costs no read a round (issue 29).
        self._watched: set[str] = set()
        self._changed: set[str] = set()
        self._changed_lock = threading.Lock()
        self._next_full_scan = 0.0
        self._pending: set[str] = set()  # queues to look at, beyond the last round's share
        # Queues whose folder a ``DurableBatch`` claims (its incarnation file written, not yet
        # committed), with how many batches do: a segment created meanwhile the one-by-one way
        # writes the claim durably itself instead of trusting a file not yet synced.
        self._claiming: dict[str, int] = {}
        self._batch_ids = itertools.count(1)
        # Folders set aside by ``free_space`` (renamed, no longer served), with what they held
        # and why they go: their files are removed by ``finish_removals`` (the repair thread),
        # not before the broker serves (issue 43: a start at 10^5 queues removed ~17,500 popped
        # segments' folders one fsync at a time for 2.5 minutes before it served).
        self._set_aside: list[tuple[Path, str, str]] = []
        self._set_aside_lock = threading.Lock()

    @functools.cached_property
    def book(self) -> SealedBook:
        """Segments sealed empty that this replica never held: a record each, no folder (issue 43)."""
        return SealedBook(self.shared.config.data_dir)

    def load_folder(self) -> None:
        """Read (or write, for a new folder) the data folder's birth record.

        A folder that is empty when first seen (a new broker, or a replaced disk) records, per
        queue, the next segment ZooKeeper will open. Of a segment below that mark it holds no
        copy, and it cannot tell what was acked there: it must not answer Fence or Seal for it
        (``end 0`` would cut off acked messages), and it copies the sealed ones from its peer
        (broker_group/repair.py, ``_refill_round``). A folder that already holds segments but
        no record predates the record: it has seen every segment of its group."""
        cfg = self.shared.config
        path = cfg.data_dir / FOLDER_FILE
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            born: dict[str, int] = {}
            if not any(p.is_dir() for p in cfg.data_dir.iterdir()):
                store = self.shared.require_store()
                for queue in store.list_queues():
                    try:
                        born[queue] = store.load_state(queue)[0].next_seg
                    except QueueNotFound:
                        continue  # deleted meanwhile
            record = {"created": time.time(), "born_at": born}
            write_json_durably(path, record)
            if any(born.values()):
                log.warning("new data folder for a group with history: segments below %s are copied from the peer "
                            "and not vouched for here", born)
        except ValueError as exc:
            raise ConfigError(f"unreadable {path}: {exc} (it says which segments this folder can vouch for; "
                              "restore it, or empty the folder to start this replica afresh)") from exc
        self.born_at = {q: int(n) for q, n in record.get("born_at", {}).items()}
        self.refill = {q for q, n in self.born_at.items() if n > 0}

    def vouches_for_absent(self, queue: str, seg: int) -> bool:
        """Can this replica say "nothing acked" of a segment it holds no copy of? Only when
        its data folder existed before the segment was opened: every ack needs its sync."""
        return seg >= self.born_at.get(queue, 0)

    def recover(self) -> None:
        """Open every segment on disk. Torn tails are truncated (and counted); a corrupt middle
        batch takes that segment out of service; anything not sealed here is never written
        again (its peer may hold synced batches this copy lost). What a removal cut short left
        (``REMOVING`` folders) is never opened: it joins the folders set aside, removed once the
        broker serves (issue 43: a start after ``ordq down`` at 10^5 queues removed 2,389 and
        6,961 such folders, one after another, before it served)."""
        # Every queue folder's name durable once: from here on a new segment syncs only its
        # own folder and its queue's (``create``), a new queue folder the data folder.
        seglog.sync_dir(self.shared.config.data_dir)
        recorded = self._load_book()
        for qdir in sorted(p for p in self.shared.config.data_dir.iterdir() if p.is_dir()):
            if qdir.name.endswith(REMOVING):  # what a removal cut short left: removed once serving
                self._leftover(qdir, f"queue folder {qdir.name}")
                continue
            entries = list(qdir.iterdir())
            for p in entries:
                if p.name.startswith(INCARNATION_FILE + ".tmp"):  # a claim a killed SealMany never committed
                    p.unlink(missing_ok=True)
                elif p.name.endswith(REMOVING) and p.is_dir():
                    self._leftover(p, f"segment folder {qdir.name}/{p.name}")
            for sdir in sorted(p for p in entries if p.name.isdigit() and p.is_dir()):
                queue, seg = qdir.name, int(sdir.name)
                meta = read_meta(sdir)
                # A record says sealed too: a folder made after it (``materialize``) may have
                # been cut short before its meta file said so.
                replica = SegmentReplica(queue, seg, self.shared.config.role,
                                         fenced_epoch=meta.get("fenced_epoch", 0),
                                         sealed=bool(meta.get("sealed", False)) or (queue, seg) in recorded)
                segment = Segment(replica=replica, directory=sdir, log=None)
                try:
                    lg = self._open_found(queue, seg)
                except CorruptLog as exc:
                    log.error("segment %s/%d is corrupt and will not be served: %s", queue, seg, exc)
                    segment.corrupt = exc
                    self.shared.stats.corrupt_segments += 1
                    replica.freeze("corrupt log")
                else:
                    segment.log = lg
                    self.shared.stats.torn_bytes_truncated += lg.recovery.truncated_bytes
                    if lg.recovery.truncated_bytes:
                        log.warning("segment %s/%d: truncated a torn tail of %d bytes", queue, seg,
                                    lg.recovery.truncated_bytes)
                    replica.restored(end=lg.synced_end, first_seq=lg.first_seq, last_seq=lg.last_seq)
                replica.freeze("held open before this broker restarted")
                self.shared.segments[segment.key] = segment
                if replica.sealed:
                    park(segment)
        for key, r in recorded.items():
            if key not in self.shared.segments:
                self.shared.segments[key] = self._recorded_segment(r)

    def _load_book(self) -> dict[tuple[str, int], Record]:
        """The book's records that still count: not those of a deleted queue whose name a new
        queue's folder took since (its incarnation differs; the file keeps them until it is
        compacted), which must never seal that queue's segments."""
        out: dict[tuple[str, int], Record] = {}
        stale: list[tuple[str, int]] = []
        folders: dict[str, str | None] = {}
        for r in self.book.load():
            if r.queue not in folders:
                folders[r.queue] = _folder_incarnation(self.shared.config.data_dir / r.queue)
            if folders[r.queue] not in (None, r.incarnation):
                stale.append(r.key)
            else:
                out[r.key] = r
        self.book.forget(stale)
        return out

    def _recorded_segment(self, r: Record) -> Segment:
        """A segment sealed empty that has no folder, only its record (``sealed_book.py``)."""
        replica = SegmentReplica(r.queue, r.seg, self.shared.config.role, fenced_epoch=0, sealed=True)
        replica.restored(end=0, first_seq=None, last_seq=None)
        data_dir = self.shared.config.data_dir
        return Segment(replica=replica, directory=seglog.segment_dir(data_dir, r.queue, r.seg),
                       log=seglog.SegmentLog.absent(data_dir, r.queue, r.seg), recorded=r.incarnation)

    def _open_found(self, queue: str, seg: int) -> seglog.SegmentLog:
        """The log of a segment folder found at start. A folder without its log is a creation
        cut short (the process was killed between the two): it holds nothing, and is opened as
        the empty log it would have had a moment later (then frozen like every segment held
        open before a restart), not a reason to refuse to start. Only an empty folder is
        one: the log is created before anything else in it, so a folder holding other files
        (``meta.json``) had a log that is gone, and an empty copy of it could let a seal with
        its peer away cut acked batches off; that start still fails (SegmentNotFound)."""
        try:
            return seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg)
        except SegmentNotFound:
            if any(seglog.segment_dir(self.shared.config.data_dir, queue, seg).iterdir()):
                raise
            log.warning("segment %s/%d: its folder has no log (its creation was cut short); recovered empty",
                        queue, seg)
            return seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg, create=True)

    def create(self, queue: str, seg: int, fenced_epoch: int, *, state: QueueState | None = None,
               timing: FirstWrite | None = None) -> Segment:
        """A new, empty, writable segment (or the one another thread created meanwhile).
        ``state``: the queue's state just read from ZooKeeper, if the caller has it (one read
        less on a new segment's first write: the failover path). ``timing``: the first
        write's record, given the durations of the steps here (``state``, ``files``)."""
        with self.shared.cv:
            existing = self.shared.segments.get((queue, seg))
            if existing is not None:
                return existing
        directory = seglog.segment_dir(self.shared.config.data_dir, queue, seg)
        with self._folder_lock:
            with self.shared.cv:  # made meanwhile (``create_for_seal`` registers before it syncs)
                existing = self.shared.segments.get((queue, seg))
            if existing is not None:
                return existing
            if state is None:
                state = self._read_state(queue, timing)
            started = time.monotonic()
            self._claim_queue_folder(queue, state)
            made = seglog.private_dir(directory)
            lg = seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg, create=True, sync_dirs=False)
        replica = SegmentReplica(queue, seg, self.shared.config.role, fenced_epoch=fenced_epoch)
        segment = Segment(replica=replica, directory=directory, log=lg)
        # The log's and the meta file's names made durable by one sync of the new folder (and
        # one of the queue's folder for the new folder's name), not one for each file: on a
        # busy disk every fsync of a folder waits for a journal commit (failover path).
        write_meta(segment, sync_dir=False)
        seglog.sync_new_names(directory, made)
        if timing is not None:
            timing.step("files", time.monotonic() - started)
        with self.shared.cv:
            existing = self.shared.segments.setdefault((queue, seg), segment)
            self.shared.changed()  # a fetch may be waiting for it
        if existing is not segment:
            lg.close()
        return existing

    def _read_state(self, queue: str, timing: FirstWrite | None) -> QueueState:
        """The queue's state from ZooKeeper now; ``timing``: a first write, given the read's
        duration as its ``state`` step."""
        started = time.monotonic()
        st, _ = self.shared.require_store().load_state(queue)
        if timing is not None:
            timing.step("state", time.monotonic() - started)
        return st

    def _claim_queue_folder(self, queue: str, st: QueueState, batch: DurableBatch | None = None) -> None:
        """Before a new segment of ``queue`` is stored: the queue's folder belongs to the
        incarnation ZooKeeper shows (``st``; files of a deleted queue of the same name go
        first). Caller holds ``_folder_lock``. ``batch``: the claim is written there, durable
        once the caller commits it (``create_for_seal``); else durable before this returns."""
        qdir = self.shared.config.data_dir / queue
        if self.book.has_other(queue, st.incarnation):
            self._drop_other_records(queue, st.incarnation)
        held = _folder_incarnation(qdir)
        if held == st.incarnation and queue not in self._claiming:
            return
        if held is not None and held != st.incarnation:
            self.drop_segments(queue, lambda seg: True, "an earlier queue of the same name was deleted")
        made = seglog.private_dir(qdir)
        if batch is not None:
            # A name of its own for the batch's temporary file: the one-by-one way below may
            # write the claim meanwhile (under the folder lock, which the batch's commit is not).
            batch.write(qdir / INCARNATION_FILE, json.dumps(st.incarnation).encode(), tmp_suffix=f".tmp{batch.id}")
            for m in made:
                batch.created(m)
            self._claiming[queue] = self._claiming.get(queue, 0) + 1
            batch.after(lambda: self._claimed(queue))
            return
        write_json_durably(qdir / INCARNATION_FILE, st.incarnation)
        # The queue folder's own name (a segment's creation syncs only the queue's folder)
        seglog.sync_dir(self.shared.config.data_dir)

    def _claimed(self, queue: str) -> None:
        with self._folder_lock:
            left = self._claiming.get(queue, 0) - 1
            if left > 0:
                self._claiming[queue] = left
            else:
                self._claiming.pop(queue, None)

    def new_batch(self) -> DurableBatch:
        """A ``DurableBatch`` over this broker's data folder."""
        return DurableBatch(self.shared.config.data_dir, use_syncfs=self.shared.config.seal_syncfs,
                            batch_id=next(self._batch_ids))

    def for_control_many(self, refs: Sequence[tuple[str, int]], batch: DurableBatch
                         ) -> dict[tuple[str, int], Segment | OrdqError]:
        """``for_control`` of many segments (SealMany, issue 43), the error of each that has
        none. Those this broker holds no copy of are read from ZooKeeper in one pipelined pass
        (``load_states``) and created empty, their files durable only once the caller commits
        ``batch`` (which it does before answering anything about them)."""
        out: dict[tuple[str, int], Segment | OrdqError] = {}
        missing: list[tuple[str, int]] = []
        with self.shared.cv:
            for key in refs:
                s = self.shared.segments.get(key)
                if s is not None:
                    out[key] = s
                else:
                    missing.append(key)
        if not missing:
            return out
        states = self.shared.require_store().load_states(sorted({q for q, _ in missing}))
        for queue, seg in missing:
            got = states.get(queue)
            if got is None:
                out[(queue, seg)] = QueueNotFound(queue)
                continue
            if isinstance(got, CorruptState):
                out[(queue, seg)] = got
                continue
            st = got[0]
            z = st.segment(seg)
            if z is None or z.gid != self.shared.config.gid:
                out[(queue, seg)] = SegmentNotFound(queue, seg)
            elif not self.vouches_for_absent(queue, seg):
                out[(queue, seg)] = BrokerUnavailable(
                    self.shared.address, f"holds no copy of {queue}/{seg}, which was opened before this broker's "
                    "data folder existed (a new disk): it cannot tell what was acked there; ask its peer")
            elif self._may_record(queue, st):
                out[(queue, seg)] = self._record(queue, seg, st)
            else:
                try:
                    out[(queue, seg)] = self._create_in_batch(queue, seg, st, batch)
                except OSError as exc:
                    out[(queue, seg)] = OrdqError(f"{queue}/{seg} not created: {exc}")
        return out

    def _may_record(self, queue: str, st: QueueState) -> bool:
        """Can a segment of ``queue`` this replica never held be kept as a record (no folder)?
        Not while files or records of another incarnation of the queue are here: those go first,
        the one-by-one way (``_claim_queue_folder``)."""
        if self.book.has_other(queue, st.incarnation):
            return False
        held = _folder_incarnation(self.shared.config.data_dir / queue)
        return held is None or held == st.incarnation

    def _record(self, queue: str, seg: int, st: QueueState) -> Segment:
        """A segment this replica never held, registered to be sealed empty with a record and no
        folder: answered for only once the caller's ``book_seals`` made the record durable."""
        with self._folder_lock, self.shared.cv:
            existing = self.shared.segments.get((queue, seg))
            if existing is not None:
                return existing
            data_dir = self.shared.config.data_dir
            segment = Segment(replica=SegmentReplica(queue, seg, self.shared.config.role, fenced_epoch=0),
                              directory=seglog.segment_dir(data_dir, queue, seg),
                              log=seglog.SegmentLog.absent(data_dir, queue, seg), recorded=st.incarnation)
            self.shared.segments[(queue, seg)] = segment
            self.shared.changed()
        return segment

    def _drop_other_records(self, queue: str, incarnation: str, among: Iterable[int] | None = None) -> None:
        """Drop the segments of ``queue`` kept as records of another incarnation than
        ``incarnation`` (a deleted queue's of the same name), in memory and in the book; never
        one with a folder (those follow the queue folder's claim) nor one of this incarnation."""
        def other(seg: int) -> bool:
            s = self.shared.segments.get((queue, seg))  # under the lock drop_segments holds
            return s is not None and s.recorded is not None and s.recorded != incarnation

        self.drop_segments(queue, other, "an earlier queue of the same name was deleted", among=among)
        self.book.forget_other(queue, incarnation)

    def book_seals(self, segments: Sequence[Segment]) -> int:
        """The records of these segments (sealed empty, no folder) durable: one append, one
        sync (``SealedBook.append``); raises OSError when not. Returns the syncs it made."""
        before = self.book.syncs
        self.book.append([Record(*s.key, s.recorded) for s in segments if s.recorded is not None])
        return self.book.syncs - before

    def write_meta(self, s: Segment) -> None:
        """``write_meta``, for a segment kept as a record too: one sealed, empty and never fenced
        is all its record says already; otherwise its folder is made first (``materialize``)."""
        if s.recorded is not None:
            with self.shared.cv:
                said = s.replica.sealed and s.replica.local_synced == 0 and s.replica.fenced_epoch == 0
            if said:
                return
            self.materialize(s)
            return
        write_meta(s)

    def materialize(self, s: Segment) -> None:
        """Give a segment kept as a record its folder, log and meta file (durable before this
        returns): a copy from the peer (its sealed end is past 0) or a fence needs them. Its
        record stays until the segment goes; a folder found at start with a record is sealed."""
        queue, seg = s.key
        with self._folder_lock:
            if s.recorded is None:
                return
            st = self._read_state(queue, None)
            if st.incarnation != s.recorded:
                raise SegmentNotFound(queue, seg)
            self._claim_queue_folder(queue, st)
            made = seglog.private_dir(s.directory)
            lg = seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg, create=True, sync_dirs=False)
            with s.io_lock:
                s.log = lg
            write_meta(s, sync_dir=False)
            seglog.sync_new_names(s.directory, made)
            s.recorded = None

    def _create_in_batch(self, queue: str, seg: int, st: QueueState, batch: DurableBatch) -> Segment:
        """``create(queue, seg, 0)`` whose files become durable with ``batch``: registered at
        once (so a Replicate or a Fence meanwhile finds this copy, and nothing else creates its
        files), answered for only after the commit."""
        directory = seglog.segment_dir(self.shared.config.data_dir, queue, seg)
        with self._folder_lock:
            with self.shared.cv:
                existing = self.shared.segments.get((queue, seg))
            if existing is not None:
                return existing
            self._claim_queue_folder(queue, st, batch)
            made = seglog.private_dir(directory)
            lg = seglog.SegmentLog.open(self.shared.config.data_dir, queue, seg, create=True, sync_dirs=False)
            batch.created(directory / seglog.SEGMENT_FILE)
            for m in made:
                batch.created(m)
            segment = Segment(replica=SegmentReplica(queue, seg, self.shared.config.role, fenced_epoch=0),
                              directory=directory, log=lg)
            with self.shared.cv:
                self.shared.segments[(queue, seg)] = segment
                self.shared.changed()
        return segment

    def free_space(self, limit: int | None = None) -> None:
        """Set aside the files of every segment no queue needs any more: popped from its consume
        list (read by every subscription, or dropped by retention), or of a deleted queue. Each
        is out of the map and renamed out of the way at once (a re-created queue's new folder
        never meets it); ``finish_removals`` removes the files later. ``limit``: at most this
        many queues looked at (``FREE_PER_ROUND``), the others kept for the next calls."""
        data_dir = self.shared.config.data_dir
        # Which segments each queue holds, from one pass over the map (issue 43: a pass over
        # the whole map per queue cost a start at 10^5 queues ~33,000 x ~40,000 steps, about a
        # minute, before it served). A segment made after this pass is one the queue needs (a
        # new one, or a copy of one in its consume list): left for a later look, never dropped.
        held: dict[str, list[int]] = {}
        with self.shared.cv:
            for queue, seg in self.shared.segments:
                held.setdefault(queue, []).append(seg)
        now = time.monotonic()
        if now >= self._next_full_scan:
            self._next_full_scan = now + FULL_SCAN_S
            with self._changed_lock:
                self._changed.clear()
            self._pending |= {p.name for p in data_dir.iterdir() if _is_queue_folder(p)} | held.keys()
        else:
            with self._changed_lock:
                changed, self._changed = self._changed, set()
            self._pending |= changed | (held.keys() - self._watched)
        names = [q for q in take_share(self._pending, limit) if q in held or _is_queue_folder(data_dir / q)]
        store = self.shared.watch_store()
        for i in range(0, len(names), FREE_READ_SLICE):
            part = names[i:i + FREE_READ_SLICE]
            # The states of a slice read pipelined (issue 43: one read after another, a start at
            # 10^5 queues spent minutes here before it served). A state read a moment before the
            # folder's lock is safe: segments only ever leave the list, so an older list keeps
            # more, never less; a deleted queue stays deleted.
            read = store.load_states(part, watch=self._on_state)
            for name in part:
                self._free_queue(data_dir, name, read.get(name), held.get(name, []))
        self.book.compact()

    def _free_queue(self, data_dir: Path, name: str,
                    got: tuple[QueueState, object, list[str] | None] | CorruptState | None, held: list[int]) -> None:
        """Free one queue's folder by ``got``, its state read a moment ago (None: no such queue);
        ``held``: the segments of it this broker held a moment ago (those popped are among them).
        Used as read only when it is of the folder's own incarnation; otherwise (the queue
        deleted, re-created, unreadable, or a folder without its record) read again now, under
        the folder's lock, as before: a re-created queue's new folder must never be taken for
        the old one's."""
        qdir = data_dir / name
        with self._folder_lock:
            held_incarnation = _folder_incarnation(qdir)
            # a queue kept here only as records (no folder): their incarnation tells the same
            known_incarnation = held_incarnation if held_incarnation is not None else self.book.incarnation(name)
            if not (isinstance(got, tuple) and known_incarnation is not None
                    and known_incarnation == got[0].incarnation):
                try:
                    got = (self.shared.watch_store().load_state(name, watch=self._on_state)[0], 0, None)
                except QueueNotFound:
                    got = None
                except CorruptState as exc:
                    got = exc
            if isinstance(got, CorruptState):  # that queue's problem: keep its files, free the others'
                log.warning("not freeing space of %s: %s", name, got)
                return
            st: QueueState | None = None if got is None else got[0]
            if st is None:
                self._watched.discard(name)
            else:
                self._watched.add(name)
            if st is None or (held_incarnation is not None and held_incarnation != st.incarnation):
                self.drop_segments(name, lambda seg: True, "its queue was deleted", later=True)
                self._put_aside(qdir, f"queue folder {name}", "its queue was deleted")
                return
            self._drop_other_records(name, st.incarnation, among=held)
            # popped (below the head) or a segment sealed empty dropped from the middle
            # (state.drop_empty): below next_seg and no longer in the consume list
            kept = {s.seg for s in st.consume}
            nxt = st.next_seg
            self.drop_segments(name, lambda seg: seg < nxt and seg not in kept,
                               "read by every subscription, past retention, or sealed empty", later=True, among=held)

    def _on_state(self, event: Any) -> None:
        """A held queue's state changed or went (kazoo's event thread): look again next round.
        No path (the connection dropped or the session was lost, and the watches with it):
        look at every folder next round."""
        if getattr(event, "type", None) == EventType.NONE:
            self._next_full_scan = 0.0
            return
        parts = str(getattr(event, "path", "")).rsplit("/", 2)
        if len(parts) == 3:
            with self._changed_lock:
                self._changed.add(parts[1])

    def drop_segments(self, queue: str, which: Callable[[int], bool], why: str, *, later: bool = False,
                      among: Iterable[int] | None = None) -> None:
        """Stop serving the segments of ``queue`` that ``which`` picks and remove their folders;
        ``later``: only renamed out of the way now, their files removed by ``finish_removals``;
        ``among``: only these segments are looked at (else every one held)."""
        with self.shared.cv:
            if among is None:
                gone = [s for (q, seg), s in self.shared.segments.items() if q == queue and which(seg)]
            else:
                gone = [s for seg in among if which(seg) and (s := self.shared.segments.get((queue, seg))) is not None]
            for s in gone:
                del self.shared.segments[s.key]
        self.book.forget(s.key for s in gone)  # a record, if any (a folder made after it keeps it)
        for s in gone:
            with s.io_lock:
                if s.log is not None:
                    s.log.close()
                if s.recorded is None and later:
                    self._put_aside(s.directory, f"segment {queue}/{s.key[1]}", why)
                elif s.recorded is None:
                    remove_folder(s.directory)
            if not later or s.recorded is not None:  # no folder: gone with its record now
                log.info("segment %s/%d removed: %s", queue, s.key[1], why)

    def _put_aside(self, path: Path, what: str, why: str) -> None:
        doomed = set_aside(path)
        if doomed is not None:
            with self._set_aside_lock:
                self._set_aside.append((doomed, what, why))

    def _leftover(self, doomed: Path, what: str) -> None:
        """A folder a removal renamed aside (``remove_folder``, ``set_aside``) and a kill or a
        stop left before its files were gone: removed with the others (``finish_removals``)."""
        with self._set_aside_lock:
            self._set_aside.append((doomed, what, "left by a removal cut short"))

    def set_aside_count(self) -> int:
        """Folders set aside whose files are not removed yet."""
        with self._set_aside_lock:
            return len(self._set_aside)

    def finish_removals(self) -> int:
        """Remove the files of the folders ``free_space`` set aside: each folder that held one
        synced once (so the renames are durable before any file goes: a crash never leaves a
        segment folder with its meta file and no log), then the files, shrunk in steps so that
        the disk keeps serving the syncs meanwhile (file_removal.py). Returns how many; a stop
        on the way leaves the rest set aside for the next start."""
        with self._set_aside_lock:
            todo, self._set_aside = self._set_aside, []
        if not todo:
            return 0
        started = time.monotonic()
        for parent in sorted({doomed.parent for doomed, _, _ in todo}):
            with contextlib.suppress(FileNotFoundError):  # itself set aside meanwhile (a deleted queue)
                seglog.sync_dir(parent)
        done = 0
        for doomed, what, why in todo:
            if not remove_tree(doomed, stopping=lambda: self.shared.stopping):
                break
            log.info("%s removed: %s", what, why)
            done += 1
        if done > 1:
            log.info("%d folders set aside removed in %.1f s", done, time.monotonic() - started)
        return done

    def zk_segment(self, queue: str, seg: int) -> tuple[Any, int]:
        """(the ZooKeeper view of the segment or None, the queue's producer epoch)."""
        st, _ = self.shared.require_store().load_state(queue)
        return st.segment(seg), st.producer_epoch

    def for_write(self, queue: str, seg: int, epoch: int, *, state: QueueState | None = None,
                  timing: FirstWrite | None = None, placed: Callable[[], None] | None = None) -> Segment:
        """Master: the segment a producer writes; created only if ZooKeeper says it is this
        group's open segment, fenced at the queue's current epoch (so a stale producer that
        never saw the takeover cannot write to a segment opened after it). ``state``: the
        queue's state the caller just read (else read here); ``placed()`` is called once
        ZooKeeper's placement is checked, before the segment is created."""
        with self.shared.cv:
            s = self.shared.segments.get((queue, seg))
        if s is not None:
            return s
        st = state if state is not None else self._read_state(queue, timing)
        z = st.segment(seg)
        if z is None or z.gid != self.shared.config.gid or z.status is not SegStatus.OPEN:
            raise SegmentNotWritable(self.shared.address, queue, seg, "not this group's open segment in ZooKeeper")
        if placed is not None:
            placed()
        s = self.create(queue, seg, st.producer_epoch, state=st, timing=timing)
        with self.shared.cv:
            s.replica.check_epoch(epoch)
        return s

    def for_control(self, queue: str, seg: int, *, to_copy: bool = False) -> Segment:
        """Fence/Seal/Reconcile target: created empty when ZooKeeper places it on this group
        but nothing was ever written here. Without a copy of a segment opened before this
        data folder existed, only a copy into it (``to_copy``) is allowed: Fence and Seal get
        BrokerUnavailable, so the Seal protocol decides from the peer (or waits for it)."""
        with self.shared.cv:
            s = self.shared.segments.get((queue, seg))
        if s is not None:
            return s
        z, _ = self.zk_segment(queue, seg)
        if z is None or z.gid != self.shared.config.gid:
            raise SegmentNotFound(queue, seg)
        if not to_copy and not self.vouches_for_absent(queue, seg):
            raise BrokerUnavailable(
                self.shared.address, f"holds no copy of {queue}/{seg}, which was opened before this broker's data "
                "folder existed (a new disk): it cannot tell what was acked there; ask its peer")
        return self.create(queue, seg, 0)

    def for_replica(self, queue: str, seg: int, timing: FirstWrite | None = None) -> Segment:
        with self.shared.cv:
            s = self.shared.segments.get((queue, seg))
        return s if s is not None else self.create(queue, seg, 0, timing=timing)


def park(s: Segment) -> None:
    """Close a sealed segment's file until it is next read (``SegmentLog.park``): a broker
    holds no file descriptor for a segment nobody reads (issue 29)."""
    with s.io_lock:
        if s.log is not None and s.replica.sealed:
            s.log.park()


def read_meta(directory: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((directory / META_FILE).read_text()))
    except FileNotFoundError:
        return {}
    except ValueError:
        log.warning("unreadable %s in %s: treating the segment as not sealed", META_FILE, directory)
        return {}


# One meta write at a time: concurrent Fence/Seal calls on a segment (a producer's seal and a
# consumer's at once) shared the tmp file, and the second rename failed (FileNotFoundError).
# One lock per segment folder (a fence and a seal of one segment write its meta file in turn;
# different segments' writes may sync at once: SealMany, issue 43). Weak: a segment's lock goes
# with the last writer holding it.
_META_LOCKS: weakref.WeakValueDictionary[Path, threading.Lock] = weakref.WeakValueDictionary()
_META_LOCKS_GUARD = threading.Lock()


def _meta_lock(directory: Path) -> threading.Lock:
    with _META_LOCKS_GUARD:
        lock = _META_LOCKS.get(directory)
        if lock is None:
            lock = _META_LOCKS[directory] = threading.Lock()
        return lock


def _meta(s: Segment) -> dict[str, Any]:
    r = s.replica
    return {"fenced_epoch": r.fenced_epoch, "sealed": r.sealed, "sealed_end": r.sealed_end}


def write_meta(s: Segment, *, sync_dir: bool = True) -> None:
    """Persist fence and seal state (atomic rename, synced) before they are acted on.
    ``sync_dir`` False: the caller syncs the segment's folder (the new name) itself."""
    with _meta_lock(s.directory):  # the state is read under it too, so the last write holds the latest
        write_json_durably(s.directory / META_FILE, _meta(s), sync_dir=sync_dir)


@contextlib.contextmanager
def meta_locks(segments: Iterable[Segment]) -> Iterator[None]:
    """Hold the meta locks of many segments (in one order: two callers never deadlock)."""
    with contextlib.ExitStack() as stack:
        for directory in sorted({s.directory for s in segments}):
            stack.enter_context(_meta_lock(directory))
        yield


def write_metas(segments: Sequence[Segment], batch: DurableBatch) -> None:
    """``write_meta`` of many segments with one ``DurableBatch`` (SealMany, issue 43): their
    states are read and their files written under their meta locks, and committed before the
    locks go, so the last write of each still holds its latest state. Raises OSError when the
    commit failed (then none of them may be answered as persisted)."""
    unique = list({s.directory: s for s in segments}.values())  # a segment named twice: one write
    with meta_locks(unique):
        for s in unique:
            batch.write(s.directory / META_FILE, json.dumps(_meta(s)).encode())
        batch.commit()


# A folder being removed is first renamed to its name + this (a character no queue name and no
# segment number has), so that a kill -9 in the middle of deleting its files never leaves a
# segment folder with its meta file and no log: such a folder refuses the next start (its log
# may have held acked batches: ``_open_found``). The next start finishes what is left.
REMOVING = "~removing"


def remove_folder(path: Path) -> None:
    """Remove a segment's or a queue's folder, crash-safe: renamed out of the way (the rename
    made durable) before any file in it goes."""
    doomed = set_aside(path)
    if doomed is None:
        return
    seglog.sync_dir(path.parent)
    remove_tree(doomed)


def set_aside(path: Path) -> Path | None:
    """Rename a folder out of the way (``REMOVING``; not synced), or None when it is gone."""
    doomed = path.with_name(path.name + REMOVING)
    remove_tree(doomed)  # an earlier removal's leftover of the same name
    try:
        path.rename(doomed)
    except FileNotFoundError:
        return None
    return doomed


def _is_queue_folder(path: Path) -> bool:
    """Only folders this broker made count (anything else in the data folder is left alone)."""
    return path.is_dir() and not path.name.endswith(REMOVING) and ((path / INCARNATION_FILE).exists() or any(
        p.is_dir() and p.name.isdigit() for p in path.iterdir()))


def _folder_incarnation(qdir: Path) -> str | None:
    """The incarnation a queue's folder belongs to; None: no record (a folder from before
    records were kept, or none yet)."""
    try:
        return str(json.loads((qdir / INCARNATION_FILE).read_text()))
    except FileNotFoundError:
        return None


def write_json_durably(path: Path, obj: Any, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``obj`` as JSON: temporary file synced, renamed, folder synced
    (unless ``sync_dir`` is False: then the caller syncs the folder before relying on it)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(obj).encode())
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        seglog.sync_dir(path.parent)
