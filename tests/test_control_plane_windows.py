"""The security-control-plane drill's measurement windows (drills/control_plane.py,
``ORDQ_CONTROL_PLANE_WINDOWS``) and its hog control (drills/control_plane_attacks.py): which window
is judged, what each variant sends, and the per-thread CPU wait it reports. Pure, no cluster."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.drills import control_plane_attacks as cpa
from ordq.drills import control_plane_judge as judge
from ordq.drills import control_plane_placement as place
from ordq.drills import control_plane_plan as plan
from ordq.drills import cpu_isolation, neighbour


def test_by_default_the_placed_attack_is_judged_and_the_unplaced_one_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance's windows (stop g): the attacks from the attacker placed as a host of its own
    (one CPU) in three of four windows, judged; from its process on every CPU in the fourth, told
    beside them (stop 65: six judged windows in a run, two told)."""
    monkeypatch.delenv(plan.WINDOWS_ENV, raising=False)
    placed, unplaced = plan.Variant("attack", cpa.ATTACKS), plan.Variant("unplaced", cpa.ATTACKS, placed=False)
    assert plan.window_variants(cpa.ATTACKS) == (placed, placed, placed, unplaced)
    assert plan.window_variants(cpa.ATTACKS, " ") == plan.window_variants(cpa.ATTACKS, plan.DEFAULT_WINDOWS)
    variants = plan.window_variants(cpa.ATTACKS)
    names = [variants[i % len(variants)].name for i in range(plan.ROUNDS)]
    windows = [(10 * i, 10 * i + 4, 10 * i + 10) for i in range(plan.ROUNDS)]
    by = judge.by_variant(windows, names)
    assert list(by) == ["attack", "unplaced"] and len(by["attack"]) == 6 and len(by["unplaced"]) == 2
    assert judge.by_variant([(0, 1, 2), (2, 3, 4)], ["attack", "attack"]) == {"attacked": [0, 1]}
    assert judge.by_variant([(0, 1, 2), (2, 3, 4)], []) == {"attacked": [0, 1]}  # a run from before variants


def test_the_placed_attacker_runs_on_one_cpu_the_unplaced_on_every_one() -> None:
    placed, every = cpu_isolation.attacker_cpus()
    assert len(placed) == 1 and placed <= every == os.sched_getaffinity(0)


def test_set_cpus_places_every_thread_of_a_process_and_those_it_starts_after() -> None:
    """A real process with threads: each one moved (``sched_setaffinity`` of its pid alone sets
    one thread), a thread started after inherits it; and back on every CPU."""
    import subprocess
    import sys

    code = ("import threading, sys, time\n"
            "ts = [threading.Thread(target=time.sleep, args=(30,), daemon=True) for _ in range(3)]\n"
            "[t.start() for t in ts]\nprint('up', flush=True)\nsys.stdin.readline()\n"
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "print('more', flush=True)\nsys.stdin.readline()\n")
    every = os.sched_getaffinity(0)
    one = {max(every)}
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline() == "up\n"
            tasks = sorted(os.listdir(f"/proc/{proc.pid}/task"))
            assert cpu_isolation.set_cpus(proc.pid, one) >= 4
            assert all(os.sched_getaffinity(int(t)) == one for t in tasks)
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "more\n"
            now = os.listdir(f"/proc/{proc.pid}/task")
            assert len(now) > len(tasks) and all(os.sched_getaffinity(int(t)) == one for t in now)  # inherited
            cpu_isolation.set_cpus(proc.pid, every)
            assert all(os.sched_getaffinity(int(t)) == every for t in now)
        finally:
            proc.kill()
            proc.wait()
    assert cpu_isolation.set_cpus(proc.pid, one) == 0  # gone


def test_variants_name_what_is_sent_and_the_attackers_weight() -> None:
    got = plan.window_variants(("huge", "flood"), "attack, hog,attack@8192,hog@2,unplaced@8")
    assert got == (plan.Variant("attack", ("huge", "flood")), plan.Variant("hog", ("hog",)),
                   plan.Variant("attack@8192", ("huge", "flood"), 8192), plan.Variant("hog@2", ("hog",), 2),
                   plan.Variant("unplaced@8", ("huge", "flood"), 8, placed=False))


