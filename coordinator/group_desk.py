"""Consumer groups on the coordinator (DESIGN §5 Leases; Kafka's group coordinator is the model):
membership by MEMBER leases, a group generation, the assignment of that generation, and the
partitions' consumer leases granted only to their owners.

Guarantee:
- The members of group G of topic T are the holders of G's member leases that have not expired
  on this coordinator's clock. The **generation** is bumped whenever that set changes — a grant
  to a new member, an expiry, a release — and the assignment of a generation is
  ``assign_partitions(members, partitions)``. Acquire and Heartbeat of a member lease answer
  the generation and the member's partitions.
- The consumer lease of partition p of T for G is granted only to a holder whose id names the
  member owning p in the current generation (``member_consumer_id``): PermissionDenied,
  counted, otherwise. A holder that no longer owns p may renew that lease for one ttl (+ margin)
  after the generation moved p (it stops at its member's next heartbeat, commits and releases);
  after that its renewals are refused (LeaseLost), so a member that left — or a forged one that
  joined, took partitions and stopped renewing its membership — cannot keep a partition.
  Whoever owns p, only one holder at a time has its consumer lease (coordinator/leases.py): the
  group decides who may *ask*, the lease decides who *delivers*. So no forged membership can make
  two members deliver one partition.
- At most ``MAX_MEMBERS`` members per group; another join is refused (PermissionDenied, counted).

Expiry is noticed lazily: on the group's next request (any member's heartbeat, every quarter
ttl while one lives, or a consumer's lease request on one of its partitions). A dead member's
partitions are given out about ttl + margin after its last renewal, plus a quarter ttl.

Persisted: the member leases are lease nodes (``<T.p0>/leases/member/<G>/<member>``); the
generation is kept in their folder's node, written with a version check at every bump. It is
stored, not derived, because members and operators compare generations: a number derived from
the member nodes could go back when members leave, and a new term could not tell. A new term
reads the nodes (honoured in full, as every lease) and bumps the generation once: its members
learn "look again" although their partitions usually stay.

Rules: no gRPC (coordinator/service_leases.py frames the calls); one lock per group, taken before
any lease lock of the desk; time from the injected ``clock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from ordq.common.errors import ConflictError, LeaseLost, PermissionDenied
from ordq.coordinator.group_assign import MAX_MEMBERS, assign_partitions, parse_consumer_id
from ordq.coordinator.leases import Decision, Kind, LeaseName, LeaseRecord, margin_s
from ordq.coordinator.store import ZkStore
from ordq.coordinator.topics import PARTITION_SEPARATOR, partition_queue

log = logging.getLogger("ordq.coordinator.groups")

# A group consumer's Acquire carries its member's lease (generation + key in the request's lease
# fields) as proof that it speaks for the member its id names (ConsumerConfig.member_lease, set
# by sdk/group.py): without it, a client that knew a member's id could ask for that member's
# partition in its name.
REQUIRE_MEMBER_PROOF = True


class Leases(Protocol):
    """What the group desk needs of the lease desk (coordinator/lease_desk.py)."""

    def term(self) -> int: ...
    def acquire(self, name: LeaseName, holder: str, *, ttl_ms: int = 0, hold_s: float = 0.0) -> Any: ...
    def heartbeat(self, name: LeaseName, generation: int, key: str) -> LeaseRecord: ...
    def release(self, name: LeaseName, generation: int, key: str) -> None: ...
    def expires_at(self, name: LeaseName) -> float | None: ...
    def evict(self, name: LeaseName) -> bool: ...
    def holder(self, name: LeaseName) -> LeaseRecord | None: ...
    def check(self, name: LeaseName, generation: int, key: str) -> tuple[LeaseRecord, int]: ...


def split_partition_queue(queue: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition queue's name ``T.p<i>``; None for another name."""
    topic, sep, index = queue.rpartition(PARTITION_SEPARATOR)
    if not sep or not topic or not index.isdigit() or str(int(index)) != index:
        return None
    return topic, int(index)


@attrs.define
class GroupState:
    """One group as this coordinator term knows it."""

    topic: str
    group: str
    partitions: int
    generation: int = 0
    version: int = -1  # of the generation's node (-1: not there yet)
    since: float = 0.0  # when this generation began (our monotonic clock)
    members: tuple[str, ...] = ()  # live, sorted
    assignment: dict[str, list[int]] = attrs.field(factory=dict)
    owners: dict[int, str] = attrs.field(factory=dict)
    next_expiry: float = float("-inf")  # no member can have expired before this (look then)

    @property
    def topic_queue(self) -> str:
        return partition_queue(self.topic, 0)

    def member_lease(self, member: str) -> LeaseName:
        return LeaseName(Kind.MEMBER, self.topic_queue, self.group, member)

    def next_generation(self, members: list[str], now: float, partitions: int) -> None:
        """The group's state after a bump (the caller wrote the generation first)."""
        self.generation += 1
        self.since = now
        self.partitions = partitions
        self.members = tuple(sorted(set(members)))
        self.assignment = assign_partitions(self.members, partitions)
        self.owners = {p: m for m, ps in self.assignment.items() for p in ps}


