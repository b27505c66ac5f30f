"""Data at rest is readable by the service's user only (issue 24): broker data folders 0700,
segment files 0600, ZooKeeper's folders 0700, whatever the umask, and folders made by an older
version are tightened when used again."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.broker_group import log as seglog
from ordq.broker_group.segments import write_json_durably
from ordq.zk_server import ZkServer


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o000, 0o022], ids=["umask000", "umask022"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_a_new_segment_is_private(tmp_path: Path, umask: int) -> None:
    data = tmp_path / "data"
    log = seglog.SegmentLog.open(data, "q", 7, create=True)
    try:
        seg = seglog.segment_dir(data, "q", 7)
        assert mode(seg / seglog.SEGMENT_FILE) == 0o600
        assert mode(seg) == 0o700 and mode(seg.parent) == 0o700
    finally:
        log.close()


def test_a_folder_from_before_is_tightened_and_state_files_are_private(tmp_path: Path, umask: int) -> None:
    old = tmp_path / "data"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    seglog.private_dir(old)
    assert mode(old) == 0o700
    write_json_durably(old / "incarnation.json", "x")
    assert mode(old / "incarnation.json") == 0o600


def test_zookeeper_data_folders_are_private_and_four_letter_words_limited(tmp_path: Path, umask: int) -> None:
    zk = ZkServer(tmp_path / "zk")
    zk._write_node_files(0)  # what start() writes before it runs Java
    node = tmp_path / "zk" / "node0"
    assert mode(node) == 0o700 and mode(node / "data") == 0o700
    cfg = (node / "zoo.cfg").read_text().splitlines()
    assert "4lw.commands.whitelist=ruok,srvr,mntr" in cfg  # counts only; cons, dump, wchc list clients and sessions
