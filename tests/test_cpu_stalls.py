"""Stalls of the CPU under a drill's cluster (drills/cpu_stalls.py): the probe, a real process
stopped for real, and what the drills' judgement leaves out for its stalls (stop 65)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ordq.drills import control_plane_judge as judge
from ordq.drills import cpu_stalls, device_stalls
from tests.util import wait_until


def test_the_probes_output_reads_as_stalls_long_enough_and_a_count_of_the_rest() -> None:
    text = "# probing every 5 ms\n1000 151000\n5000 30000\n200000 260000\n900000 1900000\n12 3"  # the last line torn
    assert cpu_stalls.read_stalls(text, 100_000) == ([(1000, 151000), (900000, 1900000)], 3)
    assert cpu_stalls.read_stalls("", 100_000) == ([], 0)
    assert cpu_stalls.read_stalls("x y\n1 2 3\n", 1) == ([], 0)


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)), max_size=30))
def test_every_well_formed_line_is_a_stall_or_counted(spans: list[tuple[int, int]]) -> None:
    long, short = cpu_stalls.read_stalls("".join(f"{a} {a + d}\n" for a, d in spans), 100_000)
    assert len(long) + short == len(spans)
    assert all(b - a >= 100_000 for a, b in long)


def test_a_probe_stopped_for_real_writes_its_stall_down(tmp_path: Path) -> None:
    """SIGSTOP the probe process for 300 ms: it wakes that late, and the stall spans the stop."""
    probe = cpu_stalls.CpuProbe(tmp_path / "stalls.txt")
    try:
        # its interpreter's start is not a stall of the machine
        wait_until(probe.probing, timeout_s=30, what="the probe to begin")
        before = time.time_ns() // 1000
        os.kill(probe.pid, signal.SIGSTOP)
        time.sleep(0.3)  # the fault's length
        os.kill(probe.pid, signal.SIGCONT)
        after = time.time_ns() // 1000
        wait_until(lambda: cpu_stalls.read_stalls(probe.out.read_text(), 1)[0], timeout_s=30,
                   what="the probe to write down its 300 ms stop")
    finally:
        stalls, _short = probe.stop(device_stalls.MIN_STALL_US)
    assert any(a <= after and b >= before + 250_000 for a, b in stalls), (before, after, stalls)
    assert _state(probe.pid) == "Z"  # stopped and reaped


def test_the_probe_ends_when_its_drill_is_killed(tmp_path: Path) -> None:
    """A drill killed with SIGKILL cannot stop its probe: the probe sees its parent gone and ends."""
    code = ("import sys, time; from pathlib import Path; from ordq.drills import cpu_stalls; "
            f"p = cpu_stalls.CpuProbe(Path({str(tmp_path / 'out.txt')!r})); print(p.pid, flush=True); "
            "time.sleep(600)")
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as drill:
        try:
            assert drill.stdout is not None
            pid = int(drill.stdout.readline())
            drill.kill()
            drill.wait(10)
            wait_until(lambda: _state(pid) == "Z", timeout_s=30, what=f"the probe {pid} to end with its killed drill")
        finally:
            drill.kill()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_the_drills_verdict_leaves_a_cpu_stall_out_of_both_sides_and_tells_it(tmp_path: Path) -> None:
    """check_control_plane on a run whose attack windows 2 and 4 each held a stall of the CPU
    (its acks 300 ms), the disk quiet: every latency rule passes and the stalls are told per kind
    of window; without the probe's stalls the same run fails."""
    from ordq.drills.audit import AckRow
    from ordq.drills.runner import DrillContext, LoadConfig

    ms = 1000
    windows = [(i * 10_000 * ms, i * 10_000 * ms + 4_000 * ms, (i + 1) * 10_000 * ms) for i in range(4)]
    stalled = [(14_500 * ms, 14_900 * ms), (34_500 * ms, 34_900 * ms)]
    acks = [AckRow("p1", i, 0, at + int((300 if any(a <= at < b for a, b in stalled) else 10) * ms), at)
            for i, at in enumerate(range(0, 40_000 * ms, 2 * ms))]
    commits = [(at, 300.0 if any(a <= at < b for a, b in stalled) else 12.0) for at in range(0, 40_000 * ms, 20 * ms)]

    def verdict(cpu: list[tuple[int, int]]) -> tuple[list[tuple[str, bool]], list[str]]:
        ctx = DrillContext(cluster=None, drill=None, round=1, rng=random.Random(0), queue="q",  # type: ignore[arg-type]
                           run_dir=tmp_path, load=LoadConfig())
        ctx.notes.update({"neighbour_windows": windows, "window_variants": ["attack"] * 4, "commit_samples": commits,
                          "device_stalls": [], "device": "vda", "cpu_stalls": cpu, "cpu_late_wakeups": 7,
                          "cpu_probe_group": "/ordq-drill-1-2-protected", "neighbour_judgement": "test: cgroups"})
        return judge.check_control_plane(ctx, acks, []), [text for _t, text in ctx.events]

    judged, told = verdict(stalled)
    assert all(ok for _what, ok in judged), judged
    assert any("froze 0 times" in t and "the CPU stalled the cluster's group (/ordq-drill-1-2-protected) 2 times" in t
               and "quiet 0 in 16 s, attacked 2 in 24 s; 7 times 20-100 ms late (kept)" in t for t in told), told
    judged, _told = verdict([])
    assert not all(ok for _what, ok in judged)
