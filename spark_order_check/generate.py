"""Synthetic audit data (docs/AUDIT_FORMAT.md) of a run with takeovers, and injected anomalies
of every class with known counts and known first examples.

Guarantee: ``generate`` writes files a real run could have written (rolling ``<writer>-<n>.tsv``
files with a header line) and returns :class:`Expected`, the exact count of every anomaly
class and the first example of each injected one, as ``verify`` must report them. It streams:
memory does not grow with ``messages`` (the benchmark writes 10^8 rows with it): only the rows
the first examples point at have their position recorded (``latency=True``, the default,
keeps every latency for the expected percentiles: pass ``latency=False`` for large runs).

The run it models, per queue of ``messages`` seqs ``0 .. N-1`` (k = N/2):

- producer ``<q>-pa`` acks ``0 .. k-in_flight-1``, then is killed: ``k-in_flight .. k-1`` were
  stored and are delivered but never acked (allowed: in flight at its end); producer
  ``<q>-pb`` takes over and acks ``k .. N-1``. ``<q>-pa`` acks ``resends`` seqs twice (a
  resend after failover, same payload: allowed).
- per subscription, consumer ``<q>-<s>-c1`` delivers ``0 .. t-1`` (t = 0.6 N) and dies; the
  standby ``<q>-<s>-c2`` resumes from the last committed cursor and delivers ``k .. N-1``, so
  ``t-k`` seqs are redelivered after takeover (allowed). ``c2`` starts delivering after ``c1``'s
  last delivery (its deliver times are shifted by ``TAKEOVER_US`` past ``c1``'s): one active
  consumer at a time.
- a keyed subscription (``Scenario.keyed``) delivers each aligned block of 4 seqs in reverse
  order (keys are ``seq % keys``, all different within a block): global order breaks, per-key
  order holds, as with hashed per-key workers.

Injected anomalies (at most 10 of each) all go to the first queue, in separate seq ranges:
duplicates, out-of-order pairs and gaps into ``c1`` of the first subscription, lost seqs at the
tail of its ``c2``, CRC mismatches into ``c2`` of the second subscription, per-key order
violations into ``c2`` of the first keyed subscription, unacked seqs and conflicting acks into
``pb``'s acks, malformed lines into ``pa``'s first file, and a torn last line into a ``.part``
file of the second subscription's ``c2``, and a zombie tail (``concurrent_consumers``): ``c1``
of the first subscription goes on delivering ``t ..`` after ``c2`` started, as a consumer leader
frozen past its session and resumed would without its lease check. Parked seqs (``skipped``):
the seqs just before the lost tail of the first subscription's ``c2`` are not delivered but have
skip records in ``skips/`` (the first of them also ``replayed`` when there are two or more), so
they count as ``skipped``, not ``lost``.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS, SKIP_COLUMNS

T0_US = 1_700_000_000_000_000
MAX_INJECT = 10
BLOCK = 4  # keyed subscriptions reverse aligned blocks of this many seqs


@attrs.frozen(kw_only=True)
class Scenario:
    queues: tuple[str, ...] = ("orders", "payments")
    subscriptions: tuple[str, ...] = ("s1", "s2")
    keyed: tuple[str, ...] = ()  # subscription names consumed with per-key ordering
    messages: int = 2_000  # per queue
    rows_per_file: int = 700
    in_flight: int = 3
    resends: int = 5
    keys: int = 8

    def __attrs_post_init__(self) -> None:
        if self.messages < 100 or self.messages % 20:
            raise ValueError("messages must be a multiple of 20, at least 100")
        if self.keys < BLOCK:
            raise ValueError(f"keys must be >= {BLOCK}")
        if not set(self.keyed) <= set(self.subscriptions):
            raise ValueError("keyed subscriptions must be among subscriptions")
        if not self.subscriptions or not self.queues:
            raise ValueError("need a queue and a subscription")


@attrs.frozen(kw_only=True)
class Injections:
    lost: int = 0
    unacked: int = 0
    duplicate: int = 0
    out_of_order: int = 0
    gap: int = 0
    key_order: int = 0
    crc_conflict_acks: int = 0
    crc_mismatch_delivery: int = 0
    malformed_row: int = 0
    concurrent_consumers: int = 0  # zombie deliveries by c1 after c2 started
    # seqs before the lost ones that c2 parked (skip records, no delivery); the first of them
    # also replayed (so not skipped) when there are two or more
    skipped: int = 0
    torn_row: bool = False

    @classmethod
    def every(cls, n: int = 3, *, keyed: bool = True) -> Injections:
        """``n`` of every class (``key_order`` only when the scenario has a keyed subscription)."""
        return cls(lost=n, unacked=n, duplicate=n, out_of_order=n, gap=n, key_order=n if keyed else 0,
                   crc_conflict_acks=n, crc_mismatch_delivery=n, malformed_row=n, concurrent_consumers=n,
                   skipped=n, torn_row=True)

    def __attrs_post_init__(self) -> None:
        for f in attrs.fields(Injections):
            v = getattr(self, f.name)
            if not isinstance(v, bool) and not 0 <= v <= MAX_INJECT:
                raise ValueError(f"{f.name}: between 0 and {MAX_INJECT}")


@attrs.frozen
class Expected:
    counts: Mapping[str, int]  # every class of report.CLASSES
    first: Mapping[str, Mapping[str, Any]]  # first example of each class with a non-zero count
    latency: Mapping[tuple[str, str], tuple[int, int, int, int]]  # nearest-rank p50, p95, p99, max
    ack_rows: int
    delivery_rows: int


def crc_of(queue: str, seq: int) -> int:
    return zlib.crc32(f"{queue}:{seq}".encode())


def key_of(seq: int, keys: int) -> str:
    return f"k{seq % keys}".encode().hex()


def latency_of(seq: int, second: bool, *, takeover_us: int = 0) -> int:
    """deliver_us - msg_us of a delivery; the standby's includes the takeover wait."""
    return 1000 + (seq * 7919) % 9000 + (500 + takeover_us if second else 0)


