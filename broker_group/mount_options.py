"""Which mount options hold a data folder's file system, read from /proc/mounts.

Why: brokers remove segment files when they are popped, and on a file system mounted with
online ``discard`` the freed blocks are discarded on the way, which the fdatasyncs on that file
system then wait for. Measured here (docs/BENCHMARKS.md, freeze20): an fdatasync loop froze for
120-140 ms three times, each time with an 80-180 MiB discard of a deleted file. Brokers now
shrink a file in steps before its unlink (file_removal.py), so a sync waits for one step's
discard, a few ms (stop 94); without online discard it waits for none. A broker says so once at
start (docs/OPERATIONS.md, "Segments, retention and disk"); it does not refuse to run.
"""

from __future__ import annotations

import re
from pathlib import Path

MOUNTS = Path("/proc/mounts")

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """/proc/mounts writes a space, tab, newline or backslash in a path as a 3-digit octal escape."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: Path, mounts: str) -> tuple[str, str, frozenset[str]] | None:
    """(mount point, file system type, options) of the mount holding ``path`` (already resolved):
    the longest mount point that contains it; the last such line wins, as the kernel stacks mounts."""
    best: tuple[str, str, frozenset[str]] | None = None
    target = str(path)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2], frozenset(fields[3].split(",")))
    return best


def online_discard_warning(data_dir: Path, mounts: str | None = None) -> str | None:
    """A one-line warning when ``data_dir``'s file system is mounted with online ``discard``."""
    if mounts is None:
        try:
            mounts = MOUNTS.read_text()
        except OSError:
            return None  # not Linux, or no /proc: nothing to say
    found = mount_of(data_dir.resolve(), mounts)
    if found is None or "discard" not in found[2]:
        return None
    point, fstype, _ = found
    return (f"the data folder {data_dir} is on {point} ({fstype}) mounted with online 'discard': each "
            "removed segment's discard holds the fdatasyncs on it (a few ms a step, as segments are removed in "
            "steps; a whole file's took 130-210 ms); mount it without 'discard' and trim on a timer (fstrim.timer)")
