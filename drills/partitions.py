"""Partition drills (issue 28): the network between the hosts of a lab cut while acks flow, on a
whole cluster deployed host by host (``ordq.lab.cluster``, layout ``SPREAD``: ZooKeeper on hosts
of its own), each verified by ``spark_order_check`` like every drill.

A drill (``run_lab_drills``; ``ordq drill NAME`` and ``drill all``):

1. a fresh queue; a producer in the producer host and a consumer in the consumer host
   (``ordq.drills.workload``, started inside the hosts with the cluster's client credentials),
   each with a standby in the other client host;
2. once a quarter of the stream is acked, the fault: a partition of the nemesis (or, in the
   randomized run, a kill -9 or a SIGSTOP). It stays until it had the effect its kind must have
   (the head failed over, the standby producer or consumer took over) and ``HOLD_S`` more —
   whatever takes writes past its session would show — or ``HOLD_S`` when the kind need not
   cause anything (a flaky link); then heal (restart, resume);
3. the stream finishes, the cluster must be whole again (every group healthy with master and
   slave), and the verdict is the verifier's: 0 acked lost, 0 reordered, 0 duplicates handed
   over, 0 deliveries by two consumers at once.

``randomized`` (``ordq drill partitions --rounds N --seed S``) reuses one cluster, and one stream
for ``FAULTS_PER_STREAM`` faults, the kinds and kills and pauses drawn at random; it reports per
kind the time from each fault to the next acknowledged send (the first ack of a message sent
after the fault was in place).

Needs root, ``ip netns`` and iptables (``ordq.lab.lab.unavailable``): elsewhere each lab drill
is skipped with one line.
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO, TypeVar

import attrs

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.drills import audit
from ordq.drills.judge import DrillResult, findings
from ordq.drills.workload import now_us, read_status
from ordq.lab import Lab, Partition, bridge, cut_pair, flaky, isolate, one_way, split
from ordq.lab.cluster import ROOT, SPREAD, LabCluster
from ordq.lab.lab import unavailable

SUBSCRIPTION = "drill"
HOLD_S = 2.0  # a cut stays this long after its effect
EFFECT_TIMEOUT_S = 60.0
FLAKY_DROP = 0.3  # the flaky link drops each packet with this probability
SESSION_TIMEOUT_S = 2.0  # the clients' ZooKeeper sessions (the cluster's own: ordq.lab.cluster)
FAULTS_PER_STREAM = 20  # the randomized run: faults on one stream before the next one


class LabDrillError(OrdqError):
    """A lab drill could not go on (a wait ran out)."""


SETUP_BUDGET_S = 240.0  # a set-up's attempts together, on a quiet machine (load_stretched beyond)
T = TypeVar("T")


def within_budget(attempt: Callable[[int], T], *, budget_s: float, what: str,
                  clock: Callable[[], float] = time.monotonic,
                  on_retry: Callable[[int, OrdqError], None] | None = None) -> T:
    """``attempt(n)`` for n = 1, 2, ... until one returns, while ``budget_s`` lasts: a set-up
    that failed on a busy machine (a wait that ran out, a process slow to lead) is made again
    from scratch rather than the drill failed (issue 42: 2 of 3 runs failed in their set-up at
    load 25). Each failed attempt must leave nothing running. LabDrillError naming the
    attempts and the last error once an attempt fails with the budget spent."""
    deadline = clock() + budget_s
    n = 0
    while True:
        n += 1
        try:
            return attempt(n)
        except OrdqError as exc:
            if clock() >= deadline:
                raise LabDrillError(f"{what}: {n} attempt{'s' if n > 1 else ''} in {budget_s:.0f}s failed; "
                                    f"the last: {type(exc).__name__}: {exc}") from exc
            if on_retry is not None:
                on_retry(n, exc)


def _say_retry(out: TextIO | None, what: str) -> Callable[[int, OrdqError], None]:
    def say(n: int, exc: OrdqError) -> None:
        if out is not None:
            out.write(f"    {what}: attempt {n} failed ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                      "again\n")
            out.flush()
    return say


def wait(condition: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    interval = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise LabDrillError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.2)


# -- the workload in the lab's client hosts ----------------------------------------------------


@attrs.define(eq=False)
class Stream:
    """One queue's stream: producers and consumers (``ordq.drills.workload``) in the cluster's
    client hosts, their status and audit files under ``folder``. A producer or consumer that
    stops (a leader deposed by a partition, a killed one) is replaced by ``replenish`` so that
    each role keeps a leader and a standby."""

    cluster: LabCluster
    queue: str
    folder: Path
    total: int
    rate: float
    procs: dict[str, ManagedProcess] = attrs.field(factory=dict)  # p1, c1, p2, ...
    hosts: dict[str, str] = attrs.field(factory=dict)

    @property
    def audit_dir(self) -> Path:
        return self.folder / "audit"

    def status(self, who: str) -> dict[str, Any]:
        return read_status(self.folder / f"{who}.status.json")

    def names(self, role: str) -> list[str]:
        return [w for w in self.procs if w[0] == role[0]]

    def writer(self, who: str) -> str:
        return f"{who}-{self.queue}"

    def start(self) -> None:
        """Create the queue, start a consumer and a producer and their standbys (once the
        leaders lead), then let the stream go."""
        producer_host, consumer_host = self.cluster.layout.clients
        self.folder.mkdir(parents=True)
        self.cluster.call(producer_host, ["queue", "create", self.queue])
        self.spawn("c", consumer_host)
        first = self.spawn("p", producer_host)
        wait(lambda: self.status(first).get("state") == "leading", timeout_s=load_stretched(60),
             what=f"{first} to lead")
        self.spawn("c", producer_host)
        self.spawn("p", consumer_host)
        (self.folder / "go").touch()

    def spawn(self, role: str, host: str) -> str:
        who = f"{role}{len(self.names(role)) + 1}"
        verb = "produce" if role == "p" else "consume"
        argv = [sys.executable, "-m", "ordq.drills.workload", verb, "--zk", self.cluster.zk_hosts,
                "--root", ROOT, "--queue", self.queue, "--total", str(self.total),
                "--status", str(self.folder / f"{who}.status.json"), "--writer", self.writer(who),
                "--audit-dir", str(self.audit_dir), "--session-timeout", str(SESSION_TIMEOUT_S)]
        argv += (["--rate", str(self.rate), "--send-timeout", "1.0", "--go-file", str(self.folder / "go"),
                  "--stop-file", str(self.folder / "stop")] if role == "p" else ["--subscription", SUBSCRIPTION])
        proc = self.cluster.lab.run(host, argv, name=f"{self.queue}-{who}", env=self.cluster.client_env())
        self.procs[who], self.hosts[who] = proc, host
        proc.wait_for_line("STARTED", timeout_s=60)
        return who

    def leader(self, role: str) -> str | None:
        return next((w for w in self.names(role) if self.procs[w].alive()
                     and self.status(w).get("state") == "leading"), None)

    def replenish(self) -> list[str]:
        """Start a standby in each role left with fewer than two live processes (in the client
        host its live one is not in). Returns the ones started."""
        started: list[str] = []
        if (self.folder / "stop").exists():
            return started
        for role in ("p", "c"):
            if any(self.status(w).get("state") == "done" for w in self.names(role)):
                continue  # that role finished the stream
            live = [w for w in self.names(role) if self.procs[w].alive()]
            if len(live) < 2:
                taken = {self.hosts[w] for w in live}
                host = next(h for h in self.cluster.layout.clients if h not in taken)
                started.append(self.spawn(role, host))
        return started

    def acked(self) -> int:
        return sum(int(self.status(w).get("acked", 0)) for w in self.names("p"))

    def wait_acked(self, n: int, *, timeout_s: float) -> None:
        wait(lambda: self.acked() >= n, timeout_s=timeout_s, what=f"{n} messages of {self.queue} acked")

    def stop_all(self) -> None:
        """Stop every process of the stream (a failed set-up or drill: nothing left writing)."""
        for proc in self.procs.values():
            with contextlib.suppress(OrdqError):
                proc.stop(timeout_s=5.0)

    def wait_leaders(self, timeout_s: float = 60.0) -> None:
        wait(lambda: self.leader("p") and self.leader("c"), timeout_s=timeout_s,
             what=f"a leading producer and consumer of {self.queue}")

    def later_segment_acked(self, seg: int) -> bool:
        return any(int(s) > seg for w in self.names("p") for s in self.status(w).get("seg_first_ack_us", {}))

    def finish(self, *, stop: bool, timeout_s: float = 180.0) -> None:
        """End the stream (``stop``: now, by the stop file; else at ``total``), wait until the
        consumers delivered every acked message, then stop every process (standbys too)."""
        if stop:
            (self.folder / "stop").touch()
        try:
            wait(lambda: not any(self.procs[w].alive() and self.status(w).get("state") == "leading"
                                 for w in self.names("p")) and any(self.status(w).get("state") == "done"
                                                                  for w in self.names("p")),
                 timeout_s=timeout_s, what="the producers to finish the stream")
            top = max((a.seq for a in audit.read_acks(self.audit_dir)), default=-1)
            wait(lambda: any(int(self.status(w).get("last_seq", -1)) >= top for w in self.names("c")),
                 timeout_s=timeout_s, what=f"the consumers to deliver up to seq {top}")
        finally:
            with ThreadPoolExecutor(len(self.procs)) as pool:
                list(pool.map(lambda p: p.stop(timeout_s=5.0), self.procs.values()))


# -- the faults --------------------------------------------------------------------------------


@attrs.frozen
class Scene:
    """Who is where when a fault goes in."""

    hosts: tuple[str, ...]
    zk: tuple[str, ...]
    head: str
    seg: int
    master: str
    slave: str
    producer: str  # the leading producer's host
    consumer: str  # the leading consumer's host
    coordinator: str | None  # the elected coordinator's host (from its log)


@attrs.frozen
class Fault:
    """One kind of fault: a partition (``make``) or an action on a process (``act``: does it
    and returns how to undo it). ``effect``: what must have happened before it is healed —
    ``segment`` (the head failed over: an ack on a later segment), ``producer``/``consumer``
    (the standby took over), or None (nothing need happen)."""

    name: str
    fault: str
    must: str
    effect: str | None
    make: Callable[[Scene], Partition] | None = None
    act: Callable[[LabCluster, Stream, Scene], Callable[[], None]] | None = None


def _zk_minority(s: Scene) -> Partition:
    # The master and one ZooKeeper node on the minority side; the master still reaches its
    # slave and the clients: only ZooKeeper is lost (a master past its session takes no write).
    return split([s.master, s.zk[0]], list(s.zk[1:]))


def _kill_head_master(cluster: LabCluster, _stream: Stream, s: Scene) -> Callable[[], None]:
    cluster.brokers[(s.head, "master")].kill()

    def restart() -> None:
        cluster.restart_broker(s.head, "master")

    return restart


def _pause_head_master(cluster: LabCluster, _stream: Stream, s: Scene) -> Callable[[], None]:
    proc = cluster.brokers[(s.head, "master")]
    proc.pause()
    return proc.resume


def _kill_producer(_cluster: LabCluster, stream: Stream, _s: Scene) -> Callable[[], None]:
    who = stream.leader("p")
    if who is not None:
        stream.procs[who].kill()
    return lambda: None


PARTITIONS: dict[str, Fault] = {f.name: f for f in (
    Fault("part-isolate-head-master", "the head master's host cut from every other host",
          "the producer fails over; the segment is sealed from the slave; nothing lost", "segment",
          make=lambda s: isolate(s.master, s.hosts)),
    Fault("part-zk-minority-head-master", "ZooKeeper split 1|2: the head master with the minority node, still "
          "reaching its slave and the clients", "the master takes no write past its session: the head fails over",
          "segment", make=_zk_minority),
    Fault("part-master-slave", "only the head master <-> its slave cut", "the master can no longer ack: fail over; "
          "seal", "segment", make=lambda s: cut_pair(s.master, s.slave)),
    Fault("part-producer-zk", "the producer leader's host cut from the control plane only (ZooKeeper and the "
          "coordinators; it still reaches the brokers)",
          "its producer lease runs out: the standby is granted it, claims a higher epoch and fences it; nothing lost, "
          "no two writers",
          "producer", make=lambda s: split([s.producer], list(s.zk))),
    Fault("part-consumer-zk", "the consumer leader's host cut from the control plane only (ZooKeeper and the "
          "coordinators; it still reaches the brokers)",
          "its consumer lease ends by its own clock: it stops delivering; the standby is granted it and resumes "
          "from the cursor; never two consumers at once", "consumer", make=lambda s: split([s.consumer], list(s.zk))),
    Fault("part-one-way", "one way only: packets from the head's slave to its master dropped (the other way "
          "flows)", "a one-way loss breaks the replication stream: fail over", "segment",
          make=lambda s: one_way(s.slave, s.master)),
    Fault("part-bridge", "a bridge: {head master, ZooKeeper 1} and {its slave, ZooKeeper 2} cut from each other, "
          "both reaching ZooKeeper 3 (and the clients)", "fail over; ZooKeeper keeps a quorum through the bridge",
          "segment", make=lambda s: bridge([s.master, s.zk[0]], [s.slave, s.zk[1]], s.zk[2])),
    Fault("part-flaky", f"a flaky link: {FLAKY_DROP:.0%} of the packets between the head master and its slave "
          "dropped at random", "slower, never wrong", None, make=lambda s: flaky(s.master, s.slave, FLAKY_DROP)),
    Fault("part-isolate-coordinator", "the elected coordinator's host cut from every other host",
          "its clients move to the standby coordinator once it leads; ZooKeeper keeps its quorum", None,
          make=lambda s: isolate(s.coordinator or s.hosts[3], s.hosts)),
)}

# Mixed in by the randomized run (the "kills and pauses").
PROCESS_FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("kill-head-master", "kill -9 the head master", "fail over", "segment", act=_kill_head_master),
    Fault("pause-head-master", "SIGSTOP the head master", "fail over", "segment", act=_pause_head_master),
    Fault("kill-producer", "kill -9 the producer leader", "the standby takes over", "producer", act=_kill_producer),
)}


@attrs.frozen
class Outcome:
    """One fault's times (seconds from the moment it went in) and what it did."""

    kind: str
    queue: str
    head: str
    seg: int
    cut_us: int
    in_place_s: float  # until its rules were in every host (or the signal sent)
    effect_s: float | None  # until its effect was seen (None: none expected, or not seen)
    error: str | None = None


