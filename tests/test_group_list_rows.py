"""The rows of ``ordq group list`` (ordq/admin/group_list.py), pure: from the groups' records and
liveness and the queues' states, without ZooKeeper (a stand-in of the three store reads it
makes); a queue the caller may not read is named in no row (issue 42)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs

from ordq.admin.group_list import group_rows
from ordq.coordinator.state import create


class Groups:
    """What ``group_rows`` reads of a store: the groups, their live members, their records."""

    def __init__(self, live: dict[str, list[str]], drained: set[str], full: frozenset[str] = frozenset()) -> None:
        self.live, self.drained, self.full = live, drained, full

    def list_groups(self) -> list[str]:
        return sorted(self.live)

    def live_members(self, gid: str) -> dict[str, Any]:
        return {role: SimpleNamespace(address=f"{gid}-{role}:1", disk_full=f"{gid}-{role}" in self.full)
                for role in self.live[gid]}

    def get_group(self, gid: str) -> dict[str, Any]:
        return {"drained": True} if gid in self.drained else {}


def test_rows_name_liveness_drain_a_full_disk_and_only_the_readable_queues() -> None:
    store = Groups({"g1": ["master", "slave"], "g2": ["slave"], "g3": []}, drained={"g3"}, full=frozenset({"g2-slave"}))
    states = {"a": attrs.evolve(create("a", ["g1", "g2"]), send=("g1", "g2")),  # g1 heads a
              "b": create("b", ["g2", "g1"]), "secret": create("secret", ["g1"])}
    rows = group_rows(store, states, lambda q: q != "secret")
    assert rows == [
        {"group": "g1", "master": "g1-master:1", "slave": "g1-slave:1", "healthy": True, "drained": False,
         "disk_full": [], "queues": ["a", "b"], "sending": ["a"]},
        {"group": "g2", "master": None, "slave": "g2-slave:1", "healthy": False, "drained": False,
         "disk_full": ["slave"], "queues": ["a", "b"], "sending": []},
        {"group": "g3", "master": None, "slave": None, "healthy": False, "drained": True, "disk_full": [],
         "queues": [], "sending": []},
    ]
    assert all("secret" not in r["queues"] + r["sending"] for r in rows)
    assert [r["queues"] for r in group_rows(store, states, lambda q: True)][0] == ["a", "b", "secret"]
