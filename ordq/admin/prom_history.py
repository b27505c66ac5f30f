"""Rates and lag over time from an operator's Prometheus, for the status page's charts (issue 42:
``ordq coordinator run --prometheus-url URL``, ``ordq up --prometheus-url URL``).

The coordinator's own ring buffer (``ordq.admin.history``) holds what this process sampled since
it started, and only while someone watched the page; a Prometheus that scrapes the cluster holds
the last hour whatever happened to the coordinator. With one configured the charts come from its
HTTP API (``/api/v1/query_range``, the last hour at ``step_s``); when it does not answer, or
answers with an error, the page says so in one line and draws the ring buffer instead.

What is asked (``QUERIES``), summed over the cluster as the charts show it:
- produced: messages the masters stored from producers (``ordq_broker_produce_messages_total``);
- consumed: messages the brokers returned to readers (``ordq_broker_fetch_messages_total``: a
  consumer's reads, and also a mirror's, ``ordq peek``'s and re-reads after a rejoin);
- lag: ``ordq_consumer_lag_messages`` of the consumers that export metrics (``metrics_listen``);
  none when no consumer does, and the page says so.

Rules: the HTTP call is ``fetch_json`` (urllib, a bounded timeout); what is parsed and aligned is
pure (``parse_matrix``, ``align``, ``series``), tested without I/O. ``PromHistory`` keeps the last
answer for ``cache_s`` and, after a failure, does not ask again for ``retry_s``: a page that
redraws every second must neither hammer Prometheus nor wait on a dead one at every redraw.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from ordq.common.errors import ConfigError, OrdqError

WINDOW_S = 3600.0  # the last hour, as the ring buffer
STEP_S = 10.0
TIMEOUT_S = 2.0  # per query: a page redraw must not wait longer on a dead Prometheus
# The rate window: four scrapes at a 30 s scrape interval (Prometheus' advice: at least four).
RATE_WINDOW = "2m"
QUERIES: Mapping[str, str] = {
    "produce": f'sum(rate(ordq_broker_produce_messages_total{{role="master"}}[{RATE_WINDOW}]))',
    "consume": f"sum(rate(ordq_broker_fetch_messages_total[{RATE_WINDOW}]))",
    "lag": "sum(ordq_consumer_lag_messages)",
}
# What the page says when a query has no series at all (the chart stays empty for it).
MISSING: Mapping[str, str] = {
    "produce": "no broker series (ordq_broker_produce_messages_total): does it scrape the brokers' /metrics?",
    "consume": "no broker series (ordq_broker_fetch_messages_total): does it scrape the brokers' /metrics?",
    "lag": "no consumer lag (ordq_consumer_lag_messages): consumers export it with metrics_listen",
}


class PrometheusUnavailable(OrdqError):
    """Prometheus did not answer, or answered with an error or with something not its API's JSON."""

    retriable = True


