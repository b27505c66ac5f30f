"""Load harness: N busy-loop processes beside a command, for a bounded time (issue 26).

    python -m bench.busy --procs 6 -- pytest -m "not slow" ...   # the suite beside 6 loops
    python -m bench.busy --procs 6 --seconds 600                  # only the loops, 10 minutes

Guarantee: the loops never outlive what started them. Each loop stops on its own at the
deadline, when its parent process is gone (``PR_SET_PDEATHSIG`` where Linux has it, and a
parent check every few milliseconds of spinning), and when the harness ends — by the command's
end, Ctrl-C, SIGTERM or its own deadline. Only a harness killed with -9 leaves the loops to
stop by themselves, within milliseconds, by the parent check.

``busy_loops(n, seconds)`` is the same as a context manager for tests. The exit code is the
command's (124 when the harness deadline stopped it, as ``timeout`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from ordq.common.proc import dying_with_parent

# The loop itself: spins, looking at the clock and at its parent every ~2^16 iterations
# (a few ms); exits when either says so. It ignores SIGINT: a Ctrl-C reaches the whole process
# group, and the harness stops its loops itself (six KeyboardInterrupt tracebacks otherwise).
_LOOP = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(65536):
        pass
"""


def start_loops(n: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """Start ``n`` busy loops that stop after ``seconds`` or when this process dies."""
    me = os.getpid()
    return [subprocess.Popen(dying_with_parent([sys.executable, "-c", _LOOP, str(me), str(seconds)]),
                             stdin=subprocess.DEVNULL) for _ in range(n)]


def stop_loops(loops: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in loops:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    for p in loops:
        p.wait(timeout=10)


@contextlib.contextmanager
def busy_loops(n: int, seconds: float = 600.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` busy loops while the block runs (at most ``seconds``)."""
    loops = start_loops(n, seconds)
    try:
        yield loops
    finally:
        stop_loops(loops)


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.busy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", "-n", type=int, default=6, help="busy-loop processes (default 6)")
    ap.add_argument("--seconds", type=float, default=7200.0, help="stop everything after this long (default 2 h)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run beside the loops")
    args = ap.parse_args(argv)
    if args.procs < 0 or args.seconds <= 0:
        ap.error("--procs must be >= 0 and --seconds > 0")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    loops = start_loops(args.procs, args.seconds)
    print(f"bench.busy: {args.procs} busy loops for at most {args.seconds:g} s", file=sys.stderr, flush=True)
    peak = 0.0
    code = 0
    child: subprocess.Popen[bytes] | None = None
    try:
        if command:
            child = subprocess.Popen(command)
        deadline = started + args.seconds
        while not stopping and time.monotonic() < deadline:
            peak = max(peak, load_average())
            if child is not None and child.poll() is not None:
                break
            time.sleep(0.2)
        if child is not None:
            if child.poll() is None:
                # Our deadline or a signal: stop the command as `timeout` would.
                child.send_signal(stopping[0] if stopping else signal.SIGTERM)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                code = 124 if not stopping else 128 + stopping[0]
            else:
                code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    finally:
        stop_loops(loops)
    print(f"bench.busy: {time.monotonic() - started:.0f} s, load average peak {peak:.1f} (1 min), "
          f"exit {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
