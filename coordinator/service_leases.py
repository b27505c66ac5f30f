"""The coordinator service's calls for clients that hold no ZooKeeper session (issue 37): leases
(Acquire, Heartbeat, Release), what a client reads (Describe, Coordinators) and the records a
consumer keeps (SubscriptionRecord). A part of ``CoordinatorService`` (coordinator/service.py),
which frames every call: leadership, the token's role on the queue, typed refusals, counts.

Guarantee: a lease is granted, renewed and checked only by the elected coordinator while its
ZooKeeper connection is up (``is_leader`` says both), through ``lease_desk.LeaseDesk``; a
refused renewal is ``LeaseLost``. Describe reads what the caller's token may read on that queue
and nothing else (no other queue, no token record, no ACL).

Rules: imports ``ordq.wire`` only inside functions (as service.py).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import attrs
from kazoo.exceptions import NoNodeError

from ordq.common.errors import ConfigError, ConflictError, OrdqError, PermissionDenied
from ordq.coordinator.lease_desk import Grant, LeaseDesk
from ordq.coordinator.leases import Decision, Kind, LeaseName
from ordq.coordinator.paths import check_name
from ordq.coordinator.store import ZkStore
from ordq.coordinator.tokens import TokenRecord
from ordq.coordinator.topics import partition_queue
from ordq.coordinator.zk_answer import zk_answer

log = logging.getLogger("ordq.coordinator.service")

# How long a consumer's renewal waits for its queue state's stamp (``LeaseRequest.with_state``):
# ZooKeeper answers in about a millisecond; slower, the renewal is answered without it.
STAMP_WAIT_S = 0.25
# LeaseKind on the wire (proto enum numbers) -> our kind and the role its holder needs.
_KINDS = {1: (Kind.PRODUCER, "produce"), 2: (Kind.CONSUMER, "consume"), 3: (Kind.MEMBER, "consume")}

# A contender node of the coordinators' election (a kazoo Election):
# "<uuid>__lock__<10-digit sequence>"; the first in sequence order leads.
LOCK_NODE = re.compile(r"__lock__(-?\d{10})$")


def lease_name(req: Any) -> tuple[LeaseName, str]:
    """The lease a LeaseRequest names and the role it needs; ConfigError when malformed."""
    kind, role = _KINDS.get(int(req.kind), (None, ""))
    if kind is None:
        raise ConfigError(f"unknown lease kind {int(req.kind)}")
    check_name("queue", req.queue)
    if kind is Kind.PRODUCER:
        return LeaseName(kind, req.queue), role
    check_name("subscription" if kind is Kind.CONSUMER else "group", req.subscription)
    if kind is Kind.MEMBER:  # kept with the topic's partition 0, whose consume grant it needs
        check_name("topic", req.queue)
        return LeaseName(kind, partition_queue(req.queue, 0), req.subscription, check_name("member", req.holder)), role
    return LeaseName(kind, req.queue, req.subscription), role


def leader_address(client: Any, path: str, *, timeout_s: float = 5.0) -> str:
    """The address of the elected coordinator: what follows the last '@' of the first
    contender's identifier ("" when none leads or it names no address)."""
    try:
        children = zk_answer(client.get_children_async(path), timeout_s)
    except NoNodeError:
        return ""
    for _, child in sorted((int(m.group(1)), c) for c in children if (m := LOCK_NODE.search(c)) is not None):
        try:
            data, _ = zk_answer(client.get_async(f"{path}/{child}"), timeout_s)
        except NoNodeError:
            continue  # gone meanwhile: the next one leads
        ident = data.decode("utf-8", "replace") if data else ""
        return ident.rpartition("@")[2] if "@" in ident else ""
    return ""


def coordinator_addresses(client: Any, path: str, *, timeout_s: float = 5.0) -> list[str]:
    """Every contending coordinator's address (what follows the last '@' of its identifier),
    the leader first: what a client refreshes its bootstrap list with."""
    try:
        children = zk_answer(client.get_children_async(path), timeout_s)
    except NoNodeError:
        return []
    out: list[str] = []
    for _, child in sorted((int(m.group(1)), c) for c in children if (m := LOCK_NODE.search(c)) is not None):
        try:
            data, _ = zk_answer(client.get_async(f"{path}/{child}"), timeout_s)
        except NoNodeError:
            continue
        ident = data.decode("utf-8", "replace") if data else ""
        if "@" in ident and (address := ident.rpartition("@")[2]) not in out:
            out.append(address)
    return out


