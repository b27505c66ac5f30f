"""Test harness, modelled on kazoo's: real ZooKeeper processes, never a mock.

- ``zk_server``: one standalone ZooKeeper for the whole session (``.connection_string``).
- ``zk_ensemble``: a 3-node ensemble for the session, started only if a test asks for it.
  Tests that kill or stop its nodes restart them in ``finally``.
- ``zk_root``: a fresh ``/t-<uuid>`` root per test, deleted recursively afterwards (on the
  ensemble if the test uses it, else on ``zk_server``).
- ``make_zk``: ZkServers of the test's own (in tmp_path), destroyed after the test.
- When a test fails, the log tails of the ZooKeeper servers it used are added to its report.
Every server is stopped in a ``finally``/yield teardown: no java process outlives the run.
Should the run itself be killed (a CI timeout, kill -9), what it started dies with it: every
``ManagedProcess`` it starts gets the parent-death signal (``ordq.common.proc.DIE_WITH_PARENT``), and
the first fixture sweeps what earlier killed runs left detached (``ordq up`` run by a test),
only processes marked with a dead run as owner and naming pytest's temporary folders.
"""

from __future__ import annotations

import atexit
import compileall
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

import ordq.common.proc
from ordq.common.proc import OWNER_ENV, owner_token, sweep_orphans
from ordq.zk_server import ZkServer
from tests.util import C1_JVM_FLAGS, wait_until

# Everything this run starts dies with it (issue 26: a killed run left 14 brokers, three
# ZooKeepers and a PostgreSQL running for most of an hour).
ordq.common.proc.DIE_WITH_PARENT = True
# This run owns everything started under it, also through `ordq up` run as a subprocess (whose
# own process exits at once): the sweep of another run must see a live owner in them.
os.environ[OWNER_ENV] = owner_token()

# Clusters the tests start register their TLS credentials here, never in the real home
# (ordq/common/security.py); set at import so every program a test spawns inherits it.
# The folder goes when this process ends (one per pytest process: 407 were left in /tmp by a day
# of runs, with the clusters' client keys in them).
_CREDENTIALS_DIR = tempfile.mkdtemp(prefix="ordq-creds-")
atexit.register(shutil.rmtree, _CREDENTIALS_DIR, ignore_errors=True)
os.environ["ORDQ_CREDENTIALS"] = os.path.join(_CREDENTIALS_DIR, "credentials.json")
os.environ.pop("ORDQ_TOKEN", None)

# Every JVM this run starts lives seconds to minutes on tiny inputs: the C1 JIT only, for Spark's
# driver (SPARK_SUBMIT_OPTS: also the sessions a doc makes itself, and `ordq verify --follow`,
# which keep full JIT as products) and for ZooKeeper servers (SERVER_JVMFLAGS, ordq/zk_server.py).
# The C2 compiler spent more CPU compiling than it saved (beside six busy loops, load 15-20):
# docs/SPARK.md's example 34 -> 18 CPU s, `ordq verify --follow` to seq 1000 27 -> 15, a
# ZooKeeper serving 4,000 requests 3.1 -> 1.9. Appended to: a flag set outside wins.
for _name in ("SPARK_SUBMIT_OPTS", "SERVER_JVMFLAGS"):
    os.environ[_name] = " ".join((C1_JVM_FLAGS, os.environ.get(_name, ""))).strip()

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode for every process the run starts (brokers, daemons, each CLI command a test or
    a doc runs). With ``PYTHONDONTWRITEBYTECODE`` set, as on the shared box, Python
    never writes it, so every one of them compiled each ordq module it imported from source
    (~0.25 s of CPU per process). Written once here, on the controller before its workers
    start; up-to-date files are skipped, and what changes during the run is compiled in memory
    as before. ``__pycache__`` is ignored by git and kept out of the wheel (a clean copy)."""
    if not sys.flags.dont_write_bytecode or hasattr(config, "workerinput"):
        return  # Python writes it on first import; or an xdist worker: the controller did
    # compile_dir does not follow links: ordq's linked folders are compiled where they are
    linked = [p.resolve() for p in (ROOT / "ordq").iterdir() if p.is_symlink()]
    for folder in (ROOT / "ordq", *linked, ROOT / "bench", ROOT / "tests"):
        # quiet: a checkout we cannot write, or a file that does not compile, is left as it is
        # (its import says what is wrong, as without this)
        compileall.compile_dir(folder, quiet=2)


# Session servers by fixture name, and the servers a test made itself: for failure reports.
_SESSION_SERVERS: dict[str, ZkServer] = {}
_TEST_SERVERS = pytest.StashKey[list[ZkServer]]()


def _session_zk(name: str, factory: pytest.TempPathFactory, nodes: int) -> Iterator[ZkServer]:
    server = ZkServer(factory.mktemp(name), nodes=nodes)
    try:
        _SESSION_SERVERS[name] = server
        server.start(timeout_s=90)
        yield server
    finally:
        _SESSION_SERVERS.pop(name, None)
        server.destroy()


@pytest.fixture(scope="session", autouse=True)
def _sweep_earlier_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Kill what killed earlier runs left behind: processes whose owner (``ORDQ_OWNER``) is dead
    and whose command line names a folder under pytest's temporary root. Live runs of others on
    this machine, and anything not marked, are never touched."""
    base = tmp_path_factory.getbasetemp()  # .../pytest-of-<user>/pytest-N[/popen-gwK under xdist]
    root = next((p for p in (base, *base.parents) if p.name.startswith("pytest-of-")), base.parent)
    killed = sweep_orphans([root])
    if killed:
        print(f"\nswept {len(killed)} leftover process(es) of earlier killed test runs: {killed}")


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    yield from _session_zk("zk_server", tmp_path_factory, nodes=1)


