"""Where a local cluster (``ordq up``) keeps itself: its folder and the file that records it, as
plain constants, so that ``ordq status`` finds out whether one is here without loading the
cluster's classes (``ordq.cluster_config`` loads attrs and the ZooKeeper server code; issue 42:
``ordq status`` of a running cluster ≤ 0.25 s on a quiet box).

Rules: the standard library only; reads files, asks no process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STATE_FILE = "ordq-cluster.json"
DEFAULT_FOLDER = Path(".ordq")


def holds_cluster(folder: Path) -> bool:
    """Whether ``folder`` records a local cluster (``LocalCluster.exists``)."""
    return (Path(folder) / STATE_FILE).exists()


class LocalFolder:
    """What a local cluster's state file says of its processes (``LocalCluster._save``): where
    each keeps its pid file, and the coordinators' and brokers' addresses. ``ordq status`` takes
    the processes' health from the elected coordinator (one admin call, ``cluster status``) and
    adds what only this folder knows: which of them run here (their pids, and ``down`` for the
    ones that do not), and the coordinators by the names ``ordq up`` gave them."""

    def __init__(self, folder: Path, state: dict[str, Any]) -> None:
        self.folder = Path(folder).absolute()
        self.zk: str = state["zk"]
        self.root: str = state["root"]
        self.bootstrap: str = state.get("bootstrap", "")
        self.pid_files: dict[str, dict[str, str]] = state["processes"]
        self.coordinator_addresses: dict[str, str] = state.get("coordinator_addresses", {})
        self.broker_addresses = {name: b.get("address") for name, b in state.get("brokers", {}).items()}

    @classmethod
    def read(cls, folder: Path) -> LocalFolder | None:
        """The cluster ``folder`` records; None when it records none, or its state file cannot
        be read, or an ``ordq up`` before this one wrote it, or it was written at another path
        (its pid files' paths are that folder's): then ``LocalCluster`` reads it."""
        try:
            state = json.loads((Path(folder) / STATE_FILE).read_text())
            if "processes" not in state or state.get("folder") != str(Path(folder).absolute()):
                return None
            return cls(folder, state)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def running(self) -> dict[str, int | None]:
        """Each process's pid while it runs, else None, in the order ``ordq up`` starts them."""
        from ordq.common.pid_file import running_pid

        return {name: running_pid(Path(p["pid_file"]), p["program"]) for name, p in self.pid_files.items()}

    def rows(self, asked: list[dict[str, Any]], running: Mapping[str, int | None]) -> list[dict[str, Any]]:
        """``local_rows`` of this folder's processes."""
        return local_rows(asked, running, {**self.broker_addresses, **self.coordinator_addresses})


NOT_RUNNING_BUT_LIVE = "live in ZooKeeper (session not expired yet)"


def local_rows(asked: list[dict[str, Any]], running: Mapping[str, int | None],
               addresses: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """The rows of ``ordq status`` for a local cluster: ``asked``, the processes' rows as the
    elected coordinator asked them (``cluster status``: ``ProcessStatus.to_dict()``), with what
    the folder knows: ``running``, each of its processes' pid (None: not running) and
    ``addresses``, where its coordinators and brokers listen.

    A process of the folder that does not run is ``down`` (the coordinator may still see its
    liveness node until its session expires, or not see it at all); one that runs has its pid
    (ZooKeeper's, which no one else knows); a coordinator is named as ``ordq up`` named it (the
    coordinator's row says ``host-pid``), found by its service address; one that runs but is not
    in the election is unhealthy. The folder's processes come in its order, then any other the
    coordinator found (a coordinator started by hand)."""
    by_address = {address: name for name, address in addresses.items()
                  if address and name.startswith("coordinator-")}
    ours: dict[str, dict[str, Any]] = {}
    others = []
    for answer in asked:
        name = (by_address.get(answer.get("listen") or "", answer["name"]) if answer["kind"] == "coordinator"
                else answer["name"])
        if name in running:
            ours[name] = {**answer, "name": name}
        else:
            others.append(answer)
    out = []
    for name, pid in running.items():
        row = ours.get(name)
        if pid is None:
            seen_live = row is not None and row["kind"] == "broker" and row["state"] != "not live"
            out.append({"name": name, "kind": row["kind"] if row else _kind(name), "pid": None,
                        "listen": (row or {}).get("listen") or addresses.get(name), "state": "down",
                        "healthy": False, "detail": NOT_RUNNING_BUT_LIVE if seen_live else "", "version": ""})
        elif row is None:
            out.append({"name": name, "kind": _kind(name), "pid": pid, "listen": addresses.get(name),
                        "state": "not registered", "healthy": False, "version": "",
                        "detail": "runs, but is not in the coordinator election" if _kind(name) == "coordinator"
                        else "runs, but the coordinator did not find it registered"})
        else:
            out.append({**row, "pid": pid})
    return out + others


def _kind(name: str) -> str:
    return "coordinator" if name.startswith("coordinator-") else "zookeeper" if name.startswith("zk") else "broker"
