"""The ``security-control-plane`` drill (issue 38; docs/SECURITY.md, "The coordinator service's
limits"): hand-made clients attack the leading coordinator under load, in windows interleaved
with quiet ones, while the drill queue is produced to and another caller commits on it.

The attacker holds real credentials: the cluster's client certificate with no token, and a
consume token for a queue of its own (the *attacked* queue, at its subscription bound). Its
attacks, all at once in each window, from a process of its own, placed as a host of its own
would be (``window_variants``): under a CPU quota in a cgroup, as the noisy-neighbour drill's
abuser (``ordq.drills.neighbour``), and on one CPU only, in the judged windows; on every CPU in
the ``unplaced`` windows between them, which are told, not judged:

- ``huge``: ``Pop`` requests naming a 200 MiB queue, with the certificate and no token (2 at once,
  each made by hand over HTTP/2: drills/huge_call.py, no 200 MiB held in the attacker);
- ``flood``: 64 threads over 4 connections calling ``Describe`` and ``Subscribe`` with the token;
- ``bound``: ``Subscribe`` of new names past the queue's ``max_subscriptions_per_queue``;
- ``parking``: ``EnsureParkingQueue`` for made-up subscriptions;
- ``undecodable``: bytes that are no protobuf, raw, to ``Pop``, ``Commit``, ``Acquire``, ``Describe``;
- ``newline``: a queue name with a new line forging a log line, with the token and without.

Each attack window ends on time (``control_plane_plan``): every attacker call's deadline is
``ATTACK_S`` after the window's start, and its threads stop within ``DRAIN_S``; the window lasts
``WINDOW_S``, as each quiet window does, or on until the leader's calls in flight are back to
their quiet level (what it still held of the attacker's ended: ``SETTLE_S`` at most), all of it
judged as attacked. The drill does the same in both kinds of window, and the rest of its work in
gaps between them (``_attack``; stop n's idle control, nothing sent, failed the per-window rule
when they differed); the attacker's connections are made once, before the first window. The
windows are placed only if, at those bounds, the last ends before the drill queue's stream does
(checked before the run and before the first window).

It must hold (``control_plane_judge.check_control_plane`` and the expectations of ``control_plane``): every attack
refused (no call of a refused kind answered ``ok``; each kind's own refusal seen) and counted by
the leader (``ordq_coordinator_requests_total{rpc, outcome}`` grew by at least what the attacker
was refused); the leader's RSS stays under ``RSS_BUDGET_BYTES`` and it keeps leading (the same
election node before and after: its ZooKeeper session never lapsed); nothing created or changed
(queues, subscriptions); no forged line, no traceback and no name over 4 KiB in its log; and the
drill queue's produce ack p99 and the neighbour's Commit p99, each pooled over the judged attack
windows, within ``LATENCY_RATIO`` of the same pooled over every quiet window between them (what
was in flight while the disk under the cluster froze left out of both: ``device_stalls``).

The drill's parts, each a job: the attacker (``control_plane_attacks``), the windows' plan and
variants (``control_plane_plan``), where the attacker runs and what each process's CPU did
(``control_plane_placement``), the latency judgement (``control_plane_judge``); here, the set-up,
the windows run in turn, the neighbour's commits, the leader's RSS and what must be unchanged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ordq.common.metrics import scrape, scrape_or_none, value
from ordq.common.security import Credentials
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.service_leases import LOCK_NODE, coordinator_addresses, leader_address
from ordq.coordinator.tokens import create_token, revoke_token, touch
from ordq.drills import control_plane_path as path
from ordq.drills import cpu_isolation, device_stalls, neighbour
from ordq.drills.control_plane_attacks import (
    ATTACKS,
    ATTACKS_ENV,
    CONTROLS,
    FLOOD_THREADS,
    FORGED,
    HUGE_AT_ONCE,
    HUGE_NAME_BYTES,
    AttackerProcess,
    attack_kinds,
    attacker_process,
    judge_attacks,
    window_times,
)
from ordq.drills.control_plane_judge import Window, by_variant, p50, p99, split
from ordq.drills.control_plane_placement import LEADER_SHARES, CpuUse, place_leader
from ordq.drills.control_plane_plan import (
    ATTACK_S,
    ATTACKS_FROM,
    DEFAULT_WINDOWS,
    LEAD_S,
    MESSAGES,
    PLAN,
    ROUNDS,
    SETTLE_S,
    SETUP_S,
    UNPLACED,
    WINDOW_S,
    WINDOWS_ENV,
    stream_left_s,
    window_variants,
)
from ordq.drills.runner import DrillContext
from ordq.drills.workload import now_us

PROBE_EVERY_S = 0.005  # the neighbour commits its cursor again this long after the last answer
RSS_BUDGET_BYTES = 256 << 20  # the leading coordinator's
TURNS = "ordq_coordinator_turns_total"  # the leader's fair turns: served, waited, reserved, refused
IN_FLIGHT = "ordq_coordinator_calls_in_flight"  # the leader's calls from their headers to their answers
QUIET_READS = 5  # the last reads of the leader's calls in flight in a quiet window: its quiet level (the most)
READ_EVERY_S = 0.1  # the leader's calls in flight read this often in each window's tail, either kind


def control_plane_load(load: Any) -> Any:
    """The noisy-neighbour drill's rate (2,000 msgs/s), ``MESSAGES`` of them. A malformed
    ``ATTACKS_ENV`` or ``WINDOWS_ENV``, or a stream the windows would outlast whatever the seed
    (``PLAN``), is refused here, before the run (ValueError)."""
    window_variants(attack_kinds())
    out = attrs.evolve(neighbour.neighbour_load(load), messages=MESSAGES)
    PLAN.check_load(out.duration_s, ATTACKS_FROM, SETUP_S)
    return out


class _CommitProbe:
    """The neighbour: another token's consumer lease on a subscription of the drill queue,
    committing its cursor every ``PROBE_EVERY_S``; each Commit's time (µs at its start, ms it
    took) recorded, its failures counted."""

    def __init__(self, bootstrap: list[str], creds: Credentials, queue: str, sub: str) -> None:
        self.queue, self.sub = queue, sub
        self.client = CoordinatorClient(bootstrap=bootstrap, credentials=creds, timeout_s=30)
        self.samples: list[tuple[int, float]] = []
        self.failures: list[str] = []
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-probe", daemon=True)
        self.lease: Held | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # the token, a moment old, may not be known to the leader yet
            try:
                lease = self.client.acquire("consumer", self.queue, self.sub, "drill-neighbour", ttl_ms=30_000)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if isinstance(lease, Held):
                self.lease = lease
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the neighbour got no consumer lease on {self.queue}/{self.sub}: {lease}")
            time.sleep(0.1)
        self._thread.start()

    def _run(self) -> None:
        assert self.lease is not None
        d = self.client.describe(self.queue, subscription=self.sub)
        assert d.cursor is not None
        cursor, version = d.cursor, d.cursor_version
        renewed = time.monotonic()
        while not self.stop_event.wait(PROBE_EVERY_S):
            try:
                if time.monotonic() - renewed > 5.0:
                    self.lease, renewed = self.client.heartbeat(self.lease), time.monotonic()
                t0, at = time.perf_counter(), now_us()
                version = self.client.commit(self.queue, self.sub, cursor, version, self.lease)
                self.samples.append((at, (time.perf_counter() - t0) * 1000.0))
            except Exception as exc:  # noqa: BLE001 - a neighbour's failed commit is a finding
                self.failures.append(f"{type(exc).__name__}: {exc}"[:300])
                d = self.client.describe(self.queue, subscription=self.sub)
                cursor, version = d.cursor or cursor, d.cursor_version

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(60)
        if self.lease is not None:
            with contextlib.suppress(Exception):
                self.client.release(self.lease)
        self.client.close()


def _in_flight(url: str) -> float | None:
    """The leader's calls in flight now (``IN_FLIGHT``); None when its metrics did not answer."""
    samples = scrape_or_none(url, timeout_s=1.0)
    return None if samples is None else value(samples, IN_FLIGHT)


