"""bench/peers_table.py reads what ../shared/peers/perf.sh leaves: the peers' harness JSON and
bench_e2e's own lines. The arithmetic is checked without I/O; the parser against a real
bench_e2e run, so a line bench_e2e changes cannot silently drop ordq's figures from the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peers_table

REPO = Path(__file__).resolve().parent.parent

# the shape of the peers' harness results (../shared/peers/common.py, run_suite): medians per phase
REDIS = {"a_async": {"producer_msgs_per_s_median": 20000.0, "producer_cpu_pct_median": 30.0,
                     "consumer_cpu_pct_median": 30.0, "servers_cpu_pct_median": 50.0},
         "b_sync": {"producer_msgs_per_s_median": 1000.0, "producer_cpu_pct_median": 25.0,
                    "consumer_cpu_pct_median": 20.0, "servers_cpu_pct_median": 40.0},
         "c_latency": {"producer_msgs_per_s_median": 2000.0, "lat_p99_ms_median": 4.5, "producer_cpu_pct_median": 20.0,
                       "consumer_cpu_pct_median": 20.0, "servers_cpu_pct_median": 40.0}}


def test_a_peers_cpu_per_message_is_its_processes_share_of_a_core_over_its_rate() -> None:
    row = peers_table.peer_row("Redis", REDIS)
    assert row["pipelined_cpu_us_msg"] == pytest.approx(110 / 100 / 20000 * 1e6)  # 55 µs
    assert row["sync_cpu_us_send"] == pytest.approx(0.85 / 1000 * 1e6)  # 850 µs
    assert row["steady_cores"] == pytest.approx(0.8)
    assert row["steady_cpu_us_msg"] == pytest.approx(400.0)
    assert row["steady_p99_ms"] == 4.5 and row["sync_reader"] is True


def test_a_phase_the_harness_did_not_finish_leaves_its_cells_empty() -> None:
    half = {"a_async": REDIS["a_async"], "b_sync": {"producer_msgs_per_s_median": 900.0,
                                                    "producer_cpu_pct_median": None}}
    row = peers_table.peer_row("NATS", half)
    assert row["sync_sends_s"] == 900.0 and row["sync_cpu_us_send"] is None
    assert row["steady_p99_ms"] is None and row["steady_cpu_us_msg"] is None


def test_an_ordq_run_that_printed_no_cpu_per_send_has_every_column_all_the_same() -> None:
    # bench_e2e before stop 103: no "CPU per send" line, no asyncio phase
    row = peers_table.ordq_row("ordq A", "synchronous: 577 sends/s; ack latency p50 1.53 ms\n")
    assert list(row) == list(peers_table.COLUMNS)
    assert row["sync_sends_s"] == 577 and row["sync_cpu_us_send"] is None and row["steady_p99_ms"] is None
    assert row["sync_reader"] is False  # no consumer read then: not the peers' workload
    alone = peers_table.ordq_row("ordq B", "synchronous, no consumer reading: 900 sends/s; ack latency p50 1 ms\n"
                                           "CPU per send: master 1; total 1,234 µs, 20% ...\n")
    assert alone["sync_sends_s"] == 900 and alone["sync_cpu_us_send"] == 1234 and alone["sync_reader"] is False


def _ordq(name: str, sync: float | None, aio: float | None, p99: float | None) -> dict[str, object]:
    return dict.fromkeys(peers_table.COLUMNS) | {"system": name, "sync_sends_s": sync,
                                                 "sync_asyncio_sends_s": aio, "steady_p99_ms": p99}


def test_the_peer_goals_take_ordqs_better_producer_and_the_lowest_peer_tail() -> None:
    nats = peers_table.peer_row("NATS", REDIS) | {"steady_p99_ms": 3.0, "sync_sends_s": 5000.0}
    found = [_ordq("ordq A", 900.0, 1100.0, 3.5), _ordq("ordq B", 800.0, None, 2.5),
             peers_table.peer_row("Redis", REDIS), nats]
    judged = {(g["run"], g["goal"].split()[0]): g for g in peers_table.goals(found)}
    a_sync, a_tail = judged["ordq A", "synchronous"], judged["ordq A", "steady"]
    assert (a_sync["ordq"], a_sync["peer_figure"], a_sync["met"]) == (1100.0, 1000.0, True)  # the AsyncProducer's
    assert (a_tail["peer"], a_tail["peer_figure"], a_tail["met"]) == ("NATS", 3.0, False)  # below Redis's 4.5 only
    assert judged["ordq B", "synchronous"]["met"] is False and judged["ordq B", "steady"]["met"] is True
    line = peers_table._goal_line(a_sync)
    assert line == "issue 39, ordq A: synchronous send ahead of Redis's: 1,100/s against Redis's 1,000/s (1.10x): met"


def test_a_goal_without_its_figures_is_not_judged() -> None:
    alone = peers_table.goals([_ordq("ordq A", None, None, 3.0)])  # no peer in the folder, no sync phase
    assert [g["met"] for g in alone] == [None, None]
    assert peers_table._goal_line(alone[0]).endswith(": not measured")


def test_a_folder_without_results_is_an_error_that_says_what_it_looks_for(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.peers_table", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "redis.out" in out.stderr and "ordq_A.out" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "bench.peers_table", str(tmp_path / "none")], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not a folder" in out.stderr, out.stderr
    (tmp_path / "nats.out").write_text("")  # perf.sh still running that peer
    out = subprocess.run([sys.executable, "-m", "bench.peers_table", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "nats.out is not the peers' harness JSON" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.zk
def test_the_table_reads_every_figure_of_a_real_bench_e2e_run(tmp_path: Path) -> None:
    folder = tmp_path / "peers"
    folder.mkdir()
    run = subprocess.run([sys.executable, "-m", "bench.bench_e2e", "--token", "--messages", "1000", "--sync-messages",
                          "30", "--aio-sync-messages", "30", "--rate", "300", "--rate-seconds", "1",
                          "--floor-round-trips", "0"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr
    (folder / "ordq_A.out").write_text(run.stdout)
    (folder / "redis.out").write_text(json.dumps(REDIS))
    out = subprocess.run([sys.executable, "-m", "bench.peers_table", str(folder), "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    ordq, redis = answer["rows"]
    assert [(g["run"], g["peer"], g["met"] is not None) for g in answer["goals"]] == \
        [("ordq A", "Redis", True), ("ordq A", "Redis", True)]  # both judged against the one peer here
    assert ordq["system"] == "ordq A" and redis["system"] == "Redis" and redis["sync_asyncio_sends_s"] is None
    missing = [c for c in peers_table.COLUMNS if ordq.get(c) is None]  # every column: ordq has all
    assert ordq["sync_reader"] is True
    assert not missing, f"bench_e2e's output gave no {missing}:\n{run.stdout}"
    assert ordq["steady_cpu_us_msg"] == pytest.approx(ordq["steady_cores"] / 300 * 1e6)
    table = subprocess.run([sys.executable, "-m", "bench.peers_table", str(folder)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["SYSTEM", "PIPE/S", "PIPE_US"]
    assert [line.split()[0] for line in table.stdout.splitlines()[1:3]] == ["ordq", "Redis"], table.stdout