def test_the_acceptances_windows_place_the_leader_apart_in_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Since stop p the leading coordinator runs apart in every round of the acceptance's run (a
    host of its own, as in production: the produce path does not call it), the idle control too."""
    monkeypatch.delenv(plan.WINDOWS_ENV, raising=False)
    assert all(v.leader_apart for v in plan.window_variants(cpa.ATTACKS))
    assert plan.window_variants(cpa.ATTACKS, "idle")[0].leader_apart


def test_a_variant_may_place_the_leader_apart_or_in_the_clusters_group() -> None:
    """Stop p's probe: the leader's place per round (both its windows), ``/apart`` (a cgroup of its
    own below the cluster's weight, control_plane_placement.LEADER_SHARES) or ``/shared``; without
    either, ``LEADER_APART``."""
    got = plan.window_variants(cpa.ATTACKS, "flood/apart,huge@64/shared,unplaced/apart,idle")
    assert got == (plan.Variant("flood/apart", ("flood",), leader_apart=True),
                   plan.Variant("huge@64/shared", ("huge",), 64, leader_apart=False),
                   plan.Variant("unplaced/apart", cpa.ATTACKS, placed=False, leader_apart=True),
                   plan.Variant("idle", (), leader_apart=plan.LEADER_APART))
    assert cpu_isolation.ATTACKER_SHARES < place.LEADER_SHARES < cpu_isolation.MAX_SHARES


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(cpu_isolation.unavailable() is not None, reason=f"{cpu_isolation.unavailable()}")
def test_a_leader_apart_gets_a_cpu_the_cluster_wants_only_after_it() -> None:
    """The leader placed apart (stop p, ``place_leader``): a cluster's process and the leader both
    spinning on one CPU, the cluster's gets it ~8 parts of 9 (cpu.shares 262144 against
    LEADER_SHARES); the leader in the cluster's group, half each, as before stop p."""
    iso, how = cpu_isolation.open_isolation()
    assert iso is not None, how
    one = {max(os.sched_getaffinity(0))}
    spin = [sys.executable, "-c", "while True: pass"]
    broker, leader = subprocess.Popen(spin), subprocess.Popen(spin)

    def broker_part(seconds: float) -> float:
        b0, l0 = _cpu_ticks(broker.pid), _cpu_ticks(leader.pid)
        time.sleep(seconds)
        b, lead = _cpu_ticks(broker.pid) - b0, _cpu_ticks(leader.pid) - l0
        return b / (b + lead)

    try:
        with iso:
            iso.group(place.CLUSTER_GROUP)
            iso.add(place.CLUSTER_GROUP, [broker.pid])
            for p in (broker, leader):
                assert cpu_isolation.set_cpus(p.pid, one)
            place.place_leader(iso, leader.pid, apart=True)
            assert (iso.groups[place.LEADER_GROUP] / "cpu.shares").read_text().strip() == str(place.LEADER_SHARES)
            apart = broker_part(1.5)
            place.place_leader(iso, leader.pid, apart=False)
            shared = broker_part(1.5)
    finally:
        for p in (broker, leader):
            p.kill()
            p.wait()
    print(f"the cluster's process got {apart:.2f} of the CPU with the leader apart, {shared:.2f} shared")
    assert apart >= 0.8, apart
    assert 0.35 <= shared <= 0.65, shared


def test_a_variant_may_name_the_kinds_it_sends_or_none() -> None:
    """A measurement's windows one kind (or a few) each, interleaved with the same quiet
    windows (stop h: which attack slows the produce acks), and an ``idle`` control that sends
    nothing; each placed, as the judged windows."""
    got = plan.window_variants(cpa.ATTACKS, "huge,flood,bound+parking+undecodable+newline,idle,hog+huge@64")
    assert got == (plan.Variant("huge", ("huge",)), plan.Variant("flood", ("flood",)),
                   plan.Variant("bound+parking+undecodable+newline", ("bound", "parking", "undecodable", "newline")),
                   plan.Variant("idle", ()), plan.Variant("hog+huge@64", ("hog", "huge"), 64))


