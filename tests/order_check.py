"""The order checker of the failover tests: pure Python over what was acked and delivered.

``check_delivery`` judges one subscription. It passes when
- every consumer instance saw strictly increasing seqs with no gap and no duplicate;
- every delivered payload is intact and carries the seq it was delivered as;
- the instances follow each other without a gap (a standby starts at or before the message
  after its predecessor's last), and without overlap unless ``redelivery`` is allowed (a
  consumer-leader crash: the standby redelivers what came after the last committed cursor),
  in which case a redelivered seq must be the same message (same CRC);
- every acked seq was delivered, as the message that was acked (same CRC, same writer).

It raises AssertionError listing the first problems found. (The Spark verifier checks the
same rules at scale over audit files; this one is for tests and needs nothing installed.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
from tests.helpers.load import AckRec, DeliveryRec

MAX_REPORTED = 20


@attrs.frozen
class Summary:
    acked: int  # distinct acked seqs
    delivered: int  # distinct delivered seqs
    redelivered: int  # deliveries of a seq an earlier instance already delivered
    last_seq: int  # highest delivered seq (-1: none)


def check_delivery(
    acked: Iterable[AckRec],
    instances: Sequence[Sequence[DeliveryRec]],
    *,
    redelivery: bool = False,
    first_seq: int | None = 0,
    starts: Sequence[int | None] | None = None,
) -> Summary:
    """Judge one subscription's deliveries (``instances``: one list per consumer instance, in
    the order they led) against the acked messages.

    ``first_seq``: the first instance must start there (None: anywhere). ``starts``: per
    instance, the ``last_seq`` of the cursor it started from (None: unknown); an instance must
    begin with the seq right after it.
    """
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < MAX_REPORTED:
            problems.append(text)
        elif len(problems) == MAX_REPORTED:
            problems.append("... (more problems not shown)")

    seen: dict[int, DeliveryRec] = {}
    redelivered = 0
    prev_last: int | None = None
    for i, inst in enumerate(instances):
        for j, d in enumerate(inst):
            if not d.intact or d.payload_seq != d.seq:
                problem(f"instance {i}: seq {d.seq} delivered a corrupt or foreign payload "
                        f"(payload says seq {d.payload_seq} by {d.writer!r}, intact={d.intact})")
            if j and d.seq != inst[j - 1].seq + 1:
                kind = "gap" if d.seq > inst[j - 1].seq else "duplicate or reorder"
                problem(f"instance {i}: {kind}: seq {d.seq} after {inst[j - 1].seq}")
            earlier = seen.get(d.seq)
            if earlier is not None:
                redelivered += 1
                if not redelivery:
                    problem(f"instance {i}: seq {d.seq} delivered again (no redelivery allowed here)")
                elif earlier.crc != d.crc:
                    problem(f"instance {i}: seq {d.seq} redelivered as a different message "
                            f"(crc {d.crc} != {earlier.crc})")
            else:
                seen[d.seq] = d
        start = starts[i] if starts is not None and i < len(starts) else None
        if inst and start is not None and inst[0].seq != start + 1:
            problem(f"instance {i}: started from a cursor at seq {start} but first delivered {inst[0].seq}")
        # where this instance began: its first delivery, or (delivering nothing) its cursor
        begin = inst[0].seq if inst else (start + 1 if start is not None else None)
        if begin is None:
            continue
        if prev_last is None:
            if first_seq is not None and begin != first_seq:
                problem(f"instance {i}: begins at seq {begin}, expected {first_seq}")
        elif begin > prev_last + 1:
            problem(f"instance {i}: begins at seq {begin}, after its predecessor's last {prev_last}: "
                    f"seqs {prev_last + 1}..{begin - 1} skipped")
        if inst:
            prev_last = inst[-1].seq if prev_last is None else max(prev_last, inst[-1].seq)

    acked_by_seq: dict[int, AckRec] = {}
    for a in acked:
        other = acked_by_seq.setdefault(a.seq, a)
        if other.crc != a.crc:
            problem(f"seq {a.seq} acked twice as different messages (crc {other.crc} and {a.crc})")
    missing = sorted(s for s in acked_by_seq if s not in seen)
    if missing:
        problem(f"{len(missing)} acked seqs never delivered, e.g. {_ranges(missing)}")
    for s, a in sorted(acked_by_seq.items()):
        d = seen.get(s)
        if d is None:
            continue
        if d.crc != a.crc or (a.writer and d.writer != a.writer):
            problem(f"seq {s}: acked as crc {a.crc} by {a.writer!r}, delivered crc {d.crc} by {d.writer!r}")

    if problems:
        raise AssertionError("order check failed:\n  " + "\n  ".join(problems))
    return Summary(acked=len(acked_by_seq), delivered=len(seen), redelivered=redelivered,
                   last_seq=max(seen, default=-1))


def read_audit(audit_dir: Path, subscription: str) -> tuple[list[AckRec], list[list[DeliveryRec]]]:
    """Acks and one subscription's deliveries (one list per consumer, in delivery order) from
    the SDK's audit files (docs/AUDIT_FORMAT.md), for ``check_delivery``. Audit rows carry a
    payload CRC, not the payload: the CRC must match the acked one."""
    acked: list[AckRec] = []
    for path in _audit_files(audit_dir / "acks"):
        for row in _rows(path, ACK_COLUMNS):
            acked.append(AckRec(seq=int(row["seq"]), crc=int(row["crc32"])))
    by_consumer: dict[str, list[DeliveryRec]] = {}
    for path in _audit_files(audit_dir / "deliveries"):
        for row in _rows(path, DELIVERY_COLUMNS):
            if row["subscription"] != subscription:
                continue
            seq = int(row["seq"])
            by_consumer.setdefault(row["consumer"], []).append(
                DeliveryRec(seq=seq, payload_seq=seq, writer="", intact=True, crc=int(row["crc32"])))
    return acked, list(by_consumer.values())


def _audit_files(folder: Path) -> list[Path]:
    """Files of each writer in roll order (``<writer>-<n>.tsv``, or a crashed writer's ``.part``)."""
    def key(p: Path) -> tuple[str, int]:
        stem = p.name.split(".tsv")[0]
        writer, _, n = stem.rpartition("-")
        return writer, int(n)

    return sorted((p for p in folder.glob("*.tsv*") if p.name.endswith((".tsv", ".tsv.part"))), key=key)


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[dict[str, str]]:
    lines = path.read_text(encoding="ascii").split("\n")
    if lines[0].split("\t") != list(columns):
        raise AssertionError(f"{path}: header {lines[0]!r} is not {columns}")
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) == len(columns):  # a crashed writer's torn last line is dropped
            yield dict(zip(columns, fields, strict=True))


def _ranges(seqs: list[int], limit: int = 5) -> str:
    """'3..7, 10, 12..13' for a sorted list (the first ``limit`` runs)."""
    runs: list[tuple[int, int]] = []
    for s in seqs:
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in runs[:limit])
    return text + (", ..." if len(runs) > limit else "")
