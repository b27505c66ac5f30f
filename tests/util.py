"""Test helpers: wait on a condition with a deadline (never a fixed sleep)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kazoo.client import KazooClient

from ordq.common.errors import OrdqError
from ordq.common.metrics import Sample, parse, scrape_text
from ordq.common.proc import load_stretched

T = TypeVar("T")

# The JVM flags of every Java process a test run starts (Spark drivers, ZooKeeper servers): the C1
# JIT only (C2 spent more CPU compiling than it saved on the tests' tiny inputs: tests/conftest.py).
# C1 alone sizes the code cache at 48 MiB, and a pytest worker's one Spark session filled it
# ~9 minutes into the heavy tier ("Out of space in CodeCache for method handle intrinsic", a
# java.lang.InternalError in the next job, stop 98): reserved as C2's default is (240 MiB,
# address space, used only as filled).
C1_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def read_metrics(url: str) -> list[Sample]:
    """``read_metrics_text``, parsed."""
    return parse(read_metrics_text(url))


def read_metrics_text(url: str) -> str:
    """Scrape a process's /metrics, waiting up to 5 s, load-stretched. The answer takes ms even
    at load 24 (measured); what takes seconds is the serving process not being scheduled:
    in the loaded suite (load ~25) a scrape of test_metrics passed ``scrape``'s 2 s default
    while the test process's own producer reported its loop 1.81 s late (issue 26)."""
    return scrape_text(url, timeout_s=load_stretched(5.0))


def wait_until(
    condition: Callable[[], T], *, timeout_s: float = 10.0, interval_s: float = 0.01, what: str = ""
) -> T:
    """Poll ``condition`` until it returns a truthy value and return that value.

    Raises AssertionError naming ``what`` (and the last exception seen, if any) when the
    deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported if the deadline passes
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}{detail}")
        time.sleep(interval_s)


@contextlib.contextmanager
def raw_zk(hosts: str, *auths: str | None) -> Iterator[KazooClient]:
    """A bare kazoo client (no ordq wrapper), with digest credentials or none: what an
    attacker or an outside tool would use."""
    client = KazooClient(hosts=hosts, timeout=5.0, auth_data=[("digest", a) for a in auths if a] or None)
    client.start(timeout=30)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class TokenContext:
    """A gRPC server context as a handler sees it: the caller's token in its metadata, no TLS peer."""

    def __init__(self, token: str | None) -> None:
        self._meta = [("authorization", f"Bearer {token}")] if token else []

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._meta

    def auth_context(self) -> dict[str, Any]:
        return {}


def refused(call: Callable[[], object]) -> OrdqError | None:
    """The OrdqError ``call`` raised, None when it returned."""
    try:
        call()
    except OrdqError as exc:
        return exc
    return None


def guard_tokens(cluster: Any) -> tuple[Any, str, str]:
    """For the guard tests of a lean link (a ``tests.cluster.Cluster``): the cluster's credentials
    with an admin token (registered for the SDK), a consume-only token for queue ``q``, and a
    produce token for another queue."""
    import attrs

    from ordq.common.security import register
    from ordq.coordinator.tokens import create_token, touch

    _, admin = create_token(cluster.store.client, cluster.root, {"*": ["admin"]}, "test admin")
    _, consume = create_token(cluster.store.client, cluster.root, {"q": ["consume"]}, "consume only")
    _, other = create_token(cluster.store.client, cluster.root, {"q-other": ["produce"]}, "another queue")
    touch(cluster.store.client, cluster.root)
    creds = attrs.evolve(cluster.credentials, token=admin)
    register(cluster.hosts, cluster.root, creds)
    return creds, consume, other