def scene(cluster: LabCluster, stream: Stream) -> Scene:
    who = wait(lambda: stream.leader("p"), timeout_s=60, what="a leading producer")
    st = wait(lambda: (s := stream.status(who)).get("head") and s, timeout_s=30, what="the producer's head")
    consumer = wait(lambda: stream.leader("c"), timeout_s=60, what="a leading consumer")
    head = str(st["head"])
    return Scene(hosts=cluster.lab.hosts, zk=cluster.layout.zk_hosts, head=head, seg=int(st["seg"]),
                 master=cluster.host_of(head, "master"), slave=cluster.host_of(head, "slave"),
                 producer=stream.hosts[who], consumer=stream.hosts[consumer],
                 coordinator=cluster.elected_coordinator())


def inject(cluster: LabCluster, stream: Stream, fault: Fault, *, hold_s: float = HOLD_S,
           out: TextIO | None = None) -> Outcome:
    """Put ``fault`` in, wait for its effect, hold, heal; the cluster is whole again after."""
    s = scene(cluster, stream)
    leaders = {r: stream.leader(r) for r in ("p", "c")}
    # what each producer acked and each consumer delivered so far: a takeover is a rise by
    # another than the leader at the fault (earlier ones may have acked before)
    counted = {w: int(stream.status(w).get("acked" if w[0] == "p" else "delivered", 0)) for w in stream.procs}
    undo: Callable[[], None] = cluster.lab.nemesis.heal
    cut_us = now_us()
    if fault.make is not None:
        cluster.lab.nemesis.replace(fault.make(s))
    elif fault.act is not None:
        undo = fault.act(cluster, stream, s)
    in_place_s = (now_us() - cut_us) / 1e6
    error = None
    effect_s = None
    try:
        if fault.effect is not None:
            def seen() -> bool:
                if fault.effect == "segment":
                    return stream.later_segment_acked(s.seg)
                role = str(fault.effect)[0]
                key = "acked" if role == "p" else "delivered"
                return any(int(stream.status(w).get(key, 0)) > counted.get(w, 0)
                           for w in stream.names(role) if w != leaders[role])

            wait(seen, timeout_s=EFFECT_TIMEOUT_S, what=f"the effect of {fault.name} ({fault.effect})")
            effect_s = (now_us() - cut_us) / 1e6
        time.sleep(hold_s)  # the fault stays: whatever takes writes past its session would show
    except LabDrillError as exc:
        error = str(exc)
    finally:
        undo()
    if out is not None:
        out.write(f"    {fault.name}: head {s.head} (master {s.master}, slave {s.slave}) segment {s.seg}; "
                  f"in place {in_place_s:.2f}s; effect {'-' if effect_s is None else f'{effect_s:.2f}s'}"
                  + (f"; {error}" if error else "") + "\n")
        out.flush()
    wait(cluster.whole, timeout_s=90, what="the cluster whole after the heal")
    return Outcome(kind=fault.name, queue=stream.queue, head=s.head, seg=s.seg, cut_us=cut_us, in_place_s=in_place_s,
                   effect_s=effect_s, error=error)