def check_url(url: str) -> str:
    """``url`` without a trailing '/' when it is an http(s) URL with a host; ConfigError otherwise."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--prometheus-url {url!r}: expected http://HOST:PORT (Prometheus' address)")
    return url.strip().rstrip("/")


def range_url(base: str, query: str, start_s: float, end_s: float, step_s: float) -> str:
    """The ``query_range`` URL for ``query`` from ``start_s`` to ``end_s`` (Unix seconds)."""
    args = urllib.parse.urlencode({"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                   "step": f"{step_s:g}"})
    return f"{base}/api/v1/query_range?{args}"


def parse_matrix(body: bytes) -> list[tuple[float, float]]:
    """(Unix seconds, value) of a ``query_range`` answer, every series summed per timestamp, in
    time order (a ``sum(...)`` query has one series; none: []). NaN and infinite values are
    left out. PrometheusUnavailable when the answer is an error or not the API's JSON."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise PrometheusUnavailable(f"not Prometheus' API (no JSON): {exc}") from None
    if not isinstance(doc, dict):
        raise PrometheusUnavailable("not Prometheus' API (no JSON object)")
    if doc.get("status") != "success":
        raise PrometheusUnavailable(f"Prometheus answered {doc.get('errorType', 'an error')}: "
                                    f"{doc.get('error', doc.get('status'))}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PrometheusUnavailable("not Prometheus' API (no matrix in the answer)")
    summed: dict[float, float] = {}
    for series in data["result"]:
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(values, list):
            raise PrometheusUnavailable("not Prometheus' API (a series without values)")
        for point in values:
            try:
                at, value = float(point[0]), float(point[1])
            except (TypeError, ValueError, IndexError, KeyError):
                raise PrometheusUnavailable(f"not Prometheus' API (a point {point!r})") from None
            if math.isfinite(value) and math.isfinite(at):
                summed[at] = summed.get(at, 0.0) + value
    return sorted(summed.items())


def grid(start_s: float, end_s: float, step_s: float) -> list[float]:
    """The timestamps ``query_range`` evaluates: ``start_s``, ``start_s + step_s``, ... ≤ ``end_s``."""
    if step_s <= 0 or end_s < start_s:
        return []
    return [start_s + i * step_s for i in range(int((end_s - start_s) / step_s + 1e-9) + 1)]


def align(points: list[tuple[float, float]], times: list[float]) -> list[float | None]:
    """The value at each of ``times`` (None where Prometheus had none: a gap in the chart).
    A point matches a time within a millisecond (Prometheus answers the times it was asked)."""
    by_ms = {round(at * 1000): value for at, value in points}
    return [by_ms.get(round(t * 1000)) for t in times]


def series(answers: Mapping[str, list[tuple[float, float]]], start_s: float, end_s: float,
           step_s: float) -> dict[str, Any]:
    """The status page's ``history`` (as ``History.series`` gives it: ``t_ms`` and, for ``*``,
    ``produce``, ``consume`` and ``lag``) from the parsed answers of ``QUERIES``; ``missing``:
    what the page says of a query that had no point at all."""
    times = grid(start_s, end_s, step_s)
    total = {key: align(answers.get(key, []), times) for key in QUERIES}
    missing = [MISSING[key] for key in QUERIES if not answers.get(key)]
    return {"t_ms": [round(t * 1000) for t in times], "queues": {"*": total}, "missing": missing}


def fetch_json(url: str, timeout_s: float) -> bytes:
    """The body of a GET of ``url``; PrometheusUnavailable (one line saying why) when it fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 - an operator's http(s) URL
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:  # Prometheus answers a bad query 400 with its JSON error
        body = exc.read()
        try:
            parse_matrix(body)
        except PrometheusUnavailable as inner:
            raise PrometheusUnavailable(f"HTTP {exc.code}: {inner}") from None
        raise PrometheusUnavailable(f"HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusUnavailable(f"no answer: {reason}") from None


class PromHistory:
    """The charts' history read from the Prometheus at ``url``: ``get()`` gives it, or raises
    PrometheusUnavailable (the caller falls back to its ring buffer and says why). Thread-safe.
    ``clock``: Unix seconds; ``fetch``: ``fetch_json``'s signature (tests give a real server)."""

    def __init__(self, url: str, *, window_s: float = WINDOW_S, step_s: float = STEP_S,
                 timeout_s: float = TIMEOUT_S, cache_s: float = 5.0, retry_s: float = 10.0,
                 clock: Callable[[], float] = time.time,
                 fetch: Callable[[str, float], bytes] = fetch_json) -> None:
        self.url = check_url(url)
        self.window_s, self.step_s, self.timeout_s = window_s, step_s, timeout_s
        self.cache_s, self.retry_s = cache_s, retry_s
        self._clock, self._fetch = clock, fetch
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, Any] | PrometheusUnavailable] | None = None

    def get(self) -> dict[str, Any]:
        with self._lock:  # one viewer's redraw asks; the others meanwhile get its answer
            now = self._clock()
            if self._last is not None:
                at, kept = self._last
                age = now - at  # a clock set back: not fresh
                if 0 <= age < (self.retry_s if isinstance(kept, PrometheusUnavailable) else self.cache_s):
                    if isinstance(kept, PrometheusUnavailable):
                        raise kept
                    return kept
            try:
                result: dict[str, Any] | PrometheusUnavailable = self._ask(now)
            except PrometheusUnavailable as exc:
                result = exc
            self._last = (now, result)
            if isinstance(result, PrometheusUnavailable):
                raise result
            return result

    def _ask(self, now: float) -> dict[str, Any]:
        # Aligned to the step, as Grafana does: two redraws ask the same times (and the points
        # of the chart do not shift by a fraction of a step at every redraw).
        end = math.floor(now / self.step_s) * self.step_s
        start = end - self.window_s
        answers = {key: parse_matrix(self._fetch(range_url(self.url, query, start, end, self.step_s),
                                                 self.timeout_s))
                   for key, query in QUERIES.items()}
        out = series(answers, start, end, self.step_s)
        out.update(source="prometheus", url=self.url, interval_s=self.step_s)
        return out
