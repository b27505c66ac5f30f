"""Run a drill: steady load through a real cluster, one fault at a random moment, a verdict.

A drill (``ordq.drills.catalog``) on a :class:`ordq.local_cluster.LocalCluster`:

1. heals the cluster (starts whatever a previous drill left down) and creates a fresh queue;
2. starts a consumer and a producer process (``ordq.drills.workload``; standbys too when the
   fault hits the producer or the consumer leader), writing audit files;
3. once acks flow, waits a random part of the run (seeded) and injects its fault, which
   also undoes it when the fault's story says so (restart, resume, free the disk);
4. lets the producers finish the stream (seqs 0..N-1) and the consumer deliver all of it;
5. asks ``spark_order_check`` for the verdict over the audit files (``ordq.drills.verdict``),
   and checks that the fault had its effect (it failed over, the stale producer was fenced,
   the torn tail was counted, ...): a fault that did nothing proves nothing.

The result row: messages acked/delivered, lost, reordered, duplicates handed to the app,
failover time (fault → first ack on the new segment / by the new leader), verdict.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.coordinator.state import SegStatus
from ordq.drills import audit
from ordq.drills.workload import now_us, read_status
from ordq.local_cluster import LocalCluster

T = TypeVar("T")

SUBSCRIPTION = "drill"


class Writer(Protocol):
    """Where a drill reports its events as they happen (a text stream, the demo's display)."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


class DrillError(OrdqError):
    """The drill itself could not go on (a wait ran out, a process would not start)."""


MIN_STREAM_S = 2.0  # a drill's stream lasts at least this long (LoadConfig.lasting; CI_LOAD lasts 2 s)


@attrs.frozen(kw_only=True)
class LoadConfig:
    """The steady load of a drill."""

    messages: int = 20_000
    rate: float = 4_000.0  # messages per second
    size: int = 100  # payload bytes
    send_timeout_s: float = 1.0  # producer ack deadline: how fast a hung head is given up
    session_timeout_s: float = 1.0  # producer/consumer ZooKeeper sessions: how fast a standby takes over

    @property
    def duration_s(self) -> float:
        return self.messages / self.rate

    def lasting(self, min_s: float) -> LoadConfig:
        """This load, its rate lowered so that the stream lasts at least ``min_s``: a fault
        injected when 20-60 % of it is acked must find it still running (issue 24:
        ``--messages 100`` at 4,000/s was over in 25 ms, before the fault; the drill then
        waited for an ack that could not come)."""
        if self.duration_s >= min_s:
            return self
        return attrs.evolve(self, rate=self.messages / min_s)


@attrs.define(eq=False)
class Workload:
    """One producer or consumer process of a drill."""

    writer: str
    role: str  # producer | consumer
    proc: ManagedProcess
    status_path: Path

    def status(self) -> dict[str, Any]:
        return read_status(self.status_path)

    def leading(self) -> bool:
        return self.status().get("state") in ("leading", "done")


@attrs.frozen
class Drill:
    """A fault and what must happen (DESIGN §6)."""

    name: str
    fault: str
    must: str
    inject: Callable[[DrillContext], None]
    standby_producer: bool = False
    standby_consumer: bool = False
    late_consumer: bool = False  # the consumer starts after the fault (it finds the damage unread)
    needs_ensemble: bool = False
    # ``inject`` runs the whole load itself, faults included (the CDC drill: ordq.drills.cdc)
    own_load: bool = False
    # raises a one-line OrdqError when the drill cannot run here (before any cluster starts)
    requires: Callable[[], None] | None = None
    failover: bool = True  # the fault makes something fail over (the failover time is measured)
    # the consumer process's own options (ordq.drills.failing), made when it starts; None: ordq.drills.workload
    consumer_options: Callable[[DrillContext], list[str]] | None = None
    # extra checks over the finished run (acks, deliveries) -> [(what, ok)]
    check: Callable[[DrillContext, list[audit.AckRow], list[audit.DeliveryRow]], list[tuple[str, bool]]] | None = None
    # the drill's own load, made from the one asked for (the neighbour drill's fixed rate)
    load: Callable[[LoadConfig], LoadConfig] | None = None
    # the drill's stream is a keyed topic (``ctx.notes["topic"]``, partitions ``<topic>.pN``), not ctx.queue:
    # its findings are those of the partitions, and its own checks say whether the stream completed
    topic: bool = False
    # The producers send this part of the stream (0-1), then wait for the fault (``ctx.fault``)
    # before sending on: a fault that waits for something first (the failing-handler-block
    # drill's alarm) still finds the stream running however slow the machine (issue 26: at
    # load 25 the 2 s stream ended first, and the failover it waited for could never come).
    hold_at: float | None = None
    # The part of the stream acked when the fault comes: a random moment between the two (seeded). A
    # drill whose fault is a series of windows (security-control-plane) starts early, so that a
    # short stream still outlasts them.
    fault_between: tuple[float, float] = (0.2, 0.6)


@attrs.define(eq=False)
class DrillContext:
    """What a fault needs: the cluster, the run's processes, a seeded rng, deadlines."""

    cluster: LocalCluster
    drill: Drill
    round: int
    rng: random.Random
    queue: str
    run_dir: Path
    load: LoadConfig
    status_dir: Path = attrs.field(default=attrs.Factory(lambda self: self.run_dir, takes_self=True))
    out: Writer | None = None
    started: float = attrs.field(factory=time.monotonic)
    producers: list[Workload] = attrs.field(factory=list)
    consumers: list[Workload] = attrs.field(factory=list)
    events: list[tuple[float, str]] = attrs.field(factory=list)
    fault_us: int | None = None
    fault_seg: int | None = None
    fault_writer: str | None = None
    failover_kind: str | None = None  # segment | producer | consumer
    expectations: list[tuple[str, bool]] = attrs.field(factory=list)
    notes: dict[str, Any] = attrs.field(factory=dict)

    # -- record --------------------------------------------------------------------------

    def event(self, text: str) -> None:
        t = time.monotonic() - self.started
        self.events.append((t, text))
        if self.out is not None:
            self.out.write(f"    {t:6.2f}s  {text}\n")
            self.out.flush()

    def fault(self, text: str, *, kind: str | None = None, seg: int | None = None, writer: str | None = None,
              at_us: int | None = None) -> None:
        """Mark the moment of the fault: ``at_us`` (taken right before doing it), else now.
        Producers held before it (``Drill.hold_at``) send on."""
        self.fault_us = at_us if at_us is not None else now_us()
        self.failover_kind, self.fault_seg, self.fault_writer = kind, seg, writer
        self.fault_file.touch()
        self.event(f"FAULT: {text}")

    def expect(self, what: str, ok: bool, *, quiet: bool = False) -> None:
        """Record something the fault must have caused (a drill with an unmet one fails)."""
        self.expectations.append((what, bool(ok)))
        if not quiet:
            self.event(f"{'ok' if ok else 'NOT MET'}: {what}")

    # -- wait ----------------------------------------------------------------------------

    def wait(self, condition: Callable[[], T | None], *, timeout_s: float, what: str,
             progress: Callable[[], int] | None = None) -> T:
        """``condition()``'s first true value. Without ``progress``, DrillError after
        ``timeout_s``. With it, ``timeout_s`` is the longest wait without progress (the count
        ``progress()`` returns did not grow): a loaded machine that is slow but moving is
        waited for, a stuck one fails as soon (issue 26: timeouts follow what the machine shows)."""
        start = next_look = time.monotonic()
        deadline = start + timeout_s
        interval = 0.01
        seen = -1 << 62
        while True:
            value = condition()
            if value:
                return value
            now = time.monotonic()
            if progress is not None and now >= next_look:  # once a second: progress may cost a query
                next_look = now + 1.0
                if (count := progress()) > seen:
                    seen, deadline = count, now + timeout_s
            if now >= deadline:
                stalled = f" without progress (at {seen}; {now - start:.0f}s in all)" if progress is not None else ""
                raise DrillError(f"{self.drill.name}: timed out after {timeout_s:g}s{stalled} waiting for {what}")
            time.sleep(interval)
            interval = min(interval * 1.5, 0.1)

    def hold(self, seconds: float, why: str) -> None:
        """Keep a fault in place for a while: part of its story, not a wait for a condition."""
        self.event(f"holding {seconds:.1f}s: {why}")
        time.sleep(seconds)

    # -- facts ---------------------------------------------------------------------------

    def head(self, timeout_s: float = 15.0) -> tuple[str, int]:
        """(group, segment) of the queue's open segment now."""
        with self.cluster.store() as store:
            st = store.wait_state(self.queue, lambda s: s.open_segment is not None, timeout_s=timeout_s)
        seg = st.open_segment
        assert seg is not None
        return seg.gid, seg.seg

    def leader(self, role: str) -> Workload:
        group = self.producers if role == "producer" else self.consumers
        return self.wait(lambda: next((w for w in group if w.proc.alive() and w.status().get("state") == "leading"),
                                      None), timeout_s=30, what=f"a leading {role}")

    def wait_acks_after(self, seg: int, timeout_s: float = 30.0) -> int:
        """Wait until a producer got an ack on a segment after ``seg``; return that segment.

        ``timeout_s``, stretched by the machine's load (``load_stretched``), bounds the wait
        without progress, not the whole wait. Progress is the failover's steps: the queue's
        state moving past ``seg`` (a new segment, ``seg`` sealed) and the producers' own
        (failovers, acks). A failover slowed by a loaded machine is waited for; one stuck fails
        as soon as before, naming where it stood (issue 26: a fixed 30 s overran at load 25)."""
        def later() -> int | None:
            running = any(w.proc.alive() for w in self.producers)  # before the statuses: a last one is read
            for w in self.producers:
                segs = [int(s) for s in w.status().get("seg_first_ack_us", {})]
                later = [s for s in segs if s > seg]
                if later:
                    return min(later)
            if not running:  # nobody left to be acked: say why
                raise DrillError(f"{self.drill.name}: no ack on a segment after {seg} and no producer running: "
                                 + "; ".join(f"{w.proc.name} {w.status().get('state')} {w.status().get('error')!r}"
                                             for w in self.producers))
            return None

        with self.cluster.store() as store:
            def moved() -> int:
                steps = sum(st.get("acked", 0) + st.get("failovers", 0) for st in (w.status() for w in self.producers))
                try:
                    qs, _ = store.load_state(self.queue)
                except OrdqError:
                    return steps  # ZooKeeper slow to answer: the producers' steps alone
                old = qs.segment(seg)
                return steps + qs.next_seg + (old is None or old.status is not SegStatus.OPEN)

            new = self.wait(later, timeout_s=load_stretched(timeout_s), what=f"an ack on a segment after {seg}",
                            progress=moved)
        self.event(f"producer acked on segment {new}")
        return new

    def restart_broker(self, gid: str, role: str) -> str:
        address = self.cluster.restart_broker(gid, role)
        self.event(f"restarted {gid} {role} at {address}")
        return address

    def broker_stats(self, gid: str, role: str) -> dict[str, Any]:
        """The broker's Health statistics ({} when it does not answer)."""
        import json

        from ordq.wire.client import GrpcTransport

        with self.cluster.store() as store:
            info = store.live_members(gid).get(role)
        if info is None:
            return {}
        transport = GrpcTransport(rpc_timeout_s=2.0, credentials=self.cluster.credentials)
        try:
            stats: dict[str, Any] = json.loads(transport.health(info.address).stats_json or "{}")
            return stats
        except OrdqError:
            return {}
        finally:
            transport.close()

    def segment_file(self, gid: str, role: str, seg: int) -> Path:
        from ordq.broker_group.log import SEGMENT_FILE, segment_dir

        return segment_dir(self.cluster.broker(gid, role).data_dir, self.queue, seg) / SEGMENT_FILE

    # -- processes -----------------------------------------------------------------------

    @property
    def go_file(self) -> Path:
        return self.run_dir / "go"

    @property
    def fault_file(self) -> Path:
        """Exists once the fault was injected (``fault``) or the inject step ended."""
        return self.run_dir / "fault"

    def start_workload(self, role: str) -> Workload:
        group = self.producers if role == "producer" else self.consumers
        name = f"{role[0]}{len(group) + 1}"
        writer = f"{name}-{self.queue}"
        status = self.status_dir / f"{name}.status.json"
        c, load = self.cluster, self.load
        custom = self.drill.consumer_options if role == "consumer" else None
        role_verb = "produce" if role == "producer" else "consume"
        entry = ["ordq.drills.failing"] if custom else ["ordq.drills.workload", role_verb]
        argv = [c.python, "-m", *entry,
                "--zk", c.zk_hosts, "--root", c.root, "--queue", self.queue, "--total", str(load.messages),
                "--status", str(status), "--writer", writer, "--audit-dir", str(self.run_dir / "audit"),
                "--session-timeout", str(load.session_timeout_s)]
        if role == "producer":
            argv += ["--rate", str(load.rate), "--size", str(load.size), "--send-timeout", str(load.send_timeout_s),
                     "--go-file", str(self.go_file)]
            if self.drill.hold_at is not None:
                argv += ["--hold-at", str(int(self.drill.hold_at * load.messages)), "--hold-file", str(self.fault_file)]
        else:
            argv += ["--subscription", SUBSCRIPTION, *(custom(self) if custom else [])]
        # Producers and consumers hold no ZooKeeper identity (issue 37): the cluster's credentials only.
        proc = ManagedProcess(name, argv, run_dir=self.run_dir)
        proc.start()
        w = Workload(writer=writer, role=role, proc=proc, status_path=status)
        group.append(w)
        proc.wait_for_line("STARTED", timeout_s=60)
        return w


# Where the workloads' status files are rewritten while a drill runs: memory, not the cluster's disk.
# Each workload replaces its status file by rename every 0.1 s; on an ext4 volume mounted with
# ``discard`` each replacement frees the old file's block and sends the disk a discard: two
# workloads made 20 writes and 20 discards a second on the brokers' disk, none without them
# (stop h). Those were the harness's own I/O, not the cluster's. (The disk's freezes of 150-460 ms
# that set the drills' p99s came with slow discards, but went on without them: drills/device_stalls.py.)
STATUS_ROOT = Path("/dev/shm")


def status_folder(queue: str, run_dir: Path, root: Path = STATUS_ROOT) -> Path:
    """A new folder for the run's status files under ``root`` (tmpfs), or ``run_dir`` when
    ``root`` cannot be written; ``keep_statuses`` moves them to ``run_dir`` at the end."""
    if root.is_dir() and os.access(root, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"ordq-{queue}-", dir=root))
    return run_dir