@pytest.mark.parametrize("spec", ["floods", "huge+", "idle+huge", "hog@", "hog@1",
                                  f"hog@{cpu_isolation.MAX_SHARES + 1}", "attack@x", "flood/", "flood/elsewhere",
                                  "flood/apart/shared"])
def test_a_malformed_variant_is_refused_by_name(spec: str) -> None:
    with pytest.raises(ValueError, match=plan.WINDOWS_ENV):
        plan.window_variants(cpa.ATTACKS, spec)


def test_the_attack_windows_are_judged_the_others_told() -> None:
    windows = [(0, 10, 20), (20, 30, 40), (40, 50, 60), (60, 70, 80)]
    by = judge.by_variant(windows, ["hog", "attack", "hog", "attack"])
    assert list(by) == ["attack", "hog"]  # the first is the judged one
    assert by == {"attack": [1, 3], "hog": [0, 2]}
    samples = [(t, float(t)) for t in range(0, 80, 5)]
    quiet, attacked = judge.split(samples, windows, by["attack"])
    assert quiet == [0.0, 5.0, 20.0, 25.0, 40.0, 45.0, 60.0, 65.0]  # every round's quiet window
    assert attacked == [30.0, 35.0, 70.0, 75.0]


@st.composite
def _windows(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], list[str]]:
    n = draw(st.integers(1, 6))
    t, out = 0, []
    for _ in range(n):
        q, a = draw(st.integers(1, 50)), draw(st.integers(1, 50))
        out.append((t, t + q, t + q + a))
        t += q + a
    return out, draw(st.lists(st.sampled_from(["attack", "hog", "attack@8192"]), min_size=n, max_size=n))


@given(_windows(), st.lists(st.integers(0, 400), max_size=60))
def test_the_variants_split_the_attacked_samples_between_them(
        case: tuple[list[tuple[int, int, int]], list[str]], ats: list[int]) -> None:
    windows, names = case
    samples = [(at, float(i)) for i, at in enumerate(ats)]
    by = judge.by_variant(windows, names)
    assert sorted(i for picked in by.values() for i in picked) == list(range(len(windows)))
    quiet_all, attacked_all = judge.split(samples, windows)
    pooled: list[float] = []
    for picked in by.values():
        quiet, attacked = judge.split(samples, windows, picked)
        assert quiet == quiet_all  # the same quiet baseline for every variant
        pooled += attacked
    assert sorted(pooled) == sorted(attacked_all)


def test_the_hog_is_sent_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpa.ATTACKS_ENV, raising=False)
    assert cpa.attack_kinds() == cpa.ATTACKS  # never a control by default
    monkeypatch.setenv(cpa.ATTACKS_ENV, "hog")
    assert cpa.attack_kinds() == ("hog",)
    monkeypatch.setenv(cpa.ATTACKS_ENV, "flood,hog")
    assert cpa.attack_kinds() == ("flood", "hog")


def test_a_hog_call_spins_and_judging_a_hog_only_window_finds_no_refusal_expected() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    neighbour.spin(0.02)  # both drills' hog call
    assert time.perf_counter() - t0 >= 0.02 and time.thread_time() > c0  # spun (not asleep) that long
    assert cpa.judge_attacks({"hog ok": 40}, {}, ("hog",)) == []


def test_thread_waits_are_per_live_thread_and_only_grow() -> None:
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: stop.wait(5), daemon=True)
    spinner.start()
    try:
        before = place.thread_waits(os.getpid())
        assert threading.get_native_id() in before and spinner.native_id in before
        after = place.thread_waits(os.getpid())
        assert place.waited_s(before, after) >= 0.0
        assert place.waited_s({}, {1: 2_000_000_000}) == 2.0  # a thread started meanwhile: all of its wait
    finally:
        stop.set()
        spinner.join()
    assert place.thread_waits(2**22 + 12345) == {}  # no such process


def test_thread_switches_count_each_threads_sleeps() -> None:
    slept, stop = threading.Event(), threading.Event()

    def sleeper() -> None:
        for _ in range(20):
            time.sleep(0.001)
        slept.set()
        stop.wait(5)

    before = place.thread_switches(os.getpid())
    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    try:
        assert slept.wait(5)
        assert place.thread_switches(os.getpid()) >= before + 20  # the sleeper's, a new thread: all counted
    finally:
        stop.set()
        thread.join()
    assert place.thread_switches(2**22 + 12345) == 0  # no such process