def tail_reads(read: Callable[[], float | None], ends_at: float, *, settle_to: float | None = None,
               bound_s: float = 0.0, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], object] = time.sleep, every_s: float = READ_EVERY_S
               ) -> tuple[list[float], float | None]:
    """A window's tail, the same in either kind: ``read()`` (the leader's calls in flight) every
    ``every_s`` until ``ends_at`` (a ``clock()``); with ``settle_to`` (an attack window's: its
    quiet window's level), on past ``ends_at`` until a read is at most that, ``bound_s`` at most
    from the first read. Returns the values read (a failed read is none) and the s from the first
    read to the first at most ``settle_to`` (None: none was, or none asked)."""
    t0, reads, settled = clock(), [], None
    while True:
        n = read()
        if n is not None:
            reads.append(n)
            if settle_to is not None and settled is None and n <= settle_to:
                settled = clock() - t0
        now = clock()
        waiting = settle_to is not None and settled is None and now - t0 < bound_s
        if now >= ends_at and not waiting:
            return reads, settled
        sleep(every_s if waiting or now + every_s <= ends_at else max(0.0, ends_at - now))


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM: the peak RSS since the process started) of ``pid``, in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


class _RssWatch:
    """The leading coordinator's RSS, sampled every 50 ms while the attacks run."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before, self.hwm_before = _rss(pid)
        self.peak = self.before
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(0.05):
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.peak = max(self.peak, _rss(self.pid)[0])

    def stop(self) -> tuple[int, int, int]:
        """(RSS before, the peak seen, RSS now); the peak is the process's own high-water mark
        when that grew meanwhile (a spike between two samples)."""
        self.stop_event.set()
        self._thread.join(5)
        now, hwm = _rss(self.pid)
        return self.before, max(self.peak, now, hwm if hwm > self.hwm_before else 0), now


def _election_head(client: Any, path: str) -> str | None:
    """The leading contender's election node (a new one after any lapse of its session)."""
    nodes = sorted((int(m.group(1)), c) for c in client.get_children(path) if (m := LOCK_NODE.search(c)))
    return nodes[0][1] if nodes else None


