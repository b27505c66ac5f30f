"""A removed segment's file is shrunk in steps before its unlink (broker_group/file_removal.py).

Why: a 256 MiB segment's unlink on a disk mounted with ``discard`` held everyone's fdatasyncs
for its whole ~160 ms; ``bench_e2e`` saw two synchronous sends of 151 and 161 ms, one for
each replica's removal of the segment every subscription had read (docs/BENCHMARKS.md, stop
94; ``python -m bench.bench_removal`` measures it: a sync during an unlink waited 134-214 ms,
during a removal in steps at most 6-7 ms in 6 runs of 7). Real files in a temporary folder; the disk's own
timing is the bench's to show, not these tests'.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ordq.broker_group import file_removal, segments
from ordq.broker_group.file_removal import STEP_BYTES, remove_tree


def segment_folder(parent: Path, log_bytes: int) -> Path:
    folder = parent / "q" / "7"
    folder.mkdir(parents=True)
    with open(folder / "segment.log", "wb") as f:
        f.truncate(log_bytes)  # sparse: the steps are what is tested, not the disk
    (folder / "meta.json").write_text("{}")
    return folder


def test_a_removed_segment_log_is_shrunk_in_steps_before_it_goes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: ``remove_tree`` under ``remove_folder`` and ``finish_removals``. Failing first:
    the folder went in one ``rmtree``, the log's blocks freed by one unlink."""
    folder = segment_folder(tmp_path, 5 * STEP_BYTES + 123)
    sizes: list[int] = []
    real = os.ftruncate

    def ftruncate(fd: int, size: int) -> None:
        sizes.append(size)
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    segments.remove_folder(folder)
    assert sizes == [4 * STEP_BYTES + 123, 3 * STEP_BYTES + 123, 2 * STEP_BYTES + 123, STEP_BYTES + 123, 123]
    assert not folder.exists() and list((tmp_path / "q").iterdir()) == []


def test_each_step_is_followed_by_a_pause_at_least_as_long_as_it_took(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = segment_folder(tmp_path, 3 * STEP_BYTES)
    real = os.ftruncate

    def slow_ftruncate(fd: int, size: int) -> None:  # a disk that takes 20 ms a step
        time.sleep(0.02)
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", slow_ftruncate)
    pauses: list[float] = []
    assert remove_tree(folder, sleep=pauses.append) is True
    assert len(pauses) == 2 and all(p >= 0.02 for p in pauses), pauses
    # a quick step still leaves the disk a moment (the pause's floor)
    quick = segment_folder(tmp_path / "b", 2 * STEP_BYTES)
    monkeypatch.setattr(os, "ftruncate", real)
    pauses.clear()
    remove_tree(quick, sleep=pauses.append)
    assert pauses and all(p >= file_removal.MIN_PAUSE_S for p in pauses), pauses


def test_a_stop_leaves_the_folder_where_the_next_start_finds_it(tmp_path: Path) -> None:
    """A broker stopping does not wait for a long removal: the folder stays set aside (the next
    start removes it: tests/test_broker.py, the removals a kill left half done)."""
    folder = segment_folder(tmp_path, 6 * STEP_BYTES)
    steps: list[float] = []
    assert remove_tree(folder, stopping=lambda: len(steps) >= 2, sleep=steps.append) is False
    assert (folder / "segment.log").stat().st_size == 4 * STEP_BYTES
    assert (folder / "meta.json").exists()


def test_a_link_in_the_folder_is_removed_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    with open(outside, "wb") as f:
        f.truncate(3 * STEP_BYTES)
    folder = segment_folder(tmp_path, 0)
    (folder / "link.log").symlink_to(outside)
    assert remove_tree(folder, sleep=lambda _s: None) is True
    assert not folder.exists()
    assert outside.stat().st_size == 3 * STEP_BYTES