class LeaseCalls:
    """Acquire, Heartbeat, Release, Describe, Coordinators, SubscriptionRecord."""

    store: ZkStore
    leases: LeaseDesk
    _pb: Any

    def _serve(self, rpc: str, queue: str, context: Any, handle: Any, *, role: str | None = None) -> Any:
        raise NotImplementedError  # CoordinatorService's frame

    # -- leases ------------------------------------------------------------------------------

    def Acquire(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        name, role = lease_name(request)
        return self._serve("Acquire", name.queue, context, lambda _rec: self._acquire(name, request), role=role)

    def _acquire(self, name: LeaseName, req: Any) -> Any:
        check_name("holder", req.holder)
        self._check_exists(name)
        if name.kind is Kind.MEMBER:
            return self._join(name, req)
        if name.kind is Kind.CONSUMER:  # a group's partition: only its owner's consumer (group_desk.py)
            proof = (int(req.generation), str(req.lease_key)) if req.lease_key else None  # the member's lease
            self.leases.groups.check_consumer(name, req.holder, renewing=False, proof=proof)
        got = self.leases.acquire(name, req.holder, ttl_ms=req.ttl_ms, hold_s=req.wait_ms / 1000.0)
        if isinstance(got, Grant):
            r = got.record
            if name.kind is Kind.CONSUMER:
                self._clear_alarms(name, keep=r.holder)  # a dead holder's alarm goes with its lease
            return self._pb.LeaseResponse(granted=True, generation=r.generation, lease_key=got.key, ttl_ms=r.ttl_ms)
        return self._pb.LeaseResponse(granted=False, generation=got.generation, holder=got.holder,
                                      retry_ms=max(1, int(got.retry_s * 1000)))

    def _join(self, name: LeaseName, req: Any) -> Any:
        """A member lease: granted with the group's generation and the member's partitions."""
        got, answer = self.leases.groups.join(name, req.queue, req.ttl_ms)
        if isinstance(got, Grant) and answer is not None:
            r = got.record
            return self._pb.LeaseResponse(granted=True, generation=r.generation, lease_key=got.key, ttl_ms=r.ttl_ms,
                                          group_generation=answer.generation, partitions=list(answer.partitions))
        assert isinstance(got, Decision)
        return self._pb.LeaseResponse(granted=False, generation=got.generation, holder=got.holder,
                                      retry_ms=max(1, int(got.retry_s * 1000)))

    def _check_exists(self, name: LeaseName) -> None:
        """A lease only of what exists: QueueNotFound, SubscriptionNotFound, TopicNotFound."""
        if name.kind is Kind.PRODUCER:
            self.store.queue_config(name.queue)
        elif name.kind is Kind.CONSUMER:
            self.store.get_cursor(name.queue, name.sub)
        elif self.store.queue_config(name.queue).topic is None:
            raise ConfigError(f"{name.queue!r} is not a partition of a keyed topic")

    def Heartbeat(self, request: Any, context: Any) -> Any:  # noqa: N802
        name, role = lease_name(request)

        def beat(_rec: TokenRecord | None) -> Any:
            if name.kind is Kind.MEMBER:
                r, answer = self.leases.groups.beat(name, request.queue, request.generation, request.lease_key)
                return self._pb.LeaseResponse(granted=True, generation=r.generation, ttl_ms=r.ttl_ms,
                                              group_generation=answer.generation, partitions=list(answer.partitions))
            if name.kind is Kind.CONSUMER:
                self.leases.groups.check_consumer(name, request.holder, renewing=True)
            r = self.leases.heartbeat(name, request.generation, request.lease_key)
            out = self._pb.LeaseResponse(granted=True, generation=r.generation, ttl_ms=r.ttl_ms)
            if request.with_state and name.kind is Kind.CONSUMER:
                # read after the renewal: a consumer that finds its state's stamp unchanged needs
                # no Describe to know its state is the latest (sdk/_queue_view.py). The renewal
                # is answered from memory: ZooKeeper slow or away leaves the stamp untold (0), and
                # so does any other failure of the read: the renewal itself has succeeded.
                try:
                    out.state_zxid = self.store.state_stamp(name.queue, name.sub, wait_s=STAMP_WAIT_S)
                except OrdqError as exc:
                    log.debug("Heartbeat of %s: state stamp untold: %s", name, exc)
            return out

        return self._serve("Heartbeat", name.queue, context, beat, role=role)

    def Release(self, request: Any, context: Any) -> Any:  # noqa: N802
        name, role = lease_name(request)

        def release(_rec: TokenRecord | None) -> Any:
            if name.kind is Kind.MEMBER:  # the member leaves: a new generation without it
                self.leases.groups.leave(name, request.queue, request.generation, request.lease_key)
            else:
                self.leases.release(name, request.generation, request.lease_key)
            if name.kind is Kind.CONSUMER:
                self._clear_alarms(name, keep=None)  # a consumer that leaves shows no alarm
            return self._pb.LeaseResponse(granted=False, generation=request.generation)

        return self._serve("Release", name.queue, context, release, role=role)

    # -- what clients read -------------------------------------------------------------------

    def Describe(self, request: Any, context: Any) -> Any:  # noqa: N802
        if request.topic:
            check_name("topic", request.topic)
            return self._serve("Describe", partition_queue(request.topic, 0), context,
                               lambda _rec: self._describe_topic(request.topic))
        return self._serve("Describe", request.queue, context, lambda _rec: self._describe(request))

    def _describe_topic(self, topic: str) -> Any:
        cfg = self.store.read_topic(topic)
        return self._pb.DescribeResponse(topic_json=json.dumps(attrs.asdict(cfg)).encode())

    def _describe(self, req: Any) -> Any:
        q = req.queue
        st, stat = self.store.load_state_stat(q)
        out = self._pb.DescribeResponse(state_json=json.dumps(st.to_dict(), sort_keys=True).encode(),
                                        state_version=stat.version, state_zxid=stat.mzxid)
        if req.with_config:
            out.config_json = json.dumps(attrs.asdict(self.store.queue_config(q))).encode()
        if req.with_live:
            for gid in st.groups:
                for role, info in sorted(self.store.live_members(gid).items()):
                    out.live.add(gid=gid, role=role, address=info.address, incarnation=str(info.incarnation),
                                 produce=info.produce)
        if req.subscription:
            check_name("subscription", req.subscription)
            cursor, cversion = self.store.get_cursor(q, req.subscription)
            out.cursor_json = json.dumps(cursor.to_dict()).encode()
            out.cursor_version = cversion
        return out

    def Coordinators(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("Coordinators", "", context, lambda _rec: self._coordinators())

    def _coordinators(self) -> Any:
        try:
            addresses = coordinator_addresses(self.store.client, self.store.paths.coordinator_leader)
        except OrdqError:
            raise
        except Exception as exc:  # noqa: BLE001 - ZooKeeper away: the client keeps its list
            raise OrdqError(f"coordinators unknown now: {type(exc).__name__}", retriable=True) from exc
        return self._pb.CoordinatorsResponse(addresses=addresses)

    # -- a subscription's records, kept by its lease holder ---------------------------------------

    def SubscriptionRecord(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("SubscriptionRecord", request.queue, context, lambda _rec: self._record(request),
                           role="consume")

    def _record(self, req: Any) -> Any:
        """One op on the records the consumer lease guards (the lease checked first: LeaseLost
        otherwise; a record of another subscription needs that subscription's lease):

        - ``set_blocked`` {alarm} | null: show or clear the alarm of the lease's holder
          (``blocked/<holder>``, written by the coordinator: cleared on release and when the
          lease is granted to another holder, so a dead consumer's alarm does not stay);
        - ``record_parked`` {seq, ...}: add a ledger record (idempotent per seq);
        - ``update_parked`` {seq, expect_status, set}: change a record only while its status is
          still ``expect_status`` (ConflictError otherwise: an operator changed it; read and
          decide again); ``seq`` cannot change;
        - ``parked``: the ledger; with {seq} only that record (a list of at most one: one
          read, where the ledger is a read per record); ``policy``: the subscription's failure
          policy;
        - ``parked_signal``: the version of the operators' "parked-changed" signal (-1: none),
          which a consumer polls to learn that the ledger changed.
        - ``settings``: the subscription's settings ({"delay_ms": N}; {} when none);
          ``set_waiting`` {seq, due_us, at_us} | null: show or clear what the holder waits on
          (the head of the line held for its time: sdk/delay.py), with the holder's name.
        """
        q, sub = req.queue, req.subscription
        check_name("subscription", sub)
        name = LeaseName(Kind.CONSUMER, q, sub)
        record, _version = self.leases.check(name, req.generation, req.lease_key)
        try:
            body = json.loads(req.body_json) if req.body_json else None
        except ValueError as exc:
            raise ConfigError(f"{req.op}: the body is not JSON") from exc
        result: Any = None
        if req.op == "set_blocked":
            if body is not None and not isinstance(body, dict):
                raise ConfigError("set_blocked: the body is a JSON object or null")
            self.store.set_blocked(q, sub, body, owner=record.holder, ephemeral=False)
        elif req.op == "record_parked":
            if not isinstance(body, dict) or not _is_int(body.get("seq")) or body["seq"] < 0:
                raise ConfigError("record_parked: the body is a JSON object with an integer seq >= 0")
            self.store.record_parked(q, sub, body["seq"], body)
        elif req.op == "update_parked":
            result = self._update_parked(q, sub, body)
        elif req.op == "parked":
            if body is None:
                result = self.store.parked(q, sub)
            elif isinstance(body, dict) and _is_int(body.get("seq")):
                one = self.store.parked_record(q, sub, body["seq"])
                result = [] if one is None else [one]
            else:
                raise ConfigError('parked: the body is null (the ledger) or {"seq": N} (that record)')
        elif req.op == "policy":
            result = self.store.sub_policy(q, sub)
        elif req.op == "parked_signal":
            result = self.store.parked_signal_version(q, sub)
        elif req.op == "settings":
            result = self.store.sub_settings(q, sub)
        elif req.op == "set_waiting":
            if body is not None and (not isinstance(body, dict) or not _is_int(body.get("due_us"))):
                raise ConfigError("set_waiting: the body is a JSON object with an integer due_us, or null")
            self.store.set_waiting(q, sub, None if body is None else {**body, "holder": record.holder})
        else:
            raise ConfigError(f"unknown record op {req.op!r}")
        return self._pb.RecordResponse(body_json=json.dumps(result).encode())

    def _update_parked(self, q: str, sub: str, body: Any) -> Any:
        if (not isinstance(body, dict) or not _is_int(body.get("seq")) or not isinstance(body.get("set"), dict)
                or not isinstance(body.get("expect_status"), str | None)):
            raise ConfigError('update_parked: the body is {"seq": N, "expect_status": S, "set": {...}}')
        seq, expect, changes = body["seq"], body.get("expect_status"), body["set"]
        if "seq" in changes and changes["seq"] != seq:
            raise ConfigError("update_parked: a record's seq cannot change")

        def change(r: dict[str, Any]) -> dict[str, Any]:
            if r.get("status", "parked") != (expect or "parked"):
                raise ConflictError(f"{q}/{sub}: the ledger record of seq {seq} is {r.get('status', 'parked')} "
                                    f"now, not {expect or 'parked'}")
            return {**r, **changes}

        return self.store.update_parked(q, sub, seq, change)

    def _clear_alarms(self, name: LeaseName, *, keep: str | None) -> None:
        """Delete the alarms of the subscription's holders but ``keep``; best effort (a lease
        answer never fails on it: the next grant or release tries again)."""
        try:
            self.store.clear_blocked(name.queue, name.sub, keep=keep)
        except OrdqError as exc:
            log.info("%s: alarms not cleared: %s", name, exc)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_lease(desk: LeaseDesk, kind: Kind, queue: str, sub: str, generation: int, key: str,
                role: str) -> tuple[str, int]:
    """For Claim and Commit: the holder and lease node version of the caller's lease
    (PermissionDenied when the request carries none; LeaseLost when not the current holder)."""
    if not key:
        raise PermissionDenied(queue, role, f"the request carries no {kind.value} lease")
    name = LeaseName(kind, queue, sub)
    record, version = desk.check(name, generation, key)
    return record.holder, version