def _counted(url: str, name: str = "ordq_coordinator_requests_total") -> dict[str, float]:
    """The leader's ``name`` by outcome (summed over the rpcs)."""
    out: dict[str, float] = {}
    for s in scrape(url, timeout_s=10.0):
        if s.name == name:
            outcome = s.labels.get("outcome", "")
            out[outcome] = out.get(outcome, 0.0) + s.value
    return out


@attrs.define
class _Stage:
    """What the drill set up before its attacks, and undoes after them (``_set_up``, ``_clear``)."""

    leader: str  # the leading coordinator's process name
    pid: int
    metrics_url: str
    log: Path
    address: str  # where it serves
    bootstrap: list[str]
    election: str | None  # its election node
    attacked: str  # the attacker's queue (at its subscription bound)
    probe_sub: str  # the neighbour's subscription of the drill queue
    token: str  # the attacker's (consume on ``attacked``)
    neighbour_token: str  # the neighbour's (consume on the drill queue)
    token_ids: list[str]
    queues: list[str]  # before the attacks
    subs: dict[str, list[str]]


def _set_up(ctx: DrillContext) -> _Stage:
    from ordq.coordinator.service import MAX_SUBSCRIPTIONS_PER_QUEUE

    c = ctx.cluster
    attacked, probe_sub = ctx.queue + "-attacked", "drill-neighbour"
    leader = ctx.wait(c.coordinator_leader, timeout_s=30, what="a coordinator leader")
    proc = next(p for p in c.coordinators if p.name == leader)
    url = c.metrics_url(leader)
    assert proc.pid is not None and url is not None
    with c.store() as store:
        paths = store.paths
        store.create_queue(attacked)
        # The attacked queue at its bound (the coordinator's max_subscriptions_per_queue, 1,000 by
        # default), made by ZooKeeper writes in transactions of 100: 999 creates sent at once held
        # ZooKeeper long enough for the brokers' 1 s sessions to expire (and the producer to fail over).
        store.create_subscription(attacked, "s0")
        data, _ = store.client.get(paths.sub(attacked, "s0"))
        for first in range(1, MAX_SUBSCRIPTIONS_PER_QUEUE, 100):
            tx = store.client.transaction()
            for i in range(first, min(first + 100, MAX_SUBSCRIPTIONS_PER_QUEUE)):
                tx.create(paths.sub(attacked, f"s{i}"), data)
            tx.commit()
        store.create_subscription(ctx.queue, probe_sub)
        attacker_rec, token = create_token(store.client, paths.root, {attacked: ["consume"]},
                                           "drill: control-plane attacker")
        neighbour_rec, neighbour_token = create_token(store.client, paths.root, {ctx.queue: ["consume"]},
                                                      "drill: control-plane neighbour")
        touch(store.client, paths.root)
        stage = _Stage(leader=leader, pid=proc.pid, metrics_url=url, log=proc.log_path,
                       address=leader_address(store.client, paths.coordinator_leader),
                       bootstrap=coordinator_addresses(store.client, paths.coordinator_leader),
                       election=_election_head(store.client, paths.coordinator_leader), attacked=attacked,
                       probe_sub=probe_sub, token=token, neighbour_token=neighbour_token,
                       token_ids=[attacker_rec.tid, neighbour_rec.tid], queues=sorted(store.list_queues()),
                       subs={q: sorted(store.list_subscriptions(q)) for q in (attacked, ctx.queue)})
    ctx.event(f"leader {leader} at {stage.address} (pid {stage.pid}); {attacked} at its bound of "
              f"{MAX_SUBSCRIPTIONS_PER_QUEUE} subscriptions; the neighbour commits on {ctx.queue}/{probe_sub}")
    return stage


