"""What a call's ``OSError`` becomes (broker_group/dataplane.py, ``answer``), pure: the broker's
own disk out of space is ``DiskFull`` and marks the disk full (disk_room.py); another failure
of its disk is ``DiskFull`` alone; a lost connection is not the disk. Seen in stop 97's run of
tests/test_disk_full.py: a lean Read stream whose reader went away was logged as "Read on q:
this broker's disk failed: Connection lost"."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ordq.broker_group.dataplane import answer
from ordq.broker_group.disk_room import DiskRoom


class Aborted(Exception):
    pass


class Context:
    """What ``answer`` uses of a call's context: its trailing metadata and ``abort``."""

    def __init__(self) -> None:
        self.kind: str | None = None

    def set_trailing_metadata(self, metadata: Any) -> None:
        ((_key, value),) = metadata
        self.kind = json.loads(value)["kind"]

    async def abort(self, _code: Any, _details: str) -> None:
        raise Aborted  # as grpc.aio's abort does


@pytest.mark.parametrize(("failure", "kind", "full", "said"), [
    (OSError(errno.ENOSPC, "No space left on device"), "disk_full", True, "this broker's disk failed"),
    (OSError(errno.EIO, "Input/output error"), "disk_full", False, "this broker's disk failed"),
    (ConnectionResetError("Connection lost"), "unavailable", False, None),
])
def test_what_an_os_error_of_a_call_becomes(tmp_path: Path, caplog: pytest.LogCaptureFixture, failure: OSError,
                                            kind: str, full: bool, said: str | None) -> None:
    room = DiskRoom(tmp_path, 1, lambda _full: True)
    refused: list[Exception] = []
    parts = SimpleNamespace(gate=SimpleNamespace(check=lambda *_a: None),
                            shared=SimpleNamespace(address="m:1", count_refused=refused.append, disk_room=room))

    async def call() -> None:
        raise failure

    context = Context()
    with caplog.at_level(logging.INFO, logger="ordq.broker"), pytest.raises(Aborted):
        asyncio.run(answer(parts, context, "Read", "q", call))  # type: ignore[arg-type]
    assert context.kind == kind
    assert room.full is full
    logged = caplog.text
    assert (said in logged) if said else ("disk" not in logged), logged
