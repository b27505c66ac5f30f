"""The ``security-control-plane`` drill (issue 38; docs/SECURITY.md, "The coordinator service's
limits"): hand-made clients attack the leading coordinator under load, in windows interleaved
with quiet ones, while the drill queue is produced to and another caller commits on it.

The attacker holds real credentials: the cluster's client certificate with no token, and a
consume token for a queue of its own (the *attacked* queue, at its subscription bound). Its
attacks, all at once in each window, from a process of its own (its own "host": a CPU quota in a
cgroup, as the noisy-neighbour drill's abuser, ``ordq.drills.neighbour``):

- ``huge``: ``Pop`` requests naming a 200 MiB queue, with the certificate and no token (2 at once);
- ``flood``: 64 threads over 4 connections calling ``Describe`` and ``Subscribe`` with the token;
- ``bound``: ``Subscribe`` of new names past the queue's ``max_subscriptions_per_queue``;
- ``parking``: ``EnsureParkingQueue`` for made-up subscriptions;
- ``undecodable``: bytes that are no protobuf, raw, to ``Pop``, ``Commit``, ``Acquire``, ``Describe``;
- ``newline``: a queue name with a new line forging a log line, with the token and without.

It must hold (``check_control_plane`` and the expectations of ``control_plane``): every attack
refused (no call of a refused kind answered ``ok``; each kind's own refusal seen) and counted by
the leader (``ordq_coordinator_requests_total{rpc, outcome}`` grew by at least what the attacker
was refused); the leader's RSS stays under ``RSS_BUDGET_BYTES`` and it keeps leading (the same
election node before and after: its ZooKeeper session never lapsed); nothing created or changed
(queues, subscriptions); no forged line, no traceback and no name over 4 KiB in its log; and the
drill queue's produce ack p99 and the neighbour's Commit p99, each pooled over the attack windows,
within ``LATENCY_RATIO`` of the same pooled over the quiet windows between them.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import grpc

from ordq.common.metrics import scrape
from ordq.common.security import Credentials, channel
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.service_frame import RETRY_METADATA_KEY
from ordq.coordinator.service_leases import LOCK_NODE, coordinator_addresses, leader_address
from ordq.coordinator.tokens import create_token, revoke_token, touch
from ordq.drills import neighbour
from ordq.drills.runner import DrillContext
from ordq.drills.workload import now_us
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.errors import METADATA_KEY

ROUNDS = 4  # quiet and attack windows, interleaved (as the noisy-neighbour drill's)
QUIET_S = 3.0
ATTACK_S = 4.0
RECOVER_S = 1.0  # after each attack window, still judged as attacked
LATENCY_RATIO = 2.0  # the neighbour's produce and commit p99, attacked / quiet
MIN_ACKS = 1000  # produce acks in each kind of window (the noisy-neighbour drill's rule)
MIN_COMMITS = 300  # commits in each kind of window
PROBE_EVERY_S = 0.02  # the neighbour commits its cursor this often
RSS_BUDGET_BYTES = 256 << 20  # the leading coordinator's
HUGE_NAME_BYTES = 200 << 20  # the queue name of the huge Pop requests
HUGE_AT_ONCE = 2
FLOOD_THREADS = 64
FLOOD_CONNECTIONS = 4
FORGED = "FORGED-LINE"  # what the newline attack tries to start a log line with
ATTACKER_START_S = 60.0
# The attack kinds and the leader's outcome label each refusal is counted under (the client sees
# the ordq error kind in the ``ordq-error`` trailer; "exhausted" is a refused turn, with its hint).
ATTACKS = ("huge", "flood", "bound", "parking", "undecodable", "newline")
COUNTED_AS = {"denied": "PermissionDenied", "exhausted": "ResourceExhausted", "sub_not_found": "SubscriptionNotFound"}
UNDECODABLE_RPCS = ("Pop", "Commit", "Acquire", "Describe")


def control_plane_load(load: Any) -> Any:
    """The noisy-neighbour drill's load (2,000 msgs/s, long enough for the windows)."""
    return neighbour.neighbour_load(load)