class _Positions:
    """(writer, file n, line) of the rows whose tag is ``wanted`` (the few examples point at),
    and the files left as ``.part``: bounded, whatever the number of rows."""

    def __init__(self, wanted: set[Any]) -> None:
        self.wanted = wanted
        self.where: dict[Any, tuple[str, int, int]] = {}
        self.parts: set[tuple[str, int]] = set()

    def at(self, tag: Any) -> str:
        writer, n, line = self.where[tag]
        return f"{writer}-{n}.tsv{'.part' if (writer, n) in self.parts else ''}:{line}"


FLUSH_LINES = 8192  # a writer's lines buffered before a write


class _Writer:
    """Rolling TSV files of one writer id, recording (writer, file n, line) of wanted tags."""

    def __init__(self, directory: Path, writer: str, columns: tuple[str, ...], rows_per_file: int,
                 positions: _Positions) -> None:
        self.directory, self.writer, self.columns = directory, writer, columns
        self.rows_per_file, self.positions = rows_per_file, positions
        self.n = 0
        self.rows = 0  # in the current file
        self.total = 0
        self.fh: TextIO | None = None
        self.buf: list[str] = []

    def _open(self) -> TextIO:
        if self.fh is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.directory / f"{self.writer}-{self.n}.tsv", "w", encoding="ascii")  # noqa: SIM115
            self.fh.write("\t".join(self.columns) + "\n")
        return self.fh

    def line(self, text: str, tag: Any = None) -> None:
        fh = self._open()
        if tag is not None and tag in self.positions.wanted:
            self.positions.where[tag] = (self.writer, self.n, self.rows + 2)
        self.buf.append(text)
        self.rows += 1
        self.total += 1
        if len(self.buf) >= FLUSH_LINES:
            fh.write("\n".join(self.buf) + "\n")
            self.buf.clear()
        if self.rows >= self.rows_per_file:
            self.close()

    def close(self, torn: str | None = None, torn_tag: Any = None) -> None:
        """Close the current file; with ``torn``, it ends in that cut line (no newline) and is
        left as ``.tsv.part``, as a writer killed mid-write leaves it."""
        if torn is None and self.fh is None:
            return
        fh = self._open()
        if self.buf:
            fh.write("\n".join(self.buf) + "\n")
            self.buf.clear()
        if torn is not None:
            fh.write(torn)
            self.positions.where[torn_tag] = (self.writer, self.n, self.rows + 2)
        fh.close()
        self.fh = None
        if torn is not None:
            final = self.directory / f"{self.writer}-{self.n}.tsv"
            final.rename(final.with_name(final.name + ".part"))
            self.positions.parts.add((self.writer, self.n))
        self.n += 1
        self.rows = 0


