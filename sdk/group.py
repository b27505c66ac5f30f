"""Consumer groups on keyed topics: the members of group G share the partitions of topic T.

    member = GroupMember(GroupConfig(zk_hosts=..., topic="orders", group="billing"))
    with member:
        member.run(lambda partition, m: handle(m.key, m.payload), stop=stop_event)

Each partition ``T.p<i>`` is consumed as the subscription ``G`` of that queue by the ordinary
elected ``Consumer`` (sdk/consumer.py). The group decides only *who tries* to lead which
partition; the partition's election and the consumer's lease decide *who delivers*, so two
members never deliver one partition at once, whatever the membership says.

Membership: one ephemeral node per member under ``subs/G/members`` of ``T.p0`` (made with the
subscription by the coordinator: clients may not create it, coordinator/acl.py), so a member
that dies or hangs past its ZooKeeper session leaves the group by itself. Every member watches
the members and computes the same assignment from them (``assign_partitions``: a pure function
of the sorted live members and the partition count) on every change.

The rebalance rule: a member gives a partition up only after it stopped delivering from it: it
stops handing out (the handler in progress finishes), commits what finished, closes the
partition's consumer and with it releases the election. The new owner joins that election
meanwhile and leads once it is released (or once the old owner's session expired, when it hung
or died): it resumes from the committed cursor, so what the old owner handed out but did not
finish is delivered again (at-least-once, in order). Each key lives in one partition, and a
partition is delivered in order by one member at a time: every key's order holds.

Delivery: ``run(handler)`` calls ``handler(partition, m)`` for each message; the partitions a
member owns run in parallel (one thread each, so the handler must be thread-safe), each in seq
order (per-key order; with ``workers_per_partition`` > 1, by key inside a partition as
``Consumer.run_keyed``). There is no ``poll``: a poll over several partitions would serialise
them and hold one partition's batch while another is given away.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

from ordq.common.errors import (
    AlreadyExists,
    ClosedError,
    ConfigError,
    CoordinationUnavailable,
    NotFound,
    NotLeader,
    SubscriptionNotFound,
    WaitTimeout,
)
from ordq.common.security import Credentials, lookup
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.group_assign import assign_partitions
from ordq.coordinator.paths import Paths, check_name
from ordq.coordinator.store import ZkStore
from ordq.coordinator.topics import partition_queue
from ordq.sdk._cluster import DEFAULT_LEASE_TTL_S, check_cluster
from ordq.sdk._consumer_core import CommitConfig
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._zk_start import connect
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
    # A new owner waits this long in a partition's election before it looks again whether the
    # partition is still its own (the old owner is finishing, or its session is expiring).
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
        member, the partition and the tenure (the audit's consumer column, the election's
        contender data). A new id for each consumer: the verifier tells consumer instances
        apart by it (one taking a partition back is a new instance, not the old one again)."""
        return ConsumerConfig(
            bootstrap=self.bootstrap, zk_hosts=self.zk_hosts, queue=partition_queue(self.topic, partition),
            subscription=self.group,
            root=self.root, start=self.start, commit=self.commit, fetch_wait_ms=self.fetch_wait_ms,
            leader_timeout_s=self.takeover_poll_s, lease_ttl_s=self.lease_ttl_s,
            connect_timeout_s=self.connect_timeout_s, coordinator_outage_s=self.coordinator_outage_s,
            audit_dir=self.audit_dir, on_failure=self.on_failure, consumer_id=member_consumer_id(self.member_id,
                                                                                                   partition, tenure),
            credentials=self.credentials)


def member_consumer_id(member_id: str, partition: int, tenure: int) -> str:
    return f"{member_id}-p{partition}-{tenure}"


def member_of_consumer(consumer_id: str | None) -> str | None:
    """The member a group consumer's id names (``member_consumer_id``); else the id itself."""
    if consumer_id is None:
        return None
    m = _CONSUMER_ID.fullmatch(consumer_id)
    return m.group(1) if m else consumer_id


_CONSUMER_ID = re.compile(r"(.+)-p\d+-\d+")


