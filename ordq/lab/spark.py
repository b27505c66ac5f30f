"""A Spark standalone cluster in a lab of hosts: a master on one host, workers on others,
started with the launcher PySpark's pip package ships (``bin/spark-class``), nothing else
installed.

Layout (``LabSpark.start`` defaults): the master on ``h1`` (``spark://<h1>:7077``), one worker
on each of ``h2`` and ``h3``, each with its own cores (1) and memory (1g). Folders, all under
``<lab folder>/spark``: ``conf/`` (an empty Spark conf dir: no ``spark-defaults.conf`` of the
machine is read), ``<host>/work`` (a worker's work dir: each executor's stdout/stderr and the
files and ``--py-files`` shipped with a job), ``<host>/local`` (scratch: shuffle files), and
``spark.json`` (the record ``LabSpark.load`` reads). The daemons' logs are
``<lab folder>/run/<host>-spark-master.log`` / ``<host>-spark-worker.log``.

Guarantees:
- Every daemon binds its host's lab address only (``--host``, ``SPARK_LOCAL_IP`` for the web
  UIs) and is a process inside its host's namespace: the lab's ``down()`` (and its reaper after
  a kill -9 of the lab's owner) kills it, its executors and their Python workers with
  everything else inside the lab.
- ``start`` starts the master and the workers together and returns once every worker is
  registered with the master (read from the master's log), or raises ``ExternalProcessError``
  with the log's tail, stopping what it started.
- ``stop()`` stops the workers (their executors with them) and the master, kills what of them
  outlives that (processes of the lab whose working directory is under ``spark/``), and
  removes the ``spark/`` folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.common.pid_file import pid_running
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.lab.lab import Lab
from ordq.lab.netns import processes_of

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
FOLDER = "spark"
RECORD = "spark.json"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
STARTUP_S = 120.0
DAEMON_MEMORY = "256m"  # the master's and each worker daemon's own heap (executors get --memory)
_REGISTERED = re.compile(r"Registering worker (\S+):\d+ with")


def spark_class() -> Path:
    """``bin/spark-class`` of the installed PySpark package. ConfigError without PySpark."""
    try:
        import pyspark
    except ImportError:
        raise ConfigError("a Spark cluster in the lab needs PySpark: pip install 'ordq[spark]'") from None
    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not path.exists():
        raise ConfigError(f"PySpark has no launcher at {path}: reinstall it (pip install 'ordq[spark]')")
    return path


@attrs.frozen(kw_only=True)
class SparkLayout:
    master: str = "h1"
    workers: tuple[str, ...] = ("h2", "h3")
    cores: int = 1  # per worker
    memory: str = "1g"  # per worker: what its executors may use

    def __attrs_post_init__(self) -> None:
        if not self.workers:
            raise ConfigError("a Spark cluster needs at least one worker host")
        if len(set(self.workers)) != len(self.workers):
            raise ConfigError(f"a host runs one worker at most: {', '.join(self.workers)}")
        if self.cores < 1:
            raise ConfigError(f"a worker needs at least one core, not {self.cores}")
        if not re.fullmatch(r"[1-9]\d*[mMgG]", self.memory):
            raise ConfigError(f"worker memory as 512m or 1g, not {self.memory!r}")


class LabSpark:
    """A Spark standalone cluster running in a lab (``start``), or found there (``load``)."""

    def __init__(self, lab: Lab, layout: SparkLayout, processes: dict[str, ManagedProcess]) -> None:
        self.lab = lab
        self.layout = layout
        self.processes = processes  # "master", and the worker hosts

    # -- starting and stopping ---------------------------------------------------------------

    @classmethod
    def start(cls, lab: Lab, layout: SparkLayout = SparkLayout(), *, timeout_s: float | None = None,
              die_with_parent: bool | None = None) -> LabSpark:
        """Start the master and the workers; return once every worker registered.
        ConfigError: a host not in the lab, a Spark cluster already in it;
        ExternalProcessError: a daemon died or did not come up within ``timeout_s`` (default
        120 s stretched by the machine's load, up to 8x: ~45 s on an idle 2-core machine)."""
        if timeout_s is None:
            timeout_s = load_stretched(STARTUP_S, most=8.0)
        for host in (layout.master, *layout.workers):
            lab.address(host)  # ConfigError for an unknown host
        folder = lab.folder / FOLDER
        if (folder / RECORD).exists():
            old = cls.load(lab)
            if old.running():
                raise ConfigError(f"a Spark cluster already runs in lab {lab.id} ({old.master_url}): "
                                  f"ordq lab spark down --dir {lab.folder}")
            old.stop()
        (folder / "conf").mkdir(parents=True, exist_ok=True)
        launcher = str(spark_class())
        spark = cls(lab, layout, {})
        spark._save()  # before anything runs: `stop` then always finds what to remove
        try:
            master_address = lab.address(layout.master)
            # All at once: a worker retries its registration until the master is up, and on a
            # loaded machine three JVMs starting side by side take a third of the wall time.
            spark.processes["master"] = lab.run(
                layout.master, [launcher, MASTER_CLASS, "--host", master_address, "--port", str(MASTER_PORT),
                                "--webui-port", str(MASTER_UI_PORT)],
                name=f"{layout.master}-spark-master", env=spark._env(layout.master), cwd=folder,
                die_with_parent=die_with_parent)
            for host in layout.workers:
                work = folder / host / "work"
                work.mkdir(parents=True, exist_ok=True)
                spark.processes[host] = lab.run(
                    host, [launcher, WORKER_CLASS, "--host", lab.address(host), "--webui-port", str(WORKER_UI_PORT),
                           "--cores", str(layout.cores), "--memory", layout.memory, "--work-dir", str(work),
                           spark.master_url],
                    name=f"{host}-spark-worker", env=spark._env(host), cwd=folder / host,
                    die_with_parent=die_with_parent)
            spark.wait_workers(layout.workers, timeout_s=timeout_s)
        except BaseException:
            spark.stop()
            raise
        return spark

    @classmethod
    def load(cls, lab: Lab) -> LabSpark:
        """The Spark cluster ``start`` recorded in ``lab``. ConfigError when there is none."""
        try:
            record = json.loads((lab.folder / FOLDER / RECORD).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no Spark cluster in lab {lab.id} (ordq lab spark up --dir {lab.folder} "
                              "starts one)") from None
        layout = SparkLayout(master=record["master"], workers=tuple(record["workers"]), cores=record["cores"],
                             memory=record["memory"])
        run_dir = lab.folder / "run"
        # spark-class execs java: the pid files name a java process.
        processes = {"master": ManagedProcess(f"{layout.master}-spark-master", ["java"], run_dir=run_dir)}
        for host in layout.workers:
            processes[host] = ManagedProcess(f"{host}-spark-worker", ["java"], run_dir=run_dir)
        return cls(lab, layout, processes)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the workers and the master, kill what of the cluster remains (executors, their
        Python workers), remove the ``spark/`` folder. Idempotent."""
        for name in [*self.layout.workers, "master"]:
            process = self.processes.get(name)
            if process is not None:
                with contextlib.suppress(ExternalProcessError):
                    process.stop(timeout_s=timeout_s / 2)
        folder = (self.lab.folder / FOLDER).resolve()
        deadline = time.monotonic() + timeout_s
        while left := self._leftovers(folder):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise ExternalProcessError(f"Spark processes {left} of lab {self.lab.id} outlived SIGKILL")
            time.sleep(0.05)
        shutil.rmtree(folder, ignore_errors=True)

    def detach(self) -> None:
        """Leave the daemons running after this object is gone (``ordq lab spark up`` exits)."""
        for process in self.processes.values():
            process.detach()

    # -- using it ----------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.lab.address(self.layout.master)}:{MASTER_PORT}"

    @property
    def folder(self) -> Path:
        return self.lab.folder / FOLDER

    def running(self) -> bool:
        return any(p.alive() for p in self.processes.values())

    def worker(self, host: str) -> ManagedProcess:
        if host not in self.layout.workers:
            raise ConfigError(f"no Spark worker on {host} (workers: {', '.join(self.layout.workers)})")
        return self.processes[host]

    def executors(self, host: str) -> list[int]:
        """Pids of the executor JVMs running on ``host``'s worker now."""
        work = (self.folder / host / "work").resolve()
        return [pid for pid in processes_of(self.lab.id)
                if _cwd_under(pid, work) and b"CoarseGrainedExecutorBackend" in _cmdline(pid)]

    def wait_workers(self, hosts: Sequence[str], *, timeout_s: float = 120.0) -> None:
        """Wait until the master's log shows each of ``hosts``' workers registered (again,
        after a restart: counted from the master's start)."""
        master = self.processes["master"]
        wanted = {self.lab.address(h) for h in hosts}

        def registered() -> bool | None:
            for name in (*hosts, "master"):
                process = self.processes[name]
                if not process.alive():
                    raise ExternalProcessError(f"{process.name} exited while starting: {process.log_tail(20)}")
            seen = set(_REGISTERED.findall(_log_since_start(master)))
            return True if wanted <= seen else None

        master.wait_ready(registered, timeout_s=timeout_s, what=f"Spark workers on {', '.join(hosts)} registered")

    def describe(self) -> dict[str, Any]:
        return {"master": self.master_url, "lab": self.lab.id, "dir": str(self.folder),
                "hosts": [{"host": self.layout.master, "role": "master",
                           "address": self.lab.address(self.layout.master), "pid": self.processes["master"].pid,
                           "cores": None, "memory": None}]
                + [{"host": h, "role": "worker", "address": self.lab.address(h), "pid": self.processes[h].pid,
                    "cores": self.layout.cores, "memory": self.layout.memory} for h in self.layout.workers]}

    # -- internals ---------------------------------------------------------------------------

    def _env(self, host: str) -> dict[str, str]:
        local = self.folder / host / "local"
        local.mkdir(parents=True, exist_ok=True)
        return {
            "SPARK_LOCAL_IP": self.lab.address(host),  # the web UI binds it (RPC binds --host)
            "SPARK_LOCAL_DIRS": str(local),
            "SPARK_CONF_DIR": str(self.folder / "conf"),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            # C1 only: the daemons' own code is small; C2 compiling it costs more than it saves.
            "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            "SPARK_NO_DAEMONIZE": "1",
        }

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"master": self.layout.master, "workers": list(self.layout.workers), "cores": self.layout.cores,
                  "memory": self.layout.memory, "url": self.master_url}
        (self.folder / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

    def _leftovers(self, folder: Path) -> list[int]:
        return [pid for pid in processes_of(self.lab.id) if pid_running(pid) and _cwd_under(pid, folder)]


def _log_since_start(process: ManagedProcess) -> str:
    """The log of ``process`` from its last start's banner on."""
    try:
        text = process.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    mark = text.rfind(" ordq: starting ")
    return text[mark:] if mark >= 0 else text


def _cwd_under(pid: int, folder: Path) -> bool:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == folder or folder in cwd.parents


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
