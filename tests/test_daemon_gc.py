"""The elected coordinator and the cyclic garbage collector (coordinator/daemon_gc.py, issue 43):
no collection while a dead group's heads move, and a long collection said in the log. Pure: no
I/O (the moves themselves: test_daemon_scale's batched-moves test)."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator

import pytest

from ordq.coordinator import daemon_gc
from ordq.coordinator.daemon_gc import LONG_COLLECTION_S, LongCollections, collections_held


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_no_collection_while_held_and_the_collector_back_on_after_even_on_an_error() -> None:
    with collections_held():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collections_held():
        assert not gc.isenabled()
        raise RuntimeError("a pass that failed")
    assert gc.isenabled()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    with collections_held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_holds_the_last_one_out_switches_it_back() -> None:
    first_in, second_out = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with collections_held():
            first_in.wait(5)
        seen.append(gc.isenabled())  # the main thread still holds
        second_out.set()

    thread = threading.Thread(target=other)
    with collections_held():
        thread.start()
        first_in.set()
        assert second_out.wait(5)
        assert not gc.isenabled()
    thread.join(5)
    assert seen == [False] and gc.isenabled()


def test_a_long_collection_is_said_in_the_log_a_short_one_is_not(caplog) -> None:
    now = [100.0]
    watch = LongCollections(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="ordq.coordinator"):
        watch("start", {"generation": 0})
        now[0] += LONG_COLLECTION_S / 10
        watch("stop", {"generation": 0, "collected": 3})
        watch("start", {"generation": 2})
        now[0] += 1.25
        watch("stop", {"generation": 2, "collected": 7})
        watch("stop", {"generation": 2, "collected": 0})  # a stop with no start: nothing
    lines = [r.getMessage() for r in caplog.records]
    assert watch.long == 1 and len(lines) == 1, lines
    assert lines[0].startswith("a garbage collection of generation 2 took 1.25 s (7 objects freed"), lines


def test_the_log_is_installed_once_a_process(monkeypatch) -> None:
    monkeypatch.setattr(daemon_gc, "_installed", None)
    callbacks = list(gc.callbacks)
    monkeypatch.setattr(gc, "callbacks", callbacks)
    first = daemon_gc.install_long_collection_log()
    assert daemon_gc.install_long_collection_log() is first and callbacks.count(first) == 1

