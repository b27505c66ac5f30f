"""Register ephemeral liveness nodes for groups, print READY, then sleep until killed.

usage: python -m tests.helpers.live_member HOSTS ROOT SESSION_S GID:ROLE [GID:ROLE ...]
"""

from __future__ import annotations

import sys
import threading

from kazoo.client import KazooClient

from ordq.common.proc import announce
from ordq.coordinator.paths import Paths
from ordq.coordinator.store import ZkStore


def main() -> None:
    hosts, root, session_s, *members = sys.argv[1:]
    client = KazooClient(hosts=hosts, timeout=float(session_s))
    client.start(timeout=10)
    store = ZkStore(client, Paths(root))
    for member in members:
        gid, role = member.split(":")
        store.register_live(gid, role, address=f"127.0.0.1:0/{gid}/{role}", incarnation="test")
    announce("READY")
    threading.Event().wait()


if __name__ == "__main__":
    main()
