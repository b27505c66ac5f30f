"""Metrics and health at 10^5 queues (issue 43), without ZooKeeper: the coordinator's /metrics
page keeps per-queue series for the top N queues only and stays under 200 KB; its /health page
is a few hundred bytes whatever the queue count; the HTTP server of every process keeps a bounded
number of request threads however many callers give up on it."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request

from hypothesis import given
from hypothesis import strategies as hs

from ordq.common.metrics import MAX_HANDLERS, serve
from ordq.coordinator.metrics import CoordinatorMetrics, DaemonStats, top_queues
from tests.util import wait_until

QUEUES = 100_000


def stats_of(n: int) -> DaemonStats:
    st = DaemonStats(is_leader=True)
    for i in range(n):
        st.set_queue(f"idle-{i:06d}", {"send": ["g1", "g2", "g3"], "segments": 1, "epoch": 0,
                                      "live_groups": ["g1", "g2", "g3"], "sealing": 0, "not_live": 0})
    return st


def test_the_page_at_10_5_queues_stays_under_200_kb_and_names_what_needs_looking_at() -> None:
    st = stats_of(QUEUES)
    st.set_queue("idle-050000", {**st.queues["idle-050000"], "not_live": 1})  # on a dead group
    written = {"idle-099999": 5.0, "idle-000007": 9.0}
    metrics = CoordinatorMetrics(st, written=lambda: written)
    body = metrics.page()[1]
    assert len(body) < 200_000, len(body)
    text = body.decode()
    named = {line.split('queue="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("ordq_queue_segments{")}
    assert len(named) == 100
    assert {"idle-050000", "idle-099999", "idle-000007"} <= named  # trouble, then the written ones
    assert "ordq_coordinator_queues 100000.0" in text
    assert "ordq_coordinator_queues_not_live 1.0" in text
    assert "ordq_coordinator_queues_with_series 100.0" in text
    health = metrics.health()[1]
    assert len(health) < 500 and json.loads(health)["queues"] == QUEUES and json.loads(health)["leader"] is True


def test_every_queue_or_none_when_asked() -> None:
    st = stats_of(300)
    every = CoordinatorMetrics(st, per_queue_series=None).page()[1].decode()
    assert every.count("ordq_queue_segments{") == 300
    none = CoordinatorMetrics(st, per_queue_series=0).page()[1].decode()
    assert "ordq_queue_segments{" not in none and "ordq_coordinator_queues 300.0" in none


def test_a_standby_exports_no_queue() -> None:
    st = stats_of(10)
    st.is_leader = False
    page = CoordinatorMetrics(st).page()[1].decode()
    assert "ordq_queue_segments{" not in page and "ordq_coordinator_queues 0.0" in page


NAMES = [f"q{i:02d}" for i in range(40)]


@given(hs.dictionaries(hs.sampled_from(NAMES),  # cheap to draw: the box may be busy (too_slow)
                       hs.tuples(hs.booleans(), hs.booleans(), hs.one_of(hs.none(), hs.integers(0, 100))),
                       max_size=30),
       hs.one_of(hs.none(), hs.integers(0, 40)))
def test_top_queues_takes_trouble_first_then_the_most_recently_written(
        raw: dict[str, tuple[bool, bool, int | None]], n: int | None) -> None:
    queues = {q: {"not_live": int(a), "sealing": int(b)} for q, (a, b, _) in raw.items()}
    written = {q: float(w) for q, (_, _, w) in raw.items() if w is not None}
    chosen = top_queues(queues, written, n)
    assert chosen == sorted(chosen) and len(set(chosen)) == len(chosen)
    assert len(chosen) == (len(queues) if n is None else min(n, len(queues)))

    def rank(q: str) -> tuple[bool, float, str]:
        d = queues[q]
        return (not (d["not_live"] or d["sealing"]), -written.get(q, float("-inf")), q)

    left = set(queues) - set(chosen)
    if chosen and left:  # nothing left out ranks before anything chosen
        assert max(rank(q) for q in chosen) < min(rank(q) for q in left)


def test_callers_that_give_up_leave_no_pile_of_threads() -> None:
    """Issue 43: health checks that timed out on a slow page left 164 threads in a coordinator.
    With every handler stuck on a slow page, more connections are closed at once."""
    release = threading.Event()

    def slow() -> tuple[str, bytes]:
        release.wait(30)
        return "text/plain", b"late"

    server = serve(__import__("prometheus_client").CollectorRegistry(), pages={"/slow": slow})
    before = threading.active_count()
    socks = []
    try:
        for _ in range(3 * MAX_HANDLERS):
            s = socket.create_connection(("127.0.0.1", int(server.url.split(":")[2].split("/")[0])), timeout=5)
            s.sendall(b"GET /slow HTTP/1.0\r\n\r\n")
            socks.append(s)
        wait_until(lambda: server.refused >= 2 * MAX_HANDLERS, timeout_s=30, what="the extra connections refused")
        assert threading.active_count() - before <= MAX_HANDLERS
    finally:
        release.set()
        for s in socks:
            s.close()
    wait_until(lambda: threading.active_count() <= before, timeout_s=30, what="the handlers to end")
    with urllib.request.urlopen(server.url, timeout=5) as resp:  # and it serves again
        assert resp.status == 200
    server.close()
