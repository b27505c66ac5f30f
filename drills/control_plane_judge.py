"""The ``security-control-plane`` drill's latency judgement (drills/control_plane.py): the drill
queue's produce ack p99 and the neighbour's Commit p99 in the attack windows against the quiet
windows between them, pooled and per window, what was in flight while the disk froze left out
of both sides (``device_stalls``); no fail-over during the attacks. Pure over the run's samples
and windows (``ctx.notes``), once the run is over. Since stop o a round has a gap between its
quiet and its attack window (``spans``): what was sent in it is on neither side, by time.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ordq.drills import device_stalls
from ordq.drills.runner import DrillContext

LATENCY_RATIO = 2.0  # the neighbour's produce and commit p99, attacked / quiet
MIN_ACKS = 1000  # produce acks in each kind of window (the noisy-neighbour drill's rule)
MIN_COMMITS = 200  # the neighbour's commits in each kind of window


def quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def p99(values: list[float]) -> float:
    return quantile(values, 0.99)


def p50(values: list[float]) -> float:
    return quantile(values, 0.5)


Window = tuple[int, ...]  # a round's (q0, q1, a0, a1) in µs; (q0, a0, a1) before stop o's gaps


def spans(window: Window) -> tuple[tuple[int, int], tuple[int, int]]:
    """A round's quiet and attack spans, [from, to) in µs: a gap between them since stop o (the
    drill's reads there, in neither); before, the quiet window ended where the attack began."""
    if len(window) == 3:
        q0, a0, a1 = window
        return (q0, a0), (a0, a1)
    q0, q1, a0, a1 = window
    return (q0, q1), (a0, a1)


def _within(samples: list[tuple[int, float]], span: tuple[int, int]) -> list[float]:
    return [ms for at, ms in samples if span[0] <= at < span[1]]


def split(samples: list[tuple[int, float]], windows: Sequence[Window],
          attacked_of: list[int] | None = None) -> tuple[list[float], list[float]]:
    """The ms of ``samples`` (µs at, ms) in the quiet windows, and in the attacked ones (of the
    rounds ``attacked_of`` only, if given; every round's quiet window all the same)."""
    picked = windows if attacked_of is None else [windows[i] for i in attacked_of]
    quiet_spans = [spans(w)[0] for w in windows]
    attack_spans = [spans(w)[1] for w in picked]
    quiet = [ms for at, ms in samples if any(a <= at < b for a, b in quiet_spans)]
    attacked = [ms for at, ms in samples if any(a <= at < b for a, b in attack_spans)]
    return quiet, attacked


def by_variant(windows: Sequence[Window], variant_of: list[str]) -> dict[str, list[int]]:
    """The rounds of each window variant, ``attacked`` for all of them when there is one kind,
    the judged one (``attack``) first (the acceptance's: ``attack``, then ``unplaced``)."""
    names = variant_of if len(variant_of) == len(windows) else ["attack"] * len(windows)
    if len(set(names)) <= 1:
        return {"attacked": list(range(len(windows)))}
    out: dict[str, list[int]] = {"attack": []} if "attack" in names else {}
    for i, name in enumerate(names):
        out.setdefault(name, []).append(i)
    return out


def window_ratios(samples: list[tuple[int, float]], windows: Sequence[Window], picked: list[int]) -> list[float]:
    """Each picked round's attacked p99 over the p99 of its own quiet window, the one right
    before it (nan where either is empty)."""
    out = []
    for quiet_span, attack_span in (spans(windows[i]) for i in picked):
        quiet, attacked = p99(_within(samples, quiet_span)), p99(_within(samples, attack_span))
        out.append(attacked / quiet if quiet > 0 else float("nan"))
    return out


