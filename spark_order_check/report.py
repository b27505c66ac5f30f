"""The verifier's result: :class:`Report` (frozen), its JSON form and its human summary."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

EXAMPLES = 20


@attrs.frozen
class AnomalyClass:
    name: str
    violation: bool  # False: counted and reported, but allowed
    unit: str  # what ``count`` counts
    rule: str


# The catalogue, in report order. docs/VERIFIER.md explains each rule in full.
CLASSES: tuple[AnomalyClass, ...] = (
    AnomalyClass("lost", True, "seqs", "acked seq never delivered to a subscription (reported as seq ranges)"),
    AnomalyClass("unacked", True, "seqs",
                 "delivered seq never acked, inside one producer's acked stream (not in flight at its end)"),
    AnomalyClass("duplicate", True, "deliveries", "a consumer instance delivered a seq it had already delivered"),
    AnomalyClass("out_of_order", True, "pairs",
                 "a consumer instance delivered a higher seq before the next lower seq it delivered"),
    AnomalyClass("gap", True, "seqs", "seqs missing between the lowest and highest seq a consumer instance delivered"),
    AnomalyClass("key_order", True, "pairs",
                 "keyed subscription: within one key, a higher seq delivered before the next lower seq"),
    AnomalyClass("concurrent_consumers", True, "deliveries",
                 "a consumer instance delivered after another instance of the subscription had started "
                 "delivering (two active consumers at once)"),
    AnomalyClass("crc_conflict_acks", True, "seqs", "one seq acked with two different payload CRCs"),
    AnomalyClass("crc_mismatch_delivery", True, "seqs",
                 "a delivered payload CRC differs from the acked one (or deliveries of an unacked seq disagree)"),
    AnomalyClass("crc_conflict_replicas", True, "seqs", "segments: master and slave store different CRCs for a seq"),
    AnomalyClass("crc_mismatch_stored", True, "seqs", "segments: the stored payload CRC differs from the acked one"),
    AnomalyClass("stored_gap", True, "seqs",
                 "segments: stored seqs of a queue in (seg, offset) order skip seqs (after dropping resends)"),
    AnomalyClass("stored_order", True, "messages",
                 "segments: inside one segment copy, a seq is not the previous one + 1"),
    AnomalyClass("acked_not_stored", True, "seqs", "segments: an acked seq is in no stored segment"),
    AnomalyClass("unreadable_segment", True, "files", "segments: a segment file that could not be parsed"),
    AnomalyClass("delivered_early", True, "deliveries",
                 "delayed delivery: a message handed out before its due time (timestamp + the subscription's "
                 "delay, or its deliver_at)"),
    AnomalyClass("malformed_row", True, "rows", "an audit line that cannot be parsed (not a torn last line)"),
    AnomalyClass("unacked_in_flight", False, "seqs",
                 "delivered seq never acked, in flight when its producer's run ended (allowed)"),
    AnomalyClass("redelivered_after_takeover", False, "deliveries",
                 "a seq delivered again by another consumer instance of the subscription (allowed)"),
    AnomalyClass("skipped", False, "seqs",
                 "a seq the subscription's consumer parked (failure policy park) with its skip record and did not "
                 "replay: explicitly skipped, not lost"),
    AnomalyClass("before_subscribed", False, "seqs",
                 "an acked seq at or before where the subscription's first audited consumer began (its start "
                 "record): made after those messages were removed, or committed past them before the audit began; "
                 "not the subscription's to deliver here"),
    AnomalyClass("torn_row", False, "rows", "the cut last line of a crashed writer's .tsv.part file (dropped)"),
    AnomalyClass("key_partitions", True, "keys",
                 "topic: one key's messages in two partitions of the topic (acked or delivered there)"),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}
# The classes the brokers' segment files feed (``verify(segments=...)``); the rest come from
# the audit files alone.
SEGMENT_CLASS_NAMES = ("crc_conflict_replicas", "crc_mismatch_stored", "stored_gap", "stored_order",
                       "acked_not_stored", "unreadable_segment")
# The classes only a topic's check feeds (``verify(topics=...)``).
TOPIC_CLASS_NAMES = ("key_partitions",)
AUDIT_CLASS_NAMES = tuple(c.name for c in CLASSES if c.name not in SEGMENT_CLASS_NAMES + TOPIC_CLASS_NAMES)


@attrs.frozen
class ClassResult:
    """One anomaly class: ``count`` in the class's unit, per (queue, subscription), examples."""

    name: str
    violation: bool
    count: int
    findings: int  # rows behind count: ranges for range classes, events otherwise
    by_subscription: tuple[tuple[str | None, str | None, int], ...]
    examples: tuple[Mapping[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        meta = CLASS_BY_NAME[self.name]
        return {
            "violation": self.violation,
            "count": self.count,
            "unit": meta.unit,
            "findings": self.findings,
            "rule": meta.rule,
            "by_subscription": [{"queue": q, "subscription": s, "count": n} for q, s, n in self.by_subscription],
            "examples": [dict(e) for e in self.examples],
        }


@attrs.frozen
class Latency:
    """End-to-end latency (deliver_us - msg_us) in µs over delivery rows."""

    count: int
    p50_us: int | None
    p95_us: int | None
    p99_us: int | None
    max_us: int | None
    min_us: int | None
    negative: int  # rows with deliver_us < msg_us (clock skew between machines)


@attrs.frozen
class SubscriptionStats:
    queue: str
    subscription: str
    deliveries: int
    consumers: tuple[str, ...]
    min_seq: int | None
    max_seq: int | None
    latency: Latency


@attrs.frozen
class QueueStats:
    queue: str
    ack_rows: int
    producers: tuple[str, ...]
    min_seq: int | None
    max_seq: int | None


@attrs.frozen
class InstanceStats:
    queue: str
    subscription: str
    consumer: str
    deliveries: int
    files: int
    min_seq: int | None
    max_seq: int | None


@attrs.frozen
class Inputs:
    ack_files: int
    delivery_files: int
    ack_rows: int
    delivery_rows: int
    unreadable_rows: int
    segment_files: int = 0
    stored_messages: int = 0


@attrs.frozen
class Report:
    """The verdict: ``ok`` is True only when every violation class counts zero."""

    ok: bool
    classes: tuple[ClassResult, ...]
    inputs: Inputs
    queues: tuple[QueueStats, ...]
    subscriptions: tuple[SubscriptionStats, ...]
    instances: tuple[InstanceStats, ...]
    latency_method: str
    seconds: float
    keyed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()  # topics checked as such (their partitions' keys; ``key_partitions``)
    # (queue, subscription, bin, count); bin k covers [10^(k/20), 10^((k+1)/20)) µs, -1000 is <= 0
    histogram: tuple[tuple[str, str, int, int], ...] = ()

    def __getitem__(self, name: str) -> ClassResult:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def violations(self) -> dict[str, int]:
        """Violation classes with a non-zero count."""
        return {c.name: c.count for c in self.classes if c.violation and c.count}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "violations": self.violations,
            "checks": {c.name: c.to_dict() for c in self.classes},
            "inputs": attrs.asdict(self.inputs),
            "queues": [attrs.asdict(q) for q in self.queues],
            "subscriptions": [attrs.asdict(s) for s in self.subscriptions],
            "consumer_instances": [attrs.asdict(i) for i in self.instances],
            "latency_method": self.latency_method,
            "keyed_subscriptions": list(self.keyed),
            "topics": list(self.topics),
            "notes": list(self.notes),
            "latency_histogram": [
                {"queue": q, "subscription": s, "low_us": bin_low_us(b), "high_us": bin_high_us(b), "count": n}
                for q, s, b, n in self.histogram
            ],
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """The report ``to_dict`` gave (``ordq verify --json`` printed): what a verification run
        elsewhere (a driver on another host) found. The latency histogram is not rebuilt."""
        classes = tuple(ClassResult(name=name, violation=c["violation"], count=c["count"], findings=c["findings"],
                                    by_subscription=tuple((b["queue"], b["subscription"], b["count"])
                                                          for b in c["by_subscription"]),
                                    examples=tuple(c["examples"]))
                        for name, c in d["checks"].items())
        order = {c.name: i for i, c in enumerate(CLASSES)}
        return cls(
            ok=d["ok"], classes=tuple(sorted(classes, key=lambda c: order.get(c.name, len(order)))),
            inputs=Inputs(**d["inputs"]),
            queues=tuple(QueueStats(**{**q, "producers": tuple(q["producers"])}) for q in d["queues"]),
            subscriptions=tuple(SubscriptionStats(**{**s, "consumers": tuple(s["consumers"]),
                                                     "latency": Latency(**s["latency"])})
                                for s in d["subscriptions"]),
            instances=tuple(InstanceStats(**i) for i in d["consumer_instances"]),
            latency_method=d["latency_method"], seconds=d["seconds"], keyed=tuple(d["keyed_subscriptions"]),
            notes=tuple(d["notes"]), topics=tuple(d["topics"]))

    def summary(self) -> str:
        """A human summary: verdict, inputs, per-subscription figures, counts, examples."""
        out: list[str] = []
        verdict = "PASS" if self.ok else f"FAIL ({', '.join(self.violations)})"
        out.append(f"ordq verify: {verdict}")
        i = self.inputs
        out.append(f"inputs: {i.ack_files} ack files ({i.ack_rows:,} rows), {i.delivery_files} delivery files "
                   f"({i.delivery_rows:,} rows), {i.unreadable_rows} unreadable rows"
                   + (f", {i.segment_files} segment files ({i.stored_messages:,} stored messages)"
                      if i.segment_files else ""))
        for q in self.queues:
            out.append(f"queue {q.queue}: {q.ack_rows:,} acks, seqs {_span(q.min_seq, q.max_seq)}, "
                       f"{len(q.producers)} producer(s)")
            for s in self.subscriptions:
                if s.queue == q.queue:
                    out.append(f"  subscription {s.subscription}: {s.deliveries:,} deliveries, seqs "
                               f"{_span(s.min_seq, s.max_seq)}, {len(s.consumers)} consumer instance(s); "
                               f"latency {_lat(s.latency)}")
        out.append(f"latency: {self.latency_method}")
        out.append("checks:")
        width = max(len(c.name) for c in self.classes)
        for c in self.classes:
            unit = CLASS_BY_NAME[c.name].unit
            mark = "" if c.violation else "  (allowed)"
            flag = "  <-- VIOLATION" if c.violation and c.count else ""
            out.append(f"  {c.name.ljust(width)}  {c.count:>12,} {unit}{mark}{flag}")
        for c in self.classes:
            if not c.examples:
                continue
            out.append(f"{c.name}: first {len(c.examples)} of {c.findings:,}")
            for queue, sub, n in c.by_subscription[:10]:
                out.append(f"  in {queue or '-'}/{sub or '-'}: {n:,}")
            for e in c.examples:
                out.append("    " + " ".join(f"{k}={_fmt(v)}" for k, v in e.items()))
        for note in self.notes:
            out.append(f"note: {note}")
        out.append(f"verified in {self.seconds:.1f} s")
        return "\n".join(out)


HIST_BINS_PER_DECADE = 20
NONPOSITIVE_BIN = -1000


def bin_low_us(b: int) -> float | None:
    return None if b == NONPOSITIVE_BIN else round(10 ** (b / HIST_BINS_PER_DECADE), 3)


def bin_high_us(b: int) -> float:
    return 0.0 if b == NONPOSITIVE_BIN else round(10 ** ((b + 1) / HIST_BINS_PER_DECADE), 3)


def _span(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None else f"{lo}..{hi}"


def _ms(us: int | None) -> str:
    return "-" if us is None else f"{us / 1000:.3f} ms"


def _lat(lat: Latency) -> str:
    if not lat.count:
        return "-"
    return f"p50 {_ms(lat.p50_us)} p95 {_ms(lat.p95_us)} p99 {_ms(lat.p99_us)} max {_ms(lat.max_us)}" + (
        f" ({lat.negative} negative)" if lat.negative else "")


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)
