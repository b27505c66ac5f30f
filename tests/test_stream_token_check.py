"""A stream's token check (broker_group/auth.py, ``Gate.stream_check``; issue 39): judged once per
stream and queue while the broker's token copy is unchanged, and again at once after any
change, so a revoked token is still refused on its stream's next request.

A real ZooKeeper (the test session's) holds the tokens; the Gate loads and watches them as a
broker does. The call context is a stand-in: only its headers are read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from ordq.broker_group import auth
from ordq.broker_group.auth import Gate
from ordq.common.errors import InvalidName, PermissionDenied
from ordq.coordinator.tokens import create_token, revoke_token, token_id, touch
from ordq.zk_server import ZkServer
from tests.util import wait_until

pytestmark = pytest.mark.zk


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


def test_a_streams_token_is_judged_once_per_copy_and_a_revoke_is_refused_on_the_next_request(
        zk: KazooClient, zk_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each produce request was checked whole (headers parsed, token hashed and compared, the
    copy locked): 1,000 requests of one stream now cost one check while the copy holds; a
    revoke (a new copy) is judged on the next request; another queue is judged on its own."""
    _, token = create_token(zk, zk_root, {"q": ["produce"], "r": ["consume"]})
    gate = Gate(tls=False)
    gate.watch(zk, zk_root)
    judged: list[str] = []
    real = auth.authorize

    def counting(records: Any, tok: str | None, queue: str, role: str) -> Any:
        judged.append(queue)
        return real(records, tok, queue, role)

    monkeypatch.setattr(auth, "authorize", counting)
    check = gate.stream_check(_Context(token), "Produce")
    for _ in range(1000):
        check("q")
    assert judged == ["q"]
    with pytest.raises(PermissionDenied):
        check("r")  # consume only: judged, and refused
    with pytest.raises(InvalidName):
        check("bad name")
    check("q")
    assert judged == ["q", "r", "q"]

    before = gate.book.generation
    revoke_token(zk, zk_root, token_id(token))
    touch(zk, zk_root)
    wait_until(lambda: gate.book.generation != before, timeout_s=30, what="the broker's copy reloaded")
    with pytest.raises(PermissionDenied, match="unknown or revoked"):
        check("q")


def test_a_stream_without_a_token_is_refused_on_every_request_while_enforced(zk: KazooClient, zk_root: str) -> None:
    """A refusal is never cached as a pass: each request of a tokenless stream is refused."""
    create_token(zk, zk_root, {"q": ["produce"]}, f"t{uuid.uuid4().hex[:6]}")
    gate = Gate(tls=False)
    gate.watch(zk, zk_root)
    check = gate.stream_check(_Context(None), "Produce")
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            check("q")