def test_page_faults_count_the_fresh_memory_a_process_touches() -> None:
    """What stop m guessed slowed the cluster beside a huge copy, told per kind of window."""
    cpu = place.CpuUse({"me": os.getpid()})
    with cpu.measure("quiet"):
        time.sleep(0.01)
    with cpu.measure("attacked"):
        fresh = bytearray(64 << 20)  # zeroed pages, each touched once
    del fresh
    assert cpu.faulted["attacked"]["me"] >= (64 << 20) // 4096 * 0.9 > cpu.faulted["quiet"]["me"], cpu.faulted
    assert "attacked: me " in cpu.faults()
    assert place.page_faults(2**22 + 12345) == 0  # no such process


def test_the_machines_steal_is_told_beside_its_busy_time() -> None:
    """The host's time on this guest's CPUs (a page it backs first is some), at most the busy time."""
    from ordq.drills.neighbour import cpu_seconds

    now = cpu_seconds({})
    assert set(now) == {"machine busy", "machine steal"} and 0 <= now["machine steal"] <= now["machine busy"]


def test_switches_per_attacker_call_are_the_attacked_windows_excess_over_the_quiet_ones() -> None:
    cpu = place.CpuUse({})
    cpu.wall = {"quiet": 10.0, "attacked": 20.0}
    cpu.switched = {"quiet": {"leader": 10_000.0}, "attacked": {"leader": 60_000.0}}
    assert cpu.per_call("leader", 2_000) == ("the attacker's calls answered: 2000 in 20.0 s of attack windows "
                                             "(100/s); leader's context switches 1000/s quiet, 3000/s attacked: "
                                             "20.0 more per attacker call")
    assert "no call answered" in cpu.per_call("leader", 0)


def test_the_attackers_process_takes_a_windows_own_kinds() -> None:
    """The real attacker process, told per window what to send (``arm(kinds)``): a hog-only
    window of a process started for the flood and the hog sends no flood call (nothing listens
    at the address: a flood call would be counted UNAVAILABLE); the process answers each window
    and goes on to the next (with every kind it was started with)."""
    from ordq.common.security import Credentials

    attacker = cpa.attacker_process("127.0.0.1:9", Credentials(), "t0ken", "q", idle=False, kinds=("flood", "hog"))
    try:
        for kinds in (("hog",), ("flood", "hog", "huge")):  # huge: not a kind it was started with
            attacker.arm(kinds)
            attacker.armed()
            attacker.go(time.monotonic() + 30)
            if kinds == ("hog",):
                first = attacker.pause()
        second = attacker.pause()
    finally:
        attacker.close()
    assert set(first) <= {"hog ok"}, first
    assert set(second) <= {"hog ok", "flood:Describe UNAVAILABLE", "flood:Subscribe UNAVAILABLE",
                           "flood:Describe cut", "flood:Subscribe cut"}, second  # cut: in flight at the end


def test_one_stalled_quiet_window_carries_the_pooled_ratio_but_not_the_per_window_one() -> None:
    """Stop g's runs: quiet window 2 (after the first attack) stalled, and the pooled quiet p99
    rose with it, so the pooled ratio passed while every attack window was 3x its own quiet one.
    The median of the per-window ratios is not carried by that one window."""
    windows = [(0, 100, 200), (200, 300, 400), (400, 500, 600), (600, 700, 800)]
    samples: list[tuple[int, float]] = []
    for q0, a0, a1 in windows:
        samples += [(t, 10.0) for t in range(q0, a0)]  # quiet: 10 ms
        samples += [(t, 30.0) for t in range(a0, a1)]  # attacked: 30 ms, 3x
    samples = [(t, 300.0 if 200 <= t < 230 else ms) for t, ms in samples]  # quiet window 2 stalls
    quiet, attacked = judge.split(samples, windows)
    assert judge.p99(attacked) <= judge.LATENCY_RATIO * judge.p99(quiet)  # the pooled rule: passes
    ratios = judge.window_ratios(samples, windows, [0, 1, 2, 3])
    assert ratios == [3.0, 0.1, 3.0, 3.0]
    assert statistics.median(ratios) > judge.LATENCY_RATIO  # the per-window rule: fails
    assert judge.window_ratios(samples, windows, [2]) == [3.0]  # only the picked rounds


