"""Consumer groups on keyed topics: the members of group G share the partitions of topic T.

    member = GroupMember(GroupConfig(bootstrap="h:p,h:p", topic="orders", group="billing"))
    with member:
        member.run(lambda partition, m: handle(m.key, m.payload), stop=stop_event)

Each partition ``T.p<i>`` is consumed as the subscription ``G`` of that queue by the ordinary
``Consumer`` (sdk/consumer.py). The group decides only *who may ask* for which partition; the
partition's consumer lease decides *who delivers*, so two members never deliver one partition at
once, whatever the membership says.

Membership is a MEMBER lease from the coordinator (Kafka's group coordinator is the model,
coordinator/group_desk.py): the coordinator keeps the live members (leases renewed in time on its
clock), bumps the group's **generation** whenever they change (a join, an expiry, a leave) and
computes the assignment of that generation (``assign_partitions``, pure). Every renewal answers
the generation and this member's partitions. The coordinator grants a partition's consumer lease
only to the consumer of the member owning it now (its id names the member:
``member_consumer_id``). A member that dies or hangs past its lease leaves the group by itself;
one whose lease was lost (it hung past it, or the coordinator evicted it) rejoins by itself
(``stats.rejoins``, a log line) and gets partitions in a new generation. No ZooKeeper here.

The rebalance rule: a member gives a partition up as soon as a renewal says it is not its own any
more: it stops handing out (the handler in progress finishes), commits what finished, closes the
partition's consumer and with it releases the consumer lease. The new owner's consumer waits for
that lease meanwhile and gets it once released (or once it expired, when the old owner hung or
died): it resumes from the committed cursor, so what the old owner handed out but did not finish
is delivered again (at-least-once, in order). Each key lives in one partition, and a partition is
delivered in order by one member at a time: every key's order holds.

Delivery: ``run(handler)`` calls ``handler(partition, m)`` for each message; the partitions a
member owns run in parallel (one thread each, so the handler must be thread-safe), each in seq
order (per-key order; with ``workers_per_partition`` > 1, by key inside a partition as
``Consumer.run_keyed``). There is no ``poll``: a poll over several partitions would serialise
them and hold one partition's batch while another is given away.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import (
    AlreadyExists,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    NotLeader,
    PermissionDenied,
    WaitTimeout,
)
from ordq.common.security import Credentials
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.group_assign import (
    assign_partitions,
    member_consumer_id,
    member_of_consumer,
    parse_consumer_id,
)
from ordq.coordinator.paths import check_name
from ordq.coordinator.topics import partition_queue
from ordq.sdk._cluster import DEFAULT_LEASE_TTL_S, check_cluster, open_coordinator
from ordq.sdk._consumer_core import CommitConfig
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk.audit import new_writer_id
from ordq.sdk.consumer import Consumer
from ordq.sdk.failure import FailurePolicy

log = logging.getLogger("ordq.group")

Handler = Callable[[int, Delivered], object]


@attrs.frozen(kw_only=True)
class GroupConfig:
    topic: str
    group: str  # the subscription name on every partition queue
    bootstrap: str | None = None  # the coordinators (ConsumerConfig's, same meaning)
    zk_hosts: str | None = None
    root: str = "/ordq"
    member_id: str = attrs.field(factory=new_writer_id)  # unique among the group's live members
    start: str = "earliest"  # where the group's subscriptions start when the first member makes them
    commit: CommitConfig = CommitConfig()
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S  # a hung member leaves the group (and its partitions) after this
    connect_timeout_s: float = 10.0
    coordinator_outage_s: float = 30.0
    fetch_wait_ms: int = 200
    # A new owner's consumer waits this long for the partition's consumer lease before the member
    # looks again whether the partition is still its own (the old owner is finishing, or its
    # lease is expiring).
    takeover_poll_s: float = 1.0
    workers_per_partition: int = 1  # > 1: Consumer.run_keyed inside each partition
    on_failure: FailurePolicy | None = None
    audit_dir: Path | None = None  # each partition's consumer writes its deliveries here
    credentials: Credentials | None = None

    def __attrs_post_init__(self) -> None:
        check_cluster(self.bootstrap, self.zk_hosts, self.root)
        check_name("topic", self.topic)
        check_name("subscription", self.group)
        check_name("member", self.member_id)
        if self.takeover_poll_s <= 0 or self.workers_per_partition < 1:
            raise ConfigError("takeover_poll_s must be > 0 and workers_per_partition >= 1")

    def consumer_config(self, partition: int, tenure: int = 0) -> ConsumerConfig:
        """The config of the member's ``tenure``-th consumer of ``partition``: its id names the
        member, the partition and the tenure (the audit's consumer column; the coordinator grants
        the partition's consumer lease only to the id of the partition's owner). A new id for
        each consumer: the verifier tells consumer instances apart by it (one taking a partition
        back is a new instance, not the old one again)."""
        return ConsumerConfig(
            bootstrap=self.bootstrap, zk_hosts=self.zk_hosts, queue=partition_queue(self.topic, partition),
            subscription=self.group,
            root=self.root, start=self.start, commit=self.commit, fetch_wait_ms=self.fetch_wait_ms,
            leader_timeout_s=self.takeover_poll_s, lease_ttl_s=self.lease_ttl_s,
            connect_timeout_s=self.connect_timeout_s, coordinator_outage_s=self.coordinator_outage_s,
            audit_dir=self.audit_dir, on_failure=self.on_failure, consumer_id=member_consumer_id(self.member_id,
                                                                                                   partition, tenure),
            credentials=self.credentials)


@attrs.define
class GroupStats:
    rebalances: int = 0  # new generations that changed this member's partitions
    takeovers: int = 0  # partitions this member started to lead
    given_up: int = 0  # partitions it stopped delivering from and released
    deposed: int = 0  # partitions whose consumer lost its lease (NotLeader) and was restarted
    rejoins: int = 0  # member leases lost (hung past the ttl, evicted) and acquired again
    generation: int = 0  # the group generation of the last answer
    delivered: dict[int, int] = attrs.field(factory=dict)  # per partition, by this member


class _Partition:
    """One partition's consumer thread: wait for the partition's consumer lease (looking every
    ``takeover_poll_s`` whether the partition is still ours), then deliver until asked to stop."""

    def __init__(self, member: GroupMember, partition: int, handler: Handler) -> None:
        self.partition = partition
        self.stop = threading.Event()
        self.leading = False
        self.led = False  # it got the lease at some point
        self.error: BaseException | None = None
        self.lost = False  # the lease was lost (NotLeader) or no coordinator answered too long
        self._member, self._handler = member, handler
        self.thread = threading.Thread(target=self._run, name=f"group-p{partition}", daemon=True)

    def _run(self) -> None:
        try:
            consumer = self._elected()
            if consumer is None:
                return
            self.leading = self.led = True
            self._member.stats.takeovers += 1
            log.info("group %s/%s: %s leads partition %d", self._member.config.topic, self._member.config.group,
                     consumer.config.consumer_id, self.partition)
            with contextlib.ExitStack() as leaving:  # the consumer's exit (it is started already):
                leaving.push(consumer)  # commits what finished, then releases the lease
                self._deliver(consumer)
        except (NotLeader, CoordinationUnavailable, PermissionDenied) as exc:
            # PermissionDenied here: the consumer's rejoin was refused the partition, another
            # member owns it in a newer generation (a revoked token ends the member at its own
            # lease, not here).
            self.lost = True
            log.warning("group %s: member %s lost partition %d: %s", self._member.config.topic,
                        self._member.config.member_id, self.partition, exc)
        except BaseException as exc:  # the handler's or the consumer's error: the member stops
            self.error = exc
        finally:
            self.leading = False
            self._member.wake()

    def _elected(self) -> Consumer | None:
        while not self.stop.is_set():
            consumer = Consumer(self._member.consumer_config(self.partition))
            try:
                consumer.start()
                return consumer
            except WaitTimeout:
                continue  # still held by the old owner: look again whether we should wait
            except PermissionDenied as exc:
                # The coordinator says another member owns it now: a generation newer than our
                # last answer. Our next renewal tells us; wait for it unless it went already.
                log.info("group %s: partition %d refused to member %s: %s", self._member.config.topic,
                         self.partition, self._member.config.member_id, exc.why)
                if self.partition not in self._member.assigned() or self.stop.wait(self._member.renew_period()):
                    return None
        return None

    def _deliver(self, consumer: Consumer) -> None:
        p, counts = self.partition, self._member.stats.delivered

        def handle(m: Delivered) -> object:
            result = self._handler(p, m)
            counts[p] = counts.get(p, 0) + 1
            return result

        workers = self._member.config.workers_per_partition
        if workers > 1:
            consumer.run_keyed(handle, workers=workers, stop=self.stop)
        else:
            consumer.run(handle, stop=self.stop)


class GroupMember:
    """A member of consumer group ``config.group`` on topic ``config.topic`` (module docstring)."""

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.stats = GroupStats()
        self._coord: CoordinatorClient | None = None
        self._lease: CoordinatorLease | None = None
        self._partitions = 0
        self._assigned: tuple[int, ...] = ()  # this member's partitions in the last answer
        self._owned: dict[int, _Partition] = {}
        self._changed = threading.Event()
        self._closed = False
        self._tenures = 0  # consumers made so far (each gets a new id)
        self._tenure_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> GroupMember:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Reach the coordinators, read the topic, make sure every partition has the group's
        subscription (the coordinator creates what is missing) and join the group (a member
        lease). TopicNotFound: no such topic; WaitTimeout: another live member has this member
        id (it leaves within its ttl when it died)."""
        cfg = self.config
        coord, _creds = open_coordinator(cfg.bootstrap, cfg.zk_hosts, cfg.root, cfg.credentials)
        self._coord = coord
        try:
            self._partitions = coord.describe_topic(cfg.topic, timeout_s=cfg.connect_timeout_s).partitions
            for p in range(self._partitions):
                try:
                    coord.subscribe(partition_queue(cfg.topic, p), cfg.group, cfg.start.split(),
                                    timeout_s=cfg.connect_timeout_s)
                except AlreadyExists:
                    pass  # made by another member, or by us before
            self._lease = CoordinatorLease(coord, "member", cfg.topic, cfg.group, cfg.member_id,
                                           ttl_s=cfg.lease_ttl_s, on_renewed=self._on_renewed)
            if not self._lease.acquire(cfg.connect_timeout_s + cfg.lease_ttl_s, stopped=lambda: self._closed):
                raise WaitTimeout(f"group {cfg.group} of {cfg.topic}: member id {cfg.member_id} is held by another "
                                  "live member")
        except BaseException:
            self._disconnect()
            raise

    def close(self) -> None:
        """Stop delivering from every partition (each commits what finished and releases its
        consumer lease), then leave the group (its partitions go to the others at once)."""
        if self._closed:
            return
        self._closed = True
        self._give_up(set(self._owned))
        self._disconnect()

    def _disconnect(self) -> None:
        if self._lease is not None:
            self._lease.stop(release=True)
        if self._coord is not None:
            self._coord.close()

    def consumer_config(self, partition: int) -> ConsumerConfig:
        with self._tenure_lock:
            self._tenures += 1
            # shown with the partition's Acquire: only the owner may consume it (coordinator/group_desk.py)
            return attrs.evolve(self.config.consumer_config(partition, self._tenures),
                                member_lease=lambda: self._require(self._lease).held)

    # -- membership ------------------------------------------------------------------------

    def _on_renewed(self, held: Held) -> None:
        """Each grant and renewal (on the lease's thread): the generation and our partitions."""
        changed = tuple(sorted(held.partitions)) != self._assigned or held.group_generation != self.stats.generation
        self._assigned = tuple(sorted(held.partitions))
        self.stats.generation = held.group_generation
        if changed:
            self.wake()

    def wake(self) -> None:
        self._changed.set()

    def assigned(self) -> tuple[int, ...]:
        """This member's partitions in the generation the coordinator last answered."""
        return self._assigned

    def generation(self) -> int:
        """The group generation the coordinator last answered."""
        return self.stats.generation

    def renew_period(self) -> float:
        return self.config.lease_ttl_s / 4

    def _rejoin(self, stop: threading.Event) -> bool:
        """Our member lease was lost: give every partition up (they may be others' now), then
        join again (a new generation). False when ``stop`` came first."""
        lease = self._require(self._lease)
        reason = lease.lost_reason
        self._assigned = ()
        self._give_up(set(self._owned))
        self.stats.rejoins += 1
        log.warning("group %s/%s: member %s lost its membership (%s); joining again", self.config.topic,
                    self.config.group, self.config.member_id, reason)
        return bool(lease.acquire(None, stopped=lambda: stop.is_set() or self._closed))

    # -- the control loop ------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The partitions this member delivers from now (lease held and running)."""
        return sorted(p for p, w in self._owned.items() if w.leading)

    def run(self, handler: Handler, *, stop: threading.Event | None = None, recheck_s: float = 2.0) -> None:
        """Deliver ``handler(partition, m)`` from this member's partitions until ``stop`` is
        set, following every new generation; on return every partition was given up (what
        finished committed). Raises the first error of a handler or consumer other than a lost
        lease (``HandlerError``, ``GapDetected``, ...) after giving every partition up; a
        partition whose lease was lost (the process hung past it) is taken again if it is still
        this member's, and a lost membership is joined again. ``recheck_s``: the partitions'
        consumers are looked at at least this often."""
        if self._closed:
            raise ClosedError("group member is closed")
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                self._step(handler, stop)
                deadline = time.monotonic() + recheck_s  # a change, ``stop`` or the recheck: next step
                while not stop.is_set() and not self._changed.wait(0.05) and time.monotonic() < deadline:
                    pass
                self._changed.clear()
        finally:
            self._give_up(set(self._owned))

    def _step(self, handler: Handler, stop: threading.Event) -> None:
        for p, w in list(self._owned.items()):
            if not w.thread.is_alive():
                del self._owned[p]
                w.thread.join()
                if w.error is not None:
                    raise w.error
                if w.lost:
                    self.stats.deposed += 1
        lease = self._require(self._lease)
        if lease.lost_reason is not None and not self._rejoin(stop):
            return
        mine, owned = set(self._assigned), set(self._owned)
        if mine != owned:
            self.stats.rebalances += 1
            log.info("group %s/%s: member %s in generation %d: partitions %s -> %s", self.config.topic,
                     self.config.group, self.config.member_id, self.stats.generation, sorted(owned), sorted(mine))
        self._give_up(owned - mine)  # first: the new owners wait for the consumer leases meanwhile
        for p in sorted(mine - owned):
            w = _Partition(self, p, handler)
            self._owned[p] = w
            w.thread.start()

    def _give_up(self, partitions: set[int]) -> None:
        """Stop delivering from ``partitions`` and wait until each consumer committed what
        finished and released its lease (only then may the new owner lead it)."""
        workers = [self._owned.pop(p) for p in sorted(partitions) if p in self._owned]
        for w in workers:
            w.stop.set()
        for w in workers:
            w.thread.join()
            if w.led and not w.lost:
                self.stats.given_up += 1

    def statistics(self) -> GroupStats:
        return attrs.evolve(self.stats, delivered=dict(self.stats.delivered))

    @staticmethod
    def _require(part: Any) -> Any:
        if part is None:
            raise ClosedError("group member not started")
        return part


__all__ = ["GroupConfig", "GroupMember", "GroupStats", "assign_partitions", "member_consumer_id",
           "member_of_consumer", "parse_consumer_id"]
