"""A stream's token check (broker_group/auth.py, ``Gate.stream_check``; issue 39): judged once per
stream and queue while the broker's token copy is unchanged, and again at once after any
change, so a revoked token is still refused on its stream's next request.

A real ZooKeeper (the test session's) holds the tokens; the Gate loads and watches them as a
broker does. The call context is a stand-in: only its headers are read.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kazoo.client import KazooClient

from ordq.broker_group import auth
from ordq.broker_group.auth import Gate
from ordq.common.errors import InvalidName, PermissionDenied
from ordq.coordinator.tokens import create_token, revoke_token, token_id, touch
from tests.util import TokenContext, wait_until

pytestmark = pytest.mark.zk




def test_a_streams_token_is_judged_once_per_copy_and_a_revoke_is_refused_on_the_next_request(
        zk_client: KazooClient, zk_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each produce request was checked whole (headers parsed, token hashed and compared, the
    copy locked): 1,000 requests of one stream now cost one check while the copy holds; a
    revoke (a new copy) is judged on the next request; another queue is judged on its own."""
    _, token = create_token(zk_client, zk_root, {"q": ["produce"], "r": ["consume"]})
    gate = Gate(tls=False)
    gate.watch(zk_client, zk_root)
    judged: list[str] = []
    real = auth.authorize

    def counting(records: Any, tok: str | None, queue: str, role: str) -> Any:
        judged.append(queue)
        return real(records, tok, queue, role)

    monkeypatch.setattr(auth, "authorize", counting)
    check = gate.stream_check(TokenContext(token), "Produce")
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
    revoke_token(zk_client, zk_root, token_id(token))
    touch(zk_client, zk_root)
    wait_until(lambda: gate.book.generation != before, timeout_s=30, what="the broker's copy reloaded")
    with pytest.raises(PermissionDenied, match="unknown or revoked"):
        check("q")


def test_a_stream_without_a_token_is_refused_on_every_request_while_enforced(zk_client: KazooClient,
                                                                             zk_root: str) -> None:
    """A refusal is never cached as a pass: each request of a tokenless stream is refused."""
    create_token(zk_client, zk_root, {"q": ["produce"]}, f"t{uuid.uuid4().hex[:6]}")
    gate = Gate(tls=False)
    gate.watch(zk_client, zk_root)
    check = gate.stream_check(TokenContext(None), "Produce")
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            check("q")
