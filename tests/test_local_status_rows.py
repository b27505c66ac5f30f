"""``ordq status`` of a local cluster from its coordinator's answer (issue 42: the command's
own sweep cost 711 M instructions): what only the folder knows, added to the rows the elected
coordinator asked (``ordq.cluster_folder.local_rows``), pure. The live cluster:
tests/test_local_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ordq.cluster_folder import NOT_RUNNING_BUT_LIVE, STATE_FILE, LocalFolder, local_rows

ADDRESSES: dict[str, str | None] = {"g1/master": "127.0.0.1:9001", "g1/slave": "127.0.0.1:9002",
                                    "coordinator-1": "127.0.0.1:7001", "coordinator-2": "127.0.0.1:7002"}


def row(name: str, kind: str, state: str, *, pid: int | None = None, listen: str | None = None,
        healthy: bool = True) -> dict[str, Any]:
    return {"name": name, "kind": kind, "pid": pid, "listen": listen, "state": state, "healthy": healthy,
            "detail": "", "version": "0.1.0"}


def asked() -> list[dict[str, Any]]:
    """A healthy cluster as its coordinator answers ``cluster status``: the leader first."""
    return [row("zk1", "zookeeper", "standalone", listen="127.0.0.1:2181"),
            row("g1/master", "broker", "live", pid=11, listen="127.0.0.1:9001"),
            row("g1/slave", "broker", "live", pid=12, listen="127.0.0.1:9002"),
            row("host-22", "coordinator", "leader", pid=22, listen="127.0.0.1:7002"),
            row("host-21", "coordinator", "standby", pid=21, listen="127.0.0.1:7001")]


RUNNING = {"zk1": 5, "g1/master": 11, "g1/slave": 12, "coordinator-1": 21, "coordinator-2": 22}


def test_a_healthy_cluster_keeps_the_coordinators_answer_with_the_folders_pids_and_names() -> None:
    rows = local_rows(asked(), RUNNING, ADDRESSES)
    assert [r["name"] for r in rows] == list(RUNNING)  # the folder's order, coordinators by its names
    assert [r["pid"] for r in rows] == list(RUNNING.values())  # ZooKeeper's too, which no one else knows
    assert [r["state"] for r in rows] == ["standalone", "live", "live", "standby", "leader"]
    assert all(r["healthy"] for r in rows)


def test_a_process_that_does_not_run_is_down_whatever_zookeeper_still_shows() -> None:
    running = {**RUNNING, "g1/master": None, "g1/slave": None}
    answer = asked()
    answer[1] = row("g1/master", "broker", "no answer", pid=11, listen="127.0.0.1:9001", healthy=False)
    answer[2] = row("g1/slave", "broker", "not live", healthy=False)  # its liveness node is gone
    by_name = {r["name"]: r for r in local_rows(answer, running, ADDRESSES)}
    master, slave = by_name["g1/master"], by_name["g1/slave"]
    assert (master["state"], master["pid"], master["healthy"], master["detail"]) == ("down", None, False,
                                                                                  NOT_RUNNING_BUT_LIVE)
    assert (slave["state"], slave["listen"], slave["healthy"], slave["detail"]) == ("down", "127.0.0.1:9002",
                                                                                 False, "")


def test_a_coordinator_gone_from_the_election_is_down_or_named_when_it_runs() -> None:
    answer = [r for r in asked() if r["name"] != "host-21"]
    rows = {r["name"]: r for r in local_rows(answer, {**RUNNING, "coordinator-1": None}, ADDRESSES)}
    assert (rows["coordinator-1"]["state"], rows["coordinator-1"]["healthy"]) == ("down", False)
    assert rows["coordinator-1"]["listen"] == "127.0.0.1:7001"
    rows = {r["name"]: r for r in local_rows(answer, RUNNING, ADDRESSES)}
    assert (rows["coordinator-1"]["state"], rows["coordinator-1"]["healthy"]) == ("not registered", False)
    assert "not in the coordinator election" in rows["coordinator-1"]["detail"]


def test_a_coordinator_the_folder_did_not_start_is_listed_after_its_own() -> None:
    answer = [*asked(), row("other-99", "coordinator", "standby", pid=99, listen="10.0.0.9:7000")]
    rows = local_rows(answer, RUNNING, ADDRESSES)
    assert [r["name"] for r in rows] == [*RUNNING, "other-99"]


def test_a_state_file_written_at_another_path_or_before_is_left_to_the_folders_own_sweep(tmp_path: Path) -> None:
    """Its pid files' paths are another folder's (moved), or it names none (an older ``ordq up``):
    ``LocalFolder.read`` gives None, and ``ordq status`` sweeps the folder's processes itself."""
    here = tmp_path / "c"
    here.mkdir()
    state = {"folder": str(here.absolute()), "zk": "127.0.0.1:2181", "root": "/ordq", "bootstrap": "127.0.0.1:7001",
             "processes": {"zk1": {"pid_file": str(here / "zk" / "node0" / "zk1.pid"), "program": "java"}},
             "coordinator_addresses": {}, "brokers": {}}
    (here / STATE_FILE).write_text(json.dumps(state))
    read = LocalFolder.read(here)
    assert read is not None and read.running() == {"zk1": None}
    (here / STATE_FILE).write_text(json.dumps({**state, "folder": str(tmp_path / "elsewhere")}))
    assert LocalFolder.read(here) is None
    (here / STATE_FILE).write_text(json.dumps({k: v for k, v in state.items() if k != "processes"}))
    assert LocalFolder.read(here) is None
    (here / STATE_FILE).write_text("not json")
    assert LocalFolder.read(here) is None
