"""The lab's reaper: ``python -m ordq.lab.reaper --lab ID --owner PID:START``.

A detached process (its own session; it outlives its owner on purpose) that holds a pidfd of
the lab's owner and, when the owner dies — kill -9 included — removes the lab
(``ordq.lab.netns.teardown``) and its records (registry entry, the folder's state file), then
exits. SIGTERM (the owner removed
the lab itself) ends it without doing anything. It prints ``READY`` once it holds the pidfd:
from then on no death of the owner can go unseen. An owner already gone (or whose pid now
names another process: the start time differs) is treated as dead at once.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from datetime import datetime
from pathlib import Path

from ordq.common.errors import ExternalProcessError
from ordq.common.proc import announce, owner_token
from ordq.lab.lab import REGISTRY_ENV, forget
from ordq.lab.netns import teardown

_ATTEMPTS = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ordq.lab.reaper")
    parser.add_argument("--lab", required=True, help="the lab's id")
    parser.add_argument("--owner", required=True, help="PID:START of the owner (ordq.common.proc.owner_token)")
    parser.add_argument("--registry", type=Path, required=True, help="folder of the lab registry")
    args = parser.parse_args(argv)
    pid = int(args.owner.partition(":")[0])
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = None
    # Checked after opening: the pidfd then names the process whose start time matched.
    if pidfd is not None and owner_token(pid) == args.owner:
        announce("READY")
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():  # readable once the owner has exited
            pass
    else:
        announce("READY")
    _say(f"owner {args.owner} is gone: removing lab {args.lab}")
    try:
        folder: Path | None = Path(json.loads((args.registry / f"{args.lab}.json").read_text())["dir"])
    except (OSError, ValueError, KeyError, TypeError):
        folder = None
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            deleted = teardown(args.lab, timeout_s=30.0)
            break
        except ExternalProcessError as exc:  # something outlived SIGKILL for 30 s: try again, say so
            _say(f"attempt {attempt} to remove lab {args.lab} failed: {exc}")
    else:
        return 1
    os.environ[REGISTRY_ENV] = str(args.registry)
    forget(args.lab, folder)
    _say(f"lab {args.lab} removed ({len(deleted)} namespaces)")
    return 0


def _say(line: str) -> None:
    print(f"{datetime.now().isoformat(timespec='milliseconds')} {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