@pytest.fixture(scope="session")
def zk_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    yield from _session_zk("zk_ensemble", tmp_path_factory, nodes=3)


@pytest.fixture
def zk_root(request: pytest.FixtureRequest) -> Iterator[str]:
    which = "zk_ensemble" if "zk_ensemble" in request.fixturenames else "zk_server"
    server: ZkServer = request.getfixturevalue(which)
    root = f"/t-{uuid.uuid4().hex}"
    yield root
    client = KazooClient(hosts=server.connection_string, timeout=5.0)
    try:
        client.start(timeout=30)

        def deleted() -> bool:
            try:
                client.delete(root, recursive=True)
            except NoNodeError:
                pass  # the test wrote nothing
            except NotEmptyError:
                return False  # a process being torn down created a node meanwhile: again
            return True

        wait_until(deleted, timeout_s=10, what=f"deleting {root}")
    finally:
        client.stop()
        client.close()


@pytest.fixture
def make_zk(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Callable[..., ZkServer]]:
    """``make_zk(**ZkServer options)``: a ZkServer in this test's tmp_path (not started)."""
    made = request.node.stash.setdefault(_TEST_SERVERS, [])

    def make(**options: Any) -> ZkServer:
        server = ZkServer(tmp_path / f"zk{len(made)}", **options)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.destroy()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        # zk_root and the cluster fixture ask for their server by name at run time: not in
        # fixturenames, so a test that used one through them names zk_root
        names = set(getattr(item, "fixturenames", ()))
        used = [s for name, s in _SESSION_SERVERS.items() if name in names or "zk_root" in names]
        for server in used + item.stash.get(_TEST_SERVERS, []):
            for node, tail in server.log_tails(40):
                report.sections.append((f"ZooKeeper {node} log, last lines ({server.folder})", tail))
    return report


# Test files whose tests are long and share no module-scoped fixture: under xdist each test is
# its own unit of work (each doc of test_docs.py runs 30 s to 4 min; as one file they were the
# run's critical path). Every other file stays whole in one worker, with its module fixtures.
_SPREAD_FILES = {"test_docs.py"}

# Seconds each group of --dist loadgroup took in a whole default run (written by
# `--store-group-seconds`; the last local run's, in pytest's cache, wins): the longest groups
# start first. xdist starts the groups with the most tests first, so the single long docs tests
# and the wheel test started last and the run ended with one worker alone on them for minutes.
GROUP_SECONDS = Path(__file__).with_name("group_seconds.json")
_CACHE_KEY = "ordq/group_seconds"
_UNKNOWN_TEST_S = 0.5  # a group not measured yet: so much per test (most files are quick)


def _group_of(nodeid: str) -> str:
    """The --dist loadgroup group of a test: its file, or the test itself in _SPREAD_FILES."""
    if "@" in nodeid:  # a pytest whose nodeid carries xdist's group suffix
        return nodeid.rsplit("@", 1)[-1]
    path = nodeid.split("::", 1)[0]
    return nodeid if path.rsplit("/", 1)[-1] in _SPREAD_FILES else path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-group-seconds", action="store_true",
                     help=f"write each group's seconds in this run to tests/{GROUP_SECONDS.name} "
                     "(after a whole default run)")