def next_ack_s(acks: Sequence[audit.AckRow], outcome: Outcome) -> float | None:
    """From the fault to the first ack of a message sent after it was in place."""
    after = outcome.cut_us + int(outcome.in_place_s * 1e6)
    times = [a.ack_us for a in acks if a.send_us >= after]
    return (min(times) - outcome.cut_us) / 1e6 if times else None


def set_up_stream(cluster: LabCluster, *, name: str, total: int, rate: float, acked: int, tried: list[Stream],
                  out: TextIO | None = None) -> Stream:
    """A stream on a new queue ``NAME-<random>``, leading and ``acked`` messages acked, on a
    whole cluster; made again on a new queue (the failed one's processes stopped) while the
    set-up budget lasts. ``tried``: every stream attempted, the last one first to report."""

    def attempt(_n: int) -> Stream:
        queue = f"{name}-{secrets.token_hex(3)}"
        stream = Stream(cluster, queue, cluster.folder / "drills" / queue, total, rate)
        tried.append(stream)
        try:
            wait(cluster.whole, timeout_s=load_stretched(90), what="the cluster whole before the drill")
            stream.start()
            stream.wait_acked(acked, timeout_s=load_stretched(120))
        except OrdqError:
            stream.stop_all()
            raise
        return stream

    return within_budget(attempt, budget_s=load_stretched(SETUP_BUDGET_S), what=f"the set-up of stream {name}",
                         on_retry=_say_retry(out, f"the set-up of stream {name}"))


