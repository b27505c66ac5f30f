"""Segment log: batch format round trips, recovery (torn tail vs corrupt middle), reads, disk full.

Pure: files in temporary folders, no network, no sleeps. ENOSPC/EIO are simulated by
replacing the ``os`` call the log uses.
"""

from __future__ import annotations

import errno
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ordq.broker_group.log as log_mod
import ordq.broker_group.segment_scan as segment_scan
from ordq.broker_group.log import SEGMENT_FILE, SegmentLog, parse_segment_path, segment_dir
from ordq.broker_group.segment_scan import iter_file_batches
from ordq.common.errors import ClosedError, CorruptLog, DiskFull, InvalidName, SegmentNotFound
from ordq.wire.batch import (
    HEAD_BYTES,
    BatchHeader,
    Message,
    split_batches,
    stamp_offset,
)
from tests.helpers.batches import SETTINGS, build, flip, message_lists, msg, recrc


@pytest.fixture(params=["default", "tiny"])
def read_sizes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a recovery test with the scan's buffers as they are and with tiny ones, so batches
    and search candidates straddle every read-ahead window and search chunk boundary."""
    if request.param == "tiny":
        monkeypatch.setattr(segment_scan, "_WINDOW_BYTES", 7)
        monkeypatch.setattr(segment_scan, "_SEARCH_CHUNK_BYTES", 5)
    return str(request.param)


@contextmanager
def tmpdir() -> Iterator[Path]:
    # Not the tmp_path fixture: hypothesis runs many examples per test function.
    with tempfile.TemporaryDirectory(prefix="ordq-log-") as d:
        yield Path(d)


def write_segment(data: Path, raw: bytes, queue: str = "q", seg: int = 0) -> Path:
    folder = segment_dir(data, queue, seg)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SEGMENT_FILE
    path.write_bytes(raw)
    return path


# -- opening and appending -----------------------------------------------------------------


def test_open_missing_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(SegmentNotFound) as info:
        SegmentLog.open(tmp_path, "orders", 3)
    assert (info.value.queue, info.value.seg) == ("orders", 3)
    for bad in ("..", "a/b", ""):
        with pytest.raises(InvalidName):
            SegmentLog.open(tmp_path, bad, 0, create=True)
    with pytest.raises(ValueError):
        SegmentLog.open(tmp_path, "q", -1, create=True)


def test_create_append_sync_reopen(tmp_path: Path) -> None:
    with SegmentLog.open(tmp_path, "orders", 7, create=True) as log:
        assert log.path == tmp_path / "orders" / "000000000007" / "segment.log"
        assert (log.end, log.synced_end, log.first_seq, log.last_seq) == (0, 0, None, None)
        assert log.last_message() is None
        raws = build([[msg(0), msg(1)], [msg(2)], [msg(3), msg(4), msg(5)]], first_seq=40)
        for raw in raws:
            header = log.append(raw)
            assert header.first_offset == log.end - header.count
        assert (log.end, log.synced_end, log.first_seq, log.last_seq) == (6, 0, 40, 45)
        assert log.read(0, max_bytes=1 << 20, upto=6) == []  # nothing served before sync
        assert log.last_message() == (5, msg(5))  # buffered ones count
        assert log.sync() == 6
        assert log.read(0, max_bytes=1 << 20, upto=6) == raws
        stats = log.statistics()
        assert (stats.syncs, stats.synced_batches, stats.batches, stats.buffered_bytes) == (1, 3, 3, 0)
        assert stats.file_bytes == sum(map(len, raws))
        assert _batches_then_zeros(log.path, sum(map(len, raws))) == 4096  # the fill: one page
        assert log.sync() == 6 and log.statistics().syncs == 1  # nothing buffered: no syscall
    assert log.path.stat().st_size == sum(map(len, raws))  # the fill cut off on close
    with SegmentLog.open(tmp_path, "orders", 7) as again:
        assert (again.end, again.synced_end, again.first_seq, again.last_seq) == (6, 6, 40, 45)
        assert again.recovery == log_mod.RecoveryReport(batches=3, messages=6, truncated_bytes=0)
        assert again.last_message() == (5, msg(5))
        assert again.read(0, max_bytes=1 << 20, upto=6) == raws
    assert SegmentLog.open(tmp_path, "orders", 7, create=True).end == 6  # create on an existing one opens it


def test_append_checks_offset_and_crc(tmp_path: Path) -> None:
    log = SegmentLog.open(tmp_path, "q", 0, create=True)
    first, second = build([[msg(0)], [msg(1)]])
    with pytest.raises(ValueError, match="first_offset 1 != end 0"):
        log.append(second)
    with pytest.raises(CorruptLog):
        log.append(flip(first, len(first) * 8 - 1))
    with pytest.raises(CorruptLog):
        log.append(first[:-1])
    assert log.end == 0 and log.statistics().buffered_bytes == 0
    log.append(first)
    with pytest.raises(ValueError):
        log.append(first)  # same offset twice
    broken = recrc(second, {HEAD_BYTES - 4: struct.pack("<I", 2)})
    with pytest.raises(CorruptLog):
        log.append(broken, check_structure=True)
    log.append(second, check_structure=True)
    assert log.sync() == 2
    third = build([[msg(0)], [msg(1)], [msg(2)]])[2]
    log.append(flip(third, len(third) * 8 - 1), verify_crc=False)  # the caller's word is taken for the CRC...
    with pytest.raises(CorruptLog):
        log.append(stamp_offset(third[:-1], 3), verify_crc=False)  # ...but not for the header
    log.close()


def test_closed_log_refuses_calls(tmp_path: Path) -> None:
    log = SegmentLog.open(tmp_path, "q", 0, create=True)
    log.append(build([[msg(0)]])[0])
    log.close()
    log.close()  # idempotent
    assert log.closed
    for call in (log.sync, log.last_message, lambda: log.read(0, max_bytes=1, upto=1), lambda: log.truncate(0)):
        with pytest.raises(ClosedError):
            call()
    # the unsynced batch was dropped on close
    assert SegmentLog.open(tmp_path, "q", 0).end == 0


def test_a_parked_log_holds_no_file_descriptor_and_reopens_on_use(tmp_path: Path) -> None:
    """Issue 29: a sealed segment nobody reads must not hold a descriptor (10,000 idle queues)."""
    log = SegmentLog.open(tmp_path, "q", 0, create=True)
    raws = build([[msg(0), msg(1)]])
    log.append(raws[0])
    log.park()  # something buffered: not parked
    assert log.sync() == 2
    fds = len(os.listdir("/proc/self/fd"))
    log.park()
    assert len(os.listdir("/proc/self/fd")) == fds - 1 and not log.closed
    assert log.read(0, max_bytes=1 << 20, upto=2) == raws  # reopened
    assert len(os.listdir("/proc/self/fd")) == fds
    log.park()
    log.close()
    assert log.closed
    with pytest.raises(ClosedError):
        log.read(0, max_bytes=1, upto=1)


# -- reads ----------------------------------------------------------------------------------


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    payload=st.integers(0, 40),
    data=st.data(),
)
def test_read_respects_upto_max_bytes_and_boundaries(sizes: list[int], payload: int, data: st.DataObject) -> None:
    raws = build([[msg(i, payload) for i in range(n)] for n in sizes])
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    total = starts[-1]
    with tmpdir() as d, SegmentLog.open(d, "q", 0, create=True) as log:
        synced_batches = data.draw(st.integers(0, len(raws)), label="synced batches")
        for raw in raws[:synced_batches]:
            log.append(raw)
        log.sync()
        for raw in raws[synced_batches:]:
            log.append(raw)  # buffered, never served
        synced_end = starts[synced_batches]
        for _ in range(10):
            offset = data.draw(st.integers(0, total + 2), label="offset")
            upto = data.draw(st.integers(0, total + 2), label="upto")
            max_bytes = data.draw(st.integers(0, sum(map(len, raws)) + 10), label="max_bytes")
            got = log.read(offset, max_bytes=max_bytes, upto=upto)
            limit = min(upto, synced_end)
            if offset >= limit:
                assert got == []
                continue
            first = max(i for i in range(len(raws)) if starts[i] <= offset)  # the batch holding offset
            assert got == raws[first : first + len(got)]  # whole, contiguous batches from there
            fits = [j for j in range(first, len(raws)) if starts[j + 1] <= limit]
            fits = fits[: next((k for k, j in enumerate(fits) if j != first + k), len(fits))]
            if not fits:
                assert got == []  # the batch holding offset straddles upto
                continue
            assert got, "at least one batch when one ends before upto"
            last = first + len(got) - 1
            assert starts[last + 1] <= limit
            assert len(got) == 1 or sum(map(len, got)) <= max_bytes
            if last + 1 < len(raws) and starts[last + 2] <= limit:  # could have taken one more
                assert sum(map(len, raws[first : last + 2])) > max_bytes


def test_read_at_boundaries(tmp_path: Path) -> None:
    raws = build([[msg(0), msg(1)], [msg(2), msg(3)], [msg(4)]])
    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        for raw in raws:
            log.append(raw)
        log.sync()
        assert log.read(1, max_bytes=0, upto=5) == raws[:1]  # offset inside batch 0
        assert log.read(2, max_bytes=1 << 20, upto=4) == raws[1:2]
        assert log.read(2, max_bytes=1 << 20, upto=3) == []  # batch 1 straddles upto
        assert log.read(0, max_bytes=len(raws[0]) + len(raws[1]), upto=100) == raws[:2]
        assert log.read(5, max_bytes=1 << 20, upto=100) == []
        with pytest.raises(ValueError):
            log.read(-1, max_bytes=1, upto=5)


def test_bytes_before_an_offset_is_where_its_batch_starts(tmp_path: Path) -> None:
    """What a master reports acked (``SegmentEnd.acked_bytes``): the bytes before the LAC."""
    raws = build([[msg(0), msg(1)], [msg(2)], [msg(3), msg(4)]])
    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        assert log.bytes_before(0) == 0
        log.append(raws[0])
        log.sync()
        log.append(raws[1])  # buffered, not synced: still where it starts
        assert [log.bytes_before(at) for at in (0, 2, 3)] == [0, len(raws[0]), len(raws[0])]
        log.append(raws[2])
        log.sync()
        assert log.bytes_before(3) == len(raws[0]) + len(raws[1])
        assert log.bytes_before(5) == log.synced_bytes == sum(map(len, raws))


# -- truncate -------------------------------------------------------------------------------


def test_truncate(tmp_path: Path) -> None:
    raws = build([[msg(0), msg(1)], [msg(2)], [msg(3), msg(4)], [msg(5)]], first_seq=10)
    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        for raw in raws[:3]:
            log.append(raw)
        log.sync()
        log.append(raws[3])  # buffered
        for bad in (1, 4, 7, -1):
            with pytest.raises(ValueError):
                log.truncate(bad)
        log.truncate(6)  # == end: just syncs the buffered batch
        assert log.synced_end == 6
        log.truncate(3)
        assert (log.end, log.synced_end, log.last_seq, log.first_seq) == (3, 3, 12, 10)
        assert log.path.stat().st_size == len(raws[0]) + len(raws[1])
        assert log.read(0, max_bytes=1 << 20, upto=10) == raws[:2]
        assert log.last_message() == (2, msg(2))
        log.append(raws[2])  # appending continues at the new end
        log.append(raws[3])
        log.truncate(5)  # only buffered batches cut: the kept one is synced
        assert (log.end, log.synced_end) == (5, 5)
        assert log.read(0, max_bytes=1 << 20, upto=10) == raws[:3]
    with SegmentLog.open(tmp_path, "q", 0) as log:
        assert (log.end, log.recovery.truncated_bytes) == (5, 0)
        log.truncate(0)
        assert (log.end, log.synced_end, log.first_seq, log.last_seq) == (0, 0, None, None)
        assert log.path.stat().st_size == 0
    assert SegmentLog.open(tmp_path, "q", 0).end == 0


def _batches_then_zeros(path: Path, batch_bytes: int) -> int:
    """The file's size, once checked to hold ``batch_bytes`` of batches and zeros after them."""
    data = path.read_bytes()
    assert len(data) >= batch_bytes and not data[batch_bytes:].strip(b"\0")
    return len(data)


