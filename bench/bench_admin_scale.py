"""Operating many queues (issue 43): creation, listing, the coordinator's pages, status, and
bringing a killed master back with what ``ordq up`` does. Not a test: prints numbers for
docs/BENCHMARKS.md ("Operating 10^4 and 10^5 queues").

    .venv/bin/python -m bench.bench_admin_scale [--counts 1000,10000] [--create cli|threads] [--json]

One local cluster (``ordq.local_cluster``: one ZooKeeper, 3 broker groups, 2 coordinators, TLS,
tokens), grown to each count of idle queues. At each count:

- creation: ``cli`` = ``ordq queue create --names-from FILE`` (batched transactions through the
  admin API); ``threads`` = ``ZkStore.create_queue`` one queue at a time on ``--threads``
  threads (what bench_queues does, and the only way before issue 43);
- the elected coordinator's /metrics page (bytes, seconds to fetch) and its /health page (when
  it serves one);
- ``ordq --json queue list --limit COUNT+1`` (every queue) and ``ordq status``, in this process;
- ``--restarts`` times: g1's master killed (SIGKILL), then ``LocalCluster.start`` (what
  ``ordq up`` runs: start what is not running, wait until healthy), timed; the coordinator's
  thread count before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_queues import create_queues
from ordq.cli import main as ordq_main
from ordq.cluster_config import ClusterConfig
from ordq.local_cluster import LocalCluster


def cli_base(cluster: LocalCluster) -> list[str]:
    """The ``ordq`` options that reach ``cluster`` as its admin."""
    return ["--zk", cluster.zk_hosts, "--root", cluster.root, "--zk-auth", str(cluster.admin_auth),
            "--zk-timeout", "600"]


def cli(cluster: LocalCluster, *argv: str) -> tuple[int, str, float]:
    base = cli_base(cluster)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = ordq_main([*base, *argv])
    took = time.monotonic() - started
    if rc != 0:
        print(f"ordq {' '.join(argv[:3])}: exit {rc}: {err.getvalue()[-500:]}", file=sys.stderr)
    return rc, out.getvalue(), took


def fetch(url: str, timeout_s: float = 120.0) -> tuple[int, float] | None:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own http URL
            size = len(r.read())
    except OSError:
        return None
    return size, round(time.monotonic() - started, 3)


def leader_url(cluster: LocalCluster) -> tuple[str, str] | None:
    """The elected coordinator and its metrics URL, read with a long timeout (before issue 43
    a health check gave up after 1 s on a page of ~300 B a queue)."""
    for proc in cluster.coordinators:
        url = cluster.metrics_url(proc.name)
        if not url:
            continue
        try:
            with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 - our own http URL
                if b"ordq_coordinator_leader 1" in r.read():
                    return proc.name, url
        except OSError:
            continue
    return None


def threads_of(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def step(cluster: LocalCluster, count: int, have: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"queues": count, "load_start": round(os.getloadavg()[0], 2)}
    names = [f"idle-{i:06d}" for i in range(have, count)]
    if args.create == "cli":
        listing = folder / f"names-{count}.txt"
        listing.write_text("\n".join(names) + "\n")
        rc, _, took = cli(cluster, "queue", "create", "--names-from", str(listing))
        out["create"] = {"rc": rc, "n": len(names), "s": round(took, 1), "per_s": round(len(names) / took, 1)}
    else:
        with cluster.store() as store:
            took = create_queues(store, names, args.threads)
        out["create"] = {"n": len(names), "s": round(took, 1), "per_s": round(len(names) / took, 1)}
    out["load_after_create"] = round(os.getloadavg()[0], 2)
    # the leader's copy takes the new queues in: wait until its list answers every queue
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(5)
        lead = leader_url(cluster)
        if lead is not None:
            break
    time.sleep(args.settle)
    lead = leader_url(cluster)
    if lead is not None:
        name, url = lead
        base = url.rsplit("/", 1)[0]
        out["leader"] = name
        out["metrics_page"] = fetch(url)
        out["health_page"] = fetch(base + "/health", timeout_s=10)
        pid = next((p.pid for p in cluster.coordinators if p.name == name), None)
        out["leader_threads"] = threads_of(pid)
    rc, text, took = cli(cluster, "--json", "queue", "list", "--limit", str(count + 10))
    rows = json.loads(text) if rc == 0 and text else []
    out["list"] = {"rc": rc, "rows": len(rows), "s": round(took, 2), "bytes": len(text)}
    rc, _, took = cli(cluster, "status", "--dir", str(cluster.folder))
    out["status"] = {"rc": rc, "s": round(took, 2)}
    restarts = []
    for _ in range(args.restarts):
        pid = next((p.pid for p in cluster.coordinators if out.get("leader") == p.name), None)
        before = threads_of(pid)
        cluster.broker("g1", "master").kill()
        started = time.monotonic()
        try:
            cluster.start(timeout_s=600)
            ok = True
        except Exception as exc:  # noqa: BLE001 - a number, not a crash
            ok = False
            print(f"restart failed: {exc!r}"[:500], file=sys.stderr)
        restarts.append({"ok": ok, "s": round(time.monotonic() - started, 1), "load": round(os.getloadavg()[0], 2),
                         "coordinator_threads": [before, threads_of(pid)]})
    out["restarts"] = restarts
    out["load_end"] = round(os.getloadavg()[0], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1000", help="idle queue counts, ascending")
    ap.add_argument("--create", choices=("cli", "threads"), default="cli")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after creation before measuring")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="ordq-bench-admin-"))
    cluster = LocalCluster(folder / "c", ClusterConfig(groups=3, zk_nodes=1, coordinators=2))
    try:
        cluster.start()
        have = 0
        for count in [int(c) for c in args.counts.split(",")]:
            result = step(cluster, count, have, args, folder)
            have = count
            print(json.dumps(result) if args.json else result, flush=True)
    finally:
        cluster.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
