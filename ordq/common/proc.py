"""A managed child process: its own log file and pid file, readiness waits, stop/kill/pause.

Guarantees:
- A process's stdout and stderr go to ``run_dir/<name>.log``, appended across restarts with a
  marker line per start, so a failure report can show what the process said.
- ``run_dir/<name>.pid`` names the running process while it runs. ``start()`` refuses when it
  names a live process of the same program (a leftover would make a failed start look ready);
  a stale pid file is replaced, with a note in the log. Another ``ManagedProcess`` with the same
  name and run_dir (e.g. in another CLI process) finds, signals and stops the process through it.
- Each child gets its own session (``start_new_session``): it survives the terminal's Ctrl-C,
  and signals go to its whole process group, so no grandchild is left behind.
- Every wait has a deadline and fails with ``ExternalProcessError`` quoting the log tail; a
  process that exits while being waited for fails the wait at once.
- Opt-in (``die_with_parent``, or ``DIE_WITH_PARENT`` for a whole process, as the tests set
  it): the child gets ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies when its starter dies, even by
  kill -9 (issue 26: a killed test run left 14 brokers and three ZooKeepers running). Linux
  sends it when the *thread* that forked the child ends, so such children are forked by one
  spawner thread that lives as long as the process. The signal is set by util-linux's
  ``setpriv --pdeathsig`` exec'ing the program, never by Python code between fork and exec
  (``preexec_fn``): in a process with threads that child can deadlock before exec — seen in
  CI as a restarted broker that never printed a line. Every child also carries ``ORDQ_OWNER`` (the starter's
  pid and start time), inherited by what it starts in turn, so ``sweep_orphans`` can find the
  leftovers of a dead owner.
- A command that owns what it starts (``ordq drill``) runs inside ``owning_children()``: its
  children get the death signal, and SIGTERM/SIGHUP raise ``Terminated`` (a
  ``KeyboardInterrupt``) in the main thread, so its ``finally`` blocks stop them as Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ordq.common.errors import ExternalProcessError
from ordq.common.pid_file import exec_chain, pid_running, program, runs_program
from ordq.common.pid_file import read_pid as _read_pid

T = TypeVar("T")

_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.2
_KILL_WAIT_S = 5.0  # after SIGKILL: the kernel frees a process within moments unless it is in state D
# Popen objects of detached children: kept referenced so that their finalizer never runs
# (it would warn "subprocess is still running" about a process we meant to leave running).
_DETACHED: list[subprocess.Popen[bytes]] = []

# Process-wide default of ``ManagedProcess(die_with_parent=...)``; the test suite sets it.
# Deliberately not an environment variable: ``ordq up`` run by a test must still leave its
# servers running after it exits.
DIE_WITH_PARENT = False
OWNER_ENV = "ORDQ_OWNER"
# util-linux's setpriv sets the parent-death signal and execs the program (same pid).
_SETPRIV = shutil.which("setpriv")


def child_python_path(current: str | None) -> str:
    """``PYTHONPATH`` for a child: ``current`` with this process's own source checkout first,
    so a Python child runs the ``ordq`` its starter runs. Without it a child (which starts
    with ``PYTHONSAFEPATH``, below) imports whatever the venv installed: started from a second
    checkout sharing the venv (a git worktree), a cluster ran the first checkout's brokers and
    coordinator under the second's tests and benches, and a trial measured code it did not
    run (docs/BENCHMARKS.md, stop 102). An installed ``ordq`` (no pyproject.toml beside its
    package) adds nothing: a child finds the same install."""
    tree = Path(__file__).parents[2]  # ordq/common/proc.py; not resolved: ordq may be a link into a checkout
    parts = [p for p in (current or "").split(os.pathsep) if p]
    if (tree / "pyproject.toml").is_file() and str(tree) not in parts:
        parts.insert(0, str(tree))
    return os.pathsep.join(parts)


def load_stretched(idle_s: float, *, most: float = 4.0) -> float:
    """A time limit measured on an idle machine, ``idle_s``, stretched by how oversubscribed
    the CPUs are now (the 1-minute load average per CPU, at least 1, at most ``most`` times):
    on a loaded machine work is slower, not stuck (issue 26). A wait that can see progress
    should bound the time without it, and stretch that."""
    return idle_s * min(most, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def announce(line: str) -> None:
    """Write a status line that a parent process waits for (``ManagedProcess.wait_for_line``:
    READY, METRICS, STARTED, LEADER, EXIT) in one write. Managed processes send stdout and
    stderr to one log file, and ``print`` writes the text and its newline separately: another
    thread's log line could land between them (seen: a broker's READY line with a replication
    log line glued to its incarnation, so its restart was never recognised)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


# How often a daemon's main thread looks up from waiting for its stop (``wait_for_stop``).
STOP_TICK_S = 0.25


