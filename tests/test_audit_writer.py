"""The audit writer (sdk/audit.py): rows reach the file before ``write_rows`` returns, so a
process killed with -9 leaves every row of what its application saw; ``close`` publishes."""

from __future__ import annotations

from pathlib import Path

from sdk.audit import ACK_COLUMNS, AuditWriter


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