def _clear(ctx: DrillContext, stage: _Stage) -> None:
    """Undo ``_set_up`` (whatever is there of it)."""
    with ctx.cluster.store() as store:
        with contextlib.suppress(Exception):
            store.delete_subscription(ctx.queue, stage.probe_sub)
        for tid in stage.token_ids:
            revoke_token(store.client, store.paths.root, tid)
        touch(store.client, store.paths.root)
        with contextlib.suppress(Exception):
            store.delete_queue(stage.attacked)


def control_plane(ctx: DrillContext) -> None:
    """The ``security-control-plane`` drill (see the module doc): ROUNDS of a quiet window then an
    attack window (ATTACK_S of attacks, then the drain and the leader's settle, judged as
    attacked), each WINDOW_S, with gaps between them; the produce ack p99 is judged over
    the finished run (``check_control_plane``), the rest here."""
    began = time.monotonic()
    stage = _set_up(ctx)
    try:
        _attack(ctx, stage, began)
    finally:
        _clear(ctx, stage)


def _attack(ctx: DrillContext, stage: _Stage, began: float) -> None:
    c = ctx.cluster
    pids = {name: p.pid for name, p in c.processes()}
    pids |= {f"producer {i}": w.proc.pid for i, w in enumerate(ctx.producers)}
    pids |= {f"consumer {i}": w.proc.pid for i, w in enumerate(ctx.consumers)}
    iso, judgement = neighbour.isolate(pids)
    kinds = attack_kinds()
    variants = window_variants(kinds)
    placed, every = cpu_isolation.attacker_cpus()
    judgement += (f"; the attacker's process on CPU {min(placed)} only in the judged windows (a host of its own: "
                  f"never on both cores at once), on CPUs {sorted(every)} in the {UNPLACED} ones (told, not judged)")
    if iso is not None and any(v.leader_apart for v in variants):
        judgement += (f"; the leading coordinator apart (a host of its own) in the rounds of "
                      f"{', '.join(sorted({v.name for v in variants if v.leader_apart}))}: a cgroup of its own at "
                      f"cpu.shares {LEADER_SHARES}, below the cluster's")
    if kinds != ATTACKS:
        judgement += f"; ONLY {'+'.join(kinds)} attacks ({ATTACKS_ENV}): a measurement, not the acceptance"
    measured = variants != window_variants(kinds, DEFAULT_WINDOWS)
    several = len({v.name for v in variants}) > 1  # windows told apart by variant
    if measured:
        judgement += (f"; attack windows in turn {', '.join(v.name for v in variants)} ({WINDOWS_ENV}): "
                      "a measurement, not the acceptance")
    sent = tuple(k for k in (*ATTACKS, *CONTROLS) if any(k in v.kinds for v in variants))
    ctx.notes["neighbour_judgement"] = judgement
    ctx.event(f"judgement: {judgement}")
    log_from = stage.log.stat().st_size
    probe = _CommitProbe(stage.bootstrap, attrs.evolve(c.credentials, token=stage.neighbour_token), ctx.queue,
                         stage.probe_sub)
    attacker: AttackerProcess | None = None
    windows: list[Window] = []
    variant_of: list[str] = []  # each window's variant (WINDOWS_ENV)
    drains: list[float] = []  # s from each attack window's end until the attacker had stopped
    told: list[str] = []  # the attacker's own times of each window: its arming, start and stop
    settles: list[str] = []  # then how long until the leader's calls in flight were back to quiet
    outcomes: dict[str, int] = {}
    rss: _RssWatch | None = None
    disk = contextlib.ExitStack()
    try:
        probe.start()
        disk.enter_context(device_stalls.watched(ctx))
        attacker = attacker_process(stage.address, c.credentials, stage.token, stage.attacked, idle=iso is None,
                                    kinds=sent)
        # Its connections made once, before it is placed (its handshakes at the cluster's weight)
        # and before the first window: no window begins with them.
        ctx.event(f"the attacker's connections to the leader, kept for every window: {attacker.connect()}")
        if iso is not None:
            iso.add("capped", [attacker.pid])
        attacker.arm(variants[0].kinds)  # each window's threads started before it (AttackerProcess)
        assert attacker.pid is not None
        counted_before = _counted(stage.metrics_url)
        turns_before = _counted(stage.metrics_url, TURNS)
        rss = _RssWatch(stage.pid)
        ctx.fault(f"an attacker with the client certificate and a consume token for {stage.attacked} attacks the "
                  f"leading coordinator {stage.leader} in {ROUNDS} windows of {ATTACK_S:g} s (judged over "
                  f"{WINDOW_S:g} s), each after {WINDOW_S:g} s quiet, from a process of its own "
                  f"({attacker.priority}): {HUGE_AT_ONCE} Pop requests at a time naming a {HUGE_NAME_BYTES >> 20} "
                  "MiB queue without a token, "
                  f"{FLOOD_THREADS} threads of Describe and Subscribe, Subscribe past the bound, EnsureParkingQueue "
                  "for made-up names, undecodable bytes, a queue name with a new line")
        gid, _seg = ctx.head()
        urls, members = c.metrics_urls(), (f"{gid}/master", f"{gid}/slave")

        zk_port, zk_tls = c.zk.specs[0].client_port, c.credentials if c.credentials.zk_tls else None

        def read_path() -> tuple[list[path.BrokerReading | None], path.ZkReading | None, float]:
            return [path.read_broker(urls.get(m)) for m in members], path.read_zk(zk_port, zk_tls), time.monotonic()

        def behind() -> int:
            return path.lag(ctx.producers[0].status(), ctx.consumers[0].status()) if ctx.consumers else -1

        cpu = CpuUse({stage.leader: stage.pid, "zookeeper": c.zk.processes[0].pid,
                       f"{gid}/master": pids.get(f"{gid}/master"), f"{gid}/slave": pids.get(f"{gid}/slave"),
                       "producer": ctx.producers[0].proc.pid,
                       "attacker": attacker.pid, "drill": os.getpid()})
        arm_s, waited_s = _armed(attacker)
        stream_s = stream_left_s(ctx.producers[0].status(), ctx.load.rate)
        short = PLAN.shortfall(stream_s)
        ctx.event(f"set up in {time.monotonic() - began:.1f} s (planned: at most {SETUP_S:g} s); the stream has "
                  f"{stream_s:.1f} s left, the windows need at most {PLAN.needed_s:g} s with the margin")
        if short is not None:
            ctx.expect(f"{short}: no window started", False)
            return

        def in_flight() -> float | None:
            return _in_flight(stage.metrics_url)

        def weigh(shares: int) -> None:
            if iso is not None:
                cpu_isolation.set_shares(iso.groups["capped"], shares)

        # Each round: a gap, the quiet window, a gap, the attack window. The two windows last
        # WINDOW_S each and the drill does the same in both (stop n's idle control failed the
        # per-window rule with nothing sent: its attack windows were longer than the quiet ones,
        # and only they began with the path's scrapes and the attacker's handshakes): at ATTACK_S
        # the attacker's cgroup weight written (in an attack window, the cluster's for its drain,
        # then the attacker's stop), then the leader's calls in flight read to the window's end.
        # An attack window goes on past WINDOW_S only until the leader settled (SETTLE_S at most).
        # Whatever else the drill does (the arming waited for, the cgroups set, the path read) is
        # in the gaps, LEAD_S before the next window: in none.
        at_end = read_path()
        for i in range(ROUNDS):
            variant = variants[i % len(variants)]
            if i:
                arm_s, waited_s = _armed(attacker)
            armed = f"armed in {arm_s:.2f} s, waited for {waited_s:.2f} s before the quiet window"
            weight = variant.shares or (cpu_isolation.ATTACKER_SHARES if variant.placed else cpu_isolation.MAX_SHARES)
            weigh(weight)
            # Where its threads may run in this window (those it starts in it inherit it).
            if not cpu_isolation.set_cpus(attacker.pid, placed if variant.placed else every):
                raise RuntimeError("the attacker's process is gone")
            if iso is not None:  # the leader's place in this round, both its windows
                place_leader(iso, stage.pid, variant.leader_apart)
            lag_q0, at_q0 = behind(), at_end
            time.sleep(LEAD_S)
            q0, start = now_us(), time.monotonic()
            apart = variant.leader_apart and iso is not None
            with cpu.measure("quiet apart" if apart and several else "quiet"):
                time.sleep(ATTACK_S)
                weigh(weight)
                reads, _ = tail_reads(in_flight, start + WINDOW_S)
            q1 = now_us()
            quiet_level = max(reads[-QUIET_READS:], default=0.0)
            at_a0 = read_path()
            time.sleep(LEAD_S)
            a0, start = now_us(), time.monotonic()
            with cpu.measure(f"attacked {variant.name}" if several else "attacked"):
                ends_at = start + ATTACK_S  # the attacker's calls' deadline, on this clock
                attacker.go(ends_at)
                time.sleep(max(0.0, ends_at - time.monotonic()))
                # Its drain at the cluster's weight, still under its quota and on its CPU(s): a
                # host of its own stops on its own CPU. At ATTACKER_SHARES it got ~0.05 core in
                # the placed windows (stop l), and each of its ~75 threads waited its turn for
                # the GIL and a CPU: drains of 7-16 s for calls its deadline had already ended.
                # Its teardown's CPU is judged with the window's.
                weigh(cpu_isolation.MAX_SHARES)
                t0 = time.monotonic()
                for k, n in attacker.pause().items():
                    outcomes[k] = outcomes.get(k, 0) + n
                drains.append(time.monotonic() - t0)
                told.append(f"{armed}; {window_times(attacker.times)}")
                _, took = tail_reads(in_flight, start + WINDOW_S, settle_to=quiet_level, bound_s=SETTLE_S)
                settles.append(f"{took:.1f} s" if took is not None else f"not in {SETTLE_S:g} s (> {quiet_level:g})")
            a1 = now_us()
            windows.append((q0, q1, a0, a1))
            variant_of.append(variant.name)
            at_end = read_path()
            if i + 1 < ROUNDS:  # the next window's threads, started in the gap, waited for before its quiet window
                attacker.arm(variants[(i + 1) % len(variants)].kinds)
            ctx.event(f"window (quiet from, to, attack from, to; µs): {windows[-1]}"
                      + (f" {variant.name}" if several else "")
                      + f", {(q1 - q0) / 1e6:.2f} s and {(a1 - a0) / 1e6:.2f} s"
                      + f"; the attacker drained in {drains[-1]:.2f} s: {told[-1]}")
            ctx.event("the drill queue's path in it (read, not judged): the consumer "
                      f"{lag_q0} messages behind at its start; "
                      + "; ".join(f"{m} quiet {path.between(x, y)}, attacked {path.between(y, z)}"
                                  for m, x, y, z in zip(members, at_q0[0], at_a0[0], at_end[0], strict=True))
                      + f"; zookeeper quiet {path.zk_between(at_q0[1], at_a0[1], at_a0[2] - at_q0[2])}, attacked "
                      + path.zk_between(at_a0[1], at_end[1], at_end[2] - at_a0[2])
                      + ("; the leader apart" if apart else ""))
        ctx.event(f"CPU cores used, {cpu}")
        ctx.event(f"CPU waited for (runnable, not running; ms per s, summed over threads), {cpu.waits()}")
        ctx.event(f"context switches per s (summed over threads), {cpu.switches()}")
        ctx.event(f"page faults per s (minor and major), {cpu.faults()}")
        ctx.event(cpu.per_call(stage.leader, sum(outcomes.values())))
        ctx.event(f"the leader's calls in flight back to their quiet level (the most of the last {QUIET_READS} reads "
                  f"of the quiet window before) after the attacker stopped, each window: {', '.join(settles)} "
                  f"(at most {SETTLE_S:g} s waited, judged as attacked)")
        ctx.expect(f"the attacker stopped within {PLAN.drain_s:g} s of each attack window's end (drains "
                   f"{', '.join(f'{d:.1f}' for d in drains)} s)", max(drains) <= PLAN.drain_s)
        ctx.expect("the drill queue's producer ran through every window (else: the load's messages are too few "
                   "for this machine's speed)", ctx.producers[0].proc.alive())
    finally:
        ctx.notes["neighbour_windows"] = windows
        ctx.notes["window_variants"] = variant_of
        ctx.notes["attacker_times"] = told
        disk.close()
        peak = rss.stop() if rss is not None else None
        if attacker is not None:
            attacker.close()
        probe.stop()
        if iso is not None:
            left = iso.close()
            ctx.event("cgroups removed, processes back in the root group" if not left
                      else f"cgroups NOT removed (swept by the next run): {left}")
    ctx.notes["commit_samples"] = probe.samples
    for name, picked in by_variant(windows, variant_of).items():
        quiet, attacked = split(probe.samples, windows, picked)
        ctx.event(f"the neighbour's Commit p99 quiet {p99(quiet):.1f} ms, {name} {p99(attacked):.1f} ms "
                  f"({len(quiet)} and {len(attacked)} commits; p50 {p50(quiet):.1f} and {p50(attacked):.1f} "
                  "ms; judged with the produce acks after the run)")
    ctx.event(f"attacks ended: {dict(sorted(outcomes.items()))}")
    counted_after = _counted(stage.metrics_url)
    counted = {k: v - counted_before.get(k, 0.0) for k, v in counted_after.items() if v > counted_before.get(k, 0.0)}
    ctx.notes["counted"] = counted
    ctx.notes["outcomes"] = outcomes
    ctx.event(f"the leader counted meanwhile: {counted}")
    turns = {k: v - turns_before.get(k, 0.0) for k, v in _counted(stage.metrics_url, TURNS).items()}
    ctx.notes["turns"] = turns
    ctx.event(f"the leader's fair turns meanwhile (coordinator/fair_share.py): {turns}")
    ctx.expect(f"every kind of attack was sent ({', '.join(kinds)}; {ATTACKS_ENV} unset)", kinds == ATTACKS)
    ctx.expect(f"the acceptance's windows: {DEFAULT_WINDOWS} in turn ({WINDOWS_ENV} unset)", not measured)
    for what, ok in judge_attacks(outcomes, counted, kinds):
        ctx.expect(what, ok)
    ctx.expect(f"the neighbour's commits never failed ({len(probe.failures)} failed: {probe.failures[:3]})",
               not probe.failures)
    if peak is not None:
        before, top, now = peak
        ctx.notes["rss_mib"] = (before / 2**20, top / 2**20, now / 2**20)
        ctx.expect(f"the leader's RSS stayed under {RSS_BUDGET_BYTES >> 20} MiB: {before / 2**20:.0f} MiB before, "
                   f"peak {top / 2**20:.0f} MiB, {now / 2**20:.0f} MiB after", top < RSS_BUDGET_BYTES)
    _check_unchanged(ctx, stage, log_from)