# The end-to-end tier (marker ``heavy``): `make test` leaves it out to stay under 15 minutes on
# two cores, `make test-heavy` runs it, and CI (.ci/run) runs both. It is what costs most CPU
# for what it adds beside the default run's real-process tests of the same guarantees: every
# Spark test (a verification is ~30-40 s of JVM CPU, whatever the input's size), the docs'
# walkthroughs (each runs a cluster and Spark through the CLI), the benches' smoke runs, the
# wheel, and the tests that start a PostgreSQL or MariaDB server (the outbox's too). Since stop 64
# (the default run took 16 min on a quiet box, 15 in CI): whole local clusters' lives (`ordq
# up`/`down`, two side by side, ZooKeeper over TLS, the lab's hosts, a killed drill's orphans), the
# disk under load (segment rolls, retention), and the floods of the defences' tests (the brokers'
# budgets, the coordinator's turns): ~430 s of the default run's 1,850.
_HEAVY_FILES = {"test_bench.py", "test_cdc_apply.py", "test_cdc_mysql.py", "test_wheel.py", "test_outbox.py",
                "test_local_cluster.py", "test_two_clusters.py", "test_zk_tls.py", "test_lab.py", "test_orphans.py",
                "test_disk.py", "test_protect.py", "test_coordinator_defences.py"}
_HEAVY_TESTS = {"test_doc_runs_as_written", "test_deploying_on_three_machines_runs_as_written_in_the_lab"}


def _is_heavy(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)
    return (item.get_closest_marker("spark") is not None or item.path.name in _HEAVY_FILES
            or name in _HEAVY_TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``--dist loadgroup`` (Makefile): one per file, or per test in _SPREAD_FILES;
    the ``heavy`` marker on the end-to-end tier."""
    for item in items:
        if _is_heavy(item):
            item.add_marker(pytest.mark.heavy)
        if item.get_closest_marker("xdist_group") is None:
            name = item.nodeid if item.path.name in _SPREAD_FILES else str(item.path.name)
            item.add_marker(pytest.mark.xdist_group(name))


def _expected_seconds(config: pytest.Config) -> dict[str, float]:
    seconds: dict[str, float] = json.loads(GROUP_SECONDS.read_text()) if GROUP_SECONDS.exists() else {}
    cache = getattr(config, "cache", None)
    if cache is not None:
        seconds.update(cache.get(_CACHE_KEY, {}))
    return seconds


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller (and without xdist): the seconds of each group, setup and teardown in."""
    _measured[_group_of(report.nodeid)] = _measured.get(_group_of(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not _measured:
        return  # an xdist worker: the controller saw every report
    cache = getattr(config, "cache", None)
    if cache is not None:
        cache.set(_CACHE_KEY, {**cache.get(_CACHE_KEY, {}), **{k: round(v, 1) for k, v in _measured.items()}})
    if config.getoption("store_group_seconds"):
        ordered = dict(sorted(((k, round(v, 1)) for k, v in _measured.items()), key=lambda kv: -kv[1]))
        GROUP_SECONDS.write_text(json.dumps(ordered, indent=0) + "\n")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` that works: xdist 3.8 names a test's group by setting ``item._nodeid``,
    which pytest 9 no longer reads (``nodeid`` comes from ``item._id``), so every test was its
    own unit of work and a file's tests, with their module fixtures (test_drills.py's CI
    drills: ~2 min each time), ran on both workers. The same groups, taken from the node id,
    handed out longest first (by GROUP_SECONDS: longest-processing-time-first keeps the end
    of the run from waiting on one long group)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    expected = _expected_seconds(config)

    class _ByFile(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the first assignment: the queue is complete, none taken yet
                self._ordered = True
                units = sorted(self.workqueue.items(),
                               key=lambda unit: -expected.get(unit[0], _UNKNOWN_TEST_S * len(unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return _ByFile(config, log)


@pytest.fixture
def zk_client(zk_server: ZkServer, zk_root: str) -> Iterator[KazooClient]:
    """A plain ZooKeeper client of the session's server, its test's root made."""
    client = KazooClient(hosts=zk_server.connection_string, timeout=5.0)
    client.start(timeout=30)
    client.ensure_path(zk_root)
    try:
        yield client
    finally:
        client.stop()
        client.close()
