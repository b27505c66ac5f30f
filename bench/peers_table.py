"""One table of a ../shared/peers/perf.sh run: every system's figures side by side, with the CPU
each spent per message. Not a measurement of its own: it reads what perf.sh left in its folder.

    .venv/bin/python -m bench.peers_table PEERS_OUT [--json]

PEERS_OUT is perf.sh's folder (``PEERS_OUT=...``): ``redis.out``, ``nats.out`` and
``rabbit.out`` (the peers' harness, JSON) and ``ordq_A.out`` / ``ordq_B.out`` (bench_e2e's
lines); a system whose file is missing is left out.

Why the CPU: issue 39 asks for at most 1.5 ms of CPU per batch at a steady 2,000 msgs/s, a
figure that moves ~2x with the host (docs/BENCHMARKS.md, stop 102). The peers' harness measures
the CPU of every system in the same minutes (the producer and consumer processes over their
timed spans, the servers over the producer's life), so the table puts ordq's beside theirs:
CPU per message = the processes' share of one core / messages per second. ordq's pipelined
CPU is counted until the last ack (bench_e2e's "CPU per message (until acked)"), the others'
until the last delivery. bench_e2e counts ZooKeeper and the coordinator in ordq's; Redis acks
from memory (WAIT for a copy on its replica, no fsync), NATS and RabbitMQ fsync.

Below the table, issue 39's two goals that need the peers' figures, judged for each ordq run: a
synchronous send ahead of Redis's (the better of ordq's two producers) and a steady end-to-end
p99 below every peer's. bench_e2e judges the goals of ordq alone (the floor, 4 ms, 1.5 ms of CPU
a batch) on its own last lines. ``--json`` gives ``{"rows": [...], "goals": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from ordq.output import emit_json, table

PEERS = (("redis", "Redis"), ("nats", "NATS"), ("rabbit", "RabbitMQ"))
ORDQ_RUNS = (("ordq_A", "ordq A"), ("ordq_B", "ordq B"))

# Each figure's name (in --json) and its header in the people's table (short: it fits a terminal).
HEADERS = {"system": "system", "pipelined_msgs_s": "pipe/s", "pipelined_cpu_us_msg": "pipe_us",
           "sync_sends_s": "sync/s", "sync_cpu_us_send": "sync_us", "sync_asyncio_sends_s": "aio_sync/s",
           "sync_reader": "reader", "steady_p99_ms": "p99_ms", "steady_cores": "cores",
           "steady_cpu_us_msg": "steady_us"}
COLUMNS = tuple(HEADERS)

LEGEND = ("pipe: pipelined, end to end; sync: synchronous sends (aio: ordq's AsyncProducer; reader: a consumer "
          "read meanwhile, as the peers' harness has one, which bench_e2e before stop 103 did not); p99, cores (of "
          "one core) and steady: at the steady rate. _us: CPU per message (or send) of all the system's processes "
          "(producer, consumer, servers; ordq's also ZooKeeper and the coordinator).")


def per_message_us(cores_pct: float | None, rate: float | None) -> float | None:
    """CPU per message in µs from the share of one core (%) the processes used at ``rate``/s."""
    if cores_pct is None or not rate:
        return None
    return cores_pct / 100 / rate * 1e6


def peer_row(name: str, d: dict[str, Any]) -> dict[str, Any]:
    """A peer's row from its harness JSON (the medians of its runs)."""
    def phase(key: str) -> tuple[float | None, float | None]:
        p = d.get(key) or {}
        parts = [p.get(f"{who}_cpu_pct_median") for who in ("producer", "consumer", "servers")]
        cores = None if None in parts else float(sum(x for x in parts if x is not None))
        return p.get("producer_msgs_per_s_median"), cores

    (a_rate, a_cores), (b_rate, b_cores), (c_rate, c_cores) = phase("a_async"), phase("b_sync"), phase("c_latency")
    return {"system": name, "pipelined_msgs_s": a_rate, "pipelined_cpu_us_msg": per_message_us(a_cores, a_rate),
            "sync_sends_s": b_rate, "sync_cpu_us_send": per_message_us(b_cores, b_rate),
            "sync_asyncio_sends_s": None,  # the harness runs one client a system
            "sync_reader": b_rate is not None,  # its consumer reads in every phase
            "steady_p99_ms": (d.get("c_latency") or {}).get("lat_p99_ms_median"),
            "steady_cores": None if c_cores is None else c_cores / 100,
            "steady_cpu_us_msg": per_message_us(c_cores, c_rate)}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _first(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text, re.MULTILINE)


