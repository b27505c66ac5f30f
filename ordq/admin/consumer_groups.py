"""What ``ordq topic group T G`` shows: a consumer group's members (their member leases, kept by
the coordinator), which partitions each owns (delivers from now: holds the partition's consumer
lease or election) and should own (the assignment of the members' generation,
coordinator/group_desk.py), and the lag of each partition. Read at one moment; nothing here
writes."""

from __future__ import annotations

from typing import Any

from ordq.admin.queue_views import describe_queue
from ordq.common.errors import QueueNotFound
from ordq.coordinator.group_assign import member_of_consumer, owner_of
from ordq.coordinator.leases import Kind, LeaseName
from ordq.coordinator.store import ZkStore
from ordq.coordinator.topics import partition_queue
from ordq.sdk.replicas import ReplicaReader


def group_members(store: ZkStore, topic: str, group: str) -> dict[str, dict[str, Any]]:
    """The members of ``group`` on ``topic`` as their member leases say: ``{member_id:
    {"lease_generation", "ttl_ms"}}``. A member that died is listed until the coordinator noticed
    (about one ttl): only the coordinator's clock knows renewals."""
    tq = partition_queue(topic, 0)
    out: dict[str, dict[str, Any]] = {}
    for m in store.lease_members(tq, group):
        record, _version = store.read_lease(LeaseName(Kind.MEMBER, tq, group, m))
        if record is not None and not record.released:
            out[m] = {"lease_generation": record.generation, "ttl_ms": record.ttl_ms}
    return out


def group_generation(store: ZkStore, topic: str, group: str) -> int:
    """The group's generation as the coordinator last wrote it (0: no member ever joined)."""
    found = store.read_group(partition_queue(topic, 0), group)
    return found[0] if found is not None else 0


def describe_consumer_group(store: ZkStore, reader: ReplicaReader, topic: str, group: str) -> dict[str, Any]:
    """``{"topic", "group", "partitions", "members": {id: {...}}, "rows": [per partition]}``;
    each row: partition, queue, owner (the member delivering it now, None: nobody),
    assigned (the member it should go to), cursor position and lag (None: unknown).
    TopicNotFound."""
    tc = store.read_topic(topic)
    members = group_members(store, topic, group)
    assigned = owner_of(members, tc.partitions)
    rows: list[dict[str, Any]] = []
    for p in range(tc.partitions):
        queue = partition_queue(topic, p)
        row: dict[str, Any] = {"partition": p, "queue": queue, "owner": None, "assigned": assigned.get(p),
                               "seg": None, "last_seq": None, "lag": None}
        try:
            view = describe_queue(store, reader, queue)
        except QueueNotFound:
            rows.append(row)
            continue
        sub = next((s for s in view.subscriptions if s.name == group), None)
        if sub is not None:
            row.update(owner=member_of_consumer(sub.held_by), seg=sub.cursor.seg, last_seq=sub.cursor.last_seq,
                       lag=sub.lag)
        rows.append(row)
    owns = {m: [r["partition"] for r in rows if r["owner"] == m] for m in members}
    return {"topic": topic, "group": group, "partitions": tc.partitions,
            "generation": group_generation(store, topic, group),
            "members": {m: {**info, "owns": owns[m], "assigned": [p for p, a in assigned.items() if a == m]}
                        for m, info in members.items()},
            "rows": rows,
            "lag": sum(r["lag"] for r in rows if r["lag"] is not None),
            "lag_known": all(r["lag"] is not None for r in rows)}