@attrs.frozen
class MemberAnswer:
    """What a member learns with its grant or renewal."""

    generation: int
    partitions: tuple[int, ...]


@attrs.define
class GroupStats:
    generations: int = 0  # bumps
    joined: int = 0
    expired: int = 0  # members whose lease ran out (evicted)
    left: int = 0  # members that released their lease
    refused_full: int = 0  # joins beyond MAX_MEMBERS
    refused_not_owner: int = 0  # consumer leases asked for a partition the holder's member does not own
    refused_renewals: int = 0  # consumer lease renewals refused after the grace (the partition moved)


class GroupDesk:
    def __init__(self, desk: Leases, store: ZkStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._desk = desk
        self.store = store
        self._now = clock
        self._term: int | None = None
        self._groups: dict[tuple[str, str], GroupState | None] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        self.stats = GroupStats()

    def _lock_of(self, key: tuple[str, str]) -> threading.Lock:
        with self._guard:
            term = self._desk.term()
            if term != self._term:
                self._term, self._groups = term, {}
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock

    # -- the group of this term (caller holds its lock) -------------------------------------

    def _load(self, topic: str, group: str, *, create: bool) -> GroupState | None:
        key = (topic, group)
        g = self._groups.get(key)
        if g is not None or (key in self._groups and not create):
            return g
        tq = partition_queue(topic, 0)
        found = self.store.read_group(tq, group)
        if found is None and not create:
            self._groups[key] = None  # no member ever joined: its partitions' leases are plain ones
            return None
        g = GroupState(topic=topic, group=group, partitions=self.store.read_topic(topic).partitions)
        self._groups[key] = g
        if found is None:  # the first member: the folder (generation 0) before its lease node
            try:
                g.version = self.store.write_group(tq, group, 0, -1)
            except ConflictError:
                self._groups.pop(key, None)
                raise
            return g
        g.generation, g.version = found
        self._refresh(g, known=self.store.lease_members(tq, group), force=True)  # a new term: a new generation
        return g

    def _refresh(self, g: GroupState, *, known: list[str] | None = None, force: bool = False,
                 joined: str = "", left: str = "") -> None:
        """Evict the members whose lease expired (or ``left``: released); bump the generation
        when the live set changed (or ``force``), with ``joined`` added. The members are looked
        at only once the earliest expiry they had may have come (``g.next_expiry``): a
        heartbeat costs O(1), not O(members)."""
        now = self._now()
        if known is None and not force and now < g.next_expiry:  # nobody can have expired
            if not (joined or left):
                return
            live = [m for m in g.members if m != left]
            if left and self._desk.evict(g.member_lease(left)):
                log.info("group %s/%s: member %s left", g.topic, g.group, left)
            if joined:
                live.append(joined)
                until = self._desk.expires_at(g.member_lease(joined))
                g.next_expiry = min(g.next_expiry, until if until is not None else now)
            self._bump(g, live)
            return
        live = []
        soonest = float("inf")
        for m in (g.members if known is None else known):
            name = g.member_lease(m)
            until = self._desk.expires_at(name)
            if until is not None and now < until:
                live.append(m)
                soonest = min(soonest, until)
            elif self._desk.evict(name):
                self.stats.expired += m != left
                log.info("group %s/%s: member %s %s", g.topic, g.group, m, "left" if m == left else "expired")
        if joined:
            live.append(joined)
            until = self._desk.expires_at(g.member_lease(joined))
            soonest = min(soonest, until if until is not None else now)
        g.next_expiry = soonest
        if force or tuple(sorted(set(live))) != g.members:
            self._bump(g, live)

    def _bump(self, g: GroupState, members: list[str]) -> None:
        partitions = self.store.read_topic(g.topic).partitions
        try:
            g.version = self.store.write_group(g.topic_queue, g.group, g.generation + 1, g.version)
        except ConflictError:
            self._groups.pop((g.topic, g.group), None)  # another coordinator wrote: read it again
            raise
        g.next_generation(members, self._now(), partitions)
        self.stats.generations += 1
        log.info("group %s/%s: generation %d, members %s", g.topic, g.group, g.generation, list(g.members))

    def _answer(self, g: GroupState, member: str) -> MemberAnswer:
        return MemberAnswer(generation=g.generation, partitions=tuple(g.assignment.get(member, ())))

    # -- member leases ------------------------------------------------------------------------

    def join(self, name: LeaseName, topic: str, ttl_ms: int) -> tuple[Any, MemberAnswer | None]:
        """Acquire ``name`` (a member lease): a Grant (lease_desk.py) when that member id is not
        held by a live member, with the group's new generation and the member's partitions;
        else the Decision (who holds it, when to ask again) and None."""
        with self._lock_of((topic, name.sub)):
            g = self._load(topic, name.sub, create=True)
            assert g is not None
            self._refresh(g)
            if name.member not in g.members and len(g.members) >= MAX_MEMBERS:
                self.stats.refused_full += 1
                raise PermissionDenied(name.queue, "consume", f"group {name.sub} has {MAX_MEMBERS} members, "
                                                               "the most a group may have")
            got = self._desk.acquire(name, name.member, ttl_ms=ttl_ms)
            if isinstance(got, Decision):
                return got, None
            self.stats.joined += 1
            self._refresh(g, joined=name.member)
            return got, self._answer(g, name.member)

    def beat(self, name: LeaseName, topic: str, generation: int, key: str) -> tuple[LeaseRecord, MemberAnswer]:
        """Renew a member lease: LeaseLost when it expired (the member was evicted: it rejoins)
        or is not the caller's."""
        with self._lock_of((topic, name.sub)):
            g = self._load(topic, name.sub, create=False)
            if g is None:
                raise LeaseLost(Kind.MEMBER.value, name.queue, name.sub, "no such group")
            self._refresh(g)  # first: an expired member is evicted, not revived
            record = self._desk.heartbeat(name, generation, key)
            return record, self._answer(g, name.member)

    def leave(self, name: LeaseName, topic: str, generation: int, key: str) -> None:
        """Release a member lease: its partitions go to the others at once (new generation)."""
        with self._lock_of((topic, name.sub)):
            g = self._load(topic, name.sub, create=False)
            self._desk.release(name, generation, key)
            if g is not None:
                self._refresh(g, left=name.member)
                self.stats.left += 1

    # -- the partitions' consumer leases ----------------------------------------------------------

    def check_consumer(self, name: LeaseName, holder: str, *, renewing: bool,
                       proof: tuple[int, str] | None = None) -> None:
        """Before granting (``renewing`` False: ``holder`` as asked) or renewing (the record's
        holder) the consumer lease ``name`` of a group's partition: PermissionDenied (grant) or
        LeaseLost (renewal, after the grace) when the holder's member does not own it now.
        ``proof``: the (generation, key) of the member lease of the member the holder names; a
        grant with a proof that is not that member's current lease is refused. Without a proof
        the holder's id alone names the member (``REQUIRE_MEMBER_PROOF``). Nothing to check
        when ``name`` is no group's partition."""
        where = split_partition_queue(name.queue)
        if where is None:
            return
        topic, p = where
        with self._lock_of((topic, name.sub)):
            g = self._load(topic, name.sub, create=False)
            if g is None:
                return
            self._refresh(g)
            if renewing:
                record = self._desk.holder(name)
                holder = record.holder if record is not None else holder
            owner = g.owners.get(p)
            parsed = parse_consumer_id(holder)
            if parsed is not None and parsed[1] == p and parsed[0] == owner:
                if renewing or self._proven(g, owner, proof):
                    return
                self.stats.refused_not_owner += 1
                raise PermissionDenied(name.queue, "consume", f"{holder!r} names member {owner}, owner of partition "
                                                              f"{p}, without that member's lease")
            why = (f"{holder!r} is not the consumer of partition {p}'s owner in generation {g.generation} of "
                   f"group {g.group} (owner: {owner or 'nobody'})")
            if renewing:
                ttl_ms = self._held_ttl_ms(name)
                if self._now() - g.since < ttl_ms / 1000.0 + margin_s(ttl_ms):
                    return  # the old owner stops at its member's next heartbeat, and releases
                self.stats.refused_renewals += 1
                raise LeaseLost(Kind.CONSUMER.value, name.queue, name.sub, why)
            self.stats.refused_not_owner += 1
            raise PermissionDenied(name.queue, "consume", why)

    def _proven(self, g: GroupState, member: str, proof: tuple[int, str] | None) -> bool:
        if proof is None:
            return not REQUIRE_MEMBER_PROOF
        try:
            self._desk.check(g.member_lease(member), *proof)
        except LeaseLost:
            return False
        return True

    def _held_ttl_ms(self, name: LeaseName) -> int:
        record = self._desk.holder(name)
        return record.ttl_ms if record is not None else 0

    def view(self, topic: str, group: str) -> GroupState | None:
        """The group as this term knows it now (an operator's view)."""
        with self._lock_of((topic, group)):
            g = self._load(topic, group, create=False)
            if g is not None:
                self._refresh(g)
            return None if g is None else attrs.evolve(g)
