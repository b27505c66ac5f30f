"""The coordinator's lease desk: grants, renews, releases and checks leases (coordinator/leases.py
decides, coordinator/store_leases.py keeps the records in ZooKeeper).

Guarantee: what ``leases.LeaseBook`` promises, for one leadership term at a time: when the term
changes (this process stopped leading and leads again, or leads for the first time) the book
starts empty and every lease is read again from ZooKeeper and honoured in full. Each lease's
decisions are serialised by a lock of its own (a renewal never slips between a grant's decision
and its write); a grant answers only after its record is written with a version check.

Rules: no gRPC here (coordinator/service.py is the frame: tokens, leadership, errors); time
from the injected ``clock``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

import attrs

from ordq.common.errors import ConflictError
from ordq.coordinator.leases import Decision, LeaseBook, LeaseName, LeaseRecord, clamp_ttl_ms, key_digest
from ordq.coordinator.store import ZkStore

MAX_HOLD_S = 0.5  # an Acquire waits at most this long on the server for a lease about to expire


@attrs.frozen
class Grant:
    """A lease granted: its record, the secret key (only the holder learns it) and the
    version of its node (what a guarded write checks)."""

    record: LeaseRecord
    key: str = attrs.field(repr=False)
    version: int


@attrs.define
class LeaseStats:
    granted: int = 0
    refused_held: int = 0  # Acquire while another held it (not an error: the caller waits)
    renewed: int = 0
    revived: int = 0  # renewals of a lease that had expired with nobody taking it
    lost: int = 0  # renewals or guarded requests refused: not the current holder
    released: int = 0


class LeaseDesk:
    def __init__(self, store: ZkStore, *, term: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``term``: the leadership term of this process (changes whenever it starts leading)."""
        self.store = store
        self._term = term
        self._now = clock
        self._sleep = sleep
        self._book_term: int | None = None
        self._book = LeaseBook()
        self._versions: dict[LeaseName, int] = {}
        self._locks: dict[LeaseName, threading.Lock] = {}
        self._guard = threading.Lock()
        self.stats = LeaseStats()
        # Consumer groups (MEMBER leases): membership, generation, assignment, partition owners.
        from ordq.coordinator.group_desk import GroupDesk

        self.groups = GroupDesk(self, store, clock=clock)

    def term(self) -> int:
        """The leadership term the desk answers for now."""
        return self._term()

    # -- the book of this term -------------------------------------------------------------

    def _lock_of(self, name: LeaseName) -> threading.Lock:
        with self._guard:
            term = self._term()
            if term != self._book_term:
                self._book_term, self._book, self._versions = term, LeaseBook(), {}
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = threading.Lock()
            return lock

    def _known(self, name: LeaseName) -> LeaseBook:
        """The book, with ``name`` read from ZooKeeper if this term has not seen it (caller
        holds the name's lock)."""
        book = self._book
        if not book.knows(name):
            record, version = self.store.read_lease(name)
            book.learn(name, record, self._now())
            self._versions[name] = version
        return book

    # -- requests --------------------------------------------------------------------------

    def acquire(self, name: LeaseName, holder: str, *, ttl_ms: int = 0, hold_s: float = 0.0) -> Grant | Decision:
        """Grant ``name`` to ``holder`` if nobody holds it; else wait up to ``hold_s`` (at most
        ``MAX_HOLD_S``) for it to expire, then answer the Decision (who holds it, when to ask
        again). ConflictError when another coordinator wrote the lease meanwhile."""
        deadline = self._now() + min(max(hold_s, 0.0), MAX_HOLD_S)
        conflicted = False
        while True:
            with self._lock_of(name):
                book = self._known(name)
                now = self._now()
                decision = book.decide(name, now)
                if decision.free:
                    try:
                        return self._grant(name, holder, decision, ttl_ms, book)
                    except ConflictError:
                        # The node moved under the book (its queue or subscription deleted and
                        # made again; another coordinator's write): decide once more on what
                        # ZooKeeper holds now; a second conflict is the caller's.
                        if conflicted:
                            raise
                        conflicted = True
                        continue
            if decision.retry_s > deadline - now:
                self.stats.refused_held += 1
                return decision
            self._sleep(decision.retry_s)

    def _grant(self, name: LeaseName, holder: str, decision: Decision, ttl_ms: int, book: LeaseBook) -> Grant:
        key = secrets.token_urlsafe(24)
        record = LeaseRecord(holder=holder, generation=decision.generation + 1, key_hash=key_digest(key),
                             ttl_ms=clamp_ttl_ms(ttl_ms))
        try:
            version = self.store.write_lease(name, record, self._versions.get(name, -1))
        except ConflictError:
            book.forget(name)  # another coordinator wrote it: read it again next time
            raise
        book.granted(name, record, self._now())
        self._versions[name] = version
        self.stats.granted += 1
        return Grant(record=record, key=key, version=version)

    def heartbeat(self, name: LeaseName, generation: int, key: str) -> LeaseRecord:
        """Renew the caller's lease (LeaseLost when it is not its any more)."""
        with self._lock_of(name):
            book = self._known(name)
            now = self._now()
            was_held = book.held(name, now)
            try:
                record = book.renew(name, generation, key, now)
            except Exception:
                self.stats.lost += 1
                raise
            self.stats.renewed += 1
            self.stats.revived += not was_held
            return record

    def release(self, name: LeaseName, generation: int, key: str) -> None:
        """The holder gives it back: a successor may be granted at once."""
        with self._lock_of(name):
            book = self._known(name)
            record = book.released(name, generation, key)
            try:
                self._versions[name] = self.store.write_lease(name, record, self._versions.get(name, -1))
            except ConflictError:
                book.forget(name)
                raise
            book.granted(name, record, self._now())
            self.stats.released += 1

    def check(self, name: LeaseName, generation: int, key: str) -> tuple[LeaseRecord, int]:
        """For a request the lease guards: the caller's current record and its node's version
        (the guarded write checks it). LeaseLost when the caller does not hold it now."""
        with self._lock_of(name):
            book = self._known(name)
            try:
                record = book.check(name, generation, key, self._now())
            except Exception:
                self.stats.lost += 1
                raise
            return record, self._versions.get(name, -1)

    def holder(self, name: LeaseName) -> LeaseRecord | None:
        """The current record of ``name`` (an operator's view), None when never granted."""
        with self._lock_of(name):
            return self._known(name).record(name)

    # -- for consumer groups (coordinator/group_desk.py) -------------------------------------

    def expires_at(self, name: LeaseName) -> float | None:
        """When ``name`` expires on our clock if not renewed (None: nobody holds it), read from
        ZooKeeper first if this term has not seen it (then honoured as renewed now)."""
        with self._lock_of(name):
            return self._known(name).expires_at(name)

    def evict(self, name: LeaseName) -> bool:
        """Remove the node of ``name`` if nobody holds it now (expired or released): a member
        that left. False when it is held (renewed meanwhile). A later renewal is refused
        (LeaseLost: no such lease): the member rejoins with a new Acquire."""
        with self._lock_of(name):
            book = self._known(name)
            if book.held(name, self._now()):
                return False
            version = self._versions.get(name, -1)
            if version >= 0:
                try:
                    self.store.delete_lease(name, version)
                except ConflictError:
                    book.forget(name)
                    raise
            book.forget(name)
            self._versions.pop(name, None)
            return True
