"""The plain single-process checker: the verifier's audit-file rules in ordinary Python.

It is the honest alternative the Spark job is measured against (bench/bench_verify.py: rows/s
per core of each on the same files), and a second reading of the rules: on generated data it
must count every class exactly as ``ordq.spark_order_check.generate`` expects, as Spark does
(tests/test_reference_checker.py). It reads only audit files (no segment files) and keeps
per-seq state in memory (about 200 bytes per acked seq): a machine's worth, not a cluster's.

The rules are those of docs/VERIFIER.md and ``report.CLASSES``; counts are in each class's
unit (seqs, deliveries, pairs, rows).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS, OPTIONAL_COLUMNS, SKIP_COLUMNS, START_COLUMNS
from ordq.spark_order_check._files import AuditFile, list_local

_ACK_REQUIRED = tuple(ACK_COLUMNS.index(c) for c in ("queue", "producer", "seq", "seg", "crc32"))
_DELIVERY_REQUIRED = tuple(DELIVERY_COLUMNS.index(c) for c in
                           ("queue", "subscription", "consumer", "seq", "crc32", "msg_us", "deliver_us"))
_SKIP_REQUIRED = tuple(SKIP_COLUMNS.index(c) for c in ("queue", "subscription", "seq", "action"))
_SKIP_NUMBERS = tuple(SKIP_COLUMNS.index(c) for c in ("seq", "parked_seq", "at_us"))
_START_REQUIRED = tuple(START_COLUMNS.index(c) for c in ("queue", "subscription", "after_seq"))
_START_NUMBERS = tuple(START_COLUMNS.index(c) for c in ("after_seq", "seg", "offset", "at_us"))
_ACK_NUMBERS = tuple(i for i, c in enumerate(ACK_COLUMNS) if c in ("epoch", "seq", "seg", "offset", "crc32",
                                                                   "send_us", "ack_us"))
_DELIVERY_NUMBERS = tuple(i for i, c in enumerate(DELIVERY_COLUMNS) if c in ("seq", "seg", "offset", "crc32",
                                                                             "msg_us", "deliver_us", "due_us"))
_DELIVER_US, _DUE_US = DELIVERY_COLUMNS.index("deliver_us"), DELIVERY_COLUMNS.index("due_us")


@attrs.frozen
class ReferenceResult:
    counts: dict[str, int]  # class -> count (every class of the audit files, zero included)
    ack_rows: int
    delivery_rows: int
    seconds: float

    @property
    def rows(self) -> int:
        return self.ack_rows + self.delivery_rows


def _rows(files: Sequence[AuditFile], width: int, required: tuple[int, ...], numbers: tuple[int, ...],
          counts: collections.Counter[str], optional: int = 0) -> Iterator[tuple[int, list[str]]]:
    """(position, fields) of each readable row, in file order; unreadable rows are counted
    (the cut last line of a crashed writer's .tsv.part is torn, any other is malformed). The
    last ``optional`` columns may be missing (rows written before they were added)."""
    for fid, f in enumerate(files):
        with open(f.path, encoding="utf-8", newline="\n") as fh:
            fh.readline()  # the header
            for row, line in enumerate(fh):
                if row == f.torn_row:  # cut short by a crash: dropped, whatever it parses as
                    counts["torn_row"] += 1
                    continue
                fields = line.rstrip("\n").split("\t")
                ok = width - optional <= len(fields) <= width and all(fields[i] for i in required)
                if ok:
                    try:
                        for i in numbers:
                            if i < len(fields) and fields[i]:
                                int(fields[i])
                    except ValueError:
                        ok = False
                if not ok:
                    counts["malformed_row"] += 1
                    continue
                yield (fid << 33) | row, fields


def check(acks: str | Path | Iterable[str | Path], deliveries: str | Path | Iterable[str | Path], *,
          keyed: Iterable[str] = (), skips: str | Path | Iterable[str | Path] = (),
          starts: str | Path | Iterable[str | Path] = ()) -> ReferenceResult:
    """Count every audit-file class of ``report.CLASSES`` over the given files; ``skips``: the
    skip records (a parked seq with its record is ``skipped``, not ``lost``); ``starts``: the
    start records (a seq at or before where the subscription's first consumer began is
    ``before_subscribed``, not ``lost``)."""
    started = time.perf_counter()
    counts: collections.Counter[str] = collections.Counter()
    keyed_set = set(keyed)
    ack_files = list_local([str(p) for p in _as_list(acks)], "acks")
    delivery_files = list_local([str(p) for p in _as_list(deliveries)], "deliveries")

    # Skip records: per (queue, subscription), the parked seqs and the replayed ones.
    parked: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    replayed: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    skip_paths = [str(p) for p in _as_list(skips)]
    for _pos, f in _rows(list_local(skip_paths, "skips") if skip_paths else [], len(SKIP_COLUMNS), _SKIP_REQUIRED,
                         _SKIP_NUMBERS, counts):
        if f[5] in ("parked", "replayed"):
            (parked if f[5] == "parked" else replayed)[(f[0], f[1])].add(int(f[3]))
    for qs, seqs in parked.items():
        counts["skipped"] += len(seqs - replayed.get(qs, set()))

    # Start records: per (queue, subscription), the lowest seq its consumers began after.
    begun: dict[tuple[str, str], int] = {}
    start_paths = [str(p) for p in _as_list(starts)]
    for _pos, f in _rows(list_local(start_paths, "starts") if start_paths else [], len(START_COLUMNS),
                         _START_REQUIRED, _START_NUMBERS, counts):
        after = int(f[3])
        begun[(f[0], f[1])] = min(after, begun.get((f[0], f[1]), after))

    # Acks: per queue, seq -> (crc low, crc high, producers).
    acked: dict[str, dict[int, list[object]]] = collections.defaultdict(dict)
    ack_rows = 0
    for _pos, f in _rows(ack_files, len(ACK_COLUMNS), _ACK_REQUIRED, _ACK_NUMBERS, counts):
        ack_rows += 1
        seq, crc = int(f[3]), int(f[7])
        per_queue = acked[f[0]]
        entry = per_queue.get(seq)
        if entry is None:
            per_queue[seq] = [crc, crc, {f[1]}]
        else:
            entry[0], entry[1] = min(entry[0], crc), max(entry[1], crc)  # type: ignore[call-overload]
            entry[2].add(f[1])  # type: ignore[attr-defined]

    # Deliveries: per (queue, subscription) and consumer instance, in file order.
    streams: dict[tuple[str, str], dict[str, list[tuple[int, int, int, int, str | None]]]] = \
        collections.defaultdict(lambda: collections.defaultdict(list))
    delivery_rows = 0
    for pos, f in _rows(delivery_files, len(DELIVERY_COLUMNS), _DELIVERY_REQUIRED, _DELIVERY_NUMBERS, counts,
                        optional=len(OPTIONAL_COLUMNS["deliveries"])):
        delivery_rows += 1
        if len(f) > _DUE_US and f[_DUE_US] and int(f[_DUE_US]) > int(f[_DELIVER_US]):
            counts["delivered_early"] += 1
        q, s = f[0], f[1]
        key = f[6] if (s in keyed_set or f"{q}/{s}" in keyed_set) else None
        streams[(q, s)][f[2]].append((int(f[3]), pos, int(f[7]), int(f[9]), key))

    subscriptions: dict[str, list[str]] = collections.defaultdict(list)
    for q, s in sorted(streams):
        subscriptions[q].append(s)
    for q, per_seq in acked.items():
        counts["crc_conflict_acks"] += sum(1 for e in per_seq.values() if e[0] != e[1])
        if q not in subscriptions:
            counts["lost"] += len(per_seq)  # nobody consumed the queue
    for (q, s), instances in streams.items():
        _check_subscription(q, s, instances, acked.get(q), q in acked, counts, parked.get((q, s), set()),
                            begun.get((q, s)))
    return ReferenceResult(counts=dict(counts), ack_rows=ack_rows, delivery_rows=delivery_rows,
                           seconds=time.perf_counter() - started)


def _as_list(value: str | Path | Iterable[str | Path]) -> list[str | Path]:
    return [value] if isinstance(value, (str, Path)) else list(value)


def _check_subscription(q: str, s: str, instances: dict[str, list[tuple[int, int, int, int, str | None]]],
                        acked: dict[int, list[object]] | None, queue_has_acks: bool,
                        counts: collections.Counter[str], parked: set[int], begun_after: int | None) -> None:
    acked = acked or {}
    delivered: dict[int, list[int]] = {}  # seq -> [deliveries, crc low, crc high]
    duplicates_of: collections.Counter[int] = collections.Counter()
    for rows in instances.values():
        for seq, _pos, crc, _t, _key in rows:
            d = delivered.get(seq)
            if d is None:
                delivered[seq] = [1, crc, crc]
            else:
                d[0] += 1
                d[1], d[2] = min(d[1], crc), max(d[2], crc)
        _check_instance(rows, counts, duplicates_of)
    _check_concurrent(instances, counts)

    for seq, (crc_lo, crc_hi, _producers) in acked.items():
        if seq not in delivered:
            if seq in parked:  # parked with its skip record: explicitly skipped, not lost
                continue
            counts["before_subscribed" if begun_after is not None and seq <= begun_after else "lost"] += 1
        else:
            n, d_lo, d_hi = delivered[seq]
            if crc_lo == crc_hi and (d_lo != crc_lo or d_hi != crc_lo):
                counts["crc_mismatch_delivery"] += 1
    unacked = sorted(seq for seq in delivered if seq not in acked)
    for seq in unacked:
        _n, d_lo, d_hi = delivered[seq]
        if d_lo != d_hi:
            counts["crc_mismatch_delivery"] += 1
    for lo, hi in _ranges(unacked):
        before = acked.get(lo - 1)
        after = acked.get(hi + 1)
        inside = queue_has_acks and before is not None and after is not None and bool(
            before[2] & after[2])  # type: ignore[operator]
        violation = inside or not queue_has_acks
        counts["unacked" if violation else "unacked_in_flight"] += hi - lo + 1
    for seq, (n, _lo, _hi) in delivered.items():
        extra = n - 1 - duplicates_of[seq]
        if extra > 0:
            counts["redelivered_after_takeover"] += extra


def _check_instance(rows: list[tuple[int, int, int, int, str | None]], counts: collections.Counter[str],
                    duplicates_of: collections.Counter[int]) -> None:
    """duplicate, gap, out_of_order (or key_order per key) over one instance's deliveries in
    (seq, position) order: the previous distinct seq's first delivery must come first."""
    by_seq = sorted(rows, key=lambda r: (r[0], r[1]))
    keyed = any(r[4] is not None for r in rows)
    pseq: int | None = None
    ppos = 0
    for seq, pos, _crc, _t, _key in by_seq:
        if seq == pseq:
            counts["duplicate"] += 1
            duplicates_of[seq] += 1
            continue
        if pseq is not None:
            if seq > pseq + 1:
                counts["gap"] += seq - pseq - 1
            if not keyed and pos < ppos:
                counts["out_of_order"] += 1
        pseq, ppos = seq, pos
    if keyed:
        per_key: dict[str, tuple[int, int]] = {}  # key -> (previous distinct seq, its first position)
        for seq, pos, _crc, _t, key in by_seq:
            if not key:  # a message without a key has no per-key order
                continue
            prev = per_key.get(key)
            if prev is not None and prev[0] == seq:
                continue
            if prev is not None and pos < prev[1]:
                counts["key_order"] += 1
            per_key[key] = (seq, pos)


def _check_concurrent(instances: dict[str, list[tuple[int, int, int, int, str | None]]],
                      counts: collections.Counter[str]) -> None:
    """Instances ordered by their first delivery (time, position): an instance delivering after
    the next one started counts each such delivery."""
    firsts = sorted((min((r[3], r[1]) for r in rows), c) for c, rows in instances.items())
    for (_first, c), (nxt, _c2) in zip(firsts, firsts[1:], strict=False):
        start = nxt[0]
        counts["concurrent_consumers"] += sum(1 for r in instances[c] if r[3] > start)


def _ranges(sorted_seqs: list[int]) -> Iterator[tuple[int, int]]:
    it = iter(sorted_seqs)
    try:
        lo = hi = next(it)
    except StopIteration:
        return
    for seq in it:
        if seq == hi + 1:
            hi = seq
            continue
        yield lo, hi
        lo = hi = seq
    yield lo, hi