def _nearest_rank(sorted_values: list[int], p: float) -> int:
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


def generate(directory: Path, scenario: Scenario = Scenario(), inject: Injections = Injections(), *,
             latency: bool = True) -> Expected:
    """Write ``<directory>/acks/*.tsv`` and ``<directory>/deliveries/*.tsv`` (see module doc).

    ``latency=False`` skips the expected latency percentiles (they keep every latency in
    memory; the benchmark's 10^7 rows do not need them)."""
    sc, inj = scenario, inject
    n_msgs = sc.messages
    k = n_msgs // 2
    t = n_msgs * 6 // 10
    if inj.key_order and not sc.keyed:
        raise ValueError("key_order needs a keyed subscription")
    if any(getattr(inj, f.name) for f in attrs.fields(Injections)) and n_msgs < 2000:
        raise ValueError("injections need messages >= 2000")
    q0, s1 = sc.queues[0], sc.subscriptions[0]
    s2 = sc.subscriptions[1] if len(sc.subscriptions) > 1 else None
    if s2 is None and (inj.crc_mismatch_delivery or inj.torn_row):
        raise ValueError("crc_mismatch_delivery and torn_row are injected into a second subscription")
    if inj.out_of_order and s1 in sc.keyed:
        raise ValueError("out_of_order is injected into the first subscription, which must not be keyed")
    ks = sc.keyed[0] if sc.keyed else None
    rpf = sc.rows_per_file
    acks_dir, dels_dir = directory / "acks", directory / "deliveries"

    dup_seqs = [100 + 10 * i for i in range(inj.duplicate)]
    ooo_seqs = [300 + 10 * i for i in range(inj.out_of_order)]
    mal_after = [500 + 10 * i for i in range(inj.malformed_row)]
    gap_seqs = [k + 50 + 10 * i for i in range(inj.gap)]
    unacked_seqs = [k + 300 + 10 * i for i in range(inj.unacked)]
    conflict_seqs = [k + 500 + 10 * i for i in range(inj.crc_conflict_acks)]
    mismatch_seqs = [k + 600 + 10 * i for i in range(inj.crc_mismatch_delivery)]
    key_order_seqs = [k + 700 + 2 * sc.keys * i for i in range(inj.key_order)]
    lost_from = n_msgs - inj.lost
    parked_seqs = list(range(lost_from - inj.skipped, lost_from))
    keyhex = [key_of(i, sc.keys) for i in range(sc.keys)]
    if key_order_seqs and key_order_seqs[-1] + sc.keys >= lost_from - inj.skipped:
        raise ValueError("too many key_order injections for this many keys")

    # c2 starts after c1's last delivery (seq t-1 at most 10.5 ms after its message time).
    takeover_us = (t - k) * 1000 + 20_000
    # c2's first delivery in time (latencies vary by up to 9 ms, so it is among its first seqs)
    c2_first_us, c2_first_seq = min((T0_US + x * 1000 + latency_of(x, True, takeover_us=takeover_us), x)
                                    for x in range(k, min(n_msgs, k + 12)))

    def examples(at: Callable[[Any], str]) -> dict[str, dict[str, Any]]:
        """The first example of each class, rows given by ``at(tag)`` (their file:line)."""
        c1 = f"{q0}-{s1}-c1"
        first: dict[str, dict[str, Any]] = {}
        if inj.skipped:
            first["skipped"] = {"queue": q0, "subscription": s1, "seq": parked_seqs[1 if inj.skipped >= 2 else 0]}
        if inj.lost:
            first["lost"] = {"queue": q0, "subscription": s1, "first_seq": lost_from, "last_seq": n_msgs - 1,
                             "count": inj.lost}
        if inj.unacked:
            x = unacked_seqs[0]
            first["unacked"] = {"queue": q0, "subscription": min(sc.subscriptions), "first_seq": x, "last_seq": x,
                                "count": 1, "acked_before_by": f"{q0}-pb", "acked_after_by": f"{q0}-pb"}
        if inj.duplicate:
            x = dup_seqs[0]
            first["duplicate"] = {"queue": q0, "subscription": s1, "consumer": c1, "seq": x,
                                  "at": at(("del", q0, s1, c1, x, True)), "first_at": at(("del", q0, s1, c1, x, False))}
        if inj.out_of_order:
            x = ooo_seqs[0]
            first["out_of_order"] = {"queue": q0, "subscription": s1, "consumer": c1, "seq": x,
                                     "seq_at": at(("del", q0, s1, c1, x, False)), "higher_seq": x + 1,
                                     "higher_seq_at": at(("del", q0, s1, c1, x + 1, False))}
        if inj.gap:
            x = gap_seqs[0]
            first["gap"] = {"queue": q0, "subscription": s1, "consumer": c1, "first_missing": x, "last_missing": x,
                            "count": 1, "before_at": at(("del", q0, s1, c1, x - 1, False)),
                            "after_at": at(("del", q0, s1, c1, x + 1, False))}
        if inj.key_order and ks is not None:
            x, kc2 = key_order_seqs[0], f"{q0}-{ks}-c2"
            first["key_order"] = {"queue": q0, "subscription": ks, "consumer": kc2, "seq": x,
                                  "seq_at": at(("del", q0, ks, kc2, x, False)), "higher_seq": x + sc.keys,
                                  "higher_seq_at": at(("del", q0, ks, kc2, x + sc.keys, False)),
                                  "key": key_of(x, sc.keys)}
        if inj.crc_conflict_acks:
            x = conflict_seqs[0]
            good, bad = crc_of(q0, x), crc_of(q0, x) ^ 0x5A5A
            lo_tag, hi_tag = (("ack", q0, x), ("ack2", q0, x)) if good < bad else (("ack2", q0, x), ("ack", q0, x))
            first["crc_conflict_acks"] = {"queue": q0, "seq": x, "crc32": min(good, bad), "at": at(lo_tag),
                                          "other_crc32": max(good, bad), "other_at": at(hi_tag)}
        if inj.crc_mismatch_delivery:
            x, mc2 = mismatch_seqs[0], f"{q0}-{s2}-c2"
            assert s2 is not None
            first["crc_mismatch_delivery"] = {
                "queue": q0, "subscription": s2, "seq": x, "consumer": mc2, "expected_crc32": crc_of(q0, x),
                "acked": True, "delivered_crc32": crc_of(q0, x) ^ 0xFFFF, "at": at(("del", q0, s2, mc2, x, False)),
                "ack_at": at(("ack", q0, x))}
        if inj.concurrent_consumers:
            z = inj.concurrent_consumers
            c2 = f"{q0}-{s1}-c2"
            first["concurrent_consumers"] = {
                "queue": q0, "subscription": s1, "consumer": c1, "deliveries_after": z, "first_seq_after": t,
                "at": at(("del", q0, s1, c1, t, False)), "successor": c2, "successor_first_seq": c2_first_seq,
                "successor_first_at": at(("del", q0, s1, c2, c2_first_seq, False)), "overlap_us": z * 1000}
        if inj.malformed_row:
            x = mal_after[0]
            first["malformed_row"] = {"at": at(("malformed", x)), "text": f"{q0}\tgarbage line {x}"}
        if inj.torn_row:
            first["torn_row"] = {"at": at("torn"),
                                 "text": f"{q0}\t{s2}\t{q0}-{s2}-c2\t{n_msgs}\t2\t{n_msgs}\t{key_of(n_msgs, sc.keys)}"
                                         f"\t1\t{T0_US}\t17"}
        qf, sf = min(sc.queues), min(sc.subscriptions)
        first["unacked_in_flight"] = {"queue": qf, "subscription": sf, "first_seq": k - sc.in_flight,
                                      "last_seq": k - 1, "count": sc.in_flight, "acked_before_by": f"{qf}-pa",
                                      "acked_after_by": f"{qf}-pb"}
        first["redelivered_after_takeover"] = {"queue": qf, "subscription": sf, "seq": k, "instances": 2,
                                               "consumers": [f"{qf}-{sf}-c1", f"{qf}-{sf}-c2"]}
        return first

    # The tags the examples look up, and only those, have their rows' positions recorded.
    wanted: set[Any] = set()

    def record(tag: Any) -> str:
        wanted.add(tag)
        return ""

    examples(record)
    positions = _Positions(wanted)
    tracked = {tag[4] for tag in wanted if tag[0] == "del"}

    ack_rows = 0
    for q in sc.queues:
        inj_here = q == q0
        pa = _Writer(acks_dir, f"{q}-pa", ACK_COLUMNS, rpf, positions)

        def ack(w: _Writer, producer: str, epoch: int, seq: int, seg: int, crc: int, tag: Any = None,
                q: str = q) -> None:
            w.line(f"{q}\t{producer}\t{epoch}\t{seq}\t{seg}\t{seq}\t{keyhex[seq % sc.keys]}\t{crc}\t"
                   f"{T0_US + seq * 1000}\t{T0_US + seq * 1000 + 500}", tag)

        for seq in range(0, k - sc.in_flight):
            ack(pa, pa.writer, 1, seq, 0, crc_of(q, seq), ("ack", q, seq))
            if inj_here and seq in mal_after:
                pa.line(f"{q}\tgarbage line {seq}", ("malformed", seq))
        for seq in range(200, 200 + sc.resends):  # resent after a failover, acked again at segment 1
            ack(pa, pa.writer, 1, seq, 1, crc_of(q, seq))
        pa.close()
        pb = _Writer(acks_dir, f"{q}-pb", ACK_COLUMNS, rpf, positions)
        for seq in range(k, n_msgs):
            if inj_here and seq in unacked_seqs:
                continue
            ack(pb, pb.writer, 2, seq, 2, crc_of(q, seq), ("ack", q, seq))
            if inj_here and seq in conflict_seqs:
                ack(pb, pb.writer, 2, seq, 2, crc_of(q, seq) ^ 0x5A5A, ("ack2", q, seq))
        pb.close()
        ack_rows += pa.total + pb.total - (len(mal_after) if inj_here else 0)

    lat_values: dict[tuple[str, str], list[int]] = {}
    delivery_rows = 0
    for q in sc.queues:
        inj_here = q == q0
        for s in sc.subscriptions:
            keyed = s in sc.keyed
            values: list[int] = []
            lat_values[(q, s)] = values
            for second in (False, True):
                cons = f"{q}-{s}-c{2 if second else 1}"
                w = _Writer(dels_dir, cons, DELIVERY_COLUMNS, rpf, positions)
                lo, hi = (k, n_msgs) if second else (0, t)
                order: Iterable[int] = _keyed_order(lo, hi) if keyed else range(lo, hi)
                if inj_here and not second and s == s1:
                    order = _edit_c1(order, dup_seqs, ooo_seqs, gap_seqs)
                if inj_here and second and s == s1 and (inj.lost or inj.skipped):
                    order = (x for x in order if x < lost_from - inj.skipped)
                if inj_here and second and s == ks and key_order_seqs:
                    order = _swap_same_key(order, key_order_seqs, sc.keys)
                if inj_here and not second and s == s1 and inj.concurrent_consumers:
                    order = itertools.chain(order, range(t, t + inj.concurrent_consumers))  # the zombie tail
                seen: set[int] = set()
                for seq in order:
                    crc = crc_of(q, seq)
                    if inj_here and second and s == s2 and seq in mismatch_seqs:
                        crc ^= 0xFFFF
                    lat = latency_of(seq, second, takeover_us=takeover_us)
                    if seq >= t and not second:  # a zombie delivery: after c2's first
                        lat = c2_first_us + (seq - t + 1) * 1000 - (T0_US + seq * 1000)
                    if latency:
                        values.append(lat)
                    tag = ("del", q, s, cons, seq, seq in seen)
                    if seq in tracked:  # a repeat matters only for a row an example points at
                        seen.add(seq)
                    w.line(f"{q}\t{s}\t{cons}\t{seq}\t{0 if seq < k else 2}\t{seq}\t{keyhex[seq % sc.keys]}\t{crc}\t"
                           f"{T0_US + seq * 1000}\t{T0_US + seq * 1000 + lat}", tag)
                torn = None
                if inj_here and second and s == s2 and inj.torn_row:
                    torn = f"{q}\t{s}\t{cons}\t{n_msgs}\t2\t{n_msgs}\t{key_of(n_msgs, sc.keys)}\t1\t{T0_US}\t17"
                w.close(torn, "torn")
                delivery_rows += w.total

    if inj.skipped:  # c2 of the first subscription parked them: skip records instead of deliveries
        sw = _Writer(directory / "skips", f"{q0}-{s1}-c2", SKIP_COLUMNS, rpf, positions)
        for i, seq in enumerate(parked_seqs):
            sw.line(f"{q0}\t{s1}\t{q0}-{s1}-c2\t{seq}\t{keyhex[seq % sc.keys]}\tparked\t{q0}.parked.{s1}\t{i}\t"
                    f"{T0_US + seq * 1000 + 900}")
        if len(parked_seqs) >= 2:
            seq = parked_seqs[0]
            sw.line(f"{q0}\t{s1}\t{q0}-{s1}-c2\t{seq}\t{keyhex[seq % sc.keys]}\treplayed\t{q0}.parked.{s1}\t0\t"
                    f"{T0_US + n_msgs * 1000}")
        sw.close()

    n_subs = len(sc.subscriptions)
    counts = {
        "lost": inj.lost, "unacked": inj.unacked * n_subs, "duplicate": inj.duplicate,
        "out_of_order": inj.out_of_order, "gap": inj.gap, "key_order": inj.key_order,
        "crc_conflict_acks": inj.crc_conflict_acks, "crc_mismatch_delivery": inj.crc_mismatch_delivery,
        "crc_conflict_replicas": 0, "crc_mismatch_stored": 0, "stored_gap": 0, "stored_order": 0,
        "acked_not_stored": 0, "unreadable_segment": 0, "malformed_row": inj.malformed_row,
        "unacked_in_flight": sc.in_flight * n_subs * len(sc.queues),
        "redelivered_after_takeover": (t - k) * n_subs * len(sc.queues) - inj.gap + inj.concurrent_consumers,
        "concurrent_consumers": inj.concurrent_consumers,
        "torn_row": int(inj.torn_row),
        "skipped": inj.skipped - (1 if inj.skipped >= 2 else 0),
        "key_partitions": 0,  # the generated queues are no topic's partitions
        "delivered_early": 0,  # no generated delivery has a due time
        "before_subscribed": 0,  # no start records are generated: every subscription is judged from seq 0
    }
    first = examples(positions.at)
    percentiles = {}
    for key, values in lat_values.items():
        if not values:
            continue
        values.sort()
        percentiles[key] = (_nearest_rank(values, 0.5), _nearest_rank(values, 0.95), _nearest_rank(values, 0.99),
                        values[-1])
    return Expected(counts=counts, first=first, latency=percentiles, ack_rows=ack_rows, delivery_rows=delivery_rows)