# -- the cluster --------------------------------------------------------------------------------


@contextlib.contextmanager
def lab_cluster(folder: Path, out: TextIO | None = None) -> Any:
    """A lab and a ``SPREAD`` cluster in it, removed after (everything: processes, namespaces)."""
    started = time.monotonic()

    def attempt(n: int) -> tuple[contextlib.ExitStack, Lab, LabCluster]:
        stack = contextlib.ExitStack()  # a failed start removes its lab (processes, namespaces)
        try:
            lab = stack.enter_context(Lab.create(folder if n == 1 else folder / f"retry-{n}", hosts=SPREAD.hosts))
            return stack, lab, LabCluster.start(lab, layout=SPREAD)
        except BaseException:
            stack.close()
            raise

    what = "the lab cluster's start"
    stack, lab, cluster = within_budget(attempt, budget_s=load_stretched(SETUP_BUDGET_S), what=what,
                                        on_retry=_say_retry(out, what))
    with stack:
        if out is not None:
            out.write(f"lab {lab.id} ({len(lab.hosts)} hosts on {lab.subnet}) and its cluster up in "
                      f"{time.monotonic() - started:.1f}s\n")
            out.flush()
        try:
            yield cluster
        finally:
            cluster.stop()


# -- one drill per kind -------------------------------------------------------------------------