def wait_for_stop(stop: threading.Event) -> None:
    """Block the main thread until ``stop`` is set, by a signal handler or another thread.

    In ticks, not one untimed wait: Python runs a signal's handler only on the main thread,
    between bytecodes, and the kernel may hand a process-wide signal to any other thread. It
    does so to a process continued after SIGSTOP with SIGTERM pending, which is what ``ordq
    down`` and systemd's stop send a paused process: the main thread, asleep in an untimed
    wait, never ran the handler, and the daemon ran on (tests/test_paused_stop.py)."""
    while not stop.wait(STOP_TICK_S):
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived inside ``owning_children()``: unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def owning_children(*, die_with_parent: bool = True) -> Iterator[None]:
    """Meanwhile, everything this process starts dies with it, and it ends cleanly when
    terminated (issue 26: SIGTERM left a drill's ZooKeeper and brokers running).

    - Every ``ManagedProcess`` started meanwhile gets the parent-death signal, so even kill -9
      of this process leaves none of them running (``die_with_parent=False``: not, e.g. for a
      broker a drill restarts in a cluster it uses but does not own).
    - SIGTERM and SIGHUP raise ``Terminated`` in the main thread (only there can Python handle
      signals; elsewhere the handlers are left as they are), SIGINT ``KeyboardInterrupt``:
      ``finally`` blocks stop what was started. A second signal during that cleanup
      interrupts it; the death signal still takes the children.
    """
    global DIE_WITH_PARENT
    saved_die = DIE_WITH_PARENT
    DIE_WITH_PARENT = DIE_WITH_PARENT or die_with_parent
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, on_signal)
        # Ctrl-C too, even when this process was started with SIGINT ignored (as a shell's
        # background job is): seen as a drill that a SIGINT did not end.
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        DIE_WITH_PARENT = saved_die


