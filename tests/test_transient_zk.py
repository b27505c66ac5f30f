"""Transient ZooKeeper errors where a process starts or serves (issue 26): retried with a bound;
only a definite refusal or an exhausted bound stops it, with one clear error.

The faults are injected into a real kazoo client on the real test ZooKeeper: a proxy that
raises ``ConnectionLoss`` on chosen calls and passes everything else through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoAuthError

from broker_group.auth import Gate
from coordinator.tokens import create_token
from ordq.errors import CoordinationUnavailable, PermissionDenied
from ordq.zk_server import ZkServer

pytestmark = pytest.mark.zk


class Flaky:
    """A kazoo client whose calls named in ``faults`` raise ``faults[name]`` (an exception
    instance, or a list of them, one per call, then pass through)."""

    def __init__(self, client: KazooClient, **faults: Any) -> None:
        self._client = client
        self._faults = {k: list(v) if isinstance(v, list) else v for k, v in faults.items()}
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name not in self._faults:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            fault = self._faults[name]
            if isinstance(fault, list):
                fault = fault.pop(0) if fault else None
            if fault is not None:
                self.raised += 1
                raise fault
            return real(*args, **kwargs)
        return call


@pytest.fixture
def zk(zk_server: ZkServer, zk_root: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_server.connection_string, timeout=5.0)
    client.start(timeout=30)
    client.ensure_path(zk_root)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class _Context:
    def __init__(self, token: str | None) -> None:
        self._meta = [("authorization", f"Bearer {token}")] if token else []

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._meta

    def auth_context(self) -> dict[str, Any]:
        return {}


def test_one_connection_loss_while_loading_tokens_does_not_stop_a_broker_start(zk: KazooClient,
                                                                               zk_root: str) -> None:
    _, token = create_token(zk, zk_root, {"q": ["produce"]})
    flaky = Flaky(zk, get_children=[ConnectionLoss()], exists=[ConnectionLoss()])
    gate = Gate(tls=False)
    gate.watch(flaky, zk_root)  # raised ConnectionLoss out of broker start before
    assert flaky.raised == 2
    gate.check(_Context(token), "Produce", "q")  # the token loaded: allowed
    with pytest.raises(PermissionDenied):
        gate.check(_Context(None), "Produce", "q")  # enforced


def test_zookeeper_silent_past_the_bound_stops_the_start_with_one_clear_error(zk: KazooClient,
                                                                              zk_root: str) -> None:
    create_token(zk, zk_root, {"q": ["produce"]})

    class Always(Flaky):
        def __getattr__(self, name: str) -> Any:
            if name in ("get_children", "exists"):
                def lost(*_a: Any, **_k: Any) -> Any:
                    raise ConnectionLoss()
                return lost
            return getattr(self._client, name)

    with pytest.raises(CoordinationUnavailable, match="ZooKeeper did not answer for 0.5s"):
        Gate(tls=False).watch(Always(zk), zk_root, deadline_s=0.5)


def test_a_definite_refusal_is_not_retried(zk: KazooClient, zk_root: str) -> None:
    create_token(zk, zk_root, {"q": ["produce"]})
    flaky = Flaky(zk, get_children=NoAuthError())
    with pytest.raises(NoAuthError):
        Gate(tls=False).watch(flaky, zk_root, deadline_s=30)
    assert flaky.raised == 1
