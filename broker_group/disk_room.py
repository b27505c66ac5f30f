"""A broker's disk out of space, said where the coordinator looks.

When a write of this broker fails for want of space (ENOSPC, EDQUOT), its liveness node gets
``disk_full`` (``ZkStore.set_disk_full``); the coordinator then admits the group to no send
list and moves heads off it (``Facts.disk_full``). Before, a group whose disk was still full
was admitted again as soon as its segments were read, and its next write failed over again
(stop 96's disk-full test). The mark goes once the disk has room again: while marked, the
free space of the data folder's file system is checked every ``CHECK_S``, and ``room_bytes``
free clears it, with no restart.

Rules: the write path only calls ``ran_out`` (no ZooKeeper call, no wait on it); one thread
of this class's own checks and writes the mark. A mark it could not write (ZooKeeper away)
is written on a later tick; a new session's registration carries it (``registered``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ordq.common.errors import OrdqError

log = logging.getLogger("ordq.broker")

CHECK_S = 1.0  # while full: how often the free space is looked at, and a failed mark written again
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, is the disk's want of space."""
    seen = 0
    while exc is not None and seen < 8:  # (a bounded walk: causes can form a cycle)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use on ``folder``'s file system."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class DiskRoom:
    """Whether this broker's disk is full, and its liveness node's mark kept in step."""

    def __init__(self, folder: Path, room_bytes: int, mark: Callable[[bool], object],
                 free: Callable[[Path], int] = free_bytes) -> None:
        """``mark(full)``: write the mark into this process's liveness node (if one is
        registered now: its registration writes ``full`` itself); ``free``: the free bytes of a folder's file system."""
        self._folder = folder
        self._room_bytes = room_bytes
        self._mark = mark
        self._free = free
        self._cv = threading.Condition()
        self._full = False
        self._marked = False  # what the liveness node says, as far as this process knows
        self._stopped = False

    @property
    def full(self) -> bool:
        with self._cv:
            return self._full

    def ran_out(self, what: str) -> None:
        """A write of ``what`` failed for want of space (any thread; returns at once)."""
        with self._cv:
            if self._full:
                return
            self._full = True
            self._cv.notify_all()
        log.warning("disk full (%s): this group takes no new writes until %s has %d MiB free",
                    what, self._folder, self._room_bytes >> 20)

    def registered(self, marked: bool) -> None:
        """A liveness node was just created, with the mark ``marked``."""
        with self._cv:
            self._marked = marked
            self._cv.notify_all()

    def run(self) -> None:
        """The thread: until ``stop``, check for room while full and keep the mark in step."""
        while True:
            with self._cv:
                while not self._stopped and not self._full and not self._marked:
                    self._cv.wait()
                if self._stopped:
                    return
                full = self._full
            if full:
                self._look_for_room()
            self._write_mark()
            with self._cv:
                if not self._stopped and (self._full or self._marked):
                    self._cv.wait(CHECK_S)

    def _look_for_room(self) -> None:
        try:
            free = self._free(self._folder)
        except OSError as exc:
            log.warning("disk full: cannot read the free space of %s: %s", self._folder, exc)
            return
        if free < self._room_bytes:
            return
        with self._cv:
            self._full = False
        log.info("disk has room again (%d MiB free on %s): this group takes writes again", free >> 20, self._folder)

    def _write_mark(self) -> None:
        with self._cv:
            full, marked = self._full, self._marked
        if full == marked:
            return
        try:
            self._mark(full)
        except OrdqError as exc:
            log.warning("disk %s: the mark in ZooKeeper not written yet: %s", "full" if full else "with room", exc)
            return
        with self._cv:
            # not written: no node of this process now; its registration writes the mark
            self._marked = full

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