def _keyed_order(lo: int, hi: int) -> Iterator[int]:
    """Aligned blocks of BLOCK seqs, each in reverse (per-key order kept, global order not)."""
    start = lo
    while start < hi:
        end = min(hi, (start // BLOCK + 1) * BLOCK)
        yield from range(end - 1, start - 1, -1)
        start = end


def _edit_c1(order: Iterable[int], dups: list[int], swaps: list[int], gaps: list[int]) -> Iterator[int]:
    dup_set, swap_set, gap_set = set(dups), set(swaps), set(gaps)
    held: int | None = None
    for seq in order:
        if seq in gap_set:
            continue
        if seq in swap_set:
            held = seq  # delivered after seq + 1
            continue
        yield seq
        if held is not None and seq == held + 1:
            yield held
            held = None
        if seq in dup_set:
            yield seq


def _swap_same_key(order: Iterable[int], firsts: list[int], keys: int) -> Iterator[int]:
    """Deliver x + keys where x was, and x where x + keys was (one key's order inverted)."""
    swap = {x: x + keys for x in firsts}
    swap.update({x + keys: x for x in firsts})
    for seq in order:
        yield swap.get(seq, seq)



# -- broker segment files -------------------------------------------------------------------

SEGMENT_BATCH = 100
MAX_SEGMENT_INJECT = 5


@attrs.frozen(kw_only=True)
class SegmentInjections:
    crc_conflict_replicas: int = 0  # the slave of segment 2 stores another payload
    crc_mismatch_stored: int = 0  # both replicas of segment 2 store another payload than acked
    stored_order: int = 0  # a batch of the master's segment 2 starts one seq early
    acked_not_stored: int = 0  # the last seqs of segment 2 are missing on both replicas
    stored_gap: bool = False  # segment 0 ends before the in-flight seqs
    unreadable_segment: bool = False  # a middle batch of the slave's segment 0 is corrupt

    def __attrs_post_init__(self) -> None:
        for f in attrs.fields(SegmentInjections):
            v = getattr(self, f.name)
            if not isinstance(v, bool) and not 0 <= v <= MAX_SEGMENT_INJECT:
                raise ValueError(f"{f.name}: between 0 and {MAX_SEGMENT_INJECT}")


def generate_segments(directory: Path, scenario: Scenario = Scenario(),
                      inject: SegmentInjections = SegmentInjections()) -> Expected:
    """Write the broker data of the run :func:`generate` models, under
    ``<directory>/brokers/{g1,g2}-{master,slave}/<queue>/<seg:012d>/segment.log``:
    segment 0 (group g1) holds seqs 0 .. k-1, segment 1 (g1) the resent seqs, segment 2 (g2)
    k .. N-1, in batches of 100, with payload ``b"<queue>:<seq>"`` (whose CRC the acks hold).
    Returns the counts and first examples of the segment classes (others are not set)."""
    from ordq.broker_group.log import segment_dir
    from ordq.wire.batch import Message, encode_batch, stamp_offset

    sc, inj = scenario, inject
    n_msgs = sc.messages
    k = n_msgs // 2
    q0 = sc.queues[0]
    root = directory / "brokers"
    rep = {name: str((root / name).absolute()) for name in ("g1-master", "g1-slave", "g2-master", "g2-slave")}
    conflict = [k + 800 + 10 * i for i in range(inj.crc_conflict_replicas)]
    mismatch = [k + 850 + 10 * i for i in range(inj.crc_mismatch_stored)]
    early = [k + SEGMENT_BATCH * (j + 1) for j in range(inj.stored_order)]
    offsets: dict[tuple[str, str, int], int] = {}  # (replica, queue, seq) -> offset in its segment

    def payload(q: str, seq: int, replica: str) -> bytes:
        if q == q0 and replica == "g2-slave" and seq in conflict:
            return f"other:{q}:{seq}".encode()
        if q == q0 and replica.startswith("g2") and seq in mismatch:
            return f"bad:{q}:{seq}".encode()
        return f"{q}:{seq}".encode()

    def write(replica: str, q: str, seg: int, seqs: list[int], epoch: int, starts_early: Sequence[int] = (),
              corrupt: bool = False) -> None:
        batches: list[list[int]] = []
        for i in range(0, len(seqs), SEGMENT_BATCH):
            chunk = seqs[i:i + SEGMENT_BATCH]
            if chunk and chunk[0] in starts_early:
                chunk = [chunk[0] - 1, *chunk]  # the batch starts one seq early: a repeat
            batches.append(chunk)
        out = []
        offset = 0
        for chunk in batches:
            msgs = [Message(payload(q, s, replica), key_of(s, sc.keys).encode(), (), T0_US + s * 1000) for s in chunk]
            # encode_batch numbers seqs first_seq + i: a batch is consecutive seqs.
            out.append(bytearray(stamp_offset(encode_batch(msgs, epoch=epoch, first_seq=chunk[0]), offset)))
            for i, s in enumerate(chunk):
                offsets.setdefault((replica, q, s), offset + i)
            offset += len(chunk)
        if corrupt:
            middle = out[len(out) // 2]
            middle[-1] ^= 0xFF  # last payload byte: the CRC no longer matches
        folder = segment_dir(root / replica, q, seg)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "segment.log").write_bytes(b"".join(out))

    for q in sc.queues:
        inj_here = q == q0
        seg0 = list(range(0, k - (sc.in_flight if inj_here and inj.stored_gap else 0)))
        seg1 = list(range(200, 200 + sc.resends))
        seg2 = list(range(k, n_msgs - (inj.acked_not_stored if inj_here else 0)))
        for replica in ("g1-master", "g1-slave"):
            write(replica, q, 0, seg0, 1, corrupt=inj_here and inj.unreadable_segment and replica == "g1-slave")
            write(replica, q, 1, seg1, 1)
        for replica in ("g2-master", "g2-slave"):
            write(replica, q, 2, seg2, 2, starts_early=early if inj_here and replica == "g2-master" else [])

    counts = {
        "crc_conflict_replicas": inj.crc_conflict_replicas, "crc_mismatch_stored": inj.crc_mismatch_stored,
        "stored_order": inj.stored_order, "acked_not_stored": inj.acked_not_stored,
        "stored_gap": sc.in_flight if inj.stored_gap else 0, "unreadable_segment": int(inj.unreadable_segment),
    }
    first: dict[str, dict[str, Any]] = {}

    def at(replica: str, seq: int) -> str:
        return f"{rep[replica]}:2:{offsets[(replica, q0, seq)]}"

    if conflict:
        x = conflict[0]
        good, other = zlib.crc32(payload(q0, x, "g2-master")), zlib.crc32(payload(q0, x, "g2-slave"))
        lo, hi = ("g2-master", "g2-slave") if good < other else ("g2-slave", "g2-master")
        first["crc_conflict_replicas"] = {"queue": q0, "seq": x, "crc32": min(good, other), "at": at(lo, x),
                                          "other_crc32": max(good, other), "other_at": at(hi, x)}
    if mismatch:
        x = mismatch[0]
        first["crc_mismatch_stored"] = {"queue": q0, "seq": x, "acked_crc32": crc_of(q0, x),
                                        "stored_crc32": zlib.crc32(payload(q0, x, "g2-master")),
                                        "stored_at": at("g2-master", x)}
    if early:
        x = early[0]
        first["stored_order"] = {"queue": q0, "replica": rep["g2-master"], "seg": 2,
                                 "offset": offsets[("g2-master", q0, x)] - 1, "seq": x - 1, "expected_seq": x}
    if inj.acked_not_stored:
        first["acked_not_stored"] = {"queue": q0, "first_seq": n_msgs - inj.acked_not_stored,
                                     "last_seq": n_msgs - 1, "count": inj.acked_not_stored}
    if inj.stored_gap:
        first["stored_gap"] = {"queue": q0, "first_missing": k - sc.in_flight, "last_missing": k - 1,
                               "count": sc.in_flight, "seg": 2}
    if inj.unreadable_segment:
        first["unreadable_segment"] = {"queue": q0, "replica": rep["g1-slave"], "seg": 0}
    return Expected(counts=counts, first=first, latency={}, ack_rows=0, delivery_rows=0)