def check_control_plane(ctx: DrillContext, acks: list[Any], _d: list[Any]) -> list[tuple[str, bool]]:
    """The drill queue's produce ack p99 and the neighbour's Commit p99, each pooled over the
    attack windows against the same pooled over the quiet windows between them (same run, same
    minutes: the noisy-neighbour drill's rule, ``neighbour.check_neighbour``), and the median of
    each attack window's p99 over its own quiet window's (``window_ratios``), each within
    ``LATENCY_RATIO``; no fail-over.

    Why both (stop g): a 4 s quiet window holds a sixth of the quiet samples, so one stalled
    quiet window sets the pooled quiet p99 alone. Quiet window 2, right after the first attack,
    had a produce ack p99 of 83-274 ms in 5 of 9 rounds (the others mostly 8-17 ms), and the
    pooled rule passed those rounds while their attack windows' acks were 2.2-4.9x (median) their
    own quiet windows'. The median of the per-window ratios is not carried by one window.

    Samples in flight while the disk under the cluster froze (``device_stalls``: I/O in flight,
    none completed for 100 ms or more) are left out of both sides, and the freezes told per kind
    of window (stop h): they are the machine's, came in quiet, idle and attack windows alike, and
    one of them set a 4 s window's p99 alone."""
    windows = ctx.notes.get("neighbour_windows")
    if not windows or not acks:
        return [("the attacks ran", False)]
    judgement = ctx.notes.get("neighbour_judgement", "?").split(":")[0]
    out: list[tuple[str, bool]] = []
    series = {"produce ack": ([(a.send_us, (a.ack_us - a.send_us) / 1000.0) for a in acks], MIN_ACKS),
              "commit": (ctx.notes.get("commit_samples", []), MIN_COMMITS)}
    variants = by_variant(windows, ctx.notes.get("window_variants", []))
    judged = next(iter(variants.values()))  # the attack windows (every window, in the acceptance's run)
    kinds = {"quiet": [spans(w)[0] for w in windows]}
    kinds |= {name: [spans(windows[i])[1] for i in picked] for name, picked in variants.items()}
    kept = device_stalls.leave_out(ctx, {what: samples for what, (samples, _) in series.items()}, kinds)
    series = {what: (kept[what], least) for what, (_, least) in series.items()}
    for what, (samples, least) in series.items():
        for name, picked in list(variants.items())[1:]:  # a measurement's other variants: told, not judged
            quiet, other = split(samples, windows, picked)
            ctx.event(f"{what} p99 quiet {p99(quiet):.1f} ms, in the {name} windows {p99(other):.1f} ms = "
                      f"{p99(other) / p99(quiet):.2f}x (p50 {p50(quiet):.1f} / {p50(other):.1f} ms; "
                      f"{len(other)} in {len(picked)} windows; not judged)")
        quiet, attacked = split(samples, windows, judged)
        q, b = p99(quiet), p99(attacked)
        per = [(_within(samples, quiet_span), _within(samples, attack_span))
               for quiet_span, attack_span in map(spans, windows)]
        ctx.notes[f"{what} p99 ms"] = (q, b)
        names = ctx.notes.get("window_variants", []) if len(variants) > 1 else []
        ctx.event(f"{what} p99 quiet {q:.1f} ms, attacked {b:.1f} ms (per window quiet/attacked, ms and how many: "
                  + ", ".join(f"{p99(x):.0f}/{p99(y):.0f} ({len(x)}/{len(y)})"
                              + (f" {names[i]}" if i < len(names) else "") for i, (x, y) in enumerate(per)) + ")")
        out.append((f"{what} p99 attacked/quiet {b:.1f}/{q:.1f} ms = {b / q:.2f}x, bound {LATENCY_RATIO:g}x "
                    f"({len(attacked)} in {len(judged)} attack windows, {len(quiet)} in the quiet ones between "
                    f"them; at least {least} each; judged {judgement})",
                    len(quiet) >= least and len(attacked) >= least and b <= LATENCY_RATIO * q))
        ratios = window_ratios(samples, windows, judged)
        middle = statistics.median(ratios)
        out.append((f"{what} p99 of each attack window over its own quiet window's: "
                    f"{', '.join(f'{r:.2f}' for r in ratios)}x, median {middle:.2f}x, bound {LATENCY_RATIO:g}x",
                    middle <= LATENCY_RATIO))
    # A fail-over before the attacks (the runner's steady load, beside busy loops, before the
    # drill isolates the cluster's CPU) is not theirs: the attacks' span is judged.
    first, last = windows[0][0], windows[-1][-1]
    moves = sorted(int(us) for w in ctx.producers for seg, us in (w.status().get("seg_first_ack_us") or {}).items()
                   if int(seg) > min(a.seg for a in acks))
    during = [us for us in moves if first <= us <= last + 5_000_000]  # its first ack: >= 1 s after the fault
    out.append((f"the drill queue's producer did not fail over during the attacks ({len(during)}; "
                f"{len(moves)} in the whole run)", not during))
    return out
