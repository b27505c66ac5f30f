"""The Python stacks of a live process, for the message of a test that found it stuck: a hang
seen once in CI is then diagnosed from its log rather than guessed at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def stacks_of(pid: int, *, timeout_s: float = 20.0) -> str:
    """``py-spy dump`` of ``pid`` (the dev extra installs it), or why there is none."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return "(no py-spy beside this Python: no stacks)"
    try:
        done = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"(py-spy dump of {pid} took over {timeout_s:.0f} s)"
    return (done.stdout + done.stderr).decode(errors="replace")