def group_members(store: ZkStore, topic: str, group: str) -> dict[str, dict[str, Any]]:
    """The live members of ``group`` on ``topic``: ``{member_id: {"host", "pid", ...}}``."""
    path = store.paths.sub_members(partition_queue(topic, 0), group)
    try:
        names = store.client.get_children(path)
    except NoNodeError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        try:
            data, _ = store.client.get(f"{path}/{name}")
        except NoNodeError:
            continue
        out[name] = json.loads(data or b"{}")
    return out


@attrs.define
class GroupStats:
    rebalances: int = 0  # membership changes that changed this member's partitions
    takeovers: int = 0  # partitions this member started to lead
    given_up: int = 0  # partitions it stopped delivering from and released
    deposed: int = 0  # partitions whose consumer lost its lease (NotLeader) and was restarted
    delivered: dict[int, int] = attrs.field(factory=dict)  # per partition, by this member


class _Partition:
    """One partition's consumer thread: join the election (looking every ``takeover_poll_s``
    whether the partition is still ours), then deliver until asked to stop."""

    def __init__(self, member: GroupMember, partition: int, handler: Handler) -> None:
        self.partition = partition
        self.stop = threading.Event()
        self.leading = False
        self.led = False  # it was elected at some point
        self.error: BaseException | None = None
        self.lost = False  # the lease was lost (NotLeader) or ZooKeeper was away too long
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
                leaving.push(consumer)  # commits what finished, then releases the election
                self._deliver(consumer)
        except (NotLeader, CoordinationUnavailable) as exc:
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
        self._client: KazooClient | None = None
        self._store: ZkStore | None = None
        self._partitions = 0
        self._members_path = ""
        self._members: list[str] = []
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
        """Connect, read the topic, make sure every partition has the group's subscription (the
        coordinator creates what is missing) and join the group. TopicNotFound: no such topic."""
        cfg = self.config
        creds = cfg.credentials or lookup(cfg.zk_hosts or "", cfg.root)
        self._client, zk = connect(cfg.zk_hosts or "", cfg.root, creds, session_timeout_s=cfg.lease_ttl_s,
                                   connect_timeout_s=cfg.connect_timeout_s,
                                   who=f"group member {cfg.topic}/{cfg.group}", stopped=lambda: self._closed)
        try:
            self._store = store = ZkStore(self._client, Paths(cfg.root))
            self._partitions = zk(lambda: store.read_topic(cfg.topic), "read the topic").partitions
            coord = CoordinatorClient(store, credentials=creds)
            try:
                for p in range(self._partitions):
                    zk(lambda p=p: self._ensure_subscription(coord, p), f"subscribe partition {p}")  # type: ignore[misc]
            finally:
                coord.close()
            self._members_path = store.paths.sub_members(partition_queue(cfg.topic, 0), cfg.group)
            self._client.add_listener(self._on_state)
            zk(self._register, "join the group")
        except BaseException:
            self._disconnect()
            raise

    def _ensure_subscription(self, coord: CoordinatorClient, partition: int) -> None:
        store, queue = self._require(self._store), partition_queue(self.config.topic, partition)
        try:
            store.get_cursor(queue, self.config.group)
            return
        except SubscriptionNotFound:
            pass
        try:
            coord.subscribe(queue, self.config.group, self.config.start.split())
        except AlreadyExists:
            pass  # another member made it first

    def close(self) -> None:
        """Stop delivering from every partition (each commits what finished and releases its
        election), then leave the group."""
        if self._closed:
            return
        self._closed = True
        self._give_up(set(self._owned))
        self._disconnect()

    def _disconnect(self) -> None:
        if self._client is not None:
            self._client.stop()  # the membership node goes with the session
            self._client.close()

    def consumer_config(self, partition: int) -> ConsumerConfig:
        with self._tenure_lock:
            self._tenures += 1
            return self.config.consumer_config(partition, self._tenures)

    # -- membership ------------------------------------------------------------------------

    @property
    def _my_path(self) -> str:
        return f"{self._members_path}/{self.config.member_id}"

    def _register(self) -> None:
        client = self._require(self._client)
        data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since_us": time.time_ns() // 1000})
        try:
            client.create(self._my_path, data.encode(), ephemeral=True)
        except NodeExistsError:
            _, stat = client.get(self._my_path)
            if stat.ephemeralOwner != client.client_id[0]:
                # Our own node of an expired session (it goes shortly), or another live member
                # with our id (a configuration error, seen when it does not go).
                raise AlreadyExists(f"group {self.config.group}: member {self.config.member_id} is registered "
                                    "by another session") from None
        except NoNodeError:
            raise NotFound(f"topic {self.config.topic}: the group's membership node is missing "
                           f"({self._members_path}); run `ordq up` to add it to a tree from before") from None

    def _on_state(self, state: str) -> None:
        if state in (KazooState.LOST, KazooState.CONNECTED):
            self.wake()  # after a lost session: register again (the control loop does it)

    def wake(self) -> None:
        self._changed.set()

    def _watch(self, _event: object) -> None:
        self.wake()

    def _read_members(self) -> list[str] | None:
        """The live members (re-arming the watch); registers this member again when its node is
        gone (its session expired); None when ZooKeeper does not answer now."""
        client = self._require(self._client)
        try:
            members = client.get_children(self._members_path, watch=self._watch)
            if self.config.member_id not in members:
                self._register()
                members = client.get_children(self._members_path, watch=self._watch)
        except AlreadyExists:
            return None  # our old session's node: look again once it went
        except Exception as exc:  # kazoo's connection errors: try again on the next round
            if isinstance(exc, (NotFound, ConfigError)):
                raise
            log.debug("group %s: reading the members: %s", self.config.group, exc)
            return None
        return sorted(members)

    # -- the control loop ------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The partitions this member delivers from now (elected and running)."""
        return sorted(p for p, w in self._owned.items() if w.leading)

    def members(self) -> list[str]:
        """The live members as this member last read them."""
        return list(self._members)

    def run(self, handler: Handler, *, stop: threading.Event | None = None, recheck_s: float = 2.0) -> None:
        """Deliver ``handler(partition, m)`` from this member's partitions until ``stop`` is
        set, following every membership change; on return every partition was given up (what
        finished committed). Raises the first error of a handler or consumer other than a lost
        lease (``HandlerError``, ``GapDetected``, ...) after giving every partition up; a
        partition whose lease was lost (the process hung past its session) is taken again if it
        is still this member's. ``recheck_s``: the membership is read at least this often."""
        if self._closed:
            raise ClosedError("group member is closed")
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                self._step(handler)
                deadline = time.monotonic() + recheck_s  # a change, ``stop`` or the recheck: next step
                while not stop.is_set() and not self._changed.wait(0.05) and time.monotonic() < deadline:
                    pass
                self._changed.clear()
        finally:
            self._give_up(set(self._owned))

    def _step(self, handler: Handler) -> None:
        for p, w in list(self._owned.items()):
            if not w.thread.is_alive():
                del self._owned[p]
                w.thread.join()
                if w.error is not None:
                    raise w.error
                if w.lost:
                    self.stats.deposed += 1
        members = self._read_members()
        if members is None:
            return
        self._members = members
        mine = set(assign_partitions(members, self._partitions).get(self.config.member_id, []))
        owned = set(self._owned)
        if mine != owned:
            self.stats.rebalances += 1
            log.info("group %s/%s: member %s of %s: partitions %s -> %s", self.config.topic, self.config.group,
                     self.config.member_id, members, sorted(owned), sorted(mine))
        self._give_up(owned - mine)  # first: the new owners wait in the elections meanwhile
        for p in sorted(mine - owned):
            w = _Partition(self, p, handler)
            self._owned[p] = w
            w.thread.start()

    def _give_up(self, partitions: set[int]) -> None:
        """Stop delivering from ``partitions`` and wait until each consumer committed what
        finished and released its election (only then may the new owner lead it)."""
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


__all__ = ["GroupConfig", "GroupMember", "GroupStats", "assign_partitions", "group_members", "member_consumer_id",
           "member_of_consumer"]
