"""``DiskRoom`` (broker_group/disk_room.py): a write refused for want of space marks the broker's
liveness node ``disk_full`` from a thread of its own; the mark goes once the data folder's file
system has ``room_bytes`` free; a mark that could not be written is written later. The mark and
the free space are stand-ins here; tests/test_disk_full.py drives the real thing (a full tmpfs,
ZooKeeper, the coordinator)."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from ordq.broker_group.disk_room import DiskRoom, out_of_space
from ordq.common.errors import CoordinationUnavailable, DiskFull
from tests.util import wait_until


class Marks:
    """The liveness node's mark as written, and a switch to make writing it fail."""

    def __init__(self) -> None:
        self.written: list[bool] = []
        self.failing = False

    def __call__(self, full: bool) -> bool:
        if self.failing:
            raise CoordinationUnavailable("ZooKeeper away")
        self.written.append(full)
        return True


@pytest.fixture
def room(tmp_path: Path):
    free = {"bytes": 0}
    marks = Marks()
    r = DiskRoom(tmp_path, 64 << 20, marks, free=lambda _p: free["bytes"])
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    yield r, marks, free
    r.stop()
    t.join(5)
    assert not t.is_alive()


def test_a_full_disk_is_marked_until_it_has_room(room) -> None:
    r, marks, free = room
    r.ran_out("segment q/0")
    r.ran_out("segment q/1")  # once is enough
    wait_until(lambda: marks.written == [True], timeout_s=5, interval_s=0.01, what="the mark")
    assert r.full
    free["bytes"] = 64 << 20
    wait_until(lambda: marks.written == [True, False], timeout_s=5, interval_s=0.01, what="the mark cleared")
    assert not r.full


def test_a_mark_zookeeper_refused_is_written_later(room) -> None:
    r, marks, free = room
    marks.failing = True
    r.ran_out("segment q/0")
    marks.failing = False
    wait_until(lambda: marks.written == [True], timeout_s=5, interval_s=0.01, what="the mark, once ZooKeeper is back")


def test_a_registration_carries_the_mark(room) -> None:
    r, marks, free = room
    r.registered(True)  # a new session's node, made while the disk was full (then room came)
    free["bytes"] = 1 << 30
    wait_until(lambda: marks.written == [False], timeout_s=5, interval_s=0.01, what="the node's mark cleared")


def test_out_of_space_is_the_errno_itself_or_what_an_error_was_raised_from() -> None:
    nospace = OSError(errno.ENOSPC, "No space left on device")
    assert out_of_space(nospace) and out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    wrapped = DiskFull("no space to write 10 bytes")
    wrapped.__cause__ = nospace
    assert out_of_space(wrapped)
    assert not out_of_space(OSError(errno.EIO, "I/O error"))
    assert not out_of_space(DiskFull("write failed: [Errno 5] I/O error"))
    assert not out_of_space(None)
