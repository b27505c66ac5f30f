"""Real database servers (Debian's MariaDB and PostgreSQL) started in temp folders, for the CDC
drill, the CDC demo, tests and benchmarks."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path


def server_folder(prefix: str, user: str | None) -> Path:
    """A new temp folder for a server's files, owned by ``user`` (the service account a
    server runs as when we are root). Made under $TMPDIR when that user can reach it, else
    under /tmp: a private $TMPDIR (pytest's tmp_path is 0700 root) would hide it."""
    parent = Path(tempfile.gettempdir())
    if user is not None and not all(os.stat(p).st_mode & 0o001 for p in (parent, *parent.parents)):
        parent = Path("/tmp")
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    return folder
