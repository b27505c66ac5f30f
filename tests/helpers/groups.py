"""Groups for tests that need no broker: added, with both processes' liveness nodes registered
under the test's own ZooKeeper session (fake addresses: nothing dials them)."""

from __future__ import annotations

from collections.abc import Iterable

from ordq.coordinator.store import ZkStore


def add_live_groups(store: ZkStore, groups: Iterable[str]) -> None:
    for g in groups:
        store.add_group(g)
        for role in ("master", "slave"):
            store.register_live(g, role, address=f"127.0.0.1:0/{g}/{role}", incarnation="t")