def keep_statuses(status_dir: Path, run_dir: Path) -> None:
    """The last status files, with the run's other files (``status_folder``); the folder removed."""
    if status_dir == run_dir:
        return
    for f in status_dir.glob("*.json"):
        shutil.copy2(f, run_dir / f.name)
    shutil.rmtree(status_dir, ignore_errors=True)


def drill_seed(seed: int, name: str, round_: int) -> int:
    return random.Random(f"{seed}:{name}:{round_}").randrange(1 << 31)


@attrs.define(eq=False)
class DrillRun:
    """A drill that ran (load and fault) and waits for its verdict."""

    ctx: DrillContext
    seed: int
    seconds: float
    error: str | None = None
    skipped: str | None = None

    @property
    def audit_dir(self) -> Path:
        return self.ctx.run_dir / "audit"


def tampered_copy(run: DrillRun, how: str, *, seed: int = 0) -> DrillRun:
    """The test hook (``audit.tamper``: ``lose`` or ``reorder`` one delivery) on a copy of a
    finished run, as a run of its own (its queue renamed in every row, so one verification
    judges both): what ``execute_drill(..., tamper=how)`` checks, without running the drill's
    load and fault again."""
    ctx = run.ctx
    queue = f"{ctx.queue}-{how}"
    copy = attrs.evolve(ctx, queue=queue, run_dir=ctx.run_dir.with_name(queue), events=list(ctx.events),
                        expectations=list(ctx.expectations), notes=dict(ctx.notes), out=None)
    audit.copy_as(run.audit_dir, copy.run_dir / "audit", ctx.queue, queue)
    copy.event(f"TEST HOOK: {audit.tamper(copy.run_dir / 'audit', how, random.Random(drill_seed(seed, how, 0)))}")
    return attrs.evolve(run, ctx=copy)


