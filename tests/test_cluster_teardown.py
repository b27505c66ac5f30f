"""The test cluster's teardown (tests/cluster.py): whatever a failed test left running is
stopped, so that no process of one test loads the box under the next ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.zk_server import ZkServer
from tests.cluster import Cluster

pytestmark = pytest.mark.zk


def test_teardown_kills_a_piped_cli_the_test_left_running(zk_server: ZkServer, zk_root: str,
                                                           tmp_path: Path) -> None:
    """A test that fails between ``ordq_piped`` and its ``communicate`` leaves the CLI running
    (once: `ordq produce load` went on after test_everyday failed): ``close`` kills it."""
    cluster = Cluster(zk_server, zk_root, tmp_path)
    try:
        cluster.add_groups("g1")
        cluster.create_queue("typed")
        proc = cluster.ordq_piped("produce", "typed")  # waits on its stdin until it is closed
    finally:
        cluster.close()
    assert proc.poll() is not None, "the CLI outlived the cluster"
    assert proc.returncode == -signal.SIGKILL, f"it ended by itself ({proc.returncode}): nothing shown"


def test_a_test_process_removes_its_credentials_folder_when_it_ends() -> None:
    """conftest.py gives each pytest process a folder for the clusters' credentials (client keys);
    it must not outlive the process (on the old conftest: every run left one in /tmp)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", "import os, tests.conftest; print(os.environ['ORDQ_CREDENTIALS'])"],
                          cwd=root, capture_output=True, text=True, timeout=120, check=True)
    folder = Path(done.stdout.strip()).parent
    assert folder.name.startswith("ordq-creds-"), done.stdout
    assert not folder.exists(), f"{folder} outlived its process"
    assert Path(os.environ["ORDQ_CREDENTIALS"]).parent.exists()  # this process's own is still there