def _armed(attacker: AttackerProcess) -> tuple[float, float]:
    """Wait for the attacker's last ``arm``: (s it took there, s waited for here)."""
    t0 = time.monotonic()
    arm_s = attacker.armed()
    return arm_s, time.monotonic() - t0


def _check_unchanged(ctx: DrillContext, stage: _Stage, log_from: int) -> None:
    """The leader kept leading; no queue or subscription made or removed; its log clean."""
    with ctx.cluster.store() as store:
        still = _election_head(store.client, store.paths.coordinator_leader)
        ctx.expect(f"{stage.leader} kept leading (election node {stage.election} before, {still} after)",
                   still == stage.election and ctx.cluster.coordinator_leader() == stage.leader)
        queues = sorted(store.list_queues())
        subs = {q: sorted(store.list_subscriptions(q)) for q in stage.subs}
    new = sorted(set(subs[stage.attacked]) - set(stage.subs[stage.attacked]))
    ctx.expect(f"no queue created or removed ({len(stage.queues)} before, {len(queues)} after: "
               f"{sorted(set(queues) ^ set(stage.queues))})", queues == stage.queues)
    ctx.expect(f"no subscription created or removed ({', '.join(f'{q}: {len(s)}' for q, s in subs.items())}; "
               f"new: {new[:5]})", subs == stage.subs)
    with open(stage.log, "rb") as f:
        f.seek(log_from)
        lines = f.read().decode(errors="replace").splitlines()
    ctx.expect(f"the leader's log: no forged line, no traceback, no line over 4 KiB ({len(lines)} lines written, "
               f"longest {max((len(x) for x in lines), default=0)} characters)",
               not any(x.startswith(FORGED) for x in lines) and not any("Traceback" in x for x in lines)
               and all(len(x) < 4096 for x in lines))
