"""Prometheus metrics of every ordq process: one way to serve a registry, one way to read one.

Every long-running process (broker, coordinator, and a producer or consumer that opts in)
keeps its series in its **own** ``CollectorRegistry``, never prometheus_client's global one,
so several of them in one process (tests, an application with a producer and a consumer)
never collide. Values that already exist as counters in a component's ``stats`` are read at
scrape time by a collector (nothing per message on the hot paths); only histograms are
observed as things happen, once per batch or per sync.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

import attrs
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from ordq.errors import ConfigError

__all__ = ["CollectorRegistry", "MetricsServer", "Sample", "parse_listen", "scrape", "serve"]


@attrs.frozen
class MetricsServer:
    """A registry served at ``url`` (``http://HOST:PORT/metrics``) until ``close()``."""

    url: str
    _httpd: WSGIServer

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` means 127.0.0.1) -> (host, port); ConfigError when malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics address must be HOST:PORT (port 0: any free one), not {listen!r}")
    return host or "127.0.0.1", int(port)


def serve(registry: CollectorRegistry, listen: str = "127.0.0.1:0") -> MetricsServer:
    """Serve ``registry`` over HTTP at ``listen`` in a daemon thread (port 0: any free port).
    Every path answers with the exposition; the URL names ``/metrics``."""
    host, port = parse_listen(listen)
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    bound_host, bound_port = httpd.server_address[:2]
    return MetricsServer(url=f"http://{bound_host!s}:{bound_port}/metrics", httpd=httpd)


@attrs.frozen
class Sample:
    """One exposed value: ``name`` as exposed (``..._total``, ``..._bucket``), its labels."""

    name: str
    labels: dict[str, str]
    value: float


def one(kind: str, name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
    """A counter (``name`` without ``_total``) or gauge family with one sample, for collectors."""
    family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition."""
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(url: str, *, timeout_s: float = 2.0) -> list[Sample]:
    """GET ``url`` and parse it; OSError/ValueError when it does not answer."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own http URL
        return parse(resp.read().decode())


def value(samples: Iterable[Sample], name: str, **labels: Any) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: none)."""
    found = [s.value for s in samples
             if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items())]
    return sum(found) if found else None
