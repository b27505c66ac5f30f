"""The check of a copy against its source (``ordq verify --copy-of SOURCE COPY``): a mirror's
target queue must hold the source's acked messages from where the copy starts, each once, in
the source's order (issue 40).

The source side is its producers' ack audit (queue, seq, payload CRC); the copy side is the
copy's delivery audit (a consumer of the target), else its ack audit (the mirror's producer,
``ordq mirror run --audit-dir``). A copy message is matched to its source message by payload
CRC, so the source payloads must be distinct (the drills' and tests' payloads carry their seq);
a CRC the source never acked is ``foreign``. Counted, each in source messages: ``lost`` (a
source seq after the copy's first that the copy lacks), ``duplicated`` (a copy of a source
message the copy held already), ``reordered`` (a copy that comes after a copy of a later source
message); ``first_divergence`` names the first copy position that is not the next source
message, and what it is.

Plain Python over the audit files (no Spark): a copy is checked seq by seq in order, one pass.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import attrs

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
from ordq.spark_order_check._files import list_local
from ordq.spark_order_check.reference import _ACK_NUMBERS, _ACK_REQUIRED, _DELIVERY_NUMBERS, _DELIVERY_REQUIRED, _rows


@attrs.frozen
class Divergence:
    kind: str  # lost | duplicated | reordered | foreign
    copy_seq: int | None  # where in the copy (None: at its end: the rest of the source is missing)
    source_seq: int | None  # the source message the copy holds there (None: foreign)
    expected_source_seq: int | None  # the one it should hold

    def describe(self) -> str:
        if self.kind == "lost" and self.copy_seq is None:
            return f"the copy ends before source seq {self.expected_source_seq}"
        what = "a message the source never acked" if self.source_seq is None else f"source seq {self.source_seq}"
        return (f"copy seq {self.copy_seq} holds {what} where source seq {self.expected_source_seq} belongs "
                f"({self.kind})")


@attrs.frozen
class CopyResult:
    source_messages: int  # source seqs from the copy's first on
    copy_messages: int
    counts: dict[str, int]
    first_divergence: Divergence | None
    first_source_seq: int | None

    @property
    def clean(self) -> bool:
        return self.first_divergence is None

    def to_dict(self) -> dict[str, Any]:
        d = self.first_divergence
        return {"verdict": "PASS" if self.clean else "FAIL", "source_messages": self.source_messages,
                "copy_messages": self.copy_messages, "first_source_seq": self.first_source_seq, **self.counts,
                "first_divergence": None if d is None else {**attrs.asdict(d), "what": d.describe()}}


def source_acks(paths: Sequence[str], queue: str | None = None) -> dict[int, int]:
    """seq -> payload CRC of the source's acked messages (of ``queue``, when given)."""
    counts: collections.Counter[str] = collections.Counter()
    out: dict[int, int] = {}
    for _pos, f in _rows(list_local(list(paths), "acks"), len(ACK_COLUMNS), _ACK_REQUIRED, _ACK_NUMBERS, counts):
        if queue is None or f[0] == queue:
            out[int(f[3])] = int(f[7])
    return out


def copy_rows(deliveries: Sequence[str], acks: Sequence[str], queue: str | None = None) -> dict[int, int]:
    """copy seq -> payload CRC: from the delivery audit when given, else the ack audit."""
    counts: collections.Counter[str] = collections.Counter()
    out: dict[int, int] = {}
    if deliveries:
        rows = _rows(list_local(list(deliveries), "deliveries"), len(DELIVERY_COLUMNS), _DELIVERY_REQUIRED,
                     _DELIVERY_NUMBERS, counts)
    else:
        rows = _rows(list_local(list(acks), "acks"), len(ACK_COLUMNS), _ACK_REQUIRED, _ACK_NUMBERS, counts)
    for _pos, f in rows:
        if queue is None or f[0] == queue:
            out[int(f[3])] = int(f[7])
    return out


def _map_by_crc(source: dict[int, int], copy: dict[int, int]) -> list[tuple[int, int | None]]:
    """(copy seq, the source seq it holds, None if no source message has its CRC), in copy
    order. Distinct source messages may share a CRC-32 (the birthday bound: likely among
    ~75,000; a mirror drill's source had one such pair): a CRC names every source seq that has
    it, and a copy takes the first of them after the source seq the copy before it took (else
    the first), so a copy holding both in order maps one to each, and a duplicate or a swap
    still shows as one."""
    by_crc: dict[int, list[int]] = {}
    for seq in sorted(source):
        by_crc.setdefault(source[seq], []).append(seq)
    out: list[tuple[int, int | None]] = []
    last = -1
    for cseq in sorted(copy):
        candidates = by_crc.get(copy[cseq])
        if candidates is None:
            out.append((cseq, None))
            continue
        sseq = next((s for s in candidates if s > last), candidates[0])
        out.append((cseq, sseq))
        last = sseq
    return out


def check_copy(source: dict[int, int], copy: dict[int, int]) -> CopyResult:
    """Check ``copy`` (copy seq -> CRC) against ``source`` (source seq -> CRC)."""
    mapped = _map_by_crc(source, copy)
    first = next((s for _, s in mapped if s is not None), None)
    expected_seqs = [s for s in sorted(source) if first is not None and s >= first]
    counts = {"lost": 0, "duplicated": 0, "reordered": 0, "foreign": 0}
    divergence: Divergence | None = None
    present = {s for _, s in mapped if s is not None}
    index = {s: k for k, s in enumerate(expected_seqs)}
    seen: set[int] = set()
    i = 0  # index in expected_seqs of the next source message the copy should hold
    for cseq, sseq in mapped:
        expected = expected_seqs[i] if i < len(expected_seqs) else None
        if sseq is None or sseq != expected:
            if sseq is None:
                kind = "foreign"
            elif sseq in seen:
                kind = "duplicated"
            elif expected is not None and (sseq < expected or expected in present):
                kind = "reordered"  # the one expected here comes later
            else:
                kind = "lost"  # the one expected here never comes
            if divergence is None:
                divergence = Divergence(kind, cseq, sseq, expected)
            if kind != "lost":
                counts[kind] += 1  # (lost ones are counted at the end, as the source seqs missing)
            if sseq is None or sseq in seen or kind == "reordered":
                if sseq is not None:
                    seen.add(sseq)
                continue
            i = index.get(sseq, i)  # lost: go on after the copy's next message
        seen.add(sseq)
        i += 1
        while i < len(expected_seqs) and expected_seqs[i] in seen:
            i += 1  # held already (it came early): not expected again
    counts["lost"] = sum(1 for s in expected_seqs if s not in seen)
    if divergence is None and counts["lost"]:
        missing = next(s for s in expected_seqs if s not in seen)
        divergence = Divergence("lost", None, None, missing)
    return CopyResult(source_messages=len(expected_seqs), copy_messages=len(copy), counts=counts,
                      first_divergence=divergence, first_source_seq=first)
