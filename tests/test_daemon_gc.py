"""The elected coordinator and the cyclic garbage collector (coordinator/daemon_gc.py, issue 43):
young collections spaced out while it leads, no collection while a dead group's heads move, and a
long collection said in the log. Pure: no I/O (the moves themselves: test_daemon_scale's
batched-moves test; the leader's thresholds: test_coordinator_daemon)."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator

import pytest

from ordq.coordinator import daemon_gc
from ordq.coordinator.daemon_gc import (
    LEADING_YOUNG_THRESHOLD,
    LONG_COLLECTION_S,
    SUMMARY_EVERY_S,
    LongCollections,
    collections_held,
    young_collections_spaced,
)


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if was else gc.disable)()  # (a test that turned it off leaves it as it was)


@pytest.fixture
def only_this_tests_log() -> Iterator[None]:
    """The process's installed log (an in-process daemon that led installs it) out of
    ``gc.callbacks`` while the test runs: its own lines would land on the same logger."""
    installed = daemon_gc._installed
    if installed is None or installed not in gc.callbacks:
        yield
        return
    gc.callbacks.remove(installed)
    yield
    gc.callbacks.append(installed)


class Collections:
    """``gc.callbacks`` entry: collections by generation."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self.counts[info["generation"]] += 1


def test_a_pass_over_a_large_heap_ends_in_no_full_collection_while_young_collections_are_spaced() -> None:
    """The leader's heap (a container per object here, ~300,000 kept) and passes over it that
    make ~4 short-lived containers per kept one, alive until the pass ends (the heads' spread
    every 2 s at 10^5 queues). With CPython's young threshold (700) such passes end in full
    collections (each walks the whole heap); spaced out, none does. Checked on the old way:
    with the block a no-op (contextlib.nullcontext) this test saw 7 full collections."""
    heap = [[i] for i in range(300_000)]
    seen = Collections()
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    gc.collect()  # counts from zero; the heap is the old generation
    gc.callbacks.append(seen)  # (the interpreter's own list: a monkeypatched one is not called)
    try:
        with young_collections_spaced():
            for _ in range(3):
                rows = [((item,), [item], (item, item)) for item in heap[:75_000]]
                del rows
    finally:
        gc.callbacks.remove(seen)
    assert seen.counts[2] == 0, seen.counts


def test_young_collections_are_spaced_while_the_block_runs_and_as_before_after_even_on_an_error() -> None:
    gc.set_threshold(700, 10, 10)
    with young_collections_spaced():
        assert gc.get_threshold() == (LEADING_YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(RuntimeError), young_collections_spaced():
        raise RuntimeError("a term that failed")
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(LEADING_YOUNG_THRESHOLD * 2, 5, 20)  # already further apart: kept so
    with young_collections_spaced():
        assert gc.get_threshold() == (LEADING_YOUNG_THRESHOLD * 2, 5, 20)
    assert gc.get_threshold() == (LEADING_YOUNG_THRESHOLD * 2, 5, 20)


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


@pytest.mark.parametrize(("block", "setting", "inside"), [
    (collections_held, gc.isenabled, False),
    (young_collections_spaced, lambda: gc.get_threshold()[0], LEADING_YOUNG_THRESHOLD),
])
def test_overlapping_blocks_the_last_one_out_sets_it_back(block, setting, inside) -> None:  # type: ignore[no-untyped-def]
    gc.set_threshold(700, 10, 10)
    before = setting()
    first_in, second_out = threading.Event(), threading.Event()
    seen: list[object] = []

    def other() -> None:
        with block():
            first_in.wait(5)
        seen.append(setting())  # the main thread is still in
        second_out.set()

    thread = threading.Thread(target=other)
    with block():
        thread.start()
        first_in.set()
        assert second_out.wait(5)
        assert setting() == inside
    thread.join(5)
    assert seen == [inside] and setting() == before


def test_a_long_collection_is_said_in_the_log_a_short_one_is_not(caplog, only_this_tests_log) -> None:
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


def test_the_collections_counts_and_seconds_are_said_once_a_period(caplog, only_this_tests_log) -> None:
    now = [0.0]
    watch = LongCollections(clock=lambda: now[0])

    def collection(generation: int, took: float) -> None:
        watch("start", {"generation": generation})
        now[0] += took
        watch("stop", {"generation": generation, "collected": 0})

    with caplog.at_level(logging.INFO, logger="ordq.coordinator"):
        collection(0, 0.01)  # the period starts at its end (it is counted in it)
        collection(0, 0.02)
        collection(1, 0.05)
        now[0] += SUMMARY_EVERY_S / 2
        collection(0, 0.03)  # not yet a period
        assert not caplog.records
        now[0] += SUMMARY_EVERY_S / 2
        collection(2, 0.1)
        collection(0, 0.01)  # the next period's
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"garbage collections in {SUMMARY_EVERY_S + 0.2:.0f} s by generation 0/1/2: 3/1/1, "
                     "0.06/0.05/0.10 s in all, the longest 0.03/0.05/0.10 s"], lines


def test_the_log_is_installed_once_a_process(monkeypatch) -> None:
    monkeypatch.setattr(daemon_gc, "_installed", None)
    callbacks = list(gc.callbacks)
    monkeypatch.setattr(gc, "callbacks", callbacks)
    first = daemon_gc.install_long_collection_log()
    assert daemon_gc.install_long_collection_log() is first and callbacks.count(first) == 1

