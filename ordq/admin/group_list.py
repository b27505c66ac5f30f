"""``ordq group list``'s rows (issue 42): each broker group with the liveness of its master and
slave, its drain mark, which of them is out of disk space, and the queues it serves and heads.
Served by the elected coordinator (``group list``, ordq/admin/api.py) from its copies of the
queues' states, and by the CLI itself only when no coordinator is known for the cluster
(ordq/commands/group.py).

Rules: reads only; a queue the caller may not read is named in no row (``may_read``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ordq.coordinator.state import QueueState


def group_rows(store: Any, states: Mapping[str, QueueState], may_read: Callable[[str], bool]) -> list[dict[str, Any]]:
    """One row per registered group; ``states``: the queues' states by name (those the caller
    may read, or all of them: filtered here)."""
    shown = {q: st for q, st in states.items() if may_read(q)}
    rows = []
    for gid in store.list_groups():
        live = store.live_members(gid)
        rows.append({
            "group": gid,
            "master": live["master"].address if "master" in live else None,
            "slave": live["slave"].address if "slave" in live else None,
            "healthy": len(live) == 2,
            "drained": bool(store.get_group(gid).get("drained", False)),
            # its processes whose disk is full: the group takes no writes until they have room
            "disk_full": sorted(role for role, info in live.items() if info.disk_full),
            "queues": sorted(q for q, st in shown.items() if gid in st.groups),
            "sending": sorted(q for q, st in shown.items() if st.head == gid),
        })
    return rows
