"""``broker_group/durable.py``: many files made durable with two syncs (issue 43, SealMany).
On a real file system (tmp_path): with syncfs and with its fallback (fdatasync of every file,
fsync of every folder), the files hold their new content under their final names, no temporary
file is left, an earlier file is replaced whole, and ``after`` callbacks run once either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ordq.broker_group.durable import DurableBatch


@pytest.mark.parametrize("use_syncfs", [True, False])
def test_a_batch_writes_every_file_whole_with_two_syncs_or_one_per_file_and_folder(tmp_path: Path,
                                                                                    use_syncfs: bool) -> None:
    folders = [tmp_path / f"q{i}" / "000000000000" for i in range(20)]
    for f in folders[:10]:  # half existed, with an older meta file
        f.mkdir(parents=True)
        (f / "meta.json").write_text(json.dumps({"sealed": False}))
    batch = DurableBatch(tmp_path, use_syncfs=use_syncfs)
    ran: list[int] = []
    batch.after(lambda: ran.append(1))
    for f in folders[10:]:
        f.mkdir(parents=True)
        batch.created(f)
        batch.created(f.parent)
    for f in folders:
        batch.write(f / "meta.json", json.dumps({"sealed": True}).encode())
    assert all(not (f / "meta.json").exists() or not json.loads((f / "meta.json").read_text())["sealed"]
               for f in folders)  # nothing under its final name before the commit
    batch.commit()
    assert ran == [1]
    batch.close()
    assert ran == [1]  # once
    for f in folders:
        assert json.loads((f / "meta.json").read_text()) == {"sealed": True}
        assert [p.name for p in f.iterdir()] == ["meta.json"]
    if use_syncfs:
        assert batch.syncs in (2, 20 + 20 + 10 + 1)  # syncfs, or the fallback where libc lacks it
    else:
        # every temporary file, then every folder whose entries changed (20 segment folders,
        # 10 new queue folders, and tmp_path holding those)
        assert batch.syncs == 20 + 20 + 10 + 1


def test_a_failed_commit_still_runs_after_and_leaves_old_files_whole(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "meta.json").write_text("old")
    batch = DurableBatch(tmp_path, use_syncfs=False)
    ran: list[int] = []
    batch.after(lambda: ran.append(1))
    batch.write(tmp_path / "a" / "meta.json", b"new")
    (tmp_path / "a" / "meta.json.tmp").unlink()  # the temporary file vanishes: the commit fails
    with pytest.raises(OSError):
        batch.commit()
    assert ran == [1]
    assert (tmp_path / "a" / "meta.json").read_text() == "old"