def execute_drill(
    cluster: LocalCluster,
    drill: Drill,
    *,
    round_: int = 1,
    seed: int = 0,
    load: LoadConfig | None = None,
    tamper: str | None = None,
    out: Writer | None = None,
    queue: str | None = None,
    monitor: Callable[[DrillContext, threading.Event], None] | None = None,
) -> DrillRun:
    """Run one drill's load and fault on ``cluster`` (healed first); the verdict comes later
    (``judge_all``), so that one Spark job can verify a whole series. ``tamper`` ('lose' or
    'reorder') is the test hook that alters the recorded deliveries before the verdict.
    ``monitor(ctx, done)`` runs in a thread while the load runs (the demo's live display)."""
    load = load or LoadConfig()
    if drill.load is not None:
        load = drill.load(load)
    if not drill.own_load:
        load = load.lasting(MIN_STREAM_S)
    run_seed = drill_seed(seed, drill.name, round_)
    rng = random.Random(run_seed)
    started = time.monotonic()
    queue = queue or f"drill-{drill.name}-r{round_}-{secrets.token_hex(3)}"
    run_dir = cluster.folder / "drills" / queue
    run_dir.mkdir(parents=True)
    ctx = DrillContext(cluster=cluster, drill=drill, round=round_, rng=rng, queue=queue, run_dir=run_dir,
                       load=load, out=out, status_dir=status_folder(queue, run_dir))
    if drill.needs_ensemble and not cluster.zk.ensemble:
        return DrillRun(ctx=ctx, seed=run_seed, seconds=0.0,
                        skipped="SKIP (needs a 3-node ZooKeeper: ordq up --zk-nodes 3)")
    error: str | None = None
    try:
        healed = cluster.heal()
        if healed:
            ctx.event(f"healed the cluster: started {', '.join(healed)}")
        with cluster.store() as store:
            store.create_queue(queue)
        done = threading.Event()
        watcher = threading.Thread(target=monitor, args=(ctx, done), name="drill-monitor", daemon=True)
        if monitor is not None:
            watcher.start()
        try:
            if drill.own_load:
                drill.inject(ctx)
            else:
                _run_load(ctx)
        finally:
            done.set()
            if monitor is not None:
                watcher.join(timeout=5)
        cluster.heal()
        if tamper:
            ctx.event(f"TEST HOOK: {audit.tamper(run_dir / 'audit', tamper, rng)}")
    except (OrdqError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        ctx.event(f"drill error: {error}")
    finally:
        for w in ctx.producers + ctx.consumers:
            with contextlib.suppress(OrdqError):
                w.proc.stop(timeout_s=5)
        for w in ctx.producers + ctx.consumers:  # read from the run's folder from now on
            w.status_path = run_dir / w.status_path.name
        keep_statuses(ctx.status_dir, run_dir)
        if error is not None:
            # The fault may still be in place (a killed master the drill did not get to
            # restart): the cluster is left as whole as it was found (issue 24).
            try:
                healed = cluster.heal()
                if healed:
                    ctx.event(f"healed the cluster after the error: started {', '.join(healed)}")
            except (OrdqError, OSError) as exc:
                ctx.event(f"could not heal the cluster: {type(exc).__name__}: {exc}")
    return DrillRun(ctx=ctx, seed=run_seed, seconds=time.monotonic() - started, error=error)


def _run_load(ctx: DrillContext) -> None:
    load, drill = ctx.load, ctx.drill
    # Every process is up (standbys waiting for their election) before the load starts.
    if not drill.late_consumer:
        ctx.start_workload("consumer")
        if drill.standby_consumer:
            ctx.wait(ctx.consumers[0].leading, timeout_s=60, what="the consumer to lead")
            ctx.start_workload("consumer")
    first = ctx.start_workload("producer")
    ctx.wait(first.leading, timeout_s=60, what="the producer to lead")
    if drill.standby_producer:
        ctx.start_workload("producer")
    ctx.go_file.touch()
    ctx.wait(lambda: first.status().get("acked", 0) > 0, timeout_s=60, what="the first ack")
    ctx.event(f"load running: {load.messages} messages at {load.rate:g}/s, "
              f"{len(ctx.producers)} producer(s), {len(ctx.consumers)} consumer(s)")
    # The random moment of the fault: when the stream is 20-60 % acked (``Drill.fault_between``; a
    # moment in time would fall after the end of the stream on a slow machine).
    at = int(ctx.rng.uniform(*drill.fault_between) * load.messages)
    ctx.wait(lambda: sum(w.status().get("acked", 0) for w in ctx.producers) >= at,
             timeout_s=load.duration_s * 4 + 60, what=f"{at} messages acked")
    try:
        drill.inject(ctx)
    finally:
        ctx.fault_file.touch()  # a held producer never waits past the inject step
    if drill.late_consumer:
        ctx.start_workload("consumer")
        ctx.event("consumer started")
    budget = load.duration_s * 4 + 90

    _await_exit(ctx, ctx.producers, budget, "the producers", "finish the stream", ("acked", "failovers"))
    # A standby consumer leads once the first exits, finds its cursor at the end and exits too.
    _await_exit(ctx, ctx.consumers, 60 + load.duration_s, "the consumers", "deliver the stream",
                ("delivered", "last_seq"))


def _await_exit(ctx: DrillContext, workers: list[Workload], timeout_s: float, who: str, task: str,
                counters: tuple[str, ...]) -> None:
    """Wait for every workload process to exit (stopping those that overrun); log each one's
    final state and counters."""
    def done() -> bool:
        return all(not w.proc.alive() for w in workers)

    try:
        ctx.wait(done, timeout_s=timeout_s, what=f"{who} to {task}")
    except DrillError as exc:
        ctx.expect(f"{who} finished ({exc})", False)
        for w in workers:
            w.proc.stop(timeout_s=5)
    for w in workers:
        st = w.status()
        shown = ", ".join(f"{c.replace('_', ' ')} {st.get(c)}" for c in counters)
        ctx.event(f"{w.writer.split('-')[0]} exited ({w.proc.returncode}): {st.get('state')}, {shown}")
