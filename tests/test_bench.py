"""Every benchmark in bench/ runs through all its phases, at a tiny size: a bench that crashes
is a failing test (bench_e2e's latency phase once crashed on a new subscription at 'latest'
and nobody saw it until a number was needed). These check that they run and print their
figures, not the figures themselves (docs/BENCHMARKS.md records those, with the commands).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.zk

def bench(name: str, args: list[str], expect: list[str], *marks: pytest.MarkDecorator, id: str | None = None) -> object:
    return pytest.param(name, args, expect, id=id or name, marks=marks)


# bench module, tiny arguments, fragments its output must hold (one per phase)
BENCHES = [
    bench("bench_e2e", ["--messages", "2000", "--sync-messages", "50", "--aio-sync-messages", "50", "--rate", "500",
                        "--rate-seconds", "1"],
          ["host: ", "; Python 3.", "floor of one acked send", "x the floor on the lean links", "pipelined:",
           "synchronous:",
           "CPU per send: master",
           "synchronous (asyncio, the producer's I/O on the caller's loop):", "goal: synchronous sends/s, asyncio",
           "steady 500 msgs/s", "CPU per batch", "µs a message", "stream writes per batch", "of them on its loop",
           "master request-time charges",
           "goal: synchronous sends/s", "goal: end-to-end p99", "goal: CPU per batch",
           "goal: pipelined"]),
    # where the steady phase's batches spend their time: every stage of the path reached (padded row),
    # sampled (one batch in 2: the same batches in every process) and each hop timed
    # (the asyncio sends after the steady phase are not counted in it)
    bench("bench_e2e", ["--messages", "0", "--sync-messages", "0", "--aio-sync-messages", "20", "--rate", "300",
                        "--rate-seconds", "1", "--floor-round-trips", "0", "--stages", "2", "--commit-every", "100000",
                        "--freeze-gc"],
          ["stages of the steady phase's batches", *(f"\n{stage}  " for stage in (
              "P.open", "P.take", "P.write", "M.request", "M.placed", "M.forward", "M.sync", "M.synced", "S.request",
              "S.sync", "S.synced", "S.answer", "M.ack", "M.slave_answer", "M.read", "P.acked", "P.resolved", "C.read",
              "C.poll")),
           "M.sync > M.synced: n ", "batches sampled (one in 2)", "\nP.take > M.request: → the master's receipt ",
           "\nM.ack > M.read: the master's ack → its Read answer built ",
           "\nS.answer > M.slave_answer: the slave's answer → at the master (its LAC moves) ",
           "\nM.slave_answer > M.read: → the master's Read answer built ", "\nM.read > C.read: ",
           "\nM.ack > C.read: ", "\nP.open > C.poll: end to end"], id="bench_e2e_stages"),
    # the consumer with a token of its own: its reads contended beside the producer's token; no
    # floor measured, so the synchronous goal is not judged (it said "NOT met" against NaN)
    bench("bench_e2e", ["--messages", "2000", "--sync-messages", "20", "--aio-sync-messages", "0", "--rate", "300",
                        "--rate-seconds", "1", "--floor-round-trips", "0", "--token", "--consumer-token"],
          ["pipelined:", "steady 300 msgs/s", "synchronous:", "goal >= 0.8x the floor (nan): no floor measured"],
          id="bench_e2e_consumer_token"),
    # plaintext brokers and clients: what TLS costs, beside peers measured without it; the
    # synchronous phases with no consumer reading, as before stop 103
    bench("bench_e2e", ["--messages", "500", "--sync-messages", "20", "--aio-sync-messages", "20", "--rate", "300",
                        "--rate-seconds", "1", "--floor-round-trips", "0", "--insecure", "--sync-alone"],
          ["pipelined:", "synchronous, no consumer reading:",
           "synchronous (asyncio, the producer's I/O on the caller's loop), no consumer reading:",
           "steady 300 msgs/s"], id="bench_e2e_insecure"),
    bench("bench_sync_many", ["--producers", "2", "--seconds", "1", "--token"],
          ["2 producers, synchronous, 1 s:", "CPU per send: master", "master's group commits:"]),
    bench("bench_roll", ["--seconds", "3", "--every", "1", "--rate", "500"],
          ["rolls (to same)", "roll call", "send->ack, sent within", "send->ack, other times"]),
    bench("bench_broker", ["--messages", "5000", "--sync-messages", "50", "--tls", "both"],
          ["tls pipelined", "plaintext pipelined", "tls synchronous", "plaintext synchronous"]),
    bench("bench_abandoned", ["--streams", "5"], ["master RSS:", "a real producer meanwhile"]),
    # one token's burst of streams beside a neighbour queue, aimed at its broker and at another
    bench("bench_neighbour_burst", ["--bursts", "2", "--rate", "300"],
          ["same (g1's master), 1 bursts", "other (g2's master), 1 bursts", "quiet, the second before: ",
           "first 250 ms: ", "rest of the hold: "]),
    # Two clusters and a mirror process (~1-2 min here): slow only.
    bench("bench_mirror", ["--backlog", "500", "--rate", "300", "--seconds", "1"], ["catch-up:", "end-to-end lag"],
          pytest.mark.slow),
    bench("bench_floor", ["--round-trips", "100", "--syncs", "50"],
          ["round trip", "lean round trip", "fdatasync", "two fdatasyncs let go together", "floor with both replicas",
           "floor on the lean links", "a synchronous send's cadence", "floor on the lean links with that sync"]),
    bench("bench_floor", ["--disk", "--syncs", "20"],
          [f"fdatasync of 1 KiB, {kind}{churn}: p50" for kind in ("append", "fallocated", "overwrite")
           for churn in ("", ", beside a rewrite", ", beside writes and deletes")], id="bench_floor_disk"),
    # a cluster's commands need --zk (docs/BENCHMARKS.md runs them); --only as the window's runs use it
    bench("bench_cli", ["--runs", "2", "--only", "help"], ["ordq --help"]),
    bench("bench_log", ["--messages", "5000", "--repeat", "1"], ["msgs/s"]),
    bench("bench_removal", ["--mib", "20", "--rounds", "1"],
          ["steps of 8 MiB", "unlink 20 MiB: removal", "steps  20 MiB: removal", "fdatasyncs during it"]),
    bench("bench_loop_lag", ["--periods-ms", "5,20", "--seconds", "0.3"],
          ["probe every 5 ms:", "probe every 20 ms (the default):"]),
    bench("bench_read_answers", ["--answers", "200", "--rate", "0", "--runs", "1"],
          ["loop CPU", "timers", "budget grants", "request-time charges"]),
    bench("bench_list_rows", ["--queues", "300", "--repeat", "1"],
          ["rows: median", "JSON text: median", "handler (rows as dicts, then their JSON): median",
           "handler (each row's text at once, row_texts): median"]),
    bench("bench_moves_gc", ["--queues", "500", "--passes", "1", "--rounds", "1"],
          ['"mode": "on"', '"mode": "held"', '"mode": "freeze"', '"collections_during"']),
    bench("bench_plan", ["--queues", "300", "--runs", "1"], ["plan of 300 moves:", "µs a move", "median"]),
    bench("bench_leases",
          ["--queues", "3", "--clients", "2", "--window", "1", "--takeovers", "1", "--idle-consumers", "2"],
          ["idle: ", "held: ", "idle_consumers: ", "describes_per_s", "takeover_ms: "]),
    bench("bench_spread_gc", ["--queues", "500", "--passes", "1", "--rounds", "1"],
          ['"mode": "default"', '"mode": "spaced"', '"passes_took"']),
    bench("bench_index", ["--messages", "20000", "--segments", "2", "--keys", "2000", "--lookups", "10"],
          ["% of the segment", "seal-time build+write", "| key, warm", "| time, cold"]),
    bench("bench_failover", ["--kills", "1", "--messages", "1500", "--rate", "1500", "--no-verify"], ["failover"]),
    bench("bench_outbox", ["--rows", "300"], ["bare Producer:", "sqlite:", "postgres:", "mariadb binlog:",
                                              "cdc apply into postgresql, 4 workers"]),
    # Spark starts a JVM and runs every check even on a small input (~40-90 s here): slow only.
    bench("bench_verify", ["--messages", "20000", "--master", "local[1]", "--no-baselines"],
          ["verify:", "per core:"], pytest.mark.slow),
    # The same: a JVM start (~10-20 s here), slow only.
    bench("bench_stream", ["--messages", "5000"], ["consumer:", "spark source"], pytest.mark.slow),
    # ordq verify --follow's Spark session beside a producer (~1 min here): slow only.
    bench("bench_follow", ["--rate", "500", "--seconds", "3", "--drain", "120"],
          ["follower (local[2]) started", "warm-up:", "producer:", "lag over", "trend:", "verdict clean",
           "CPU s while sending"],
          pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "args", "expect"), BENCHES)
def test_bench_runs_every_phase(name: str, args: list[str], expect: list[str], tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, f"{name} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    text = out.stdout + out.stderr
    missing = [e for e in expect if e not in text]
    assert not missing, f"{name} printed none of {missing}:\n{text}"
    assert "Traceback" not in text, text


@pytest.mark.timeout(600)
def test_bench_mirror_cut_holds_the_copies_back(tmp_path: Path) -> None:
    """``bench_mirror --cut`` (docs/BENCHMARKS.md's link-cut figures): the cut drops every port
    cluster B publishes (``published_ports``: the lean links too), so B gets almost nothing while
    it lasts, and after the heal B catches up. A cut that misses a port the mirror writes to (as
    main's own port list once missed the lean produce link: 1,183 of 1,200 copies went through)
    fails here."""
    import json

    from ordq.common.errors import ConfigError
    from ordq.drills.cdc_mirror import require_link

    try:
        require_link()  # root, iptables and setpriv
    except ConfigError as exc:
        pytest.skip(str(exc))
    rate, cut = 300, 4
    out = subprocess.run([sys.executable, "-m", "bench.bench_mirror", "--backlog", "200", "--rate", str(rate),
                          "--seconds", "1", "--cut", str(cut), "--after", "4", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=540, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, f"bench_mirror exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])["cut"]
    # What was in flight when the cut began may still land (a few batches); a leaky cut lets
    # the stream through at its rate.
    assert result["copied_during_cut"] < rate * cut * 0.1, result
    assert result["backlog_at_heal"] > rate * cut * 0.5, result
    assert result["catch_up_s"] is not None, result


def test_bench_queues_times_a_listing_and_spies_after_a_kill(tmp_path: Path) -> None:
    """bench_queues' ``--list-after-kill`` and ``--spy-kill`` (issue 43's figures at 10^5, run
    in measurement windows only) at a tiny count: a bench option no test runs can crash unseen
    and lose a window. The listing is timed and complete; py-spy wrote the leader's and the
    listing's stacks. The listing's CLI told its steps' times (bench/timed_cli.py); ``--keep-logs``
    kept every process's log; the heads' moves, seals and spread were told (read by watches).

    Created in batched transactions (``--threads 0``): their spread is by each queue's place, so
    the killed group (the busy queue's head, the first queue) heads 6 of the 20 idle queues. Four
    threads at once read the same queue count now and then and skewed it: in CI the killed group
    headed none of them once (stop 99) and the tracking had nothing to track. The listing's CLI
    waits for its go until py-spy is attached: a listing that ended while py-spy attached left
    no profile (stop 101, once in the heavy tier)."""
    import json

    spy, logs = tmp_path / "spy", tmp_path / "logs"
    out = subprocess.run([sys.executable, "-m", "bench.bench_queues", "--counts", "20", "--window", "1", "--kills", "1",
                          "--threads", "0", "--idle-wait", "60", "--list-after-kill", "1", "--spy-kill", str(spy),
                          "--spy-s", "2", "--keep-logs", str(logs), "--spread-wait", "2", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, f"bench_queues exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    step = json.loads(out.stdout.splitlines()[-1])
    kill = step["kills"][0]
    listed = kill["list_after_kill"]
    assert listed["rc"] == 0 and listed["rows"] == 20 + 1 and listed["s"] > 0, listed  # the idle queues and busy
    steps = listed["steps"]
    assert 0 <= steps["started"] <= steps["ready"] <= steps["asked"] <= steps["answers"][0][0] <= steps["ended"] \
        <= listed["s"] + 1, steps
    assert steps["answers"][0][1] > 0 and len(steps["answers"]) == 1, steps
    kept = sorted(p.name for p in logs.iterdir())
    assert "coordinator-1.log" in kept and any(name.startswith("g1") for name in kept), kept
    spied = sorted(p.name for p in spy.iterdir())
    assert spied == sorted(["kill-20-0-" + kill["group"] + ".txt", "kill-20-0-" + kill["group"] + "-slave.txt",
                            "list-20-0.txt"]), spied
    # the dead group's heads and segments, tracked by watches (StateWatch): all moved, then all sealed
    assert kill["heads_at_kill"][kill["group"]] == kill["headed"] == 6, kill
    assert kill["headed"] > 0 and 0 < kill["all_moved_s"] <= kill["all_sealed_s"], kill
    assert sum(kill["spread"]["heads_at_restart"].values()) == 20, kill["spread"]  # every idle queue's head
