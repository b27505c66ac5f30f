"""Where a doc's blocks run: one bash session and one Python process in a fresh folder.

``DocSession`` is the reader's terminal: shell steps are written to one long-lived ``bash``
(so ``cd``, ``export``, ``&`` and ``wait`` work across commands as they would when typed),
Python steps go to one long-lived interpreter (``tests/helpers/doc_python.py``) whose
globals the blocks share. Each step's output (stdout and stderr on one pipe, in the order
written: ``PYTHONUNBUFFERED``) is cut out of the stream by a marker line carrying a random
token and the exit code. ``close()`` stops and wipes every local cluster and ZooKeeper the
doc started in the folder, then kills what the session still runs (its own process groups).

A doc that deploys on several machines (``<!-- on: hostN -->``, ``doc_blocks.Block.host``)
runs with one session per machine (``run_doc`` given a mapping of host to session): each
its own shell, environment and credentials file, all in one folder (the doc's ``cp`` between
machines); ``wrap`` starts a session's shell inside a host of the lab (``ip netns exec``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import attrs

from ordq.cluster_config import STATE_FILE
from ordq.common.proc import OWNER_ENV, load_stretched
from ordq.local_cluster import LocalCluster
from ordq.zk_server import CONFIG_FILE, ZkServer
from tests.helpers.doc_blocks import DOC_ZK, Block, DocFormatError, Mismatch, Step, check, parse_doc

DRIVER = Path(__file__).with_name("doc_python.py")
STEP_TIMEOUT_S = 180.0  # on an idle machine: see step_timeout_s
EVERY_HOST = "every host"  # ``<!-- on: every host -->``: the block runs on each machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Stream:
    """A child's output pipe, read by a thread into a buffer, cut at marker lines."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buf = bytearray()
        self._eof = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof = True
                else:
                    self._buf += chunk
                self._cond.notify_all()
            if not chunk:
                return

    def until(self, token: str, deadline: float) -> tuple[str, int | None]:
        """Output up to the marker line ``<token> <exit code>`` (consumed); exit code None if
        the deadline passed or the process ended first (the output so far is returned)."""
        mark = token.encode()
        with self._cond:
            while True:
                at = self._buf.find(mark)
                if at >= 0:
                    end = self._buf.find(b"\n", at)
                    if end >= 0:
                        out = bytes(self._buf[:at])
                        code = int(self._buf[at + len(mark):end].strip() or b"-1")
                        del self._buf[:end + 1]
                        return out.decode(errors="replace"), code
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    out = bytes(self._buf)
                    self._buf.clear()
                    return out.decode(errors="replace"), None
                self._cond.wait(min(left, 1.0))

    def close(self, proc: subprocess.Popen[bytes]) -> None:
        """After ``proc`` ended: let the reader see the end, then close the pipe."""
        self._reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


class DocSession:
    """Run the steps of ``doc`` (its path, for tracebacks) in ``folder`` (created), with its
    ZooKeeper address on ``zk_port`` (default: a free port). ``wrap``: the argv prefix that
    starts its shell and Python where they run (a lab host's ``ip netns exec NS``); ``home``:
    the folder of its credentials file (default ``<folder>-home``; one per machine)."""

    def __init__(self, folder: Path, *, doc: str = "doc", zk_port: int | None = None, wrap: Sequence[str] = (),
                 home: Path | None = None) -> None:
        self.folder = folder
        self.doc = doc
        self.wrap = list(wrap)
        folder.mkdir(parents=True, exist_ok=True)
        # The doc reads as run from a checkout: `.venv/bin/ordq` works there.
        if not (folder / ".venv").is_symlink():  # the sessions of several machines share a folder
            (folder / ".venv").symlink_to(Path(sys.prefix))
        home = home or folder.parent / f"{folder.name}-home"
        self.zk = f"127.0.0.1:{zk_port or free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORDQ_")}
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
            ORDQ_ZK=self.zk, PYTHONUNBUFFERED="1", LC_ALL="C.UTF-8", LANG="C.UTF-8",
            # Not the user's ~/.config/ordq/credentials.json: another suite's docs register there too.
            ORDQ_CREDENTIALS=str(home / "credentials.json"),
        )
        if OWNER_ENV in os.environ:
            # What the doc starts (`ordq up` exits at once and leaves its servers running) is this
            # test run's: without the mark they carry the dead `ordq up` as owner, and another
            # suite's sweep at its start kills them mid-doc (issue 26: "cannot reach ZooKeeper",
            # shown as 127.0.0.1:2181 since the harness writes the session's port as the doc's).
            env[OWNER_ENV] = os.environ[OWNER_ENV]
        self.env = env
        self._shell = self._spawn(["bash", "--noprofile", "--norc"])
        self._shell_out = _Stream(self._shell)
        self._python: subprocess.Popen[bytes] | None = None
        self._python_out: _Stream | None = None

    def __enter__(self) -> DocSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(wipe=exc_type is None)

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self.wrap, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=self.folder, env=self.env, start_new_session=True)

    def run(self, step: Step, *, timeout_s: float) -> tuple[str, int | None]:
        """Run one step; (what it printed, exit code or None if it did not finish)."""
        source = step.source.replace(DOC_ZK, self.zk)
        if step.kind == "python":
            out, code = self._run_python(source, step, timeout_s)
        else:
            out, code = self._run_shell(source, timeout_s)
        return out.replace(self.zk, DOC_ZK), code

    def _run_shell(self, command: str, timeout_s: float) -> tuple[str, int | None]:
        token = f"@@doc-step-{uuid.uuid4().hex}@@"
        # The newline before '}' lets a command end in '&' or a comment; stdin is not the
        # session's (a command reading stdin would eat the next commands).
        script = f"{{ {command}\n}} </dev/null\nprintf '%s %d\\n' '{token}' $?\n"
        try:
            assert self._shell.stdin is not None
            self._shell.stdin.write(script.encode())
            self._shell.stdin.flush()
        except BrokenPipeError:
            return "(the doc's shell session has ended)", None
        return self._shell_out.until(token, time.monotonic() + timeout_s)

    def _run_python(self, code: str, step: Step, timeout_s: float) -> tuple[str, int | None]:
        if self._python is None:
            self._python = self._spawn([sys.executable, str(DRIVER)])
            self._python_out = _Stream(self._python)
        assert self._python.stdin is not None and self._python_out is not None
        token = f"@@doc-step-{uuid.uuid4().hex}@@"
        request = {"code": code, "filename": self.doc, "line": step.line, "token": token}
        try:
            self._python.stdin.write((json.dumps(request) + "\n").encode())
            self._python.stdin.flush()
        except BrokenPipeError:
            return "(the doc's Python process has ended)", None
        return self._python_out.until(token, time.monotonic() + timeout_s)

    def close(self, *, wipe: bool = True) -> None:
        """Stop every local cluster and ZooKeeper the doc left in the folder (wiped unless
        ``wipe`` is False: after a failure their logs stay for a look), then end the shell,
        its background jobs and the Python process."""
        for proc in (self._python, self._shell):
            if proc is not None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        clusters = [p.parent for p in self.folder.rglob(STATE_FILE)]
        for folder in clusters:
            with contextlib.suppress(Exception):  # best effort: report the doc's failure, not this
                cluster = LocalCluster.load(folder)
                cluster.destroy() if wipe else cluster.stop()
        for cfg in list(self.folder.rglob(CONFIG_FILE)):
            if cfg.parent.exists() and not any(cfg.parent.is_relative_to(c) for c in clusters):
                with contextlib.suppress(Exception):
                    server = ZkServer.load(cfg.parent)
                    server.destroy() if wipe else server.stop()
        for proc, stream in ((self._python, self._python_out), (self._shell, self._shell_out)):
            if proc is None or stream is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the session's group: its background jobs too
            proc.wait(timeout=10)
            stream.close(proc)