def _outcome(exc: grpc.RpcError) -> str:
    """An attack call's outcome: the ordq error kind of its refusal (``exhausted+hint`` for a refused
    turn carrying its retry hint), else the bare gRPC status (not typed by ordq)."""
    trailers = dict(exc.trailing_metadata() or ()) if isinstance(exc, grpc.Call) else {}
    raw = trailers.get(METADATA_KEY)
    if raw:
        kind = str(json.loads(raw)["kind"])
        return kind + ("+hint" if RETRY_METADATA_KEY in trailers else "")
    return exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__


def _field(number: int, data: bytes) -> bytes:
    """``data`` as protobuf length-delimited field ``number``."""
    n, varint = len(data), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([(number << 3) | 2]) + bytes(varint) + data


class _Attacker:
    """One window of every attack, in threads, until ``stop``; outcomes counted per attack (an
    attack's sub-kind after a colon: ``newline:anonymous``, ``flood:Subscribe``)."""

    def __init__(self, address: str, creds: Credentials, token: str, queue: str, huge: bytes) -> None:
        self.address, self.queue, self.huge = address, queue, huge
        self.anonymous = attrs.evolve(creds, token=None)
        self.md = (("authorization", f"Bearer {token}"),)
        self.stop_event = threading.Event()
        self.outcomes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel] = []
        self._threads: list[threading.Thread] = []
        self._made_up = 0

    def _channel(self, options: Any = ()) -> grpc.Channel:
        ch = channel(self.address, self.anonymous, options)  # the token travels in each call's metadata
        self._channels.append(ch)
        return ch

    def _count(self, what: str, call: Callable[[], object]) -> None:
        try:
            call()
            outcome = "ok"
        except grpc.RpcError as exc:
            outcome = _outcome(exc)
        with self._lock:
            self.outcomes[f"{what} {outcome}"] = self.outcomes.get(f"{what} {outcome}", 0) + 1

    def _loop(self, what: str, call: Callable[[], object], every_s: float = 0.0) -> None:
        while not self.stop_event.is_set():
            self._count(what, call)
            if every_s:
                self.stop_event.wait(every_s)

    def _call(self, method: Callable[..., object], request: object) -> Callable[[], object]:
        """``method(request)`` with the token, as a loop's call."""
        return lambda: method(request, timeout=30, metadata=self.md)

    def _name(self, prefix: str) -> str:
        with self._lock:
            self._made_up += 1
            return f"{prefix}{self._made_up}"

    def start(self) -> None:
        loops: list[tuple[str, Callable[[], object], float]] = []
        # huge: the certificate, no token; gRPC's send limit raised so the client sends it at all
        big = self._channel(options=[("grpc.max_send_message_length", HUGE_NAME_BYTES + (1 << 20))])
        huge_pop = big.unary_unary("/ordq.v1.Coordinator/Pop")
        loops += [("huge", lambda: huge_pop(self.huge, timeout=30), 0.0)] * HUGE_AT_ONCE
        # flood: one token, 64 threads, 4 connections, Describe and Subscribe as fast as answered
        stubs = [pb_grpc.CoordinatorStub(self._channel()) for _ in range(FLOOD_CONNECTIONS)]  # type: ignore[no-untyped-call]
        for i in range(FLOOD_THREADS):
            stub = stubs[i % FLOOD_CONNECTIONS]
            if i % 2:
                describe = pb.DescribeRequest(queue=self.queue, with_config=True, with_live=True)
                loops.append(("flood:Describe", self._call(stub.Describe, describe), 0.0))
            else:
                subscribe = pb.SubscribeRequest(queue=self.queue, subscription=f"flood{i}")
                loops.append(("flood:Subscribe", self._call(stub.Subscribe, subscribe), 0.0))
        own = pb_grpc.CoordinatorStub(self._channel())  # type: ignore[no-untyped-call]
        loops.append(("bound", lambda: own.Subscribe(pb.SubscribeRequest(queue=self.queue,
                                                                         subscription=self._name("over")),
                                                     timeout=30, metadata=self.md), 0.05))
        loops.append(("parking", lambda: own.EnsureParkingQueue(
            pb.SubscriptionRef(queue=self.queue, subscription=self._name("made-up")), timeout=30, metadata=self.md),
            0.05))
        raw = self._channel()
        garbage = b"\xff\xff\xff\xff\x0f" + b"\x00" * 64
        for rpc in UNDECODABLE_RPCS:
            loops.append((f"undecodable:{rpc}", self._call(raw.unary_unary(f"/ordq.v1.Coordinator/{rpc}"), garbage),
                          0.1))
        forged = pb.QueueRef(queue=f"{self.queue}\n{FORGED} coordinator elected")
        loops.append(("newline:token", lambda: own.Pop(forged, timeout=30, metadata=self.md), 0.1))
        anonymous = pb_grpc.CoordinatorStub(self._channel())  # type: ignore[no-untyped-call]
        loops.append(("newline:anonymous", lambda: anonymous.Pop(forged, timeout=30), 0.1))
        for what, call, every_s in loops:
            t = threading.Thread(target=self._loop, args=(what, call, every_s), name=f"attack-{what}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> dict[str, int]:
        """End the window: each thread finishes its call in flight (no call is cancelled)."""
        self.stop_event.set()
        for t in self._threads:
            t.join(40)
        for ch in self._channels:
            with contextlib.suppress(Exception):
                ch.close()
        return dict(self.outcomes)


def _attacker_process(address: str, creds: Credentials, token: str, queue: str, conn: Any, idle: bool) -> None:
    """The attacker's own process (spawned): each ``go`` starts a window of every attack, the
    next ``stop`` ends it and sends back its outcomes; ``exit`` ends the process."""
    priority = neighbour.idle_priority() if idle else "normal priority"
    huge = _field(1, b"a" * HUGE_NAME_BYTES)  # a QueueRef (field 1: queue), made once, sent raw
    conn.send(("ready", priority))
    while conn.recv() == "go":
        attacker = _Attacker(address, creds, token, queue, huge)
        attacker.start()
        conn.recv()
        conn.send(attacker.stop())


class _AttackerProcess:
    """``_Attacker`` in a process of its own (``neighbour._AbuserProcess``'s pattern)."""

    def __init__(self, address: str, creds: Credentials, token: str, queue: str, *, idle: bool) -> None:
        mp = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
        self._conn, child = mp.Pipe()
        self._proc = mp.Process(target=_attacker_process, args=(address, creds, token, queue, child, idle),
                                name="ordq-attacker", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(ATTACKER_START_S):
            self.close()
            raise RuntimeError(f"the attacker's process did not start within {ATTACKER_START_S:g} s")
        _ready, self.priority = self._conn.recv()
        self.pid = self._proc.pid

    def attack(self) -> None:
        self._conn.send("go")

    def pause(self) -> dict[str, int]:
        self._conn.send("stop")
        if not self._conn.poll(90):
            raise RuntimeError("the attacker did not end its window within 90 s")
        outcomes: dict[str, int] = self._conn.recv()
        return outcomes

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send("exit")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
        self._conn.close()


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


class _CpuUse:
    """The CPU each process used (cores), per kind of window (``neighbour.cpu_seconds``)."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self.wall: dict[str, float] = {}
        self.used: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        t0, c0 = time.monotonic(), neighbour.cpu_seconds(self.pids)
        try:
            yield
        finally:
            c1 = neighbour.cpu_seconds(self.pids)
            self.wall[kind] = self.wall.get(kind, 0.0) + time.monotonic() - t0
            use = self.used.setdefault(kind, {})
            for k in c1:
                if k in c0:
                    use[k] = use.get(k, 0.0) + c1[k] - c0[k]

    def __str__(self) -> str:
        return "; ".join(f"{kind}: " + ", ".join(f"{k} {v / self.wall[kind]:.2f}" for k, v in use.items())
                         for kind, use in self.used.items())


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


def _counted(url: str) -> dict[str, float]:
    """The leader's ``ordq_coordinator_requests_total`` by outcome (summed over the rpcs)."""
    out: dict[str, float] = {}
    for s in scrape(url, timeout_s=10.0):
        if s.name == "ordq_coordinator_requests_total":
            outcome = s.labels.get("outcome", "")
            out[outcome] = out.get(outcome, 0.0) + s.value
    return out


def _server_label(attack: str, outcome: str) -> str | None:
    """The leader's outcome label an attack's refusal is counted under (None: not a refusal)."""
    kind = outcome.split("+")[0]
    if kind in COUNTED_AS:
        return COUNTED_AS[kind]
    if kind == "bad_request":
        return {"bound": "ConfigError", "flood": "ConfigError", "undecodable": "Undecodable",
                "newline": "InvalidName"}.get(attack)
    return None


# The refusal each attack must have got at least once (besides a refused turn, "exhausted+hint").
OWN_REFUSAL = {"huge": "denied", "flood:Describe": "exhausted+hint", "flood:Subscribe": "bad_request",
               "bound": "bad_request", "parking": "sub_not_found", "newline:token": "bad_request",
               "newline:anonymous": "denied", **{f"undecodable:{r}": "bad_request" for r in UNDECODABLE_RPCS}}


def judge_attacks(outcomes: dict[str, int], counted: dict[str, float]) -> list[tuple[str, bool]]:
    """Every attack refused (``flood:Describe`` may be served: a consume token may describe its
    queue; its excess is refused) with its own refusal seen, and counted by the leader."""
    out: list[tuple[str, bool]] = []
    per: dict[str, dict[str, int]] = {}
    for key, n in outcomes.items():
        what, _, outcome = key.partition(" ")
        per.setdefault(what, {})[outcome] = n
    for what, own in OWN_REFUSAL.items():
        seen = per.get(what, {})
        served = seen.get("ok", 0) if what != "flood:Describe" else 0
        untyped = {k: v for k, v in seen.items() if k not in (own, "exhausted+hint", "ok")}
        out.append((f"{what}: refused {own} {seen.get(own, 0)}x ({seen or 'never sent'})",
                    seen.get(own, 0) > 0 and not served and not untyped))
    expected: dict[str, int] = {}
    for what, seen in per.items():
        for outcome, n in seen.items():
            label = _server_label(what.split(":")[0], outcome)
            if label is not None:
                expected[label] = expected.get(label, 0) + n
    for label, n in sorted(expected.items()):
        out.append((f"the leader counted {label}: {counted.get(label, 0):.0f} >= the attacker's {n}",
                    counted.get(label, 0) >= n))
    return out


def control_plane(ctx: DrillContext) -> None:
    """The ``security-control-plane`` drill (see the module doc): ROUNDS of QUIET_S quiet then
    ATTACK_S of attacks (+ RECOVER_S, judged as attacked); the produce ack p99 is judged over
    the finished run (``check_control_plane``), the rest here."""
    c = ctx.cluster
    attacked = ctx.queue + "-attacked"
    probe_sub = "drill-neighbour"
    leader = ctx.wait(c.coordinator_leader, timeout_s=30, what="a coordinator leader")
    proc = next(p for p in c.coordinators if p.name == leader)
    pid, url = proc.pid, c.metrics_url(leader)
    assert pid is not None and url is not None
    with c.store() as store:
        paths = store.paths
        store.create_queue(attacked)
        address = leader_address(store.client, paths.coordinator_leader)
        bootstrap = coordinator_addresses(store.client, paths.coordinator_leader)
        election = _election_head(store.client, paths.coordinator_leader)
        # The attacked queue at its bound (the coordinator's max_subscriptions_per_queue, 1,000 by
        # default), made by ZooKeeper writes in transactions of 100: 999 creates sent at once held
        # ZooKeeper long enough for the brokers' 1 s sessions to expire (and the producer to fail over).
        from ordq.coordinator.service import MAX_SUBSCRIPTIONS_PER_QUEUE

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
        queues = sorted(store.list_queues())
        subs = {q: sorted(store.list_subscriptions(q)) for q in (attacked, ctx.queue)}
    ctx.event(f"leader {leader} at {address} (pid {pid}); {attacked} at its bound of "
              f"{MAX_SUBSCRIPTIONS_PER_QUEUE} subscriptions; the neighbour commits on {ctx.queue}/{probe_sub}")
    pids = {name: p.pid for name, p in c.processes()}
    pids |= {f"producer {i}": w.proc.pid for i, w in enumerate(ctx.producers)}
    pids |= {f"consumer {i}": w.proc.pid for i, w in enumerate(ctx.consumers)}
    iso, judgement = neighbour.isolate(pids)
    ctx.notes["neighbour_judgement"] = judgement
    ctx.event(f"judgement: {judgement}")
    log_from = proc.log_path.stat().st_size
    probe = _CommitProbe(bootstrap, attrs.evolve(c.credentials, token=neighbour_token), ctx.queue, probe_sub)
    attacker: _AttackerProcess | None = None
    windows: list[tuple[int, int, int]] = []
    outcomes: dict[str, int] = {}
    rss: _RssWatch | None = None
    try:
        probe.start()
        attacker = _AttackerProcess(address, c.credentials, token, attacked, idle=iso is None)
        if iso is not None:
            iso.add("capped", [attacker.pid])
        counted_before = _counted(url)
        rss = _RssWatch(pid)
        ctx.fault(f"an attacker with the client certificate and a consume token for {attacked} attacks the leading "
                  f"coordinator {leader} in {ROUNDS} windows of {ATTACK_S:g} s, each after {QUIET_S:g} s quiet, "
                  f"from a process of its own ({attacker.priority}): {HUGE_AT_ONCE} Pop requests at a time naming a "
                  f"{HUGE_NAME_BYTES >> 20} MiB queue without a token, {FLOOD_THREADS} threads of Describe and "
                  "Subscribe, Subscribe past the bound, EnsureParkingQueue for made-up names, undecodable bytes, "
                  "a queue name with a new line")
        gid, _seg = ctx.head()
        cpu_pids = {leader: pid, "zookeeper": c.zk.processes[0].pid, f"{gid}/master": pids.get(f"{gid}/master"),
                    "producer": ctx.producers[0].proc.pid, "attacker": attacker.pid, "drill": os.getpid()}
        cpu = _CpuUse(cpu_pids)
        for _ in range(ROUNDS):
            q0 = now_us()
            with cpu.measure("quiet"):
                time.sleep(QUIET_S)
            a0 = now_us()
            with cpu.measure("attacked"):
                attacker.attack()
                time.sleep(ATTACK_S)
                for k, n in attacker.pause().items():
                    outcomes[k] = outcomes.get(k, 0) + n
                time.sleep(RECOVER_S)
            windows.append((q0, a0, now_us()))
            ctx.event(f"window (quiet from, attack from, attack to; µs): {windows[-1]}")
        ctx.event(f"CPU cores used, {cpu}")
        ctx.expect("the drill queue's producer ran through every window", ctx.producers[0].proc.alive())
    finally:
        ctx.notes["neighbour_windows"] = windows
        peak = rss.stop() if rss is not None else None
        if attacker is not None:
            attacker.close()
        probe.stop()
        if iso is not None:
            left = iso.close()
            ctx.event("cgroups removed, processes back in the root group" if not left
                      else f"cgroups NOT removed (swept by the next run): {left}")
    ctx.notes["commit_samples"] = probe.samples
    ctx.event(f"attacks ended: {dict(sorted(outcomes.items()))}")
    counted_after = _counted(url)
    counted = {k: v - counted_before.get(k, 0.0) for k, v in counted_after.items() if v > counted_before.get(k, 0.0)}
    ctx.event(f"the leader counted meanwhile: {counted}")
    for what, ok in judge_attacks(outcomes, counted):
        ctx.expect(what, ok)
    ctx.expect(f"the neighbour's commits never failed ({len(probe.failures)} failed: {probe.failures[:3]})",
               not probe.failures)
    if peak is not None:
        before, top, now = peak
        ctx.notes["rss_mib"] = (before / 2**20, top / 2**20, now / 2**20)
        ctx.expect(f"the leader's RSS stayed under {RSS_BUDGET_BYTES >> 20} MiB: {before / 2**20:.0f} MiB before, "
                   f"peak {top / 2**20:.0f} MiB, {now / 2**20:.0f} MiB after", top < RSS_BUDGET_BYTES)
    with c.store() as store:
        still = _election_head(store.client, paths.coordinator_leader)
        ctx.expect(f"{leader} kept leading (election node {election} before, {still} after)",
                   still == election and c.coordinator_leader() == leader)
        now_queues = sorted(store.list_queues())
        now_subs = {q: sorted(store.list_subscriptions(q)) for q in (attacked, ctx.queue)}
        ctx.expect(f"no queue created or removed ({len(queues)} before, {len(now_queues)} after: "
                   f"{sorted(set(now_queues) ^ set(queues))})", now_queues == queues)
        ctx.expect(f"no subscription created or removed ({', '.join(f'{q}: {len(s)}' for q, s in now_subs.items())}; "
                   f"new: {sorted(set(now_subs[attacked]) - set(subs[attacked]))[:5]})", now_subs == subs)
    with open(proc.log_path, "rb") as f:
        f.seek(log_from)
        lines = f.read().decode(errors="replace").splitlines()
    ctx.expect(f"the leader's log: no forged line, no traceback, no line over 4 KiB ({len(lines)} lines written, "
               f"longest {max((len(x) for x in lines), default=0)} characters)",
               not any(x.startswith(FORGED) for x in lines) and not any("Traceback" in x for x in lines)
               and all(len(x) < 4096 for x in lines))
    with c.store() as store:
        store.delete_subscription(ctx.queue, probe_sub)
        for rec in (attacker_rec, neighbour_rec):
            revoke_token(store.client, store.paths.root, rec.tid)
        touch(store.client, store.paths.root)
        store.delete_queue(attacked)


def _p99(values: list[float]) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("nan")


def check_control_plane(ctx: DrillContext, acks: list[Any], _d: list[Any]) -> list[tuple[str, bool]]:
    """The drill queue's produce ack p99 and the neighbour's Commit p99, each pooled over the
    attack windows against the same pooled over the quiet windows between them (same run, same
    minutes: the noisy-neighbour drill's rule, ``neighbour.check_neighbour``); no fail-over."""
    windows = ctx.notes.get("neighbour_windows")
    if not windows or not acks:
        return [("the attacks ran", False)]
    judgement = ctx.notes.get("neighbour_judgement", "?").split(":")[0]
    out: list[tuple[str, bool]] = []
    series = {"produce ack": ([(a.send_us, (a.ack_us - a.send_us) / 1000.0) for a in acks], MIN_ACKS),
              "commit": (ctx.notes.get("commit_samples", []), MIN_COMMITS)}
    for what, (samples, least) in series.items():
        quiet = [ms for at, ms in samples if any(q0 <= at < a0 for q0, a0, _ in windows)]
        attacked = [ms for at, ms in samples if any(a0 <= at < a1 for _, a0, a1 in windows)]
        q, b = _p99(quiet), _p99(attacked)
        per = [(_p99([ms for at, ms in samples if q0 <= at < a0]), _p99([ms for at, ms in samples if a0 <= at < a1]))
               for q0, a0, a1 in windows]
        ctx.notes[f"{what} p99 ms"] = (q, b)
        ctx.event(f"{what} p99 quiet {q:.1f} ms, attacked {b:.1f} ms (per window quiet/attacked: "
                  + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in per) + ")")
        out.append((f"{what} p99 attacked/quiet {b:.1f}/{q:.1f} ms = {b / q:.2f}x, bound {LATENCY_RATIO:g}x "
                    f"({len(attacked)} in {len(windows)} attack windows, {len(quiet)} in the quiet ones between "
                    f"them; at least {least} each; judged {judgement})",
                    len(quiet) >= least and len(attacked) >= least and b <= LATENCY_RATIO * q))
    failovers = sum(int(w.status().get("failovers") or 0) for w in ctx.producers)
    out.append((f"the drill queue's producer never failed over ({failovers})", failovers == 0))
    return out
