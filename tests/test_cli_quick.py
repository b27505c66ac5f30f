"""An admin command's start-up and exit (issue 42: ``ordq queue list`` ≤ 0.25 s of CPU on a quiet
box). What its process loads is pinned here, in a separate interpreter each: no attrs (its import
and its generated classes were a sixth of the command), no uuid (it loads platform), neither the
queue state's classes nor the certificate code, whether the cluster is named by --bootstrap or
found through the current context. And the commands that only ask and print end without the
interpreter's teardown (``ordq.cli._quick_exit``) with their output and exit code whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.zk_server import free_ports

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("attrs", "attr", "uuid", "platform", "dataclasses", "ordq.coordinator.state", "ordq.coordinator.store_values",
         "ordq.coordinator.paths", "ordq.coordinator.client_values", "ordq.common.security", "ordq.sdk",
         "ordq.coordinator.topics", "ordq.coordinator.store_values")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_BOOTSTRAP", "ORDQ_CONTEXT", "ORDQ_CONTEXTS", "ORDQ_HOME")}
    return {**env, "ORDQ_CREDENTIALS": str(tmp_path / "credentials.json"), "PYTHONPATH": str(REPO)}


def _loaded_by(argv: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    code = ("import json, sys\nfrom ordq.cli import main\n"
            f"main({argv!r})\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1]), res.stderr


def test_queue_list_loads_no_attrs_nor_the_queue_state_by_bootstrap_or_by_context(tmp_path: Path) -> None:
    [closed] = free_ports(1)
    env = _env(tmp_path)
    loaded, err = _loaded_by(["--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.3", "queue", "list"], env)
    assert "no coordinator of the cluster answered" in err, err
    assert loaded == []
    # the cluster found through the current context, its coordinators registered in the credentials file
    (tmp_path / "credentials.json").write_text(json.dumps({"clusters": {
        f"127.0.0.1:{closed}/ordq": {"coordinators": [f"127.0.0.1:{closed}"]}}}))
    add = subprocess.run([sys.executable, "-m", "ordq.cli", "context", "add", "here", "--zk", f"127.0.0.1:{closed}",
                          "--use"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert add.returncode == 0, add.stderr
    loaded, err = _loaded_by(["--zk-timeout", "0.3", "queue", "list"], env)
    assert f"no coordinator of the cluster answered at 127.0.0.1:{closed}" in err, err
    assert loaded == []
    loaded, err = _loaded_by(["--zk-timeout", "0.3", "sub", "list", "q"], env)  # its module imported attrs
    assert f"no coordinator of the cluster answered at 127.0.0.1:{closed}" in err, err
    assert loaded == []


def test_a_quick_exit_keeps_the_output_and_the_exit_code(tmp_path: Path) -> None:
    env = _env(tmp_path)

    def ordq(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True,
                              timeout=120, env=env, cwd=REPO)

    for i in range(30):  # a table still in stdout's buffer when the command returns
        assert ordq("context", "add", f"c{i:02d}-" + "x" * 50, "--zk", f"10.0.0.{i}:2181").returncode == 0
    listed = ordq("context", "list")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 31 and listed.stdout.splitlines()[-1].startswith("         c29-")
    [closed] = free_ports(1)
    refused = ordq("--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.3", "queue", "list")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("ordq: error: no coordinator of the cluster answered"), refused.stderr
    assert ordq("context", "use", "nope").returncode == 1


def test_topic_list_loads_neither_attrs_nor_the_topic_and_settings_classes(tmp_path: Path) -> None:
    """Issue 42: ``topic list`` imported attrs, the queue state and the settings' class for its
    parser (362 M instructions against queue list's 253 M)."""
    [closed] = free_ports(1)
    loaded, err = _loaded_by(["--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.3", "topic", "list"],
                             _env(tmp_path))
    assert "no coordinator of the cluster answered" in err, err
    assert loaded == []


def test_status_with_neither_a_coordinator_nor_zookeeper_answering_names_both(tmp_path: Path) -> None:
    """``ordq status`` asks the elected coordinator (one admin call); when none answers it asks
    every process itself through ZooKeeper; when that does not answer either, one line says
    both (tests/test_status_any.py: the coordinator's answer, and the command's own sweep)."""
    coordinator, zk = free_ports(2)
    env = _env(tmp_path)
    done = subprocess.run([sys.executable, "-m", "ordq.cli", "--bootstrap", f"127.0.0.1:{coordinator}",
                           "--zk", f"127.0.0.1:{zk}", "--zk-timeout", "0.3", "status"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 1 and done.stdout == "", done
    [line] = done.stderr.splitlines()
    assert line.startswith(f"ordq: error: no coordinator of the cluster answered at 127.0.0.1:{coordinator}"), line
    assert f"; and cannot reach ZooKeeper at 127.0.0.1:{zk}" in line, line
    # named by --bootstrap alone: no ZooKeeper to ask instead (not --zk's default), the coordinators' line alone
    done = subprocess.run([sys.executable, "-m", "ordq.cli", "--bootstrap", f"127.0.0.1:{coordinator}",
                           "--zk-timeout", "0.3", "status"], capture_output=True, text=True, timeout=120, env=env,
                          cwd=REPO)
    assert done.returncode == 1 and "ZooKeeper" not in done.stderr, done
    assert done.stderr.startswith(f"ordq: error: no coordinator of the cluster answered at 127.0.0.1:{coordinator}")
    # no coordinator known for the cluster: ZooKeeper's error alone, as before
    done = subprocess.run([sys.executable, "-m", "ordq.cli", "--zk", f"127.0.0.1:{zk}", "--zk-timeout", "0.3",
                           "status"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 1 and done.stderr.startswith(f"ordq: error: cannot reach ZooKeeper at 127.0.0.1:{zk}")


@pytest.mark.parametrize("argv", [("group", "list"), ("top", "--once"), ("topic", "group", "t", "g")], ids=" ".join)
def test_reads_moved_to_the_admin_api_load_neither_attrs_nor_the_queue_state(tmp_path: Path,
                                                                             argv: tuple[str, ...]) -> None:
    """Issue 42: ``group list`` opened a ZooKeeper session and read every queue's state (451 M
    instructions against status's 265 M), ``top --once`` a session and a channel to every broker
    (1,081 M), ``topic group`` a session and every partition's replicas; now each is an admin
    call, its process loading what ``queue list``'s does, and a coordinator that does not answer
    is the one error line."""
    [closed] = free_ports(1)
    loaded, err = _loaded_by(["--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.3", *argv], _env(tmp_path))
    assert f"no coordinator of the cluster answered at 127.0.0.1:{closed}" in err, err
    assert loaded == []


def test_top_takes_the_rates_between_two_frames() -> None:
    from ordq.commands.top import with_rates

    prev = {"interval_s": None, "mirrors": [],
            "queues": [{"queue": "a", "last_seq": 10, "produce_rate": None}, {"queue": "b", "last_seq": None}],
            "subscriptions": [{"queue": "a", "subscription": "s", "last_seq": 4, "consume_rate": None}]}
    cur = {"interval_s": None, "mirrors": [],
           "queues": [{"queue": "a", "last_seq": 30, "produce_rate": None}, {"queue": "b", "last_seq": 5},
                      {"queue": "c", "last_seq": 1}],
           "subscriptions": [{"queue": "a", "subscription": "s", "last_seq": 8, "consume_rate": None},
                             {"queue": "a", "subscription": "t", "last_seq": 0, "consume_rate": None}]}
    got = with_rates(cur, prev, 2.0)
    assert got["interval_s"] == 2.0
    assert [q["produce_rate"] for q in got["queues"]] == [10.0, None, None]  # b unknown before, c new
    assert [s["consume_rate"] for s in got["subscriptions"]] == [2.0, None]
    assert [q["produce_rate"] for q in with_rates(cur, prev, 0.0)["queues"]] == [None, None, None]
    assert with_rates(prev, cur, 1.0)["queues"][0]["produce_rate"] == 0.0  # a queue re-created: never negative
