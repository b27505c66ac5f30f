"""Prometheus metrics of every ordq process: one way to serve a registry, one way to read one.

Every long-running process (broker, coordinator, and a producer or consumer that opts in)
keeps its series in its **own** ``CollectorRegistry``, never prometheus_client's global one,
so several of them in one process (tests, an application with a producer and a consumer)
never collide. Values that already exist as counters in a component's ``stats`` are read at
scrape time by a collector (nothing per message on the hot paths); only histograms are
observed as things happen, once per batch or per sync.
"""

from __future__ import annotations

import http.client
import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from ordq.common.errors import ConfigError

__all__ = ["CollectorRegistry", "MetricsServer", "Page", "Sample", "parse_listen", "scrape", "serve"]

log = logging.getLogger("ordq.common.metrics")

# A page served beside /metrics: () -> (content type, body), called per request.
Page = Callable[[], tuple[str, bytes]]

# Bounds on the HTTP server of every process (issue 43: health checks that gave up on a slow
# /metrics page left their handler threads behind, 25 -> 164 threads in a coordinator): a
# request not read or written within REQUEST_TIMEOUT_S ends, and beyond MAX_HANDLERS requests in
# progress a new connection is closed at once (the caller retries) instead of taking a thread.
REQUEST_TIMEOUT_S = 10.0
MAX_HANDLERS = 16


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    refused = 0  # connections closed at once: MAX_HANDLERS requests were in progress

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


@attrs.frozen
class MetricsServer:
    """A registry served at ``url`` (``http://HOST:PORT/metrics``) until ``close()``."""

    url: str
    _httpd: ThreadingHTTPServer

    @property
    def refused(self) -> int:
        """Connections closed unanswered: MAX_HANDLERS requests were in progress."""
        return getattr(self._httpd, "refused", 0)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (for the other pages served beside /metrics)."""
        return self.url.rsplit("/", 1)[0]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` means 127.0.0.1) -> (host, port); ConfigError when malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics address must be HOST:PORT (port 0: any free one), not {listen!r}")
    return host or "127.0.0.1", int(port)


def serve(registry: CollectorRegistry, listen: str = "127.0.0.1:0", *,
          pages: Mapping[str, Page] | None = None) -> MetricsServer:
    """Serve ``registry`` at ``http://listen/metrics`` in a daemon thread (port 0: any free
    port), and each of ``pages`` at its path (the coordinator's status page). Other paths: 404.
    ConfigError for a malformed ``listen``; OSError when it cannot bind."""
    host, port = parse_listen(listen)
    routes: dict[str, Page] = {"/metrics": lambda: (CONTENT_TYPE_LATEST, generate_latest(registry))}
    routes.update(pages or {})

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # the socket's: reading the request, writing the answer

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            page = routes.get(self.path.split("?", 1)[0])
            if page is None:
                self.send_error(404)
                return
            try:
                content_type, body = page()
            except Exception:  # noqa: BLE001 - one failed page must not end the server
                log.exception("serving %s", self.path)
                self.send_error(500)
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # a scrape every few seconds is not news

    httpd = _BoundedServer((host, port), Handler)
    threading.Thread(target=httpd.serve_forever, name="ordq-metrics-http", daemon=True).start()
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


def scrape_text(url: str, *, timeout_s: float = 2.0) -> str:
    """GET ``url``: its exposition as text; OSError/ValueError when it does not answer."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own http URL
        return resp.read().decode()


def scrape(url: str, *, timeout_s: float = 2.0) -> list[Sample]:
    """GET ``url`` and parse it; OSError/ValueError when it does not answer."""
    return parse(scrape_text(url, timeout_s=timeout_s))


def scrape_or_none(url: str | None, *, timeout_s: float = 2.0) -> list[Sample] | None:
    """``scrape``, or None when there is no URL or it did not answer (a drill's or a bench's
    reading of a process that may be frozen, killed or busy: no reason to stop the run)."""
    if url is None:
        return None
    try:
        return scrape(url, timeout_s=timeout_s)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def value(samples: Iterable[Sample], name: str, **labels: Any) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: none)."""
    found = [s.value for s in samples
             if s.name == name and all(s.labels.get(k) == str(v) for k, v in labels.items())]
    return sum(found) if found else None


class ServedCollector:
    """A collector a client process registers in its ``registry`` and serves at ``listen``
    (``register_and_serve``); ``close`` undoes both. ``describe`` returns the series' names,
    so a registry refuses a second collector of the same kind (ValueError at start) instead of
    exposing its series twice. Subclasses set ``registry`` and define ``collect``."""

    registry: CollectorRegistry
    server: MetricsServer | None = None

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def register_and_serve(self, listen: str | None) -> None:
        self.registry.register(self)  # type: ignore[arg-type]
        self.server = serve(self.registry, listen) if listen else None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.registry.unregister(self)  # type: ignore[arg-type]

    def describe(self) -> Iterable[Metric]:
        return self.collect()
