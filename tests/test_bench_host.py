"""The host line every bench_e2e run starts with names the interpreter the cluster runs on: the
project ran on a plain source build of Python (pyenv's, first on PATH) for a hundred stops
before anyone saw it, at ~15 % more CPU per send (docs/BENCHMARKS.md, stop 104)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from bench._cluster import host_line


def test_the_host_line_names_the_running_interpreter_and_whether_libpython_is_shared() -> None:
    line = host_line()
    assert f"Python {platform.python_version()} at {os.path.realpath(sys.executable)}, " in line
    linked = subprocess.run(["ldd", os.path.realpath(sys.executable)], capture_output=True, text=True, check=True)
    assert ("libpython" in linked.stdout) == line.split("; ")[1].endswith(" shared"), (line, linked.stdout)
    assert line.startswith("host: ") and "load average" in line
