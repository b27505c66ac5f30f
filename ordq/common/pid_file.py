"""Which process a pid file names, and whether it still runs the program it names: read without
the process machinery of ``ordq.common.proc`` (threads, subprocess), so that ``ordq status`` of a
local cluster checks its processes' pid files at the cost of a few reads (issue 42: a command
against a running cluster answers in 0.25 s on a quiet box).

Rules: the standard library only; reads pid files and /proc, never signals or writes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def read_pid(path: Path) -> int | None:
    """The pid a pid file names; None when there is none, or it is not a number."""
    try:
        return int(Path(path).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (exited, waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3, after the parenthesised command name (which may itself contain spaces).
    return stat.rpartition(")")[2].split()[0] != "Z"


def exec_chain(argv: Sequence[str]) -> list[str]:
    """The names of the programs ``argv`` runs in turn, each exec'ing the next in the same pid:
    ``setpriv ... --`` and ``ip netns exec NS`` (a process of ``ordq.lab``) before the program
    itself, which is last."""
    chain: list[str] = []
    args = list(argv)
    while args:
        name = os.path.basename(args[0])
        chain.append(name)
        if name == "setpriv" and "--" in args[:-1]:
            args = args[args.index("--") + 1:]
        elif name == "ip" and args[1:3] == ["netns", "exec"] and len(args) > 4:
            args = args[4:]
        else:
            return chain
    return chain or [""]


def program(argv: Sequence[str]) -> str:
    """The name of the program ``argv`` runs in the end (``exec_chain``): a process still in
    setpriv or ``ip netns exec`` on a loaded machine is ours all the same."""
    return exec_chain(argv)[-1]


def runs_program(pid: int, name: str) -> bool:
    """Whether ``pid`` is a running (not zombie) process of the program ``name`` (``program``):
    the program check keeps a recycled pid from looking like the process a pid file named."""
    if not pid_running(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc to ask: trust the pid
    return program([a.decode(errors="replace") for a in cmdline]) == name


def running_pid(path: Path, name: str) -> int | None:
    """The pid the pid file ``path`` names while that process runs the program ``name``, else None."""
    pid = read_pid(path)
    return pid if pid is not None and runs_program(pid, name) else None