class ManagedProcess:
    """A child process with its own log file (stdout+stderr) and pid file under run_dir."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        run_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must name a program")
        self.name = name
        self.argv = tuple(argv)
        self.run_dir = Path(run_dir)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.die_with_parent = die_with_parent  # None: the process-wide DIE_WITH_PARENT
        self.log_path = self.run_dir / f"{name}.log"
        self.pid_path = self.run_dir / f"{name}.pid"
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # log offset where this start's output begins

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid}>"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process. ExternalProcessError if it (or what the pid file names) runs."""
        if self._popen is not None and self._popen.poll() is None:
            raise ExternalProcessError(f"{self.name} is already running (pid {self._popen.pid})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        note = self._check_pid_file()
        env = {**os.environ, **(self.env or {})}
        env.setdefault(OWNER_ENV, owner_token())  # the first owner wins: what a test's `ordq up` starts is the test's
        # A Python child (`python -m ordq.cli ...`) must not put its working directory first on
        # sys.path: run from a folder holding a folder named `ordq` (the parent of a clone), that
        # folder shadowed the package and `ordq up`/`drill`/`demo` failed (issue 42). PYTHONPATH
        # still counts; other programs ignore the variable.
        env.setdefault("PYTHONSAFEPATH", "1")
        if path := child_python_path(env.get("PYTHONPATH")):
            env["PYTHONPATH"] = path
        die = DIE_WITH_PARENT if self.die_with_parent is None else self.die_with_parent
        with open(self.log_path, "ab") as log:
            stamp = datetime.now().isoformat(timespec="milliseconds")
            log.write(f"=== {stamp} ordq: starting {self.name}: {shlex.join(self.argv)}\n".encode())
            if note:
                log.write(f"=== {note}\n".encode())
            log.flush()
            self._log_start = log.tell()
            argv = list(self.argv)

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True,
                )

            try:
                # The death signal follows the thread that forked: fork from one thread that
                # lives as long as this process (LocalCluster starts processes from a pool
                # whose threads end right after).
                if die:
                    argv = dying_with_parent(self.argv)
                self._popen = _spawner().submit(spawn).result() if die else spawn()
            except OSError as exc:
                raise ExternalProcessError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc
            _wait_exec(self._popen.pid, argv)
        # Written via a rename so that a reader never sees a half-written pid.
        tmp = self.pid_path.with_suffix(".pid.tmp")
        tmp.write_text(f"{self._popen.pid}\n")
        tmp.replace(self.pid_path)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; reap; remove the pid file.

        Returns the exit code (negative: killed by that signal), or None when it was not
        running or is not our child (found through the pid file: its code is its parent's).
        """
        pid = self.pid
        if pid is None:
            self._remove_pid_file()
            return self._popen.returncode if self._popen is not None else None
        self._signal(pid, signal.SIGTERM)
        self._signal(pid, signal.SIGCONT)  # a paused process acts on SIGTERM only once continued
        if not self._wait_exit(pid, timeout_s):
            self._signal(pid, signal.SIGKILL)  # a stopped process dies of it too
            if not self._wait_exit(pid, _KILL_WAIT_S):
                # Only a process stuck in the kernel (state D) outlives SIGKILL: say so, do not hang.
                raise ExternalProcessError(f"{self.name} (pid {pid}) still runs {_KILL_WAIT_S:g}s after SIGKILL")
        return self._finished(pid)

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap: the process gets no chance to clean up."""
        pid = self.pid
        if pid is None:
            return
        self._signal(pid, signal.SIGKILL)
        self._wait_exit(pid, 10.0)
        self._finished(pid)

    def pause(self) -> None:
        """SIGSTOP: the process hangs (still alive) until ``resume()``. Returns once every
        thread of it is stopped: the signal is only queued when kill() returns, and a fault
        injected right after must not meet a process still running its last few steps."""
        pid = self._require_pid()
        self._signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise ExternalProcessError(f"{self.name} (pid {pid}) did not stop within 10 s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        self._signal(self._require_pid(), signal.SIGCONT)

    def detach(self) -> None:
        """Leave the process running after this object is gone (e.g. ``ordq zk start``
        exits): a later ``ManagedProcess`` with the same name and run_dir stops it."""
        if self._popen is not None:
            _DETACHED.append(self._popen)
            self._popen = None

    # -- state -------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid while the process runs (paused counts as running), else None."""
        if self._popen is not None:
            return self._popen.pid if self._popen.poll() is None else None
        pid = _read_pid(self.pid_path)
        return pid if pid is not None and self._is_ours(pid) else None

    def alive(self) -> bool:
        return self.pid is not None

    @property
    def returncode(self) -> int | None:
        """Exit code of our child once it exited (None while running or if not our child)."""
        return self._popen.poll() if self._popen is not None else None

    # -- waiting -----------------------------------------------------------------------------

    def wait_ready(self, probe: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
        """Call ``probe`` every few ms until it returns a truthy value and return that.

        An ``OSError`` from ``probe`` (connection refused, ...) counts as "not yet"; other
        exceptions propagate. ExternalProcessError, with the log tail, if the process exits
        first or ``timeout_s`` passes.
        """
        deadline = time.monotonic() + timeout_s
        interval = _POLL_FIRST_S
        last_error: OSError | None = None
        while True:
            try:
                value = probe()
            except OSError as exc:
                value, last_error = None, exc
            # Checked after the probe: a success from someone else (a leftover server on the
            # same port) must not hide that our process died.
            if not self.alive():
                raise self._exited_error(f"before {what}")
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                detail = f" (last error: {last_error})" if last_error else ""
                raise ExternalProcessError(
                    f"{self.name}: timed out after {timeout_s:g}s waiting for {what}{detail}\n"
                    f"{self._tail_text()}"
                )
            time.sleep(min(interval, left))
            interval = min(interval * 1.5, _POLL_MAX_S)

    def wait_for_line(self, prefix: str, *, timeout_s: float) -> str:
        """Wait for a complete log line, written since this start, beginning with ``prefix``;
        return the rest of that line, stripped."""
        want = prefix.encode()
        offset = self._log_start
        deadline = time.monotonic() + timeout_s
        interval = _POLL_FIRST_S
        while True:
            exited = not self.alive()  # read once more after it exits: its last words count
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # only complete lines; the rest is read next time
            for line in chunk[:end].splitlines():
                if line.startswith(want):
                    return line[len(want):].decode(errors="replace").strip()
            offset += end
            if exited:
                raise self._exited_error(f"before printing a line starting {prefix!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExternalProcessError(
                    f"{self.name}: no line starting {prefix!r} within {timeout_s:g}s\n{self._tail_text()}"
                )
            time.sleep(min(interval, left))
            interval = min(interval * 1.5, _POLL_MAX_S)

    def log_tail(self, lines: int = 50) -> str:
        """The last ``lines`` lines of the log file ('' if there is none)."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 256 * lines))  # lines are short; enough for the tail
                data = f.read()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------------

    def _check_pid_file(self) -> str | None:
        """Raise if the pid file names a live process of ours; describe a stale one."""
        pid = _read_pid(self.pid_path)
        if pid is None:
            if self.pid_path.exists():
                return f"replaced unreadable pid file {self.pid_path}"
            return None
        if self._is_ours(pid):
            raise ExternalProcessError(
                f"{self.name} is already running as pid {pid} (per {self.pid_path}); "
                "stop it first, or remove the pid file if that process is not it"
            )
        return f"replaced stale pid file {self.pid_path} (pid {pid} is not running)"

    def _is_ours(self, pid: int) -> bool:
        """Is ``pid`` a running (not zombie) process of the same program as argv[0]?
        The program check keeps a recycled pid from looking like our process."""
        return runs_program(pid, program(self.argv))

    def _require_pid(self) -> int:
        pid = self.pid
        if pid is None:
            raise ExternalProcessError(f"{self.name} is not running")
        return pid

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        # Our children lead their own process group: signal the group (grandchildren too).
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass  # exited meanwhile

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        if self._popen is not None and self._popen.pid == pid:
            try:
                self._popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout_s
        while pid_running(pid):  # not our child: we cannot wait(), only watch it go
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_FIRST_S)
        return True

    def _finished(self, pid: int) -> int | None:
        self._remove_pid_file(pid)
        if self._popen is not None and self._popen.pid == pid:
            return self._popen.poll()
        return None

    def _remove_pid_file(self, pid: int | None = None) -> None:
        # Only a file naming this pid (or a dead one): never one a newer start wrote.
        named = _read_pid(self.pid_path)
        if named is not None and (named == pid or not self._is_ours(named)):
            with contextlib.suppress(FileNotFoundError):
                self.pid_path.unlink()

    def _exited_error(self, when: str) -> ExternalProcessError:
        code = self.returncode
        if code is None:
            how = "exited"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return ExternalProcessError(f"{self.name} {how} {when}\n{self._tail_text()}")

    def _tail_text(self, lines: int = 30) -> str:
        return f"last lines of {self.log_path}:\n{self.log_tail(lines)}"


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ordq-spawner")
        return _SPAWNER


def _wait_exec(pid: int, argv: Sequence[str], timeout_s: float = 30.0) -> None:
    """Return once ``pid`` runs its own program: past every wrapper that execs it (setpriv,
    which sets the death signal; ``ip netns exec``) and with its command line set. Popen
    returns while the child is still inside exec: the kernel has switched it to the new
    program, and closed the pipe Popen waits on, before it sets the program's arguments; until
    then /proc shows an empty command line, and ``_is_ours`` judged the pid not ours (issue 26:
    beside six busy loops a detached process's ``pid`` read as None right after ``start()``, in
    36 of 1,000 starts at load 12). Each wrapper's own exec opens that window again: CI saw a
    lab process, still in ``ip netns exec``, read as not running by a second ``ManagedProcess``
    right after start. A process signalled still inside setpriv — paused by a test right after
    start, or its starter killed — would be left without the death signal. Normally a few ms;
    a process that exits meanwhile ends the wait, and so does the deadline (the pid file is
    then written all the same, as before)."""
    chain = exec_chain(argv)
    wrappers = set(chain[:-1]) - {chain[-1]}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return  # gone, or not ours to read: nothing to wait for
        if (cmdline and os.path.basename(os.path.realpath(exe)) not in wrappers) or not pid_running(pid):
            return
        time.sleep(0.001)


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it gets SIGKILL when the thread that forks it ends (Linux, with
    util-linux's setpriv; elsewhere unchanged). Fork it from a thread that lives as long as
    the starter (``_spawner``). A starter that dies before setpriv ran leaves the child to
    ``sweep_orphans``."""
    if not _SETPRIV:
        return list(argv)
    if shutil.which(argv[0]) is None:  # setpriv would start, then fail to exec: say it here
        raise FileNotFoundError(2, "no such program", argv[0])
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), None when it is gone
    or a zombie: with the pid it names one process, whatever pid reuse happens later."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]


def owner_token(pid: int | None = None) -> str:
    """``pid:start-time`` of this process (or ``pid``): the value of ``ORDQ_OWNER``."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def _owner_alive(token: str) -> bool:
    pid_s, _, start = token.partition(":")
    try:
        return _start_time(int(pid_s)) == start
    except ValueError:
        return True  # not ours to judge: leave it alone


def sweep_orphans(roots: Sequence[str | Path]) -> list[int]:
    """SIGKILL the leftovers of dead owners: processes whose ``ORDQ_OWNER`` names a process that
    is gone and whose command line names a path under one of ``roots`` (e.g. the temporary
    folders of earlier test runs). Anything else — other users' processes, live runs'
    servers, processes without the variable — is never touched. Returns the pids killed."""
    marks = [str(r).rstrip("/") for r in roots]
    me = os.getpid()
    killed = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone, or not ours to read
        prefix = f"{OWNER_ENV}=".encode()
        token = next((e[len(prefix):].decode(errors="replace") for e in environ if e.startswith(prefix)), None)
        if token is None or _owner_alive(token) or not any(a == m or m + "/" in a for a in args for m in marks):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # SIGKILL works on a stopped process too
            killed.append(pid)
    return killed


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc), or the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        # The state is the field after the parenthesised command name (which may hold spaces).
        if stat[stat.rindex(")") + 2] not in "TtXZ":
            return False
    return True


