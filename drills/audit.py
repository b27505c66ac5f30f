"""Small reads of a drill's audit files (docs/AUDIT_FORMAT.md): the counts and timings of the
summary table. The verdict is never decided here: ``ordq.drills.verdict`` asks spark_order_check.

Also the test hook that makes a run lose or reorder one delivery (``tamper``), so the tests
can show that such a run fails.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import attrs

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS


@attrs.frozen
class AckRow:
    producer: str
    seq: int
    seg: int
    ack_us: int
    send_us: int = 0  # when the batch holding it went out (ack_us - send_us: its ack latency)
    queue: str = ""


@attrs.frozen
class DeliveryRow:
    consumer: str
    seq: int
    seg: int
    deliver_us: int
    queue: str = ""


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    files = [p for p in directory.iterdir() if p.name.endswith((".tsv", ".tsv.part"))]

    def order(p: Path) -> tuple[str, int]:
        stem = p.name.removesuffix(".part").removesuffix(".tsv")
        writer, _, n = stem.rpartition("-")
        return (writer, int(n) if n.isdigit() else 0)

    return sorted(files, key=order)


def _rows(directory: Path, width: int) -> Iterator[list[str]]:
    for path in _files(directory):
        lines = path.read_text(encoding="ascii", errors="replace").split("\n")
        for line in lines[1:]:  # the first line names the columns
            fields = line.split("\t")
            if len(fields) == width:  # a crashed writer's cut last line is dropped
                yield fields


def read_acks(audit_dir: Path) -> list[AckRow]:
    c = {name: i for i, name in enumerate(ACK_COLUMNS)}
    return [AckRow(producer=f[c["producer"]], seq=int(f[c["seq"]]), seg=int(f[c["seg"]]),
                   ack_us=int(f[c["ack_us"]]), send_us=int(f[c["send_us"]]), queue=f[c["queue"]])
            for f in _rows(audit_dir / "acks", len(ACK_COLUMNS))]


def read_deliveries(audit_dir: Path) -> list[DeliveryRow]:
    c = {name: i for i, name in enumerate(DELIVERY_COLUMNS)}
    return [DeliveryRow(consumer=f[c["consumer"]], seq=int(f[c["seq"]]), seg=int(f[c["seg"]]),
                        deliver_us=int(f[c["deliver_us"]]), queue=f[c["queue"]])
            for f in _rows(audit_dir / "deliveries", len(DELIVERY_COLUMNS))]


def copy_as(audit_dir: Path, dest: Path, queue: str, new_queue: str) -> None:
    """Copy a run's audit files to ``dest`` with ``queue`` renamed ``new_queue`` in every row
    and file name (writer ids name the queue): a second run of the same data that one
    verification tells apart from the first (the tests tamper with such a copy instead of
    running a drill again)."""
    for kind in ("acks", "deliveries", "skips"):
        for path in _files(audit_dir / kind):
            text = path.read_text(encoding="ascii", errors="replace")
            (dest / kind).mkdir(parents=True, exist_ok=True)
            name = path.name.replace(queue, new_queue) if queue in path.name else f"{new_queue}-{path.name}"
            (dest / kind / name).write_text(text.replace(queue, new_queue), encoding="ascii")


def tamper(audit_dir: Path, how: str, rng: random.Random) -> str:
    """Test hook: make the recorded run lose (``lose``) or reorder (``reorder``) one delivery,
    by rewriting the delivery audit file that holds it. Returns what was done."""
    if how not in ("lose", "reorder"):
        raise ValueError(f"tamper how must be 'lose' or 'reorder', not {how!r}")
    delivered_by: dict[int, int] = {}
    for row in read_deliveries(audit_dir):
        delivered_by[row.seq] = delivered_by.get(row.seq, 0) + 1
    for path in _files(audit_dir / "deliveries"):
        lines = path.read_text(encoding="ascii").split("\n")
        body = [i for i, line in enumerate(lines) if i > 0 and line.count("\t") == len(DELIVERY_COLUMNS) - 1]
        seq_col = DELIVERY_COLUMNS.index("seq")
        # only seqs delivered exactly once: losing a redelivered one would lose nothing
        once = [i for i in body[1:-1] if delivered_by.get(int(lines[i].split("\t")[seq_col])) == 1]
        if len(once) < 3:
            continue
        i = rng.choice(once[:-1])
        seq = lines[i].split("\t")[seq_col]
        if how == "lose":
            del lines[i]
            done = f"removed the delivery of seq {seq} from {path.name}"
        else:
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
            done = f"swapped the deliveries of seq {seq} and the next one in {path.name}"
        path.write_text("\n".join(lines), encoding="ascii")
        return done
    raise ValueError(f"no delivery file in {audit_dir} to tamper with")
