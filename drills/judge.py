"""A drill's verdict: what the verifier found on its queue, the fault checks it expected, the
failover it measured; and a series of drills run on one cluster and judged in one Spark job.

Rules: a verdict comes only from the audit files through ``spark_order_check`` (drills/verdict.py)
and the drill's own expectations; a run that could not be verified is an ERROR, never a PASS.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from ordq.common.errors import OrdqError
from ordq.coordinator.topics import topic_of
from ordq.drills import audit
from ordq.drills.runner import Drill, DrillContext, DrillRun, LoadConfig, execute_drill
from ordq.local_cluster import LocalCluster


@attrs.frozen
class DrillResult:
    name: str
    round: int
    seed: int
    queue: str
    ok: bool
    verdict: str
    acked: int = 0
    delivered: int = 0
    lost: int | None = None
    reordered: int | None = None
    duplicates: int | None = None
    redelivered: int | None = None
    failover_s: float | None = None
    seconds: float = 0.0
    expectations: tuple[tuple[str, bool], ...] = ()
    events: tuple[tuple[float, str], ...] = ()
    run_dir: str = ""
    report: Any = None
    skipped: bool = False

    def row(self) -> dict[str, Any]:
        dups = None if self.duplicates is None else str(self.duplicates) + (
            f" (+{self.redelivered} redelivered)" if self.redelivered else "")
        return {
            "drill": self.name, "round": self.round, "acked": self.acked, "delivered": self.delivered,
            "lost": self.lost, "reordered": self.reordered, "dups": dups,
            "failover": None if self.failover_s is None else f"{self.failover_s * 1000:.0f} ms",
            "seconds": f"{self.seconds:.1f}", "verdict": self.verdict,
        }

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self, filter=lambda a, _v: a.name != "report")
        d["report"] = self.report.to_dict() if self.report is not None else None
        return d


TABLE_COLUMNS = ["drill", "round", "acked", "delivered", "lost", "reordered", "dups", "failover", "seconds",
                 "verdict"]


def judge_all(runs: Sequence[DrillRun], verify: Callable[..., Any], *, keep: bool = False,
              report_path: Path | None = None) -> list[DrillResult]:
    """One verification (``verify(audit_dirs, report_path=...)`` -> spark_order_check Report)
    over every run that has audit files; each drill's findings are those of its queue."""
    ready = [r for r in runs if r.error is None and r.skipped is None and _has_audit(r.audit_dir)]
    report = None
    error = None
    if ready:
        try:
            report = verify([r.audit_dir for r in ready], report_path=report_path)
        except (OrdqError, OSError, ValueError) as exc:
            error = f"verifier: {type(exc).__name__}: {exc}"
    results = [_judge(r, report if r in ready else None, error) for r in runs]
    for run, res in zip(runs, results, strict=True):
        if res.ok and not keep:
            if not res.skipped:
                with contextlib.suppress(OrdqError), run.ctx.cluster.store() as store:
                    store.delete_queue(run.ctx.queue)
                    if "topic" in run.ctx.notes:
                        store.delete_topic(run.ctx.notes["topic"])
            shutil.rmtree(run.ctx.run_dir, ignore_errors=True)
    return results


def _has_audit(audit_dir: Path) -> bool:
    return all(any((audit_dir / kind).glob("*.tsv*")) for kind in ("acks", "deliveries"))


def failover_seconds(run: DrillRun) -> float | None:
    """Fault -> first ack on the new segment (or by the new producer leader; first delivery by
    the new consumer leader), from the run's audit files; None when the drill has no failover."""
    return _failover_s(run.ctx, audit.read_acks(run.audit_dir), audit.read_deliveries(run.audit_dir))


def _failover_s(ctx: DrillContext, acks: list[audit.AckRow], deliveries: list[audit.DeliveryRow]) -> float | None:
    t0 = ctx.fault_us
    if t0 is None or ctx.failover_kind is None:
        return None
    if ctx.failover_kind == "segment" and ctx.fault_seg is not None:
        times = [a.ack_us for a in acks if a.seg > ctx.fault_seg and a.ack_us >= t0]
    elif ctx.failover_kind == "producer":
        times = [a.ack_us for a in acks if a.producer != ctx.fault_writer and a.ack_us >= t0]
    elif ctx.failover_kind == "consumer":
        times = [d.deliver_us for d in deliveries if d.consumer != ctx.fault_writer and d.deliver_us >= t0]
    else:
        return None
    return (min(times) - t0) / 1e6 if times else None


