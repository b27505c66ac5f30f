"""Many small files and folders made durable together, at the cost of two syncs, not two per
file (issue 43: a SealMany of 1,000 idle queues' segments; one file at a time took ~50 ms of
syncs each, ~14 segments/s on a loaded disk).

Guarantee: once ``commit`` returned, every file written through the batch holds its new content
under its final name and every folder made through it is in its parent, all of it surviving a
power cut; a crash before that leaves each file either as it was or (a file that did not exist)
absent or empty, never a torn copy under the final name of a file that existed. How: a file's
new content goes to ``<name>.tmp`` first; one sync makes every temporary file's data durable;
then the renames; then one more sync makes the names durable. Each sync is ``syncfs(2)`` of the
data folder's file system (one journal commit for all of them; documented to write every file's
data and metadata, and since Linux 5.8 to report a write-back error) where the C library has it,
otherwise ``fdatasync`` of every file, then ``fsync`` of every folder, in threads.

Rules: the caller holds whatever lock keeps other writers off these files (``segments.py``'s
meta locks) from the first write to the end of ``commit``; nothing here knows what the files mean.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import os
from collections.abc import Callable, Iterable
from pathlib import Path

# Threads for the fallback's fsyncs (one sync each, at once: the file system commits them together).
SYNC_THREADS = 16


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_SYNCFS = _load_syncfs()


def syncfs(path: Path) -> bool:
    """``syncfs(2)`` of the file system holding ``path``; False when the C library lacks it.
    Raises OSError when it fails (a write-back error: nothing it covered may be trusted)."""
    if _SYNCFS is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def _fsync_each(paths: Iterable[Path], *, data_only: bool) -> None:
    todo = list(dict.fromkeys(paths))
    if not todo:
        return

    def one(p: Path) -> None:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            (os.fdatasync if data_only else os.fsync)(fd)
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(min(SYNC_THREADS, len(todo)), thread_name_prefix="ordq-sync") as pool:
        list(pool.map(one, todo))  # the first error raises


class DurableBatch:
    """Files written and folders made, durable together at ``commit`` (module docstring).
    ``anchor``: a folder on the file system they are all on (the broker's data folder)."""

    def __init__(self, anchor: Path, *, use_syncfs: bool = True, batch_id: int = 0) -> None:
        self.anchor = anchor
        self.use_syncfs = use_syncfs
        self.id = batch_id
        self._after: list[Callable[[], None]] = []  # run once ``commit`` succeeded or failed
        self._written: list[Path] = []  # temporary files holding new content
        self._renames: list[tuple[Path, Path]] = []
        self._folders: set[Path] = set()  # folders whose entries changed
        self.syncs = 0  # sync passes ``commit`` made (2 with syncfs; else one per file and folder)

    def write(self, path: Path, data: bytes, *, tmp_suffix: str = ".tmp") -> None:
        """``path`` will hold ``data`` once committed (its folder must exist). The new content
        waits in ``path`` + ``tmp_suffix``, which nobody else may write meanwhile."""
        tmp = path.with_name(path.name + tmp_suffix)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._written.append(tmp)
        self._renames.append((tmp, path))
        self._folders.add(path.parent)

    def created(self, path: Path) -> None:
        """``path`` (a file or folder) was just created by the caller: its name, and an empty
        file's existence, are made durable with the rest."""
        self._folders.add(path.parent)

    def after(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the batch is over (``commit`` returned or raised, or ``close``)."""
        self._after.append(fn)

    def close(self) -> None:
        """The batch is over (committed or abandoned): the ``after`` callbacks run, once."""
        after, self._after = self._after, []
        for fn in after:
            fn()

    def commit(self) -> None:
        """Make everything durable (module docstring); raises OSError if a sync or a rename
        failed (then nothing written through the batch may be relied on)."""
        try:
            self._commit()
        finally:
            self.close()

    def _commit(self) -> None:
        if not self._renames and not self._folders:
            return
        if not (self.use_syncfs and syncfs(self.anchor)):
            _fsync_each(self._written, data_only=True)
            self.syncs += len(self._written)
        else:
            self.syncs += 1
        for tmp, path in self._renames:
            os.replace(tmp, path)
        if not (self.use_syncfs and syncfs(self.anchor)):
            _fsync_each(sorted(self._folders), data_only=False)
            self.syncs += len(self._folders)
        else:
            self.syncs += 1
        self._written, self._renames, self._folders = [], [], set()
