"""The drill ``mirror`` (issue 40): a queue mirrored from one data centre to another in a lab,
each centre its own cluster with its own three-node ZooKeeper ensemble on hosts of its own
(centre 1: h1-h5, centre 2: h6-h10), the mirror's two instances in centre 2 with both clusters'
credentials, and faults in a random order (the seed's) while centre 1 takes a steady stream:

- ``link``: the link between the centres cut both ways (every host of one from every host of
  the other) for ``LINK_CUT_S``, then healed: the mirror waits (its WAITING line), the copy
  falls behind, then catches up;
- ``kill-head-dc1`` / ``kill-head-dc2``: the head master of the queue killed (-9) in a centre,
  restarted once the stream (centre 1) or the copy (centre 2) moved on;
- ``kill-mirror``: the mirror's leader killed (-9): the standby leads, a new standby starts;
- ``pause-mirror``: the leader paused (SIGSTOP) past its lease until the standby leads, then
  resumed: fenced on centre 2's brokers, it goes back to waiting as a standby;
- ``zk-majority-dc2``: two of centre 2's three ZooKeeper nodes stopped for ``ZK_LOSS_S`` (and
  until centre 1 took messages meanwhile), then started again: centre 2 can take no write
  without its quorum, so the mirror waits and centre 1's backlog grows; once the quorum is
  back the copy goes on.

The verdict is the copy check (``ordq verify --copy-of``'s ``check_copy``): every message
centre 1's producer got acked is in centre 2's queue once, in order (read back by a consumer
in centre 2 with its delivery audit), nothing foreign.

Needs root, ``ip netns`` and iptables (``ordq.lab.lab.unavailable``): elsewhere a one-line SKIP.
"""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.common.security import Credentials, register, register_coordinators
from ordq.drills.judge import DrillResult
from ordq.drills.partitions import SETUP_BUDGET_S, LabDrillError, _say_retry, wait, within_budget
from ordq.lab import Lab, split
from ordq.lab.cluster import ROOT, LabCluster, Layout, ordq_command
from ordq.lab.lab import unavailable

NAME = "mirror"
FAULT = ("the link between two data centres cut and healed, the queue's head master killed (-9) in each centre, "
         "the mirror's leader killed (-9) and paused (SIGSTOP) past its lease, two of centre 2's three ZooKeeper "
         "nodes stopped for a while, in a random order")
MUST = ("the mirror waits while the link is cut and catches up after; a standby mirror takes over from what "
        "centre 2 holds: centre 2's copy holds every message centre 1 acked, once, in order (ordq verify --copy-of)")
QUEUE = "orders"
DC1 = Layout(zk_hosts=("h1", "h2", "h3"), groups={"g1": ("h1", "h2"), "g2": ("h2", "h3")}, coordinators=("h1",),
             producer_host="h4", consumer_host="h5")
DC2 = Layout(zk_hosts=("h6", "h7", "h8"), groups={"g1": ("h6", "h7"), "g2": ("h7", "h8")}, coordinators=("h6",),
             producer_host="h9", consumer_host="h10")
HOSTS = 10
MIRROR_HOSTS = ("h9", "h10")  # the mirror runs in the target's centre
LINK_CUT_S = 20.0  # the default; ``ordq drill mirror --link-cut SECONDS`` for minutes
ZK_LOSS_S = 30.0
LEASE_TTL_S = 2.0
FAULTS = ("link", "kill-head-dc1", "kill-head-dc2", "kill-mirror", "pause-mirror", "zk-majority-dc2")
STATES = ("STARTED", "STANDBY", "LEADING", "WAITING")