@attrs.frozen
class StepRun:
    step: Step
    output: str
    exit_code: int | None
    seconds: float
    mismatch: Mismatch | None
    host: str | None = None  # the machine it ran on (a doc run with a session per machine)


def step_timeout_s(idle_s: float = STEP_TIMEOUT_S, *, most: float = 4.0) -> float:
    """A step's time limit: ``idle_s`` stretched by how oversubscribed the CPUs are now (at most
    ``most`` times). A Spark verify that needs ~40 s of CPU got ~8 % of a core beside 26
    runnable processes on 2 cores and overran a fixed 180 s (issue 26: slower, not stuck)."""
    return load_stretched(idle_s, most=most)


def run_doc(sessions: DocSession | Mapping[str, DocSession], text: str, *, stop_at_mismatch: bool = True,
            timeout_s: float | None = None) -> Iterator[StepRun]:
    """Run the doc's steps in order, yielding each with its verdict; stop after the first
    mismatch unless told not to (what follows a failed step tends to fail too). Given one
    session, every block runs there; given a session per machine, each block runs on the
    machine its ``<!-- on: NAME -->`` names (``every host``: on each, in the mapping's
    order), and a block naming none, or an unknown one, is a DocFormatError."""
    doc = sessions.doc if isinstance(sessions, DocSession) else next(iter(sessions.values())).doc
    for block in parse_doc(doc, text):
        if not block.runs:
            continue
        for host, session in _where(sessions, block):
            for step in block.steps:
                started = time.monotonic()
                output, code = session.run(step, timeout_s=step_timeout_s() if timeout_s is None else timeout_s)
                bad = check(session.doc, step, output, code)
                yield StepRun(step, output, code, time.monotonic() - started, bad, host)
                if bad is not None and stop_at_mismatch:
                    return


def _where(sessions: DocSession | Mapping[str, DocSession], block: Block) -> list[tuple[str | None, DocSession]]:
    if isinstance(sessions, DocSession):
        return [(None, sessions)]
    if block.host == EVERY_HOST:
        return list(sessions.items())
    if block.host is None or block.host not in sessions:
        raise DocFormatError(f"{block.path}:{block.line}: a block of a doc run on machines {', '.join(sessions)} "
                             f"must name one (<!-- on: NAME -->), not {block.host!r}")
    return [(block.host, sessions[block.host])]


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.helpers.doc_session DOC.md [FOLDER]``: run a doc as the test does,
    without stopping at a mismatch, and print every step with what it printed (in the doc's
    ``$`` form, ready to paste) and whether it matched. For writing docs."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("doc")
    parser.add_argument("folder", nargs="?", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop what the doc started
    folder = args.folder or Path(tempfile.mkdtemp(prefix="doc-session-")) / "run"
    failed = 0
    with DocSession(folder, doc=args.doc) as session:
        for run in run_doc(session, Path(args.doc).read_text(), stop_at_mismatch=False):
            failed += run.mismatch is not None
            verdict = "ok" if run.mismatch is None else f"MISMATCH: {run.mismatch.why}"
            print(f"--- {args.doc}:{run.step.line} ({run.seconds:.1f}s) {verdict}")
            print(("$ " if run.step.kind != "python" else "") + run.step.source.rstrip())
            code = run.exit_code
            print(run.output.rstrip("\n") + (f"\n[exit {code}]" if code else ""), flush=True)
    print(f"{failed} step(s) did not match; files in {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
