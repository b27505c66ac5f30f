"""The status page's history read from Prometheus (ordq/admin/prom_history.py), the pure part:
the query_range answer parsed, aligned on the page's grid, cached, and refused clearly. The
real Prometheus is in tests/test_status_prometheus.py (heavy)."""

from __future__ import annotations

import json
import socket
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.admin.prom_history import (
    QUERIES,
    PrometheusUnavailable,
    PromHistory,
    align,
    check_url,
    fetch_json,
    grid,
    parse_matrix,
    range_url,
    series,
)
from ordq.common.errors import ConfigError


def matrix(*series_values: list[tuple[float, str]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"i": str(i)}, "values": [[t, v] for t, v in values]} for i, values in enumerate(series_values)]}
    }).encode()


def test_a_matrix_is_summed_per_timestamp_in_time_order_and_nan_left_out() -> None:
    body = matrix([(20.0, "1.5"), (10.0, "2")], [(10.0, "3"), (30.0, "NaN")])
    assert parse_matrix(body) == [(10.0, 5.0), (20.0, 1.5)]
    assert parse_matrix(matrix()) == []


@pytest.mark.parametrize("body, says", [
    (b"<html>", "no JSON"),
    (b"[]", "no JSON object"),
    (json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode(),
     "bad_data: parse error"),
    (json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(), "no matrix"),
    (json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [{"values": [[1]]}]}}).encode(),
     "a point"),
])
def test_what_is_not_an_answer_is_refused_saying_why(body: bytes, says: str) -> None:
    with pytest.raises(PrometheusUnavailable, match=says):
        parse_matrix(body)


def test_the_grid_and_the_alignment_leave_gaps_where_prometheus_had_nothing() -> None:
    times = grid(100.0, 130.0, 10.0)
    assert times == [100.0, 110.0, 120.0, 130.0]
    assert align([(110.0, 7.0), (130.0, 1.0), (135.0, 9.0)], times) == [None, 7.0, None, 1.0]
    assert grid(10.0, 0.0, 10.0) == []


@given(st.integers(0, 400), st.lists(st.tuples(st.integers(0, 360), st.floats(0, 1e9)), max_size=50))
def test_every_point_on_the_grid_lands_on_its_time(start: int, points: list[tuple[int, float]]) -> None:
    start_s = 1_700_000_000.0 + start
    times = grid(start_s, start_s + 3600, 10.0)
    assert len(times) == 361
    on_grid = {start_s + 10.0 * i: v for i, v in points}
    out = align(sorted(on_grid.items()), times)
    assert [v for v in out if v is not None] == [on_grid[t] for t in times if t in on_grid]


def test_series_has_the_ring_buffers_shape_and_names_what_is_missing() -> None:
    out = series({"produce": [(10.0, 4.0)], "consume": [(20.0, 2.0)], "lag": []}, 0.0, 20.0, 10.0)
    assert out["t_ms"] == [0, 10_000, 20_000]
    assert out["queues"]["*"] == {"produce": [None, 4.0, None], "consume": [None, None, 2.0],
                                  "lag": [None, None, None]}
    assert len(out["missing"]) == 1 and "ordq_consumer_lag_messages" in out["missing"][0]


def test_a_url_must_name_an_http_server() -> None:
    assert check_url(" http://127.0.0.1:9090/ ") == "http://127.0.0.1:9090"
    for bad in ("127.0.0.1:9090", "ftp://x", "http://"):
        with pytest.raises(ConfigError, match="--prometheus-url"):
            check_url(bad)
    url = range_url("http://p:9090", 'sum(x{a="b"})', 0.0, 3600.0, 10.0)
    args = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert url.startswith("http://p:9090/api/v1/query_range?")
    assert args == {"query": ['sum(x{a="b"})'], "start": ["0.000"], "end": ["3600.000"], "step": ["10"]}


def test_answers_are_kept_a_while_and_a_dead_prometheus_is_not_asked_at_every_redraw() -> None:
    now = [1_000_005.0]
    asked: list[str] = []
    dead = [False]

    def fetch(url: str, timeout_s: float) -> bytes:
        asked.append(url)
        if dead[0]:
            raise PrometheusUnavailable("no answer: connection refused")
        return matrix([(1_000_000.0, "3")])

    prom = PromHistory("http://p:9090", cache_s=5.0, retry_s=10.0, clock=lambda: now[0], fetch=fetch)
    first = prom.get()
    assert len(asked) == len(QUERIES) and first["source"] == "prometheus"
    assert first["t_ms"][-1] == 1_000_000_000 and first["queues"]["*"]["produce"][-1] == 3.0  # aligned to the step
    assert len(first["t_ms"]) == 361
    now[0] += 4.0
    assert prom.get() is first and len(asked) == len(QUERIES)  # kept
    now[0] += 2.0
    dead[0] = True
    with pytest.raises(PrometheusUnavailable, match="connection refused"):
        prom.get()
    n = len(asked)
    now[0] += 9.0
    with pytest.raises(PrometheusUnavailable):
        prom.get()
    assert len(asked) == n  # not asked again within retry_s
    dead[0] = False
    now[0] += 1.5
    assert prom.get()["source"] == "prometheus" and len(asked) == n + len(QUERIES)


def test_a_closed_port_is_no_answer_at_once() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(PrometheusUnavailable, match="no answer"):
            fetch_json(f"http://127.0.0.1:{port}/api/v1/query_range?query=up", 2.0)


def test_the_url_reaches_the_coordinators_and_a_bad_one_is_one_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from ordq.cli import main
    from ordq.cluster_config import ClusterConfig
    from ordq.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=1, coordinators=2,
                                                         prometheus_url="http://127.0.0.1:9090"))
    for proc in cluster.coordinators:  # what `ordq up --prometheus-url` starts them with
        argv = list(proc.argv)
        assert argv[argv.index("--prometheus-url") + 1] == "http://127.0.0.1:9090"
    assert "--prometheus-url" not in LocalCluster(tmp_path / "d", ClusterConfig(groups=1)).coordinators[0].argv
    for argv in (["coordinator", "run", "--prometheus-url", "127.0.0.1:9090"],
                 ["up", "--dir", str(tmp_path / "e"), "--prometheus-url", "ftp://p"]):
        capsys.readouterr()
        assert main(["--zk", "127.0.0.1:1", *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("ordq: error: --prometheus-url") and "http://HOST:PORT" in err, err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "e").exists()  # refused before anything was made