class MirrorDrill:
    """One run: both centres, the stream, the mirror's instances, the faults."""

    def __init__(self, lab: Lab, dc1: LabCluster, dc2: LabCluster, folder: Path, *, messages: int, rate: float,
                 out: TextIO | None, link_cut_s: float = LINK_CUT_S) -> None:
        self.lab, self.dc1, self.dc2, self.folder = lab, dc1, dc2, folder
        self.link_cut_s = link_cut_s
        self.messages, self.rate, self.out = messages, rate, out
        self.mirrors: list[ManagedProcess] = []
        self.producers: list[ManagedProcess] = []
        self.stopping = False
        self.events: list[tuple[float, str]] = []
        self.expectations: list[tuple[str, bool]] = []
        self.started = time.monotonic()
        self.credentials = folder / "mirror-credentials.json"
        for c in (dc1, dc2):  # the mirror is a client of both centres
            client = c.folder / c.layout.consumer_host
            register(c.zk_hosts, ROOT, Credentials(ca_file=str(c.folder / "ca" / "ca.pem"),
                                                   cert_file=str(client / "client.pem"),
                                                   key_file=str(client / "client-key.pem"), zk_tls=True),
                     path=self.credentials)
            register_coordinators(c.zk_hosts, ROOT, [c.coordinator_address(h) for h in c.layout.coordinators],
                                  path=self.credentials)

    def say(self, text: str) -> None:
        self.events.append((round(time.monotonic() - self.started, 1), text))
        if self.out is not None:
            self.out.write(f"    {time.monotonic() - self.started:6.1f}s {text}\n")
            self.out.flush()

    def expect(self, what: str, ok: bool) -> None:
        self.expectations.append((what, ok))
        self.say(f"{'ok' if ok else 'NOT'}: {what}")

    # -- reading the centres --------------------------------------------------------------------

    def describe(self, c: LabCluster) -> dict[str, Any]:
        return dict(json.loads(c.call(c.layout.producer_host, ["queue", "describe", QUEUE, "--json"])))

    def last_seq(self, c: LabCluster) -> int:
        """The queue's last readable seq in centre ``c`` (-1 while none is known)."""
        with contextlib.suppress(OrdqError, ValueError):
            last = self.describe(c).get("last_seq")
            return -1 if last is None else int(last)
        return -1

    def head(self, c: LabCluster) -> str:
        return str(wait(lambda: self._head(c), timeout_s=load_stretched(60), what="the queue's head"))

    def _head(self, c: LabCluster) -> str | None:
        with contextlib.suppress(OrdqError, ValueError):
            return self.describe(c).get("head")
        return None

    def start_producer(self) -> None:
        """Centre 1's producer: a steady stream until every fault had its turn (at least
        ``messages``); SIGTERM then stops it at a clean point: what it sent is acked and in its
        audit. One that exited (no coordinator led centre 1 within its bound: seen at load 25,
        a coordinator's ZooKeeper session lost for 40 s) is started again, as a supervisor
        would, with payloads of its own (the copy check tells messages apart by their CRC)."""
        argv = ["produce", QUEUE, "--rate", f"{self.rate:g}", "--size", "120", "--audit-dir",
                str(self.folder / "dc1-run")]
        if not self.producers:
            proc = self.lab.run(self.dc1.layout.producer_host, self.dc1.client_argv(
                [*argv, "--count", str(self.messages * 100)]), name="h4-producer")
        else:
            first = len(self.producers) * 10**9  # lines of its own: "1000000000", ...
            proc = self.lab.run(self.dc1.layout.producer_host, [
                "bash", "-c", f"exec {shlex.join(self.dc1.client_argv(argv))} < <(seq {first} {first + 10**8})"],
                name=f"h4-producer-{len(self.producers) + 1}")
        self.producers.append(proc)

    def supervise_producer(self) -> None:
        if self.producers and not self.producers[-1].alive() and not self.stopping:
            self.say(f"centre 1's producer exited ({self.producers[-1].returncode}): started again")
            self.start_producer()

    def acked(self) -> int:
        """Messages centre 1's producer got acked (its audit's lines)."""
        from ordq.spark_order_check.copy_check import source_acks

        self.supervise_producer()
        if not (self.folder / "dc1-run" / "acks").exists():
            return 0
        return len(source_acks([str(self.folder / "dc1-run" / "acks")]))

    # -- the mirror's instances -----------------------------------------------------------------

    def spawn_mirror(self, host: str) -> ManagedProcess:
        name = f"m{len(self.mirrors) + 1}"
        source, target = (f"{c.zk_hosts}{ROOT}/{QUEUE}" for c in (self.dc1, self.dc2))
        argv = ["env", f"ORDQ_CREDENTIALS={self.credentials}", ordq_command(), "mirror", "run", "--from", source,
                "--to", target, "--instance", name, "--lease-ttl", str(LEASE_TTL_S), "--send-timeout", "1",
                "--retry-max", "1"]
        proc = self.lab.run(host, argv, name=f"{host}-mirror-{name}")
        self.mirrors.append(proc)
        self.say(f"mirror {name} started in {host}")
        return proc

    @staticmethod
    def state(proc: ManagedProcess) -> str | None:
        """The last state line of an instance (STANDBY, LEADING, WAITING ...)."""
        lines = [ln.split()[0] for ln in proc.log_tail(400).splitlines() if ln.split() and ln.split()[0] in STATES]
        return lines[-1] if lines else None

    def leader(self) -> ManagedProcess | None:
        return next((m for m in self.mirrors if m.alive() and self.state(m) == "LEADING"), None)

    def wait_leader(self, *, other_than: ManagedProcess | None = None) -> ManagedProcess:
        def found() -> ManagedProcess | None:
            m = self.leader() if other_than is None else next(
                (m for m in self.mirrors if m is not other_than and m.alive() and self.state(m) == "LEADING"), None)
            return m
        return wait(found, timeout_s=load_stretched(90), what="a mirror to lead")  # type: ignore[no-any-return]

    def copied_moves(self, what: str) -> None:
        before = self.last_seq(self.dc2)

        def moved() -> bool:
            self.supervise_producer()  # the copy moves only while centre 1 takes messages
            return self.last_seq(self.dc2) > before
        wait(moved, timeout_s=load_stretched(90), what=what)

    # -- the faults -----------------------------------------------------------------------------

    def link(self) -> None:
        one, two = (tuple(f"h{i}" for i in r) for r in (range(1, 6), range(6, HOSTS + 1)))
        before = self.last_seq(self.dc2)
        self.lab.nemesis.apply(split(one, two))
        self.say(f"link between the centres cut for {self.link_cut_s:g}s")
        cut_at = time.monotonic()
        # The leader either says WAITING (a call to centre 1 failed) or waits inside its
        # source consumer, which rides out an unreachable cluster by itself: both are waiting.
        waiting = wait(lambda: any(self.state(m) == "WAITING" for m in self.mirrors if m.alive())
                       or (time.monotonic() - cut_at > self.link_cut_s and "no WAITING"),
                       timeout_s=self.link_cut_s + 30,
                       what="the mirror to wait")
        self.say("the mirror says WAITING" if waiting is True else "the mirror waits in its source consumer")
        time.sleep(max(0.0, self.link_cut_s - (time.monotonic() - cut_at)))  # the cut lasts its time
        behind = self.last_seq(self.dc1) - self.last_seq(self.dc2)
        self.lab.nemesis.heal()
        self.say(f"link healed; centre 2 {behind} messages behind centre 1 (it held up to seq {before} at the cut)")
        self.copied_moves("the copy to go on after the heal")
        self.expect("the copy goes on after the heal", True)

    def kill_head(self, c: LabCluster, centre: str) -> None:
        gid = self.head(c)
        c.brokers[(gid, "master")].kill()
        self.say(f"{centre}: head master {gid} killed (-9)")
        if c is self.dc1:
            acked = self.acked()
            wait(lambda: self.acked() > acked + 50, timeout_s=load_stretched(90), what="acks after the kill")
        else:
            self.copied_moves("the copy to go on after the kill")
        self.expect(f"{centre}: the stream goes on after its head master's kill", True)
        c.restart_broker(gid, "master")
        self.say(f"{centre}: {gid}'s master restarted")

    def kill_mirror(self) -> None:
        leader = self.wait_leader()
        host = self.host_of(leader)
        leader.kill()
        self.say(f"mirror leader {leader.name} killed (-9)")
        self.wait_leader(other_than=leader)
        self.expect("a standby mirror leads after the leader's kill", True)
        self.copied_moves("the copy to go on after the takeover")
        self.spawn_mirror(host)

    def pause_mirror(self) -> None:
        leader = self.wait_leader()
        leader.pause()
        self.say(f"mirror leader {leader.name} paused (SIGSTOP)")
        try:
            self.wait_leader(other_than=leader)
            self.copied_moves("the copy to go on after the takeover")
        finally:
            leader.resume()
        self.say(f"mirror {leader.name} resumed")
        stood_down = wait(lambda: self.state(leader) in ("STANDBY", "WAITING") and leader,
                          timeout_s=load_stretched(60), what="the resumed mirror to stand down")
        self.expect("the paused leader, resumed, waits as a standby (fenced)", stood_down is leader)

    def zk_majority_dc2(self) -> None:
        """Two of centre 2's three ZooKeeper nodes stopped, then started again."""
        lost = self.dc2.layout.zk_hosts[1:]
        acked = self.acked()
        for host in lost:
            self.lab.call(host, [ordq_command(), "zk", "stop", "--dir", str(self.dc2.folder / host / "zk")])
        lost_at = time.monotonic()
        self.say(f"centre 2's ZooKeeper majority lost: nodes on {', '.join(lost)} stopped")
        try:
            wait(lambda: time.monotonic() - lost_at >= ZK_LOSS_S and self.acked() > acked + 50,
                 timeout_s=load_stretched(ZK_LOSS_S + 120),
                 what="centre 1 to take messages while centre 2 has no quorum")
        finally:
            for host in lost:
                self.lab.call(host, [ordq_command(), "zk", "start", "--config", str(self.dc2.folder / host / "zk.toml"),
                                     "--no-wait"], timeout_s=120)
        self.say(f"centre 2's ZooKeeper nodes started again after {time.monotonic() - lost_at:.0f}s "
                 f"(centre 1 took {self.acked() - acked} messages meanwhile)")
        self.copied_moves("the copy to go on once centre 2's quorum is back")
        self.expect("the copy goes on once centre 2's ZooKeeper quorum is back", True)

    def host_of(self, proc: ManagedProcess) -> str:
        return proc.name.split("-", 1)[0]

    # -- the run ----------------------------------------------------------------------------------

    def run(self, rng: random.Random) -> dict[str, Any]:
        for c in (self.dc1, self.dc2):
            c.call(c.layout.producer_host, ["queue", "create", QUEUE])
        for host in MIRROR_HOSTS:
            self.spawn_mirror(host)
        self.wait_leader()
        self.start_producer()
        self.say(f"producer in centre 1 at {self.rate:g}/s")
        faults = list(FAULTS)
        rng.shuffle(faults)
        acts: dict[str, Callable[[], None]] = {
            "link": self.link, "kill-head-dc1": lambda: self.kill_head(self.dc1, "centre 1"),
            "kill-head-dc2": lambda: self.kill_head(self.dc2, "centre 2"), "kill-mirror": self.kill_mirror,
            "pause-mirror": self.pause_mirror, "zk-majority-dc2": self.zk_majority_dc2}
        for fault in faults:
            self.copied_moves(f"the copy to move before {fault}")
            acts[fault]()
        wait(lambda: self.acked() >= self.messages, timeout_s=load_stretched(600),
             what=f"{self.messages} acked messages")
        self.stopping = True
        code = self.producers[-1].stop(timeout_s=load_stretched(60))
        self.expect(f"centre 1's producer stops cleanly on SIGTERM (exit {code})", code in (0, 130, 143))
        acked = self.acked()
        wait(lambda: self.last_seq(self.dc2) >= acked - 1, timeout_s=load_stretched(300),
             what=f"centre 2 to hold {acked} messages")
        self.dc2.call(self.dc2.layout.consumer_host, [
            "consume", QUEUE, "-s", "check", "--count", str(acked), "--quiet", "--audit-dir",
            str(self.folder / "dc2-run")], timeout_s=load_stretched(300))
        from ordq.spark_order_check.copy_check import check_copy, copy_rows, source_acks

        result = check_copy(source_acks([str(self.folder / "dc1-run" / "acks")]),
                            copy_rows([str(self.folder / "dc2-run" / "deliveries")], []))
        self.expect(f"the copy holds all {acked} acked messages", result.copy_messages == acked)
        return {"order": faults, "acked": acked, "copy": result.to_dict(), "clean": result.clean}


