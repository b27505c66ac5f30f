"""The drill runner's own rules, without a cluster (issue 24: ``ordq drill kill-head-master
--messages 100`` ended in ERROR, its verdict cut off, g1's master left down)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from ordq.drills.judge import judge_all
from ordq.drills.runner import MIN_STREAM_S, Drill, DrillContext, DrillError, LoadConfig, execute_drill


def test_a_short_stream_is_paced_to_outlast_its_fault() -> None:
    short = LoadConfig(messages=100, rate=4_000.0)  # over in 25 ms: before any fault
    paced = short.lasting(MIN_STREAM_S)
    assert paced.messages == 100 and paced.duration_s == MIN_STREAM_S
    ci = LoadConfig(messages=8_000, rate=4_000.0)
    assert ci.lasting(MIN_STREAM_S) is ci  # a stream long enough keeps its rate (the CI drills' timing)


@attrs.define
class _FakeCluster:
    folder: Path
    heals: int = 0
    down: list[str] = attrs.field(factory=list)
    zk: Any = attrs.field(factory=lambda: type("Zk", (), {"ensemble": False})())

    def heal(self) -> list[str]:
        self.heals += 1
        started, self.down = self.down, []
        return started

    @contextlib.contextmanager
    def store(self) -> Iterator[Any]:
        yield type("Store", (), {"create_queue": lambda _self, _q: None})()


def test_a_drill_that_errs_heals_the_cluster_and_says_why_in_full(tmp_path: Path) -> None:
    why = "kill-head-master: timed out after 30s waiting for an ack on a segment after 0 (a long cause, whole)"

    def inject(ctx: DrillContext) -> None:
        ctx.cluster.down.append("g1-master")  # type: ignore[attr-defined]  # the fault, left in place
        raise DrillError(why)

    cluster = _FakeCluster(tmp_path)
    drill = Drill("fake", "a fault", "something", inject, own_load=True)
    run = execute_drill(cluster, drill, queue="fake-q")  # type: ignore[arg-type]
    assert run.error is not None and cluster.heals == 2 and not cluster.down  # healed after the error too
    assert any("healed the cluster after the error: started g1-master" in text for _t, text in run.ctx.events)
    [res] = judge_all([run], verify=lambda *_a, **_k: None, keep=True)
    assert not res.ok and res.verdict == f"ERROR (DrillError: {why})"


def _context(tmp_path: Path) -> DrillContext:
    drill = Drill("fake", "a fault", "something", lambda _ctx: None, own_load=True)
    return DrillContext(_FakeCluster(tmp_path), drill, 1, random.Random(0), "fake-q", tmp_path,  # type: ignore[arg-type]
                        LoadConfig(messages=100, rate=100.0))


def test_a_wait_with_progress_outlasts_its_timeout_while_moving_and_fails_once_stalled(tmp_path: Path) -> None:
    # The cdc drill at load 30 moved at ~43 row changes/s and was failed by a fixed 110 s bound
    # (issue 26). A wait given a progress count now fails only after timeout_s without progress.
    ctx = _context(tmp_path)
    began = time.monotonic()
    moving = lambda: int((time.monotonic() - began) * 10)  # noqa: E731 - grows all the time
    assert ctx.wait(lambda: time.monotonic() - began > 3.5, timeout_s=1.5, what="x", progress=moving)
    stuck_at = lambda: 7  # noqa: E731
    began = time.monotonic()
    try:
        ctx.wait(lambda: False, timeout_s=1.5, what="the end", progress=stuck_at)
    except DrillError as exc:
        assert "without progress (at 7" in str(exc) and 1.5 <= time.monotonic() - began < 10
    else:
        raise AssertionError("a stalled wait must fail")


def test_waiting_for_a_failover_with_no_producer_left_fails_at_once_and_says_why(tmp_path: Path) -> None:
    """The failing-handler-block drill at load 25 killed the head master after its 2 s stream had
    ended: the producer was done, all acked on segment 0, and the wait for an ack on a later
    segment ran its whole 30 s to say only "timed out" (issue 26). Now it says so at once."""
    import json

    from ordq.drills.runner import Workload

    ctx = _context(tmp_path)
    status = tmp_path / "p1.status.json"
    status.write_text(json.dumps({"state": "done", "error": "", "acked": 100, "seg_first_ack_us": {"0": 1}}))
    proc = type("Proc", (), {"name": "p1", "alive": lambda _self: False})()
    ctx.producers.append(Workload(writer="p1-fake-q", role="producer", proc=proc, status_path=status))  # type: ignore[arg-type]
    began = time.monotonic()
    try:
        ctx.wait_acks_after(0)
    except DrillError as exc:
        assert "no producer running: p1 done" in str(exc) and time.monotonic() - began < 10, exc
    else:
        raise AssertionError("no ack can come")


def test_the_fault_releases_producers_held_for_it(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    assert not ctx.fault_file.exists()
    ctx.fault("kill -9 something", kind="segment", seg=0)
    assert ctx.fault_file.exists()  # what a producer started with --hold-file waits for


def test_status_files_are_rewritten_in_memory_and_kept_with_the_run(tmp_path: Path) -> None:
    """A workload's status file, replaced by rename every 0.1 s, goes under ``STATUS_ROOT``
    (tmpfs), not the run's folder on the cluster's disk, where each replacement was a discard
    (stop h); the last ones end in the run's folder, the memory folder removed. Without a
    writable root, the run's folder as before."""
    from ordq.drills.runner import keep_statuses, status_folder

    run_dir, root = tmp_path / "run", tmp_path / "shm"
    run_dir.mkdir()
    root.mkdir()
    folder = status_folder("q", run_dir, root)
    assert folder.parent == root and folder.is_dir()
    (folder / "p1.status.json").write_text('{"acked": 7}')
    keep_statuses(folder, run_dir)
    assert (run_dir / "p1.status.json").read_text() == '{"acked": 7}' and not folder.exists()
    assert status_folder("q", run_dir, tmp_path / "none") == run_dir
    keep_statuses(run_dir, run_dir)  # nothing moved, nothing removed
    assert (run_dir / "p1.status.json").exists()