def test_the_file_runs_ahead_of_its_batches_with_zeros_that_later_syncs_overwrite(tmp_path: Path) -> None:
    """Issue 39: a sync that only overwrites blocks the file has writes no inode for a new size
    (on a journalled ext4, no journal commit). The zeros come with the sync that needed them,
    as much as the file holds (a page at least, FILL_AHEAD_MAX at most); a later sync within
    them leaves the size alone. A copy opened from the file as it is (a kill -9 now) keeps the
    zeros and counts nothing torn."""
    raws = build([[msg(i, 1000)] for i in range(8)])
    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        log.append(raws[0])
        log.sync()
        first = _batches_then_zeros(log.path, len(raws[0]))
        assert first == 4096 > 2 * len(raws[0])
        log.append(raws[1])
        log.append(raws[2])
        log.sync()  # within the zeros: the file keeps its size
        assert _batches_then_zeros(log.path, sum(map(len, raws[:3]))) == first
        for raw in raws[3:]:
            log.append(raw)
        log.sync()
        whole = sum(map(len, raws))
        assert _batches_then_zeros(log.path, whole) == -(-2 * whole // 4096) * 4096
        with SegmentLog.open(tmp_path, "q", 0) as crashed:
            assert (crashed.end, crashed.recovery.truncated_bytes) == (8, 0)
            assert crashed.read(0, max_bytes=1 << 20, upto=8) == raws
        log.park()  # parked: the zeros are cut off, and the next sync brings new ones
        assert log.path.stat().st_size == whole
        assert log.read(0, max_bytes=1 << 20, upto=8) == raws
    assert log.path.stat().st_size == whole
    big = SegmentLog.open(tmp_path, "big", 0, create=True)
    big.append(build([[msg(0, 3 << 20)]])[0])
    big.sync()
    assert _batches_then_zeros(big.path, big.statistics().file_bytes) - big.statistics().file_bytes \
        <= log_mod.FILL_AHEAD_MAX + log_mod.FILL_PAGE  # to a page's end
    big.close()


def test_zeros_that_find_no_space_leave_the_batches_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fill is best effort: with no space for the zeros the batches are still written and
    synced (no DiskFull), and the file holds them alone."""
    raws = build([[msg(0)], [msg(1)]])
    real_pwrite = os.pwrite

    def no_room_for_zeros(fd: int, data: bytes, pos: int) -> int:
        if not bytes(data).strip(b"\0"):
            _enospc()
        return real_pwrite(fd, data, pos)

    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        monkeypatch.setattr(log_mod.os, "pwrite", no_room_for_zeros)
        log.append(raws[0])
        assert log.sync() == 1
        log.append(raws[1])
        assert log.sync() == 2
        monkeypatch.undo()
        assert log.path.read_bytes() == b"".join(raws)


# -- recovery: torn tail --------------------------------------------------------------------


def _check_recovered(data: Path, raws: list[bytes], counts: list[int], kept: int, truncated: int) -> None:
    with SegmentLog.open(data, "q", 0) as log:
        assert log.recovery.batches == kept
        assert log.recovery.truncated_bytes == truncated
        assert log.end == log.synced_end == sum(counts[:kept])
        size = _batches_then_zeros(log.path, sum(map(len, raws[:kept])))
        assert log.path.read_bytes()[:size].startswith(b"".join(raws[:kept]))
        if truncated:  # cut off whole; a tail of zeros alone is kept as the fill
            assert size == sum(map(len, raws[:kept]))
        assert log.read(0, max_bytes=1 << 30, upto=1 << 30) == raws[:kept]
        if kept < len(raws):  # the log is usable: the lost batch can be appended again
            log.append(raws[kept])
            assert log.sync() == sum(counts[: kept + 1])


def test_torn_tail_at_every_byte_of_the_last_batch(tmp_path: Path, read_sizes: str) -> None:
    batches = [[msg(0), msg(1)], [msg(2)], [msg(3), Message(b"", key=None, headers=(("k", b"v"),)), msg(5, 30)]]
    raws = build(batches)
    counts = [len(b) for b in batches]
    whole = b"".join(raws)
    last_at = len(whole) - len(raws[-1])
    for cut in range(len(raws[-1]) + 1):
        path = write_segment(tmp_path, whole[: last_at + cut])
        kept = 3 if cut == len(raws[-1]) else 2
        assert [h.count for h, _ in iter_file_batches(path)] == counts[:kept]  # the torn tail ignored
        _check_recovered(tmp_path, raws, counts, kept, 0 if kept == 3 else cut)


@SETTINGS
@given(batches=st.lists(message_lists, min_size=1, max_size=5), data=st.data())
def test_cut_anywhere_recovers_exactly_the_complete_batches(batches: list[list[Message]], data: st.DataObject) -> None:
    raws = build(batches)
    whole = b"".join(raws)
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    tail = b"\x00" * data.draw(st.sampled_from([0, 7, 4096]), label="zero bytes after the cut")
    content = whole[:cut] + tail
    # A batch survives when all its bytes are in the file. Usually that means it ends before
    # the cut, but zeros written after the cut can stand in for missing zero bytes (an empty
    # payload ends in zero lengths): then the batch is genuinely intact, bit for bit.
    kept, at = 0, 0
    while kept < len(raws) and content[at : at + len(raws[kept])] == raws[kept]:
        at += len(raws[kept])
        kept += 1
    assert kept >= sum(1 for i in range(len(raws)) if len(b"".join(raws[: i + 1])) <= cut)
    with tmpdir() as d:
        write_segment(d, content)
        torn = len(content) - at if content[at:].strip(b"\0") else 0  # zeros alone: the fill, kept
        _check_recovered(d, raws, [len(b) for b in batches], kept, torn)


def test_bad_last_batch_is_a_torn_tail(tmp_path: Path, read_sizes: str) -> None:
    """Rule: nothing valid follows it, so a damaged last batch is treated as a torn write,
    whichever field is hit (length, CRC, first_offset, body)."""
    raws = build([[msg(0)], [msg(1), msg(2)]])
    whole = b"".join(raws)
    last_at = len(raws[0]) * 8
    for bit in (last_at + 3, last_at + 31, last_at + 40, last_at + 70, last_at + 300, len(whole) * 8 - 1):
        write_segment(tmp_path, flip(whole, bit))
        with SegmentLog.open(tmp_path, "q", 0) as log:
            assert (log.end, log.recovery.truncated_bytes) == (1, len(raws[1])), f"bit {bit}"


# -- recovery: a write torn by a power cut ---------------------------------------------------


def _crash_image(before: bytes, after: bytes, lost: set[int]) -> bytes:
    """The file as a power cut leaves it in the middle of one write: sector ``i`` is
    ``after``'s unless ``i`` is in ``lost``, then what it held ``before`` (zeros past its end)."""
    sector = segment_scan.SECTOR
    old = before.ljust(len(after), b"\0")
    return b"".join((old if i in lost else after)[i * sector : (i + 1) * sector]
                    for i in range(-(-len(after) // sector)))


def _synced_then_written(d: Path, synced: list[list[bytes]], unsynced: list[bytes]) -> tuple[bytes, bytes]:
    """A log's file after ``synced`` group commits, and after one more written but not synced."""
    with SegmentLog.open(d, "q", 0, create=True) as log:
        for group in synced:
            for raw in group:
                log.append(raw)
            log.sync()
        before = log.path.read_bytes()
        for raw in unsynced:
            log.append(raw)
        assert log.begin_sync() is not None  # written; the power goes before its fdatasync
        after = log.path.read_bytes()
        log._buffer.clear()  # closed as if it died: what is on disk is what the crash left
        log._buffered_bytes = 0
    return before, after


def test_a_power_cut_that_keeps_a_later_sector_of_a_write_is_a_torn_tail(tmp_path: Path) -> None:
    """Issue 39: with the file running ahead in zeros, a power cut in a group commit can leave a
    later sector of it on disk and an earlier one not. The lost sector reads as zeros and the
    batches after it are whole: the scan cuts it all off as a torn tail, keeping every synced
    batch, instead of calling the segment corrupt (on both replicas, after one power cut, no
    replica would then serve its acked messages). Fails with a scan that treats every valid
    batch after a bad one as corruption."""
    raws = build([[msg(i, 300)] for i in range(12)])
    before, after = _synced_then_written(tmp_path, [raws[:2], raws[2:4]], raws[4:])
    synced = sum(map(len, raws[:4]))
    lost_at = (synced + 1100) // segment_scan.SECTOR  # a sector of the 5th-8th batches
    image = _crash_image(before, after, {lost_at})
    assert image[lost_at * 512 : lost_at * 512 + 512] == bytes(512)
    kept = max(i for i in range(13) if sum(map(len, raws[:i])) <= lost_at * 512)
    assert 4 <= kept < 12
    later = sum(map(len, raws[: kept + 1]))
    with open(write_segment(tmp_path, image), "rb") as f:  # a whole batch past the lost sector fooled the old scan
        assert segment_scan._find_valid_batch(f.fileno(), later, len(image)) is not None
    with SegmentLog.open(tmp_path, "q", 0) as log:
        assert (log.end, log.recovery.batches) == (kept, kept)
        assert log.recovery.truncated_bytes == len(image) - sum(map(len, raws[:kept]))
        assert log.read(0, max_bytes=1 << 20, upto=log.end) == raws[:kept]
        log.append(raws[kept])  # usable: the lost batches can come again
        log.sync()


def test_a_sector_of_zeros_past_the_tear_window_is_corruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torn write leaves nothing whole that starts ``TEAR_WINDOW`` or more past where it went
    bad (every batch of one write starts within it of the write's start, ``begin_sync``): a
    sector of zeros with a valid batch that far after it is corruption, not a tear."""
    monkeypatch.setattr(segment_scan, "TEAR_WINDOW", 4096)
    raws = build([[msg(i, 300)] for i in range(30)])
    whole = bytearray(b"".join(raws))
    at = len(raws[0]) + len(raws[1])
    whole[1024:1536] = bytes(512)  # the 3rd batch's second sector: the scan goes bad at ``at``
    assert at < 1024 < at + len(raws[2])
    write_segment(tmp_path, bytes(whole))
    with pytest.raises(CorruptLog) as info:
        SegmentLog.open(tmp_path, "q", 0)
    assert info.value.position == at
    monkeypatch.setattr(segment_scan, "TEAR_WINDOW", len(whole))  # all of it within the window: torn
    with SegmentLog.open(tmp_path, "q", 0) as log:
        assert log.end == 2


def test_one_write_holds_only_batches_that_start_within_the_tear_window(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``begin_sync`` writes the batches that start within ``TEAR_WINDOW`` of its start and keeps
    the rest for the next write: sync() makes as many writes and fdatasyncs as that takes."""
    monkeypatch.setattr(log_mod, "TEAR_WINDOW", 2048)
    raws = build([[msg(i, 300)] for i in range(10)])  # ~350 bytes each: 6 start within 2,048
    with SegmentLog.open(tmp_path, "q", 0, create=True) as log:
        for raw in raws:
            log.append(raw)
        first = log.begin_sync()
        assert first is not None
        starts = [sum(map(len, raws[:i])) for i in range(10)]
        assert first.batches == sum(1 for p in starts if p < 2048) == 6
        assert log.end_sync(first) == 6 == log.synced_end and log.end == 10
        assert log.sync() == 10
        assert (log.statistics().syncs, log.statistics().synced_batches) == (2, 10)
        assert log.read(0, max_bytes=1 << 20, upto=10) == raws


@SETTINGS
@given(groups=st.lists(st.lists(message_lists, min_size=1, max_size=4), min_size=1, max_size=4), data=st.data())
def test_a_power_cut_in_any_write_keeps_every_synced_batch(groups: list[list[list[Message]]],
                                                           data: st.DataObject) -> None:
    """Any subset of the unsynced write's sectors lost: the log opens (no CorruptLog), keeps
    every batch synced before it, and what it keeps is those batches and then a prefix of the
    write's, in order."""
    raws = build([ms for g in groups for ms in g])
    sizes = [len(g) for g in groups]
    cut = sum(sizes[:-1])
    with tmpdir() as d:
        before, after = _synced_then_written(
            d, [raws[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(groups) - 1)], raws[cut:])
        sectors = -(-len(after) // segment_scan.SECTOR)
        lost = data.draw(st.sets(st.integers(0, sectors - 1)), label="lost sectors")
        write_segment(d, _crash_image(before, after, lost))
        with SegmentLog.open(d, "q", 0) as log:
            kept = log.recovery.batches
            assert kept >= cut
            assert log.read(0, max_bytes=1 << 30, upto=log.end) == raws[:kept]


# -- recovery: corrupt middle ---------------------------------------------------------------


def test_every_bit_flip_in_a_middle_batch_raises_corrupt_log(tmp_path: Path, read_sizes: str) -> None:
    raws = build([[msg(0)], [msg(1), Message(b"", key=b"", headers=(("h", b"\xa1"),))], [msg(3)]])
    whole = b"".join(raws)
    mid_at = len(raws[0])
    path = tmp_path / "q" / "000000000000" / SEGMENT_FILE
    for bit in range(mid_at * 8, (mid_at + len(raws[1])) * 8):
        bad = flip(whole, bit)
        write_segment(tmp_path, bad)
        with pytest.raises(CorruptLog) as info:
            SegmentLog.open(tmp_path, "q", 0)
        assert info.value.position == mid_at, f"bit {bit}"
        assert path.read_bytes() == bad  # left untouched for inspection / repair
        got: list[BatchHeader] = []
        with pytest.raises(CorruptLog):
            for header, _ in iter_file_batches(path):
                got.append(header)
        assert [h.first_offset for h in got] == [0]  # batches before the bad one were yielded


@SETTINGS
@given(batches=st.lists(message_lists, min_size=3, max_size=6), data=st.data())
def test_random_bit_flip_before_the_tail_is_never_skipped(batches: list[list[Message]], data: st.DataObject) -> None:
    raws = build(batches)
    index = data.draw(st.integers(0, len(raws) - 2), label="damaged batch")  # a valid batch follows it
    at = sum(map(len, raws[:index]))
    bit = data.draw(st.integers(at * 8, (at + len(raws[index])) * 8 - 1), label="bit")
    damaged = flip(b"".join(raws), bit)
    with tmpdir() as d:
        write_segment(d, damaged)
        if bytes(segment_scan.SECTOR) in damaged[at : at + len(raws[index])]:
            # A message of zeros can hold a sector of zeros: the scan cannot tell that batch from
            # one a power cut tore (log.py's rules), and cuts the file there or calls it corrupt,
            # by the sector's alignment; either way it stops exactly at the damaged batch.
            try:
                with SegmentLog.open(d, "q", 0) as log:
                    assert (log.recovery.batches, log.recovery.truncated_bytes) == (index, len(damaged) - at)
            except CorruptLog as exc:
                assert exc.position == at
            return
        with pytest.raises(CorruptLog) as info:
            SegmentLog.open(d, "q", 0)
        assert info.value.position == at


def test_corrupt_length_that_looks_like_a_short_last_batch(tmp_path: Path, read_sizes: str) -> None:
    """A middle batch whose length field points past the end of the file must not be taken
    for a torn tail: the valid batch after it proves the file went on."""
    raws = build([[msg(0)], [msg(1)], [msg(2)], [msg(3)]])
    b = bytearray(b"".join(raws))
    struct.pack_into("<I", b, len(raws[0]), 1 << 30)
    write_segment(tmp_path, bytes(b))
    with pytest.raises(CorruptLog, match="short batch.*valid batch follows"):
        SegmentLog.open(tmp_path, "q", 0)
    struct.pack_into("<I", b, len(raws[0]), 0)  # and a zeroed length
    write_segment(tmp_path, bytes(b))
    with pytest.raises(CorruptLog):
        SegmentLog.open(tmp_path, "q", 0)


def test_offset_that_does_not_continue_is_corrupt(tmp_path: Path) -> None:
    raws = build([[msg(0)], [msg(1)], [msg(2)]])
    raws[1] = stamp_offset(raws[1], 5)  # CRC still valid: only the offset check sees it
    write_segment(tmp_path, b"".join(raws))
    with pytest.raises(CorruptLog, match="first_offset 5 where 1 was expected"):
        SegmentLog.open(tmp_path, "q", 0)


def test_the_follow_on_search_is_what_catches_a_corrupt_middle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a recoverer that truncates at the first bad batch (no search for a valid batch
    after it) silently drops the batches after a corrupt middle one. The tests above would
    fail against it; this shows the failure they guard against is real."""
    raws = build([[msg(0)], [msg(1)], [msg(2)]])
    write_segment(tmp_path, flip(b"".join(raws), len(raws[0]) * 8 + 200))
    monkeypatch.setattr(segment_scan, "_find_valid_batch", lambda *a: None)
    with SegmentLog.open(tmp_path, "q", 0) as log:
        assert log.end == 1  # two batches, one of them intact and acked, silently gone
    monkeypatch.undo()
    write_segment(tmp_path, flip(b"".join(raws), len(raws[0]) * 8 + 200))
    with pytest.raises(CorruptLog):
        SegmentLog.open(tmp_path, "q", 0)


# -- disk full and I/O errors ---------------------------------------------------------------


def _enospc(*args: object) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["write", "partial-write", "fdatasync", "quota"])
def test_disk_full_drops_unsynced_and_stays_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    raws = build([[msg(0)], [msg(1), msg(2)], [msg(3)]], first_seq=0)
    log = SegmentLog.open(tmp_path, "q", 0, create=True)
    log.append(raws[0])
    log.sync()
    synced_size = log.statistics().file_bytes
    log.append(raws[1])
    log.append(raws[2])
    real_pwrite = os.pwrite
    if where == "write":
        monkeypatch.setattr(log_mod.os, "pwrite", _enospc)
    elif where == "partial-write":
        calls: list[int] = []

        def partial(fd: int, data: bytes, pos: int) -> int:
            calls.append(pos)
            if len(calls) > 1:
                _enospc()
            return real_pwrite(fd, bytes(data)[:5], pos)  # half a header reaches the file

        monkeypatch.setattr(log_mod.os, "pwrite", partial)
    elif where == "fdatasync":
        real_sync = os.fdatasync
        seen: list[int] = []

        def failing_sync(fd: int) -> None:
            seen.append(fd)
            if len(seen) == 1:
                _enospc()
            real_sync(fd)

        monkeypatch.setattr(log_mod.os, "fdatasync", failing_sync)
    else:
        monkeypatch.setattr(
            log_mod.os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded"))
        )
    with pytest.raises(DiskFull) as info:
        log.sync()
    assert info.value.retriable
    monkeypatch.undo()
    assert (log.end, log.synced_end, log.last_seq) == (1, 1, 0)
    assert log.path.stat().st_size == synced_size  # nothing half-written left behind
    assert log.read(0, max_bytes=1 << 20, upto=10) == raws[:1]
    assert log.last_message() == (0, msg(0))
    log.append(raws[1])  # usable: the dropped batches can come again
    log.append(raws[2])
    assert log.sync() == 4
    log.close()
    with SegmentLog.open(tmp_path, "q", 0) as again:
        assert (again.end, again.recovery.truncated_bytes) == (4, 0)


def test_other_io_error_refuses_writes_until_reopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raws = build([[msg(0)], [msg(1)]])
    log = SegmentLog.open(tmp_path, "q", 0, create=True)
    log.append(raws[0])
    log.sync()
    log.append(raws[1])

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(log_mod.os, "fdatasync", eio)
    with pytest.raises(OSError) as info:
        log.sync()
    assert info.value.errno == errno.EIO and not isinstance(info.value, DiskFull)
    monkeypatch.undo()
    assert (log.end, log.synced_end) == (1, 1)
    assert log.read(0, max_bytes=1 << 20, upto=10) == raws[:1]  # the synced prefix is still served
    for write in (lambda: log.append(raws[1]), log.sync, lambda: log.truncate(0)):
        with pytest.raises(OSError, match="reopen"):
            write()
    log.close()
    with SegmentLog.open(tmp_path, "q", 0) as again:
        assert again.end == 1
        again.append(raws[1])
        assert again.sync() == 2


# -- reading files outside the broker -------------------------------------------------------


def test_iter_file_batches_and_paths(tmp_path: Path) -> None:
    batches = [[msg(0), msg(1)], [msg(2)]]
    raws = build(batches, first_seq=9)
    path = write_segment(tmp_path, b"".join(raws) + raws[0][:30], queue="orders", seg=12)
    got = list(iter_file_batches(path))
    assert [h.first_seq for h, _ in got] == [9, 11]
    assert [ms for _, ms in got] == batches
    assert parse_segment_path(path) == ("orders", 12) == parse_segment_path(path.parent)
    with pytest.raises(ValueError):
        parse_segment_path(tmp_path / "orders")
    empty = write_segment(tmp_path, b"", queue="e", seg=0)
    assert list(iter_file_batches(empty)) == []
    with pytest.raises(FileNotFoundError):
        list(iter_file_batches(tmp_path / "nope"))
    assert split_batches(path.read_bytes()[: sum(map(len, raws))]) == raws


def test_iter_file_batches_survives_the_file_shrinking(tmp_path: Path, read_sizes: str) -> None:
    """A reader outside the broker may race a truncate (recovery, reconcile, disk full):
    it reads less, it does not crash (no mmap, so no SIGBUS) and it never invents data."""
    raws = build([[msg(0)], [msg(1)], [msg(2)]])
    path = write_segment(tmp_path, b"".join(raws))
    it = iter_file_batches(path)
    first = next(it)
    assert first[0].first_offset == 0
    os.truncate(path, len(raws[0]) + 10)  # batch 1 is cut in the middle
    rest = list(it)
    assert [h.first_offset for h, _ in rest] in ([], [1, 2])  # [1, 2]: already read ahead


def test_a_created_segment_syncs_every_folder_that_got_a_new_name_and_only_those(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new file's name (its folder), the new folder's (the queue's folder) and, when the
    queue's folder is new too, its name in the data folder: each synced once. A second segment
    of the same queue leaves the data folder alone (a failover's way to its first ack)."""
    synced: list[Path] = []
    real = log_mod._fsync_dir
    monkeypatch.setattr(log_mod, "_fsync_dir", lambda p: (synced.append(Path(p)), real(p)))
    with SegmentLog.open(tmp_path, "q", 0, create=True):
        pass
    assert sorted(synced) == sorted([segment_dir(tmp_path, "q", 0), tmp_path / "q", tmp_path])
    synced.clear()
    with SegmentLog.open(tmp_path, "q", 1, create=True):
        pass
    assert sorted(synced) == sorted([segment_dir(tmp_path, "q", 1), tmp_path / "q"])
    synced.clear()
    with SegmentLog.open(tmp_path, "q", 2, create=True, sync_dirs=False):
        pass
    assert synced == []
