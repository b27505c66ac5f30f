"""What a session on a cluster master needs beyond a local one: ordq's Python code shipped to
the executors as a zip through Spark (``SparkContext.addPyFile``, what ``--py-files`` does),
the driver's address as the executors can reach it, and one line of progress per stage.

Guarantees:
- ``code_zip()`` is the ``ordq`` package as this process imports it (every file under it, its
  linked folders followed, no bytecode), built once per process in a temporary folder removed
  at exit. Executors put it first on their Python path: nothing is installed on a worker, and
  an executor imports ordq from the zip even where another copy is installed.
- ``driver_address(master)`` is the local address of the route to the master's host (no packet
  is sent): the address executors on other hosts connect back to.
- ``StageProgress`` prints one line per finished stage (its id, tasks, failed task attempts,
  seconds) from Spark's status tracker; it never fails the job it watches.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

SHIP_CONF = "spark.ordq.shipCode"  # "false": the executors import ordq from their own install


@functools.cache
def code_zip() -> Path:
    import ordq

    folder = Path(tempfile.mkdtemp(prefix="ordq-pyfiles-"))
    atexit.register(shutil.rmtree, folder, True)
    target = folder / "ordq.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for dirpath, dirnames, filenames in os.walk(ordq.__path__[0], followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = Path(dirpath) / name
                out.write(path, Path("ordq") / path.relative_to(ordq.__path__[0]))
    return target


def driver_address(master: str) -> str | None:
    """The local address on the route to the master's host, or None when the URL names no
    host (``local[*]``, ``yarn``, ``k8s://`` resolves its own)."""
    url = urlparse(master.split(",")[0])  # spark://a:7077,b:7077 (standby masters): the first
    if url.scheme != "spark" or not url.hostname:
        return None
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((url.hostname, url.port or 7077))  # UDP: picks a route, sends nothing
        address: str = s.getsockname()[0]
        return address
    return None


class StageProgress:
    """A thread printing one line per finished stage of the session's jobs to ``out``:
    ``stage 4: 8/8 tasks (1 failed attempt, retried) in 3.2 s [PHASE]``. Seconds run from when
    the stage was first seen active (polled every ``interval_s``); PHASE is what ``phase`` said
    when its job was first seen (a job shorter than the poll interval may take the next one's)."""

    def __init__(self, spark: Any, out: TextIO = sys.stderr, *, interval_s: float = 0.25) -> None:
        self._sc = spark.sparkContext
        self._out = out
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._seen: dict[int, float] = {}
        self._done: set[int] = set()
        self.phase: str | None = None  # the caller's name for the jobs it starts now
        self._job_phase: dict[int, str | None] = {}
        self._stage_phase: dict[int, str | None] = {}
        self._jobs_before = set(self._sc.statusTracker().getJobIdsForGroup(None))
        self._thread = threading.Thread(target=self._run, name="ordq-stage-progress", daemon=True)

    def __enter__(self) -> StageProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self._poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(Exception):  # py4j gone at shutdown: stop quietly
                self._poll()

    def _poll(self, final: bool = False) -> None:
        tracker = self._sc.statusTracker()
        now = time.monotonic()
        active = set(tracker.getActiveStageIds())
        for sid in active:
            self._seen.setdefault(sid, now)
        stages: set[int] = set()
        for jid in set(tracker.getJobIdsForGroup(None)) - self._jobs_before:
            phase = self._job_phase.setdefault(jid, self.phase)  # the phase when first seen
            job = tracker.getJobInfo(jid)
            if job is not None:
                stages.update(job.stageIds)
                for sid in job.stageIds:
                    self._stage_phase.setdefault(sid, phase)
        for sid in sorted(stages - self._done - active):
            info = tracker.getStageInfo(sid)
            if info is None or info.numTasks == 0 or info.numCompletedTasks < info.numTasks:
                if info is not None and final and sid in self._seen:
                    self._line(sid, info, now, "did not finish")
                continue  # skipped (its output reused), or not started yet
            self._line(sid, info, now, None)

    def _line(self, sid: int, info: Any, now: float, note: str | None) -> None:
        self._done.add(sid)
        failed = info.numFailedTasks
        extra = f" ({failed} failed attempt{'s' if failed != 1 else ''}, retried)" if failed else ""
        took = now - self._seen.get(sid, now)
        name = self._stage_phase.get(sid) or ""
        print(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks{extra} in {took:.1f} s"
              f"{f' ({note})' if note else ''}{f' [{name}]' if name else ''}", file=self._out, flush=True)