def run_mirror_drill(folder: Path, *, seed: int, messages: int = 10_000, rate: float = 200.0,
                     out: TextIO | None = None, link_cut_s: float = LINK_CUT_S) -> DrillResult:
    """The drill in a lab in ``folder`` (removed after): its DrillResult (a SKIP where no lab
    can be made)."""
    why = unavailable()
    if why is not None:
        return DrillResult(name=NAME, round=1, seed=seed, queue=QUEUE, ok=True, skipped=True,
                           verdict=f"SKIP (the lab needs root, ip netns and iptables: {why})")
    started = time.monotonic()
    drill: MirrorDrill | None = None

    def attempt(n: int) -> tuple[contextlib.ExitStack, Lab, LabCluster, LabCluster]:
        stack = contextlib.ExitStack()  # a failed start removes its lab (processes, namespaces)
        try:
            lab = stack.enter_context(Lab.create(folder / f"lab-{n}", hosts=HOSTS))
            return stack, lab, LabCluster.start(lab, layout=DC1, name="dc1"), LabCluster.start(lab, layout=DC2,
                                                                                             name="dc2")
        except BaseException:
            stack.close()
            raise

    try:
        what = "the two centres' start"
        stack, lab, dc1, dc2 = within_budget(attempt, budget_s=load_stretched(2 * SETUP_BUDGET_S), what=what,
                                             on_retry=_say_retry(out, what))
        with stack:
            if out is not None:
                out.write(f"  two centres up in {time.monotonic() - started:.0f}s (lab {lab.id})\n")
            drill = MirrorDrill(lab, dc1, dc2, folder, messages=messages, rate=rate, out=out, link_cut_s=link_cut_s)
            try:
                report = drill.run(random.Random(seed))
            finally:
                for proc in drill.mirrors:
                    proc.stop(timeout_s=5.0)
                dc1.stop()
                dc2.stop()
    except OrdqError as exc:
        return DrillResult(name=NAME, round=1, seed=seed, queue=QUEUE, ok=False,
                           verdict=f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0]}",
                           seconds=time.monotonic() - started, run_dir=str(folder),
                           expectations=tuple(drill.expectations) if drill else (),
                           events=tuple(drill.events) if drill else ())
    copy = report["copy"]
    ok = report["clean"] and all(ok for _w, ok in drill.expectations)
    verdict = ("PASS" if ok else "FAIL") + (f": {copy['first_divergence']['what']}" if copy["first_divergence"]
                                            else "") + f" (faults: {', '.join(report['order'])})"
    (folder / "report.json").write_text(json.dumps({**report, "events": drill.events}, indent=1))
    return DrillResult(name=NAME, round=1, seed=seed, queue=QUEUE, ok=ok, verdict=verdict, acked=report["acked"],
                       delivered=copy["copy_messages"], lost=copy["lost"], reordered=copy["reordered"],
                       duplicates=copy["duplicated"], seconds=time.monotonic() - started, run_dir=str(folder),
                       expectations=tuple(drill.expectations), events=tuple(drill.events))


__all__ = ["FAULT", "MUST", "NAME", "LabDrillError", "run_mirror_drill"]
