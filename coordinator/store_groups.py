"""Broker groups in ZooKeeper: their registration and config (the drain mark), and the
ephemeral nodes their live processes hold.

Rules: a part of ``ZkStore`` (coordinator/store.py) over ``ZkBase``'s requests; kazoo errors
become ordq's here, as everywhere in the store.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ordq.common.errors import AlreadyExists, ConflictError, GroupNotFound
from ordq.coordinator.paths import ROLES
from ordq.coordinator.store_base import ZkBase
from ordq.coordinator.store_values import LiveInfo, json_bytes, json_value, live_info


class GroupRecords(ZkBase):
    """Broker groups and their live processes (a part of ZkStore)."""

    def add_group(self, gid: str, config: Mapping[str, Any] | None = None) -> None:
        path = self.paths.group(gid)
        with self._errors():
            try:
                self._wait(self.client.create_async(path, json_bytes(dict(config or {})), makepath=True))
            except NodeExistsError as exc:
                raise AlreadyExists(f"broker group {gid!r} already exists") from exc
            self._wait(self.client.ensure_path_async(self.paths.live(gid)))

    def list_groups(self) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.groups))
            except NoNodeError:
                return []

    def get_group(self, gid: str) -> dict[str, Any]:
        with self._errors():
            try:
                data, _ = self._read(self.client.get_async, self.paths.group(gid))
            except NoNodeError as exc:
                raise GroupNotFound(gid) from exc
        return dict(json_value(data))

    def register_live(self, gid: str, role: str, address: str, incarnation: str, *,
                      replication: str | None = None, produce: str | None = None, disk_full: bool = False) -> None:
        """Create this process's ephemeral liveness node (gone when its session ends).
        Safe to repeat (coordinator/zk_retry.py): a node already there with this
        ``incarnation`` is our own create, landed before its connection dropped.

        A node with this ``incarnation`` held by an *earlier* session of this process (the
        registration again after a lost session, while ZooKeeper has not expired the old one
        yet: a new leader expires it only a session timeout after it starts) is replaced by
        one of this session: kept, it would go with the old session, and the group would look
        dead for good (issue 26: no group admitted, NoGroupAvailable)."""
        self.get_group(gid)  # GroupNotFound for an unregistered group
        path = self.paths.live(gid, role)
        node = {"address": address, "incarnation": incarnation, "pid": os.getpid()}
        if replication is not None:  # a slave's lean replication link (broker_group/lean_link.py)
            node["replication"] = replication
        if produce is not None:  # a master's lean produce link (broker_group/lean_produce.py)
            node["produce"] = produce
        if disk_full:  # registered again (a new session) while its disk is still full
            node["disk_full"] = True
        data = json_bytes(node)
        with self._errors():
            for _ in range(50):
                try:
                    self._wait(self.client.create_async(path, data, ephemeral=True, makepath=True))
                    return
                except NodeExistsError as exc:
                    try:
                        held, stat = self._read(self.client.get_async, path)
                    except NoNodeError:
                        continue  # the old session just ended: create it again
                    if json_value(held).get("incarnation") != incarnation:
                        raise AlreadyExists(
                            f"a {role} of group {gid!r} is already live (another process holds the role)"
                        ) from exc
                    session = self.client.client_id
                    if session is not None and stat.ephemeralOwner == session[0]:
                        return
                    try:  # ours, from a lost session that ZooKeeper has not expired yet
                        self._wait(self.client.delete_async(path, version=stat.version))
                    except (NoNodeError, BadVersionError):
                        pass
        raise ConflictError(f"group {gid!r}: gave up registering the {role} after 50 conflicting writes")

    def set_disk_full(self, gid: str, role: str, incarnation: str, full: bool) -> bool:
        """Say in this process's own liveness node whether its disk is full (``LiveInfo.disk_full``);
        False when the node is not this incarnation's (not registered, or its session ended:
        ``register_live`` then writes the mark)."""
        gave_up = f"group {gid!r}: gave up marking the {role}'s disk"
        return self._set_flag(self.paths.live(gid, role), "disk_full", full, gave_up,
                              keep=lambda node: node.get("incarnation") == incarnation) is not None

    def live_members(self, gid: str) -> dict[str, LiveInfo]:
        """The group's live processes by role. Both liveness nodes are read in one round trip
        (pipelined; a producer's failover looks its new head's master up this way)."""

        def both() -> dict[str, LiveInfo]:
            asked = [(role, self.client.get_async(self.paths.live(gid, role))) for role in ROLES]
            out: dict[str, LiveInfo] = {}
            for role, request in asked:
                try:
                    data, _ = self._wait(request)
                except NoNodeError:
                    continue
                out[role] = live_info(json_value(data))
            return out

        with self._errors():
            found: dict[str, LiveInfo] = self._retry.copy()(both)
        return found

    def live_groups(self, gids: tuple[str, ...] | list[str]) -> frozenset[str]:
        """The groups among ``gids`` whose master and slave are both live."""
        return self.liveness(gids)[0]

    def liveness(self, gids: tuple[str, ...] | list[str]) -> tuple[frozenset[str], frozenset[str]]:
        """The groups among ``gids`` whose master and slave are both live, and those a live
        process of which says its disk is full (``Facts.live_groups``, ``Facts.disk_full``)."""
        members = {g: self.live_members(g) for g in gids}
        return (frozenset(g for g, m in members.items() if len(m) == len(ROLES)),
                frozenset(g for g, m in members.items() if any(info.disk_full for info in m.values())))

    def set_group_drained(self, gid: str, drained: bool) -> bool:
        """Mark (or unmark) ``gid`` as drained for maintenance in its config znode and return
        the previous mark. A drained group is never admitted to a send list (``Facts.drained``);
        taking it out of the send lists it is in is the caller's transition (``remove_from_send``)."""
        before = self._set_flag(self.paths.group(gid), "drained", drained, f"group {gid!r}: gave up marking it drained")
        if before is None:
            raise GroupNotFound(gid)
        return before

    def _set_flag(self, path: str, key: str, on: bool, gave_up: str,
                  keep: Callable[[dict[str, Any]], bool] = lambda _node: True) -> bool | None:
        """Set (``on``) or clear the boolean ``key`` of the JSON node at ``path``, by a
        versioned write read again on a conflict; its value before, or None when the node is
        gone or ``keep(node)`` is false (not ours: left as it is). ``gave_up``: the
        ConflictError's words after 50 conflicting writes."""
        for _ in range(50):
            with self._errors():
                try:
                    data, stat = self._read(self.client.get_async, path)
                    node = dict(json_value(data))
                    if not keep(node):
                        return None
                    before = bool(node.get(key, False))
                    if before == on:
                        return before
                    if on:
                        node[key] = True
                    else:
                        node.pop(key, None)
                    self._wait(self.client.set_async(path, json_bytes(node), version=stat.version))
                    return before
                except NoNodeError:
                    return None
                except BadVersionError:
                    continue  # the node changed meanwhile: read it again
        raise ConflictError(f"{gave_up} after 50 conflicting writes")

    def _drained_with_versions(self, gids: tuple[str, ...] | list[str]) -> tuple[frozenset[str], dict[str, int]]:
        drained: set[str] = set()
        versions: dict[str, int] = {}
        with self._errors():
            for gid in gids:
                try:
                    data, stat = self._read(self.client.get_async, self.paths.group(gid))
                except NoNodeError:
                    continue
                versions[gid] = stat.version
                if json_value(data).get("drained"):
                    drained.add(gid)
        return frozenset(drained), versions

    def drained_groups(self, gids: tuple[str, ...] | list[str]) -> frozenset[str]:
        """The groups among ``gids`` an operator drained (``set_group_drained``)."""
        return self._drained_with_versions(gids)[0]

    def wait_not_live(self, gid: str, role: str, *, timeout_s: float) -> bool:
        """Block until no process is registered live as ``role`` of ``gid`` (watch-driven);
        False if one still is after ``timeout_s``."""
        gone = threading.Event()
        deadline = time.monotonic() + timeout_s
        while True:
            gone.clear()
            with self._errors():
                stat = self._read(self.client.exists_async, self.paths.live(gid, role), watch=lambda _e: gone.set())
            if stat is None:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not gone.wait(left):
                return False
