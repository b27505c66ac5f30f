"""Lease records in ZooKeeper (coordinator/leases.py decides; this reads and writes them).

Guarantee: a grant is one versioned write of the lease's node (created when new), so two
coordinators that both believe they lead cannot both grant it: the second write loses with
ConflictError. The node's version at the grant travels with requests the lease guards (a
cursor commit checks it in the same transaction, store_cursors.py), so a commit of a superseded
holder cannot land even through a deposed coordinator.

Rules: a part of ``ZkStore``; only the coordinator writes these nodes (clients hold no
ZooKeeper session, coordinator/acl.py gives them no right here).
"""

from __future__ import annotations

import logging

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ordq.common.errors import ConflictError, OrdqError
from ordq.coordinator.leases import Kind, LeaseName, LeaseRecord
from ordq.coordinator.store_base import ZkBase
from ordq.coordinator.store_values import json_bytes, json_value

log = logging.getLogger("ordq.coordinator.leases")


class LeaseRecords(ZkBase):
    """Reading and writing lease nodes (a part of ZkStore)."""

    def lease_path(self, name: LeaseName) -> str:
        return self.paths.lease(name.kind.value, name.queue, name.sub, name.member)

    def read_lease(self, name: LeaseName) -> tuple[LeaseRecord | None, int]:
        """The record and its node's version; (None, -1) when there is none."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.lease_path(name))
            except NoNodeError:
                return None, -1
        try:
            return LeaseRecord.from_dict(dict(json_value(data))), int(stat.version)
        except (OrdqError, TypeError, ValueError) as exc:
            # Garbled (no coordinator writes that): nobody holds it; the next grant overwrites it.
            log.warning("lease %s: unreadable record (%s): counted as free", name, exc)
            return None, int(stat.version)

    def write_lease(self, name: LeaseName, record: LeaseRecord, version: int) -> int:
        """Write ``record`` if the node is still at ``version`` (-1: create it); its new version.
        ConflictError when another write came first."""
        return self._write_versioned(self.lease_path(name), json_bytes(record.to_dict()), version, f"lease {name}")

    def _write_versioned(self, path: str, data: bytes, version: int, what: str) -> int:
        """Write ``data`` at ``path`` if the node is still at ``version`` (-1: create it, with
        its parents); the new version. ConflictError when another write came first (or the
        node was removed meanwhile)."""
        with self._errors():
            try:
                if version < 0:
                    self._wait(self.client.create_async(path, data, makepath=True))
                    return 0
                return int(self._wait(self.client.set_async(path, data, version=version)).version)
            except (NodeExistsError, BadVersionError) as exc:
                raise ConflictError(f"{what} changed meanwhile") from exc
            except NoNodeError as exc:
                raise ConflictError(f"{what} was removed meanwhile") from exc

    def lease_members(self, topic_queue: str, group: str) -> list[str]:
        """The member names with a lease node in ``group`` (of the topic's partition-0 queue)."""
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async,
                                         self.paths.lease(Kind.MEMBER.value, topic_queue, group)))
            except NoNodeError:
                return []

    # -- consumer groups: the member leases' folder keeps the group's generation ----------------

    def delete_lease(self, name: LeaseName, version: int) -> None:
        """Remove a lease node (a member that left or expired) if it is still at ``version``;
        gone already is fine. ConflictError when another write came first."""
        with self._errors():
            try:
                self._wait(self.client.delete_async(self.lease_path(name), version=version))
            except NoNodeError:
                return
            except BadVersionError as exc:
                raise ConflictError(f"lease {name} changed meanwhile") from exc

    def read_group(self, topic_queue: str, group: str) -> tuple[int, int] | None:
        """(generation, node version) of a consumer group's member folder; None when no member
        ever joined it."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.lease(Kind.MEMBER.value, topic_queue, group))
            except NoNodeError:
                return None
        try:
            generation = int(dict(json_value(data)).get("generation", 0)) if data else 0
        except (OrdqError, TypeError, ValueError):
            generation = 0  # garbled: the next bump rewrites it (members only compare generations)
        return generation, int(stat.version)

    def write_group(self, topic_queue: str, group: str, generation: int, version: int) -> int:
        """Write the group's generation if its folder is still at ``version`` (-1: create it);
        the new version. ConflictError when another coordinator wrote first."""
        return self._write_versioned(self.paths.lease(Kind.MEMBER.value, topic_queue, group),
                                     json_bytes({"generation": generation}), version, f"group {topic_queue}/{group}")