def run_lab_drills(folder: Path, names: Sequence[str], *, verify: Callable[..., Any], rounds: int = 1,
                   messages: int = 6000, rate: float = 1000.0, seed: int = 0, keep: bool = False,
                   out: TextIO | None = None, spark_cluster: bool = False) -> list[DrillResult]:
    """Each partition drill ``rounds`` times on one lab cluster in ``folder``, then one
    verification: by ``verify``, or with ``spark_cluster`` on a Spark standalone cluster
    started in the same lab (``drills/spark_lab.py``; it starts after the drills, so its JVMs
    do not load the hosts under test). Where no lab can be made, each is a one-line SKIP."""
    why = unavailable()
    if why is not None:
        return [DrillResult(name=n, round=1, seed=seed, queue="", ok=True, skipped=True,
                            verdict=f"SKIP (the lab needs root, ip netns and iptables: {why})") for n in names]
    runs: list[tuple[Fault, int, Stream, Outcome | None, str | None, float]] = []
    with lab_cluster(folder, out) as cluster:
        for r in range(1, rounds + 1):
            for name in names:
                fault = PARTITIONS[name]
                if out is not None:
                    out.write(f"== drill {name} round {r}/{rounds}: {fault.fault}\n")
                    out.flush()
                started = time.monotonic()
                tried: list[Stream] = []
                outcome, error = None, None
                try:
                    stream = set_up_stream(cluster, name=f"{name}-r{r}", total=messages, rate=rate,
                                           acked=messages // 4, tried=tried, out=out)
                    outcome = inject(cluster, stream, fault, out=out)
                    stream.replenish()
                    stream.finish(stop=False)
                except OrdqError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    stream = tried[-1]
                    with contextlib.suppress(OrdqError):
                        cluster.lab.nemesis.heal()
                    stream.stop_all()
                runs.append((fault, r, stream, outcome, error, time.monotonic() - started))
        ready = [s.audit_dir for _f, _r, s, o, e, _t in runs if e is None and o is not None]
        report = None
        if ready and spark_cluster:
            from ordq.drills.spark_lab import LabSparkVerifier

            with LabSparkVerifier.start(cluster, out=out) as on_cluster:
                report = on_cluster(ready, report_path=folder / "report.json")
        elif ready:
            report = verify(ready, report_path=folder / "report.json")
        results = [_result(f, r, s, o, e, t, report, seed) for f, r, s, o, e, t in runs]
        if not keep:
            for (_f, _r, stream, _o, _e, _t), res in zip(runs, results, strict=True):
                if res.ok:
                    with contextlib.suppress(OrdqError):
                        cluster.call(cluster.layout.producer_host, ["queue", "delete", stream.queue])
    return results


def _result(fault: Fault, round_: int, stream: Stream, outcome: Outcome | None, error: str | None,
            seconds: float, report: Any, seed: int) -> DrillResult:
    acks = audit.read_acks(stream.audit_dir)
    deliveries = audit.read_deliveries(stream.audit_dir)
    acked, delivered = {a.seq for a in acks}, {d.seq for d in deliveries}
    counts, violations = findings(report, stream.queue) if report is not None else ({}, {})
    expectations: list[tuple[str, bool]] = []
    if outcome is not None:
        expectations += [
            (f"the fault had its effect ({fault.effect}) while in place", fault.effect is None
             or outcome.effect_s is not None),
            (f"the stream completed: last acked seq {max(acked, default=-1)} of {stream.total - 1}",
             max(acked, default=-1) == stream.total - 1),
            (f"every seq delivered ({len(delivered)} of {stream.total})", len(delivered) == stream.total),
        ]
    unmet = [w for w, ok in expectations if not ok]
    if error is not None or outcome is None:
        verdict = f"ERROR ({(error or 'no outcome').splitlines()[0]})"
    elif report is None:
        verdict = "ERROR (no audit files to verify)"
    elif violations:
        verdict = "FAIL (" + ", ".join(f"{k} {v}" for k, v in violations.items()) + ")"
    elif outcome.error or unmet:
        verdict = f"FAIL ({(outcome.error or unmet[0])[:80]})"
    else:
        verdict = "PASS"
    return DrillResult(
        name=fault.name, round=round_, seed=seed, queue=stream.queue, ok=verdict == "PASS", verdict=verdict,
        acked=len(acked), delivered=len(delivered), lost=counts.get("lost"), reordered=counts.get("out_of_order"),
        duplicates=counts.get("duplicate"), redelivered=counts.get("redelivered_after_takeover"),
        failover_s=next_ack_s(acks, outcome) if outcome is not None else None, seconds=seconds,
        expectations=tuple(expectations), run_dir=str(stream.folder), report=report)


# -- the randomized run ---------------------------------------------------------------------------


@attrs.frozen
class RandomizedRun:
    rounds: int
    seed: int
    outcomes: tuple[tuple[Outcome, float | None], ...]  # (outcome, next ack s)
    results: tuple[DrillResult, ...]  # one per stream
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not any(o.error for o, _t in self.outcomes)

    def per_kind(self) -> list[dict[str, Any]]:
        """Per kind: faults, effect errors, next-ack p50/p99 (seconds)."""
        rows = []
        for kind in sorted({o.kind for o, _t in self.outcomes}):
            times = sorted(t for o, t in self.outcomes if o.kind == kind and t is not None)
            rows.append({"kind": kind, "faults": sum(1 for o, _t in self.outcomes if o.kind == kind),
                         "no_effect": sum(1 for o, _t in self.outcomes if o.kind == kind and o.error),
                         "next_ack_p50_s": round(_pct(times, 0.5), 2) if times else None,
                         "next_ack_p99_s": round(_pct(times, 0.99), 2) if times else None,
                         "next_ack_max_s": round(times[-1], 2) if times else None})
        return rows


def _pct(values: Sequence[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if q < 1 else values[-1]


def randomized(folder: Path, *, rounds: int, seed: int, verify: Callable[..., Any], rate: float = 100.0,
               hold_s: tuple[float, float] = (0.3, 1.0), out: TextIO | None = None) -> RandomizedRun:
    """``rounds`` faults drawn at random (seeded) from the partition kinds, kills and pauses,
    on one lab cluster, ``FAULTS_PER_STREAM`` on each stream; then one verification of every
    stream."""
    rng = random.Random(seed)
    kinds = [*PARTITIONS.values(), *PROCESS_FAULTS.values()]
    started = time.monotonic()
    streams: list[tuple[Stream, str | None]] = []
    outcomes: list[Outcome] = []
    with lab_cluster(folder, out) as cluster:
        stream: Stream | None = None
        on_stream = 0
        for r in range(1, rounds + 1):
            if stream is None:
                stream = set_up_stream(cluster, name=f"partitions-{seed}-{len(streams) + 1}", total=10**9, rate=rate,
                                       acked=1, tried=[], out=out)
                on_stream = 0
            fault = rng.choice(kinds)
            if out is not None:
                out.write(f"== round {r}/{rounds} on {stream.queue}: {fault.name}\n")
                out.flush()
            try:
                outcomes.append(inject(cluster, stream, fault, hold_s=rng.uniform(*hold_s), out=out))
                with open(folder / "outcomes.jsonl", "a") as f:  # kept as it goes: a cut-short run still counts
                    f.write(json.dumps(attrs.asdict(outcomes[-1])) + "\n")
                stream.replenish()
                stream.wait_leaders()
                error = None
            except OrdqError as exc:
                error = f"round {r} ({fault.name}): {type(exc).__name__}: {exc}"
                if out is not None:
                    out.write(f"    ERROR {error}\n")
            on_stream += 1
            if error is not None or on_stream >= FAULTS_PER_STREAM or r == rounds:
                try:
                    stream.finish(stop=True)
                except OrdqError as exc:
                    error = error or f"finishing {stream.queue}: {type(exc).__name__}: {exc}"
                streams.append((stream, error))
                stream = None
                with contextlib.suppress(OrdqError):
                    cluster.lab.nemesis.heal()
        ready = [s.audit_dir for s, e in streams if e is None]
        report = verify(ready, report_path=folder / "report.json") if ready else None
    results = []
    acks_by_queue = {s.queue: audit.read_acks(s.audit_dir) for s, _e in streams}
    for i, (s, e) in enumerate(streams, 1):
        acks = acks_by_queue[s.queue]
        deliveries = audit.read_deliveries(s.audit_dir)
        acked, delivered = {a.seq for a in acks}, {d.seq for d in deliveries}
        counts, violations = findings(report, s.queue) if report is not None else ({}, {})
        gaps = len(acked - delivered)
        verdict = (f"ERROR ({e.splitlines()[0]})" if e else "ERROR (not verified)" if report is None
                   else "FAIL (" + ", ".join(f"{k} {v}" for k, v in violations.items()) + ")" if violations
                   else f"FAIL ({gaps} acked never delivered)" if gaps else "PASS")
        results.append(DrillResult(name="partitions", round=i, seed=seed, queue=s.queue, ok=verdict == "PASS",
                                   verdict=verdict, acked=len(acked), delivered=len(delivered),
                                   lost=counts.get("lost"), reordered=counts.get("out_of_order"),
                                   duplicates=counts.get("duplicate"),
                                   redelivered=counts.get("redelivered_after_takeover"), run_dir=str(s.folder),
                                   report=report))
    timed = [(o, next_ack_s(acks_by_queue[o.queue], o)) for o in outcomes]
    return RandomizedRun(rounds=rounds, seed=seed, outcomes=tuple(timed), results=tuple(results),
                         seconds=time.monotonic() - started)