def ordq_row(name: str, text: str) -> dict[str, Any]:
    """ordq's row from bench_e2e's output: the pipelined end-to-end rate, the threaded Producer's
    synchronous sends (the CPU of that phase, printed since stop 103), the AsyncProducer's (a
    column of its own: the peers' harness runs one client each) and the steady phase."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS) | {"system": name}  # a figure not printed stays None
    if m := _first(r"^pipelined: .* end to end \(first send to last delivery\) ([\d,]+) msgs/s", text):
        row["pipelined_msgs_s"] = _number(m.group(1))
    if m := _first(r"^CPU per message \(until acked\): .*; total ([\d,]+) µs", text):
        row["pipelined_cpu_us_msg"] = _number(m.group(1))
    sync = r"^synchronous(, no consumer reading)?: ([\d,]+) sends/s.*\n(CPU per send: .*; total ([\d,]+) µs)?"
    if m := _first(sync, text):
        row["sync_sends_s"] = _number(m.group(2))
        if m.group(4):
            row["sync_cpu_us_send"] = _number(m.group(4))
        # a consumer read meanwhile, as the peers' harness has one: bench_e2e since stop 103
        # (it prints the phase's CPU since then), unless run with --sync-alone
        row["sync_reader"] = m.group(1) is None and m.group(3) is not None
    if m := _first(r"^synchronous \(asyncio, [^)]*\)(?:, no consumer reading)?: ([\d,]+) sends/s", text):
        row["sync_asyncio_sends_s"] = _number(m.group(1))
    steady = _first(r"^steady ([\d,]+) msgs/s .*end-to-end latency p50 [\d.]+ ms, p99 ([\d.]+) ms.*\n"
                    r"CPU per batch: .*\((\d+)% of one core", text)
    if steady:
        rate, cores_pct = _number(steady.group(1)), _number(steady.group(3))
        row.update(steady_p99_ms=_number(steady.group(2)), steady_cores=cores_pct / 100,
                   steady_cpu_us_msg=per_message_us(cores_pct, rate))
    return row


def rows(folder: Path) -> list[dict[str, Any]]:
    out = []
    for stem, name in ORDQ_RUNS:
        if (folder / f"{stem}.out").exists():
            out.append(ordq_row(name, (folder / f"{stem}.out").read_text()))
    for stem, name in PEERS:
        path = folder / f"{stem}.out"
        if path.exists():
            try:
                results = json.loads(path.read_text())
            except ValueError as exc:  # perf.sh still running, or stopped in that peer
                raise UnreadableResults(f"{path} is not the peers' harness JSON ({exc})") from None
            out.append(peer_row(name, results))
    return out


def goals(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 39's goals against the peers, for each ordq run of ``found`` (``rows``): ``met`` is
    None where a figure is missing (a phase not run, a peer not in the folder)."""
    ordq_runs = {name for _, name in ORDQ_RUNS}
    peers = [r for r in found if r["system"] not in ordq_runs]
    redis = next((r for r in peers if r["system"] == "Redis"), None)
    tails = [r for r in peers if r["steady_p99_ms"] is not None]
    lowest = min(tails, key=lambda r: r["steady_p99_ms"]) if tails else None
    out = []
    for r in (r for r in found if r["system"] in ordq_runs):
        sends = [v for v in (r["sync_sends_s"], r["sync_asyncio_sends_s"]) if v is not None]
        best = max(sends) if sends else None
        theirs = None if redis is None else redis["sync_sends_s"]
        out.append({"run": r["system"], "goal": "synchronous send ahead of Redis's", "ordq": best,
                    "peer": "Redis", "peer_figure": theirs,
                    "met": None if best is None or theirs is None else best > theirs})
        p99 = r["steady_p99_ms"]
        out.append({"run": r["system"], "goal": "steady end-to-end p99 below every peer's", "ordq": p99,
                    "peer": None if lowest is None else lowest["system"],
                    "peer_figure": None if lowest is None else lowest["steady_p99_ms"],
                    "met": None if p99 is None or lowest is None else p99 < lowest["steady_p99_ms"]})
    return out


def _goal_line(g: dict[str, Any]) -> str:
    """One goal's verdict for people."""
    ms = "p99" in g["goal"]

    def shown(v: float) -> str:
        return f"{v:.2f} ms" if ms else f"{v:,.0f}/s"
    if g["met"] is None:
        return f"issue 39, {g['run']}: {g['goal']}: not measured"
    ratio = g["ordq"] / g["peer_figure"] if g["peer_figure"] else float("nan")
    return (f"issue 39, {g['run']}: {g['goal']}: {shown(g['ordq'])} against {g['peer']}'s "
            f"{shown(g['peer_figure'])} ({ratio:.2f}x): {'met' if g['met'] else 'NOT met'}")


class UnreadableResults(Exception):
    """A result file of the folder cannot be read."""


def _shown(r: dict[str, Any]) -> dict[str, Any]:
    """Rounded for people: rates and µs whole, ms and cores to two places."""
    def fmt(k: str, v: Any) -> Any:
        if v is None or k == "system":
            return v
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:.2f}" if k in ("steady_p99_ms", "steady_cores") else f"{v:,.0f}"
    return {HEADERS[k]: fmt(k, v) for k, v in r.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="perf.sh's PEERS_OUT folder")
    ap.add_argument("--json", action="store_true", help="the rows as JSON (unrounded)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"peers_table: {args.folder} is not a folder (perf.sh's PEERS_OUT)", file=sys.stderr)
        return 2
    try:
        found = rows(args.folder)
    except UnreadableResults as exc:
        print(f"peers_table: {exc}", file=sys.stderr)
        return 2
    if not found:
        print(f"peers_table: {args.folder} holds none of perf.sh's results "
              f"({', '.join(s + '.out' for s, _ in ORDQ_RUNS + PEERS)})", file=sys.stderr)
        return 2
    judged = goals(found)
    if args.json:
        emit_json({"rows": found, "goals": judged})
    else:
        table([_shown(r) for r in found], list(HEADERS.values()))
        print(textwrap.fill(LEGEND, 100))
        for g in judged:
            print(_goal_line(g))
    return 0


if __name__ == "__main__":
    sys.exit(main())