def findings(report: Any, queue: str, topic: str | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """What the verifier's ``report`` found on ``queue`` (and on the partitions of ``topic``,
    a keyed-topic drill's): (count per class, count per violating class found). The queue is
    unique to a drill; a finding of no queue counts against every drill."""
    counts: dict[str, int] = {}
    violations: dict[str, int] = {}
    for c in report.classes:
        n = sum(k for q, _s, k in c.by_subscription
                if q in (queue, None) or (topic is not None and topic_of(q) == topic))
        counts[c.name] = n
        if c.violation and n:
            violations[c.name] = n
    return counts, violations


def _judge(run: DrillRun, report: Any, verifier_error: str | None) -> DrillResult:
    ctx = run.ctx
    base: dict[str, Any] = {"name": ctx.drill.name, "round": ctx.round, "seed": run.seed, "queue": ctx.queue,
            "seconds": run.seconds, "run_dir": str(ctx.run_dir)}
    if run.skipped is not None:
        return DrillResult(**base, ok=True, skipped=True, verdict=run.skipped)
    acks = audit.read_acks(run.audit_dir)
    deliveries = audit.read_deliveries(run.audit_dir)
    acked = {(a.queue, a.seq) for a in acks}  # by queue: a topic drill's partitions each count from 0
    delivered = {(d.queue, d.seq) for d in deliveries}
    error = run.error
    if error is None and not ctx.drill.topic:
        top = max((seq for _q, seq in acked), default=-1)
        ctx.expect(f"the stream completed: last acked seq {top} of {ctx.load.messages - 1}",
                   top == ctx.load.messages - 1, quiet=True)
    if error is None:
        ctx.expect(f"the consumers delivered messages ({len(delivered)})", bool(delivered), quiet=True)
        if ctx.drill.check is not None:
            for what, ok in ctx.drill.check(ctx, acks, deliveries):
                ctx.expect(what, ok, quiet=True)
    unmet = [what for what, ok in ctx.expectations if not ok]
    topic = ctx.notes.get("topic")
    counts, violations = findings(report, ctx.queue, topic) if report is not None else ({}, {})
    if error is not None:
        verdict = f"ERROR ({error.splitlines()[0]})"  # whole: the cause is what the reader needs
    elif report is None:
        verdict = f"ERROR ({(verifier_error or 'no audit files to verify').splitlines()[0]})"
    elif violations:
        verdict = "FAIL (" + ", ".join(f"{k} {v}" for k, v in violations.items()) + ")"
    elif unmet:
        verdict = f"FAIL (fault check: {unmet[0][:70]})"
    else:
        verdict = "PASS"
    return DrillResult(
        **base, ok=verdict == "PASS", verdict=verdict, acked=len(acked), delivered=len(delivered),
        lost=counts.get("lost"), reordered=counts.get("out_of_order"), duplicates=counts.get("duplicate"),
        redelivered=counts.get("redelivered_after_takeover"), failover_s=_failover_s(ctx, acks, deliveries),
        expectations=tuple(ctx.expectations), events=tuple(ctx.events), report=report,
    )


def run_drill(
    cluster: LocalCluster,
    drill: Drill,
    *,
    verify: Callable[..., Any],
    round_: int = 1,
    seed: int = 0,
    load: LoadConfig | None = None,
    tamper: str | None = None,
    keep: bool = False,
    out: TextIO | None = None,
) -> DrillResult:
    """Run one drill and verify it (see ``execute_drill`` and ``judge_all``)."""
    run = execute_drill(cluster, drill, round_=round_, seed=seed, load=load, tamper=tamper, out=out)
    return judge_all([run], verify, keep=keep, report_path=run.ctx.run_dir / "report.json")[0]


def run_series(
    cluster: LocalCluster,
    drills: Sequence[Drill],
    *,
    verify: Callable[..., Any],
    rounds: int = 1,
    seed: int = 0,
    load: LoadConfig | None = None,
    tamper: str | None = None,
    keep: bool = False,
    report_path: Path | None = None,
    out: TextIO | None = sys.stdout,
) -> list[DrillResult]:
    """Every drill, ``rounds`` times (round-robin), on one cluster, then one verification of
    all of them (a Spark job has a large fixed cost; the data of a drill is small)."""
    runs = []
    for r in range(1, rounds + 1):
        for drill in drills:
            if out is not None:
                out.write(f"== drill {drill.name} round {r}/{rounds}: {drill.fault}\n")
                out.flush()
            run = execute_drill(cluster, drill, round_=r, seed=seed, load=load, tamper=tamper, out=out)
            runs.append(run)
            if out is not None:
                how = run.skipped or (f"ERROR: {run.error}" if run.error else "ran")
                out.write(f"   -> {how} in {run.seconds:.1f}s\n")
                out.flush()
    if out is not None:
        out.write(f"== verifying {sum(1 for r in runs if r.error is None and not r.skipped)} run(s) with "
                  "spark_order_check\n")
        out.flush()
    return judge_all(runs, verify, keep=keep, report_path=report_path)


def summarize(results: Iterable[DrillResult]) -> list[dict[str, Any]]:
    return [r.row() for r in results]
