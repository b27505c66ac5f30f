"""The audit writer (sdk/audit.py): rows reach the file before ``write_rows`` returns, so a
process killed with -9 leaves every row of what its application saw; ``close`` publishes."""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

import pytest

from ordq.sdk.audit import ACK_COLUMNS, AuditWriter


def _row(seq: int) -> tuple[object, ...]:
    return ("q", "p", 1, seq, 0, seq, "", 123, 1, 2)


def test_rows_reach_the_file_before_write_rows_returns_and_close_publishes(tmp_path: Path) -> None:
    w = AuditWriter(tmp_path, "acks", writer_id="p", rows_per_file=3)
    part = tmp_path / "acks" / "p-0.tsv.part"
    w.write_rows([_row(0)])
    lines = part.read_text().splitlines()  # read through the OS, as after a kill -9
    assert lines[0].split("\t") == list(ACK_COLUMNS)
    assert [line.split("\t")[3] for line in lines[1:]] == ["0"]
    w.write_rows([_row(1), _row(2), _row(3)])  # the third row fills file 0: it rolls
    assert not part.exists()
    assert (tmp_path / "acks" / "p-0.tsv").read_text().count("\n") == 4  # header + 3 rows
    assert (tmp_path / "acks" / "p-1.tsv.part").read_text().splitlines()[1].split("\t")[3] == "3"
    w.close()
    assert sorted(f.name for f in (tmp_path / "acks").iterdir()) == ["p-0.tsv", "p-1.tsv"]


def test_a_write_that_fails_half_way_leaves_no_half_row_to_glue_onto_the_next(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: a row missing from the middle of a delivery audit. A write that fails after
    part of a batch reached the file left half a row; the retry's rows glued onto it into one
    unreadable line, which readers drop."""
    w = AuditWriter(tmp_path, "acks", writer_id="p")
    w.write_rows([_row(0)])
    real_write = os.write
    calls: list[int] = []

    def half_then_fail(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            real_write(fd, bytes(data[: len(data) // 2]))  # part of the batch reaches the file
            raise InterruptedError("write interrupted")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(InterruptedError):
        w.write_rows([_row(1), _row(2), _row(3)])
    w.write_rows([_row(4)])
    monkeypatch.undo()
    w.close()
    lines = (tmp_path / "acks" / "p-0.tsv").read_text().splitlines()
    assert all(len(line.split("\t")) == len(ACK_COLUMNS) for line in lines), lines
    assert [int(line.split("\t")[3]) for line in lines[1:]] == [0, 1, 2, 3, 4]


def test_a_writer_restarted_with_the_same_id_keeps_what_the_last_one_wrote(tmp_path: Path) -> None:
    """A consumer with a fixed id (``ordq consume --member m1``, a ConsumerConfig.consumer_id)
    restarted into the same audit folder: the rows of the instance before it stay, killed (a
    ``.part``) or closed, and the new one numbers its files after them, so they sort in the
    order written. Before, the new writer truncated the same ``m1-0.tsv.part`` and replaced
    ``m1-0.tsv``: the evidence of every earlier delivery was gone."""
    killed = AuditWriter(tmp_path, "acks", writer_id="m1")
    killed.write_rows([_row(0), _row(1)])  # killed -9 here: its file stays a .part
    closed = AuditWriter(tmp_path, "acks", writer_id="m1")
    closed.write_rows([_row(2)])
    closed.close()
    again = AuditWriter(tmp_path, "acks", writer_id="m1")
    again.write_rows([_row(3)])
    again.close()
    files = sorted((tmp_path / "acks").iterdir(), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
    assert [f.name for f in files] == ["m1-0.tsv.part", "m1-1.tsv", "m1-2.tsv"]
    assert [[line.split("\t")[3] for line in f.read_text().splitlines()[1:]] for f in files] == [
        ["0", "1"], ["2"], ["3"]]


KPF_DIRTY = 4  # the page's bit in /proc/kpageflags (linux/kernel-page-flags.h)


def _dirty_pages(path: Path, upto: int) -> int:
    """How many of the file's pages before byte ``upto`` the kernel holds dirty (not yet
    written back): the file mapped, each page's frame from /proc/self/pagemap, its flags from
    /proc/kpageflags (root)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with path.open("rb") as f, mmap.mmap(f.fileno(), upto, prot=mmap.PROT_READ) as m:
        for at in range(0, upto, page):
            m[at]  # map every page
        start = next(int(line.split("-")[0], 16) for line in Path("/proc/self/maps").read_text().splitlines()
                     if line.endswith(str(path)))
        dirty = 0
        with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as flags:
            for i in range(upto // page):
                pagemap.seek((start // page + i) * 8)
                frame = struct.unpack("Q", pagemap.read(8))[0] & ((1 << 55) - 1)
                flags.seek(frame * 8)
                dirty += (struct.unpack("Q", flags.read(8))[0] >> KPF_DIRTY) & 1
        return dirty


def test_a_growing_file_is_written_back_as_it_grows_not_in_one_burst_30_s_later(tmp_path: Path) -> None:
    """Stop 73: the drills' audit files (600 KB/s, never synced) were written back by the kernel
    ~18 MB at once every ~30 s (their oldest dirty page's age), and the brokers' fdatasyncs on
    the same disk waited behind it: the control-plane drill's first attacked window had acks of
    70-110 ms for ~0.5 s. Each ``writeback_bytes`` written now start their writeback at once:
    what lies before the last stretch is soon clean. Left to the kernel it stays dirty ~30 s."""
    w = AuditWriter(tmp_path, "acks", writer_id="p", writeback_bytes=256 << 10)
    for seq in range(0, 400_000, 2000):  # ~6 MB in 200 writes
        w.write_rows([_row(s) for s in range(seq, seq + 2000)])
    part = tmp_path / "acks" / "p-0.tsv.part"
    page = os.sysconf("SC_PAGE_SIZE")
    upto = (part.stat().st_size - w.writeback_bytes) // page * page  # before the last stretch
    assert upto >= 4 << 20
    deadline = time.monotonic() + 10.0  # the kernel's own writeback comes at 30 s
    while (dirty := _dirty_pages(part, upto)) and time.monotonic() < deadline:
        time.sleep(0.05)
    w.close()
    assert dirty == 0, f"{dirty} of {upto // page} pages still dirty after 10 s"
