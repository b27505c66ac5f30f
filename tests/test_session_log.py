"""``SessionLog``: one line per change of a coordinator's ZooKeeper connection, named by the
session's role (issue 43). The lines of a session expired and replaced, driven by hand (a real
drop and reconnect on the same session: tests/test_daemon_view_reconnect.py)."""

from __future__ import annotations

import logging

import attrs
from kazoo.client import KazooState

from ordq.coordinator.session_log import SessionLog


@attrs.define
class _Client:  # what SessionLog reads of a KazooClient
    client_id: tuple[int, bytes] | None


def test_an_expired_session_and_its_successor_are_named(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="ordq.coordinator")
    now = [100.0]
    client = _Client((0xAB, b""))
    listener = SessionLog(client, "leadership and duties", clock=lambda: now[0])  # type: ignore[arg-type]
    listener(KazooState.SUSPENDED)
    now[0] = 104.5
    listener(KazooState.LOST)  # the first of the two times counts: suspended at 100
    client.client_id = (0xCD, b"")
    now[0] = 105.25
    listener(KazooState.CONNECTED)
    # this module's lines only: the collector's log (daemon_gc) shares the logger, once installed
    assert [r.getMessage() for r in caplog.records if r.module == "session_log"] == [
        "ZooKeeper session of the leadership and duties: connection suspended (session 0xab)",
        "ZooKeeper session of the leadership and duties: lost (expired or closed) (session 0xab)",
        "ZooKeeper session of the leadership and duties: connected, new session after 5.25 s (session 0xcd)",
    ]
