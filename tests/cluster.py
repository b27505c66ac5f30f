"""Cluster fixture of the failover tests: broker groups of real processes on real ZooKeeper.

    from tests.cluster import cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture

    def test_x(cluster):
        cluster.add_groups("g1", "g2")
        cluster.create_queue("q")
        ...

- ``cluster``: a :class:`Cluster` on the session ``zk_server`` (or ``zk_ensemble`` when the
  test asks for that fixture) under a fresh ``zk_root``; its processes keep their data and
  logs under the test's ``tmp_path``. Brokers run with a 1 s ZooKeeper session (the test
  ZooKeeper ticks every 200 ms), so a killed process's liveness node goes within ~1 s.
- Teardown kills every process it started (brokers, producer/consumer programs, coordinator
  daemons) in a ``finally``; when a test fails, the last lines of each process's log are
  added to its report.
- ``LoadProducer`` / ``LoadConsumer``: producer and consumer threads in the test process,
  for faults that hit brokers or ZooKeeper. Programs for faults that hit the producer or the
  consumer themselves: ``Cluster.spawn_producer`` / ``spawn_consumer``
  (``tests.helpers.produce`` / ``consume``).

Producers ask the coordinator service for their epoch, failovers and rolls (issue 23), so
``add_groups`` starts one coordinator process (``coordinator-0``) unless the test already
runs one. A test that starts its own (``start_daemon``) gets only its own: the stand-in is
stopped (cleanly, so the election moves at once) as soon as the first of them is ready.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from ordq.broker_group.process import BrokerGroupProcesses, BrokerProcess
from ordq.common.errors import NotLeader
from ordq.common.proc import ManagedProcess
from ordq.common.security import provision, register_coordinators, unregister
from ordq.coordinator.paths import Paths
from ordq.coordinator.state import QueueState
from ordq.coordinator.store import ZkStore
from ordq.sdk import BatchingConfig, CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk._consumer_types import ConsumerStats
from ordq.sdk._producer_types import ProducerStats
from ordq.wire.client import GrpcTransport
from ordq.zk_server import ZkServer, free_ports
from tests.helpers.load import AckRec, ConsumerProgram, DeliveryRec, ProducerProgram, delivery_of, make_payload
from tests.util import wait_until

REPO = Path(__file__).resolve().parent.parent
SESSION_TIMEOUT_S = 1.0  # brokers (ZooKeeper here ticks every 200 ms, so 1 s is allowed)
# Producers and consumers keep the SDK's default. With 1 s, kazoo must get a ping answered
# within ~0.3 s, which a busy Python process on a shared 2-core machine misses now and then:
# the session expires and a live leader loses its election (safe, it is fenced, but it is not
# the fault a test injected).
CLIENT_SESSION_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 1.0  # producer ack deadline in these tests
COORDINATOR_SLOTS = 4  # coordinator ports a test cluster reserves (its bootstrap list)

log = logging.getLogger("tests.cluster")
_CLUSTER = pytest.StashKey["Cluster"]()
_PLUGIN_NAME = "ordq-cluster-log-tails"



def start_coordinator(name: str, hosts: str, root: str, run_dir: Path, *, interval_s: float = 0.2,
                      session_timeout_s: float = 1.0, listen: str | None = None,
                      extra: Sequence[str] = (), program: Sequence[str] = ("-m", "ordq.cli")) -> ManagedProcess:
    """A coordinator process (daemon and service) on a test cluster, serving once it returns:
    producers and consumers ask it (issue 23). It finds its certificate next to the CA
    registered for ``hosts`` and ``root``; the caller stops it. ``listen``: where its service
    answers (default: any port). ``program``: what the interpreter runs, given the CLI's
    arguments (a test's wrapper of ``ordq.cli``)."""
    argv = [sys.executable, *program, "--zk", hosts, "--root", root, "coordinator", "run",
            "--metrics", "127.0.0.1:0", "--interval", str(interval_s), "--session-timeout", str(session_timeout_s)]
    if listen is not None:
        argv += ["--listen", listen]
    argv += list(extra)  # more options of `ordq coordinator run`
    proc = ManagedProcess(name, argv, run_dir=run_dir, env={"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
                          cwd=REPO)
    proc.start()
    proc.wait_for_line("READY", timeout_s=30)
    return proc

class Cluster:
    """Broker groups, helper programs and daemons of one test, on one ZooKeeper root."""

    def __init__(self, zk: ZkServer, root: str, base: Path) -> None:
        self.zk = zk
        self.hosts = zk.connection_string
        self.root = root
        self.base = base
        self.run_dir = base / "run"
        self.groups: dict[str, BrokerGroupProcesses] = {}
        self.programs: list[ManagedProcess] = []
        self.store = ZkStore.connect(self.hosts, root, timeout_s=10)
        self.paths = Paths(root)
        self.broker_tls, self.credentials = provision(base / "tls", self.hosts, root)
        self.transport = GrpcTransport(credentials=self.credentials)
        self._threads: list[LoadProducer | LoadConsumer] = []
        self.coordinators: list[ManagedProcess] = []
        self._stand_in: ManagedProcess | None = None  # started by create_queue, until the test starts its own
        self._piped: list[subprocess.Popen[bytes]] = []  # ordq_piped's CLIs: killed at teardown if still running
        # Clients find the coordinators by address only (issue 37): each coordinator of this
        # cluster listens on one of these ports, so ``bootstrap`` names every one it may run.
        self.coordinator_ports = free_ports(COORDINATOR_SLOTS)
        self._coordinator_port: dict[str, int] = {}  # name -> its port
        register_coordinators(self.hosts, root, self.bootstrap.split(","))  # clients named by hosts/root find them

    # -- brokers -------------------------------------------------------------------------------

    def add_groups(self, *gids: str, extra_args: Mapping[str, Sequence[str]] | None = None) -> None:
        """Register and start each group (slave, then master) and wait until both are live.
        ``extra_args``: more ``ordq broker run`` options by role ("master", "slave")."""
        for gid in gids:
            self.store.add_group(gid)
            group = BrokerGroupProcesses(gid, zk_hosts=self.hosts, root=self.root, base_dir=self.base,
                                         session_timeout_s=SESSION_TIMEOUT_S, tls=self.broker_tls,
                                         extra_args=extra_args)
            self.groups[gid] = group
            group.start()
        self.wait_live(*gids)
        if not any(p.alive() for p in self.coordinators):
            self._stand_in = self.start_daemon("coordinator-0")

    def wait_live(self, *gids: str, timeout_s: float = 30.0) -> None:
        wait_until(lambda: self.store.live_groups(list(gids)) == frozenset(gids), timeout_s=timeout_s,
                   interval_s=0.05, what=f"master and slave of {gids} live")

    def restart(self, member: BrokerProcess) -> None:
        """Start a killed or stopped broker again on its data folder; wait until it is live."""
        member.start()
        wait_until(lambda: member.role in self.store.live_members(member.gid), timeout_s=30, interval_s=0.05,
                   what=f"{member.gid} {member.role} live again")

    def create_queue(self, queue: str = "q", groups: list[str] | None = None) -> QueueState:
        st = self.store.create_queue(queue, groups if groups is not None else list(self.groups))
        assert st.open_segment is not None, f"queue {queue} not writable after create: {st}"
        return st

    def state(self, queue: str = "q") -> QueueState:
        return self.store.load_state(queue)[0]

    def wait_state(self, predicate: Callable[[QueueState], bool], *, queue: str = "q", timeout_s: float = 30.0,
                   what: str = "") -> QueueState:
        def probe() -> QueueState | None:
            st = self.state(queue)
            return st if predicate(st) else None

        return wait_until(probe, timeout_s=timeout_s, interval_s=0.05, what=what or "queue state")

    def head(self, queue: str = "q") -> BrokerGroupProcesses:
        st = self.state(queue)
        assert st.head is not None, f"queue {queue} has no send head: {st}"
        return self.groups[st.head]

    # -- programs ------------------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        """Start ``python <argv>`` from the repository with its own log under run/."""
        env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        proc = ManagedProcess(name, [sys.executable, *argv], run_dir=self.run_dir, env=env, cwd=REPO)
        self.programs.append(proc)
        proc.start()
        return proc

    def ordq(self, *args: str, timeout_s: float = 120.0,
             stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run the ``ordq`` CLI on this cluster to its end, as a user would (a separate process)."""
        return subprocess.run(self._ordq_argv(args), input=stdin, capture_output=True, timeout=timeout_s,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)

    def ordq_piped(self, *args: str) -> subprocess.Popen[bytes]:
        """Start the ``ordq`` CLI with pipes on stdin, stdout and stderr, for a test that talks
        to it while it runs (reads its output, types into it, sends it Ctrl-C). A failed test
        leaves it running: teardown kills it."""
        proc = subprocess.Popen(self._ordq_argv(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        self._piped.append(proc)
        return proc

    def _ordq_argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, "-m", "ordq.cli", "--zk", self.hosts, "--root", self.root, *args]

    def spawn_ordq(self, name: str, *args: str) -> ManagedProcess:
        """Start the ``ordq`` CLI on this cluster in the background (killed at teardown); its
        stdout and stderr go to its log (``log_tail``)."""
        return self.spawn(name, ["-m", "ordq.cli", "--zk", self.hosts, "--root", self.root, *args])

    def spawn_producer(self, writer: str, *, total: int, queue: str = "q", rate: float | None = None,
                       size: int = 200, send_timeout_s: float = SEND_TIMEOUT_S,
                       session_timeout_s: float = CLIENT_SESSION_TIMEOUT_S, hold: bool = False,
                       gate_at: int | None = None) -> ProducerProgram:
        """A producer program; with ``hold`` it starts (imports, ~1-4 s on a busy machine) but
        connects only on ``go()``, so a test can have a standby ready before load flows; with
        ``gate_at`` it sends no seq from there on until ``open_gate()`` (a fault lands before it
        could finish: tests.helpers.produce)."""
        out = self.base / f"producer-{writer}.jsonl"
        go = self.base / f"producer-{writer}.go"
        argv = ["-m", "tests.helpers.produce", "--zk", self.hosts, "--root", self.root, "--queue", queue,
                "--writer", writer, "--total", str(total), "--out", str(out), "--size", str(size),
                "--send-timeout", str(send_timeout_s), "--session-timeout", str(session_timeout_s),
                "--audit", str(self.base / "audit"), "--go", str(go)]
        if rate:
            argv += ["--rate", str(rate)]
        gate = self.base / f"producer-{writer}.gate" if gate_at is not None else None
        if gate is not None:
            argv += ["--gate", str(gate), "--gate-at", str(gate_at)]
        program = ProducerProgram(writer, self.spawn(f"producer-{writer}", argv), out, go, gate)
        if not hold:
            program.go()
        return program

    def spawn_consumer(self, name: str, *, until: int, queue: str = "q", sub: str = "s",
                       commit_every: int = 1000, commit_ms: float = 200.0, crash_at: int | None = None,
                       session_timeout_s: float = CLIENT_SESSION_TIMEOUT_S, hold: bool = False) -> ConsumerProgram:
        """A consumer program (``hold``: as for ``spawn_producer``)."""
        out = self.base / f"consumer-{name}.jsonl"
        go = self.base / f"consumer-{name}.go"
        argv = ["-m", "tests.helpers.consume", "--zk", self.hosts, "--root", self.root, "--queue", queue,
                "--sub", sub, "--until", str(until), "--out", str(out), "--commit-every", str(commit_every),
                "--commit-ms", str(commit_ms), "--session-timeout", str(session_timeout_s),
                "--audit", str(self.base / "audit"), "--go", str(go)]
        if crash_at is not None:
            argv += ["--crash-at", str(crash_at)]
        program = ConsumerProgram(name, self.spawn(f"consumer-{name}", argv), out, go)
        if not hold:
            program.go()
        return program

    @property
    def bootstrap(self) -> str:
        """The coordinators' addresses, as a client is given them (``host:port,...``)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.coordinator_ports)

    def start_daemon(self, name: str, *, interval_s: float = 0.2, session_timeout_s: float = 1.0,
                     extra: Sequence[str] = ()) -> ManagedProcess:
        """A coordinator process (daemon and service; its session as short as the brokers'), on
        its port of ``coordinator_ports`` (the same again when a name is started again)."""
        port = self._coordinator_port.get(name)
        if port is None:
            taken = {self._coordinator_port[p.name] for p in self.coordinators
                     if p.alive() and p.name in self._coordinator_port}
            free = [p for p in self.coordinator_ports if p not in taken and p not in self._coordinator_port.values()]
            free = free or [p for p in self.coordinator_ports if p not in taken]
            if not free:
                raise RuntimeError(f"more than {COORDINATOR_SLOTS} coordinators at once in one test cluster")
            port = self._coordinator_port[name] = free[0]
        proc = start_coordinator(name, self.hosts, self.root, self.run_dir, interval_s=interval_s,
                                 session_timeout_s=session_timeout_s, listen=f"127.0.0.1:{port}", extra=extra)
        self.programs.append(proc)
        self.coordinators.append(proc)
        stand_in, self._stand_in = self._stand_in, None
        if stand_in is not None and stand_in.alive():
            stand_in.stop()
        return proc

    def lock_contenders(self, path: str) -> list[str]:
        return list(self.store.client.Lock(path).contenders())

    def coordinator_requests(self, **labels: str) -> float:
        """``ordq_coordinator_requests_total`` with ``labels`` (rpc, outcome), summed over the
        coordinators running now (only the leader answers requests)."""
        from ordq.common.metrics import value
        from tests.util import read_metrics

        total = 0.0
        for proc in self.coordinators:
            if proc.alive():
                url = proc.wait_for_line("METRICS ", timeout_s=30).split()[-1]
                total += value(read_metrics(url), "ordq_coordinator_requests_total", **labels) or 0.0
        return total

    def consumer_lease(self, queue: str = "q", sub: str = "s") -> Any:
        """The subscription's consumer lease record as the coordinator wrote it (None: never granted)."""
        from ordq.coordinator.leases import Kind, LeaseName

        return self.store.read_lease(LeaseName(Kind.CONSUMER, queue, sub))[0]

    # -- threads in this process ---------------------------------------------------------------

    def producer(self, *, n: int, **options: Any) -> LoadProducer:
        p = LoadProducer(self, n=n, **options)
        self._threads.append(p)
        return p

    def consumer(self, *, until: int, **options: Any) -> LoadConsumer:
        c = LoadConsumer(self, until=until, **options)
        self._threads.append(c)
        return c

    # -- reporting and teardown ----------------------------------------------------------------

    def log_sections(self, lines: int = 40) -> Iterator[tuple[str, str]]:
        for group in self.groups.values():
            for member in group.members:
                yield f"broker {group.gid} {member.role} log, last lines", member.log_tail(lines)
        for proc in self.programs:
            yield f"{proc.name} log, last lines", proc.log_tail(lines)
        try:
            yield "queue states", "\n".join(repr(self.state(q)) for q in self.store.list_queues())
        except Exception as exc:  # noqa: BLE001 - a report must not fail
            yield "queue states", f"unavailable: {exc!r}"

    def close(self) -> None:
        errors: list[BaseException] = []
        for t in self._threads:
            t.stop()
        for piped in self._piped:
            if piped.poll() is None:
                piped.kill()
                piped.wait(timeout=10)
            for stream in (piped.stdin, piped.stdout, piped.stderr):
                if stream is not None:
                    stream.close()
        for proc in self.programs:
            try:
                if proc.alive():
                    proc.resume()  # a SIGSTOPped process must not survive as a zombie group
                    proc.kill()
            except Exception as exc:  # noqa: BLE001 - kill the rest anyway
                errors.append(exc)
        for group in self.groups.values():
            for member in group.members:
                try:
                    if member.alive():
                        member.resume()
                        member.kill()
                except Exception as exc:  # noqa: BLE001
                    errors.append(exc)
        for t in self._threads:
            t.join(timeout_s=10, check=False)
        self.transport.close()
        self.store.close()
        unregister(self.hosts, self.root)
        if errors:
            raise errors[0]


class _LoadThread:
    def __init__(self, name: str) -> None:
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # noqa: BLE001 - raised in the test by join()
            self.error = exc
            log.exception("%s failed", self._thread.name)

    def run(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float, *, check: bool = True) -> None:
        """Wait for the thread; with ``check``, raise its error or fail on timeout."""
        self._thread.join(timeout_s)
        if not check:
            return
        if self._thread.is_alive():
            raise AssertionError(f"{self._thread.name} still running after {timeout_s}s: {self.describe()}")
        if self.error is not None:
            raise AssertionError(f"{self._thread.name} failed: {self.error!r}") from self.error

    def describe(self) -> str:
        return ""


class LoadProducer(_LoadThread):
    """Sends seqs 0..n-1 (payloads carry seq and writer) at ``rate`` msgs/s, records acks.
    ``stop_sending()`` ends the stream early (then ``n`` is what was sent)."""

    def __init__(self, cluster: Cluster, *, n: int, queue: str = "q", writer: str = "P", size: int = 200,
                 rate: float | None = 4000.0, send_timeout_s: float = SEND_TIMEOUT_S,
                 audit_dir: Path | None = None) -> None:
        super().__init__(f"load-producer-{writer}")
        self.cluster, self.n, self.queue, self.writer, self.size, self.rate = cluster, n, queue, writer, size, rate
        self.config = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue,
                                     send_timeout_s=send_timeout_s, lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                                     audit_dir=audit_dir, batching=BatchingConfig(linger_ms=2.0))
        self.acked: list[AckRec] = []
        self.stats: ProducerStats | None = None
        self._producer: Producer | None = None
        self._stop_sending = threading.Event()

    def stop_sending(self) -> None:
        """Send nothing more; flush what was sent (``n`` becomes its count)."""
        self._stop_sending.set()

    def run(self) -> None:
        with Producer(self.config) as producer:
            self._producer = producer
            futures = []
            crcs = []
            t0 = time.monotonic()
            done = 0
            for seq in range(self.n):
                if self._stop.is_set():
                    return
                if self._stop_sending.is_set():
                    break
                if self.rate:
                    pause = t0 + seq / self.rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                payload = make_payload(seq, self.writer, self.size)
                futures.append(producer.send(payload))
                crcs.append(zlib.crc32(payload))
                while done < len(futures) and futures[done].done():
                    self._record(done, futures[done].result().seq, crcs[done])
                    done += 1
            self.n = len(futures)
            producer.flush(timeout_s=120)
            for i in range(done, len(futures)):
                self._record(i, futures[i].result(timeout=60).seq, crcs[i])
            self.stats = producer.statistics()

    def _record(self, i: int, seq: int, crc: int) -> None:
        if seq != i:
            raise AssertionError(f"message {i} was acked as seq {seq}")
        self.acked.append(AckRec(seq=seq, crc=crc, writer=self.writer))

    def statistics(self) -> ProducerStats | None:
        p = self._producer
        return p.statistics() if p is not None else None

    def describe(self) -> str:
        return f"acked {len(self.acked)} of {self.n}, stats {self.statistics()}"


@attrs.frozen
class HandedOut:
    """One ``poll`` that handed out messages, on the system-wide monotonic clock (the same in
    every process of the machine): it was called at ``called_at`` (the hand-out, after the
    consumer's lease check, came later) and returned at ``returned_at``, before the messages
    were looked at (checking a payload is slow: counting deliveries lags the hand-outs)."""

    called_at: float
    returned_at: float
    count: int
    first_seq: int
    valid_until: float  # the consumer's lease as it stood right after (diagnostics)


class LoadConsumer(_LoadThread):
    """Consumes a subscription until it delivered seq ``until``; records every delivery.
    ``pause_s`` per poll makes it a slow subscription; ``hold_at``: once it delivered that seq,
    it polls no more until ``release()`` (a subscription held behind a segment's end whatever the
    machine's speed). A consumer whose lease went to another rejoins by itself: what it delivers
    after that is a new entry of ``instances``. ``rejoin``: on NotLeader start a new consumer,
    as an application would; else the thread fails."""

    def __init__(self, cluster: Cluster, *, until: int, queue: str = "q", sub: str = "s", pause_s: float = 0.0,
                 fetch_max_bytes: int = 4 << 20, audit_dir: Path | None = None, rejoin: bool = False,
                 hold_at: int | None = None) -> None:
        super().__init__(f"load-consumer-{sub}")
        self.until, self.pause_s = until, pause_s
        self.hold_at = hold_at
        self._released = threading.Event()
        self.config = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue, subscription=sub,
                                     lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, audit_dir=audit_dir,
                                     fetch_max_bytes=fetch_max_bytes,
                                     commit=CommitConfig(every_messages=1000, every_ms=200.0))
        self.delivered: list[DeliveryRec] = []  # by every instance, in delivery order
        self.handed_out: list[HandedOut] = []  # each poll that handed out messages, as it returned
        self.instances: list[list[DeliveryRec]] = []  # the same, one list per consumer instance
        self.rejoin = rejoin
        self._consumer: Consumer | None = None

    def run(self) -> None:
        last = -1
        while True:
            instance: list[DeliveryRec] = []
            self.instances.append(instance)
            try:
                with Consumer(self.config) as consumer:
                    self._consumer = consumer
                    rejoins = 0
                    while last < self.until and not self._stop.is_set():
                        if self.hold_at is not None and last >= self.hold_at and not self._released.is_set():
                            self._released.wait(0.1)
                            continue
                        called_at = time.monotonic()
                        batch = consumer.poll(0.2)
                        st = consumer.statistics()
                        if st.rejoins != rejoins:
                            # Its lease went to another and came back: it reads on from the
                            # committed cursor, a new stretch of delivery (an "instance").
                            rejoins, last = st.rejoins, st.last_seq
                            instance = []
                            self.instances.append(instance)
                        if batch:
                            lease = consumer._checks.lease if consumer._checks is not None else None
                            self.handed_out.append(HandedOut(
                                called_at, time.monotonic(), len(batch), batch[0].seq,
                                lease.valid_until if lease is not None else float("nan")))
                        for m in batch:
                            d = delivery_of(m.seq, m.payload)
                            self.delivered.append(d)
                            instance.append(d)
                            last = m.seq
                        if self.pause_s:
                            self._stop.wait(self.pause_s)
                    consumer.commit()
                return
            except NotLeader:
                if not self.rejoin:
                    raise
                log.info("%s: lost its lease; a new consumer joins the election", self._thread.name)

    def statistics(self) -> ConsumerStats | None:
        c = self._consumer
        return c.statistics() if c is not None else None

    def last_seq(self) -> int:
        return self.delivered[-1].seq if self.delivered else -1

    def release(self) -> None:
        """Poll on past ``hold_at``."""
        self._released.set()

    def describe(self) -> str:
        c = self._consumer
        return f"delivered {len(self.delivered)} (last seq {self.last_seq()}) of 0..{self.until}, " \
               f"stats {c.statistics() if c is not None else None}"


# -- load under faults ------------------------------------------------------------------------------

LOAD_RATE = 4000.0  # msgs/s: continuous load, so a fault lands while messages flow both ways
FINISH_S = 90.0  # deadline for producer and consumers to finish after a fault


def start_load(cluster: Cluster, n: int, *, send_timeout_s: float = SEND_TIMEOUT_S,
               **consumer_options: Any) -> tuple[LoadProducer, LoadConsumer]:
    """A producer thread (seqs 0..n-1 at LOAD_RATE) and a consumer thread (subscription "s"),
    both writing audit files under ``base/audit``."""
    producer = cluster.producer(n=n, rate=LOAD_RATE, audit_dir=cluster.base / "audit", send_timeout_s=send_timeout_s)
    consumer = cluster.consumer(until=n - 1, audit_dir=cluster.base / "audit", **consumer_options)
    producer.start()
    consumer.start()
    return producer, consumer


def wait_acked(producer: LoadProducer, count: int, timeout_s: float = 60.0) -> None:
    """Under load: wait until ``count`` messages were acked (the moment to inject a fault)."""
    def progressed() -> bool:
        if producer.error is not None:
            raise AssertionError(f"producer failed: {producer.error!r}")
        return len(producer.acked) >= count

    try:
        wait_until(progressed, timeout_s=timeout_s, interval_s=0.005, what=f"{count} acks")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {producer.describe()}\n{thread_stacks()}") from None


def thread_stacks() -> str:
    """Where this process's load and SDK threads are now (for a report on a stall)."""
    frames = sys._current_frames()
    out = []
    for t in threading.enumerate():
        frame = frames.get(t.ident or -1)
        if frame is not None and t.name.startswith(("load-", "ordq-")):
            out.append(f"--- thread {t.name}\n" + "".join(traceback.format_stack(frame)[-8:]))
    return "\n".join(out)


def finish(producer: LoadProducer, *consumers: LoadConsumer) -> None:
    """Wait for the producer and consumers to complete (raising their errors)."""
    producer.join(FINISH_S)
    for c in consumers:
        c.join(FINISH_S)


# -- fixtures ------------------------------------------------------------------------------------


class _LogTailReporter:
    """Adds the cluster's process log tails to the report of a failed test."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        cluster = item.stash.get(_CLUSTER, None)
        if report.failed and cluster is not None:
            for title, text in cluster.log_sections():
                report.sections.append((title, text))
        return report


@contextlib.contextmanager
def module_cluster(zk: ZkServer, tmp_path_factory: pytest.TempPathFactory, name: str,
                   *groups: str) -> Iterator[Cluster]:
    """One cluster shared by a module's tests (under a fresh root), with ``groups`` started;
    closed (every process it started stopped) after the module."""
    c = Cluster(zk, f"/{name}-{uuid.uuid4().hex}", tmp_path_factory.mktemp(name))
    try:
        c.add_groups(*groups)
        yield c
    finally:
        c.close()


@pytest.fixture(name="cluster")
def cluster_fixture(request: pytest.FixtureRequest, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on ``zk_ensemble`` if the test requests it, else on ``zk_server``."""
    pm = request.config.pluginmanager
    if not pm.has_plugin(_PLUGIN_NAME):
        pm.register(_LogTailReporter(), _PLUGIN_NAME)
    which = "zk_ensemble" if "zk_ensemble" in request.fixturenames else "zk_server"
    zk: ZkServer = request.getfixturevalue(which)
    c = Cluster(zk, zk_root, tmp_path)
    request.node.stash[_CLUSTER] = c
    try:
        yield c
    finally:
        c.close()


def modules_loaded_by(cluster: Cluster, heavy: Sequence[str], *argv: str) -> list[str]:
    """The modules of ``heavy`` an ``ordq`` command on ``cluster`` loads, run as a program."""
    return modules_loaded(heavy, "--zk", cluster.hosts, "--root", cluster.root, *argv)


def modules_loaded(heavy: Sequence[str], *argv: str) -> list[str]:
    """The modules of ``heavy`` the ``ordq`` command ``argv`` loads, run as a program."""
    import json

    code = ("import json, sys\nfrom ordq.cli import main\n"
            f"code = main({list(argv)!r})\n"
            f"print(json.dumps(sorted(m for m in {tuple(heavy)!r} if m in sys.modules)))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert res.returncode == 0, res.stderr
    loaded: list[str] = json.loads(res.stdout.splitlines()[-1])
    return loaded