def test_the_drill_queues_path_is_read_per_window_from_the_brokers_own_metrics() -> None:
    """What a window's slow acks coincide with (control_plane_path, stop m): the head broker's
    writes held by the session guard and its slow fsyncs, read from its exposition as a broker
    exposes them (the same bucket bounds), and the consumer's lag from the status files."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from ordq.broker_group.metrics import FSYNC_BUCKETS
    from ordq.common.metrics import parse
    from ordq.drills import control_plane_path as path

    registry = CollectorRegistry()
    held = Counter("ordq_broker_session_confirmed_writes", "held", ["group", "role"], registry=registry)
    fsync = Histogram(path.FSYNC, "fsync", ["group", "role"], buckets=FSYNC_BUCKETS, registry=registry)
    labels = {"group": "g1", "role": "master"}

    def now() -> path.BrokerReading | None:
        return path.reading(parse(generate_latest(registry).decode()))

    held.labels(**labels)  # exposed from the start, as the broker's collector does
    fsync.labels(**labels).observe(0.002)
    before = now()
    held.labels(**labels).inc(35)
    for seconds in (0.001, 0.05, 0.2, 0.6, 1.5):
        fsync.labels(**labels).observe(seconds)
    assert path.between(before, now()) == "35 writes held, 5 fsyncs (3 > 0.1 s, 2 > 0.25 s, 1 > 1.0 s)"
    assert path.between(None, now()) == "not read" and path.reading([]) is None
    assert path.lag({"acked": 5_000}, {"delivered": 4_200}) == 800 and path.lag({}, {"delivered": 1}) == -1


def test_zookeepers_requests_and_times_are_told_per_window_from_its_mntr() -> None:
    """Whether an attack on the leader reaches the brokers through ZooKeeper (stop p): its
    requests per s and its read, update and fsync times' means over a window, from two ``mntr``
    answers (ZooKeeper 3.8's format: ``zk_sum_X`` and ``zk_cnt_X`` of each summary)."""
    from ordq.drills import control_plane_path as path

    def mntr(received: int, reads: tuple[int, int], updates: tuple[int, int], fsyncs: tuple[int, int]) -> str:
        lines = [("zk_version", "3.8.0"), ("zk_packets_received", received), ("zk_avg_readlatency", "0.68")]
        for name, (total, n) in zip(path.ZK_TIMES, (reads, updates, fsyncs), strict=True):
            lines += [(f"zk_cnt_{name}", n), (f"zk_sum_{name}", total)]
        return "\n".join(f"{k}\t{v}" for k, v in lines) + "\n"

    a = path.zk_reading(mntr(100, (10, 20), (300, 100), (50, 100)))
    b = path.zk_reading(mntr(1300, (40, 80), (700, 300), (90, 300)))
    assert path.zk_between(a, b, 2.0) == ("600 requests/s, readlatency 0.50 ms x60, updatelatency 2.00 ms x200, "
                                          "fsynctime 0.20 ms x200")
    assert path.zk_between(b, b, 2.0) == "0 requests/s, readlatency x0, updatelatency x0, fsynctime x0"
    assert path.zk_between(None, b, 2.0) == "not read" and path.zk_reading("not a server\n") is None


def _verdict(tmp_path: object, windows: list[tuple[int, ...]], latency_ms: object) -> list[tuple[str, bool]]:
    """``check_control_plane`` over a made-up run: an ack sent every 2 ms and a commit every 20 ms
    over the whole span, each taking ``latency_ms(µs sent)``; the disk watched, never frozen."""
    import random
    from pathlib import Path

    from ordq.drills.audit import AckRow
    from ordq.drills.runner import DrillContext, LoadConfig

    assert callable(latency_ms)
    end = windows[-1][-1] + 1_000_000
    acks = [AckRow("p1", i, 0, at + int(latency_ms(at) * 1000), at) for i, at in enumerate(range(0, end, 2000))]
    commits = [(at, float(latency_ms(at))) for at in range(0, end, 20_000)]
    ctx = DrillContext(cluster=None, drill=None, round=1, rng=random.Random(0), queue="q",  # type: ignore[arg-type]
                       run_dir=Path(str(tmp_path)), load=LoadConfig())
    ctx.notes.update({"neighbour_windows": windows, "window_variants": ["attack"] * len(windows),
                      "commit_samples": commits, "device_stalls": [], "device": "vda",
                      "neighbour_judgement": "test: cgroups"})
    return [(what, ok) for what, ok in judge.check_control_plane(ctx, acks, []) if "p99" in what]


def _gapped(rounds: int = plan.ROUNDS, window_us: int = 6_500_000, gap_us: int = 600_000) -> list[tuple[int, ...]]:
    """The drill's rounds since stop o: a gap, the quiet window, a gap, the attack window, as long."""
    out, t = [], 0
    for _ in range(rounds):
        q0 = t + gap_us
        a0 = q0 + window_us + gap_us
        out.append((q0, q0 + window_us, a0, a0 + window_us))
        t = a0 + window_us
    return out


def _in(spans: list[tuple[int, int]], at: int) -> bool:
    return any(a <= at < b for a, b in spans)


def test_attack_windows_three_times_slower_than_the_quiet_ones_fail_both_rules(tmp_path: object) -> None:
    """The judgement can still fail: every ack and commit sent in an attack window 3x those of the
    quiet windows (30 against 10 ms), the gaps as slow as the quiet windows."""
    windows = _gapped()
    attacked = [judge.spans(w)[1] for w in windows]
    judged = _verdict(tmp_path, windows, lambda at: 30.0 if _in(attacked, at) else 10.0)
    assert len(judged) == 4 and not any(ok for _what, ok in judged), judged  # pooled and per window, both series
    assert all("3.00x" in what for what, _ok in judged), judged


def test_an_artefact_shared_by_both_kinds_of_window_and_the_gaps_drill_work_pass(tmp_path: object) -> None:
    """Stop n: the slow acks came where the drill itself acted (its scrapes at the go, the
    attacker's handshakes), not where the attack did. Since stop o the drill does the same in
    either kind of window and the rest in the gaps: here each window of either kind begins with
    0.25 s of 200 ms acks (a shared onset) and carries one 0.3 s stretch of 150 ms at the same
    place, and the gaps are 500 ms throughout (the drill's reads): left out by time, on neither
    side, the ratios are 1.00x and every latency rule passes."""
    windows = _gapped()
    spans = [s for w in windows for s in judge.spans(w)]

    def latency(at: int) -> float:
        span = next((s for s in spans if s[0] <= at < s[1]), None)
        if span is None:
            return 500.0  # a gap
        into = at - span[0]
        return 200.0 if into < 250_000 else 150.0 if 3_000_000 <= into < 3_300_000 else 10.0

    judged = _verdict(tmp_path, windows, latency)
    assert len(judged) == 4 and all(ok for _what, ok in judged), judged
    assert all("1.00x" in what for what, _ok in judged), judged
    # the same run read as before the gaps (each quiet window to the go): the gap's slow acks land on the
    # quiet side, as the old layout put the drill's reads there, and the verdict no longer says 1.00x
    old = [(q0, a0, a1) for q0, _q1, a0, a1 in windows]
    assert not all("1.00x" in what for what, _ok in _verdict(tmp_path, old, latency))


def test_a_round_is_read_with_or_without_its_gap() -> None:
    assert judge.spans((0, 5, 7, 12)) == ((0, 5), (7, 12))
    assert judge.spans((0, 7, 12)) == ((0, 7), (7, 12))  # a run from before stop o
    samples = [(t, float(t)) for t in range(12)]
    assert judge.split(samples, [(0, 5, 7, 12)]) == ([0.0, 1.0, 2.0, 3.0, 4.0], [7.0, 8.0, 9.0, 10.0, 11.0])
    assert judge.window_ratios(samples, [(0, 5, 7, 12)], [0]) == [11.0 / 4.0]
