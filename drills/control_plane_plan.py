"""The ``security-control-plane`` drill's window plan (drills/control_plane.py): how long its
rounds of quiet and attack windows last, the attacker's drain bound included, and whether the
drill queue's stream outlasts them.

It also holds the windows' timing (``ROUNDS`` of a quiet then an attack window of ``WINDOW_S``
each, with gaps between them, ``PLAN``), the drill queue's stream that must outlast them
(``MESSAGES``, ``ATTACKS_FROM``, ``SETUP_S``), and what each attack window sends and from where
(``Variant``, ``window_variants``).

Rules: pure (no clock, no process: the drill measures, this decides; ``WINDOWS_ENV`` is the one
thing read). Every attack window is judged from its start to its end, the drain included, and
its length is bounded: the attacker's calls end at their deadline, ``attack_s`` after the
window's start, and its threads stop within ``drain_s``. The plan places no window whose end,
at that bound, passes the stream's end minus ``margin_s``; when the stream left cannot hold them
all, it says so before the first window (``shortfall``), never after the stream ran out (stop h:
run 3811's last window did).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from ordq.drills import cpu_isolation
from ordq.drills.control_plane_attacks import ATTACKS, CONTROLS, DRAIN_S


@attrs.frozen
class WindowPlan:
    """ROUNDS of a gap, a quiet window, a gap, then an attack window (attacks, drain, the leader
    settled: all judged). The two kinds of window last ``window_s`` each, the drill doing the
    same in both (control_plane.py ``_window``); an attack window longer only when its drain and
    settle run past that. Whatever the drill does between windows is in the gaps, in none."""

    rounds: int
    window_s: float  # each quiet window, and each attack window unless its drain and settle outlast it
    attack_s: float  # the attacker sends for this long from its window's start (its calls' deadline)
    drain_s: float  # then its threads have stopped within this, its reply to the drill included
    settle_s: float  # then the leader's calls in flight are back to their quiet level within this
    gap_s: float  # before each window: what the drill must do there (arming, cgroups, reads), then LEAD_S
    margin_s: float  # the stream still runs at least this long after the last window's end

    @property
    def round_s(self) -> float:
        """One round's longest span: its two gaps and windows, the attack window at its bounds."""
        return 2 * self.gap_s + self.window_s + max(self.window_s, self.attack_s + self.drain_s + self.settle_s)

    @property
    def needed_s(self) -> float:
        """The stream time the windows need from their start, the margin included."""
        return self.rounds * self.round_s + self.margin_s

    def ends(self, start_s: float) -> list[float]:
        """Each window's latest end (s on the stream's clock) when the first starts at ``start_s``."""
        return [start_s + (i + 1) * self.round_s for i in range(self.rounds)]

    def shortfall(self, stream_left_s: float) -> str | None:
        """None when every window, at its bound, ends ``margin_s`` before a stream with
        ``stream_left_s`` to go; else why not (said before the first window starts)."""
        if self.needed_s <= stream_left_s:
            return None
        return (f"the windows do not fit in the stream: {self.rounds} rounds of at most {self.round_s:g} s "
                f"(windows of {self.window_s:g} s, quiet and attacked: {self.attack_s:g} s attacks, then at most "
                f"{self.drain_s:g} s drain and {self.settle_s:g} s for the leader to settle; two gaps of "
                f"{self.gap_s:g} s) and a {self.margin_s:g} s margin need {self.needed_s:g} s, "
                f"the stream has {stream_left_s:.1f} s left")

    def check_load(self, duration_s: float, fault_between: tuple[float, float], setup_s: float) -> None:
        """Before a run: the windows fit in a stream of ``duration_s`` whatever the seed (the
        attacks set up at the latest ``fault_between`` moment, taking ``setup_s``); ValueError
        saying why not."""
        left = duration_s * (1.0 - max(fault_between)) - setup_s
        short = self.shortfall(left)
        if short is not None:
            raise ValueError(f"{short} (a {duration_s:g} s stream, the attacks set up from "
                             f"{max(fault_between):.0%} of it for at most {setup_s:g} s)")


def stream_left_s(status: Mapping[str, Any], rate: float) -> float:
    """The least time the drill queue's producer still streams, from its status: the messages
    it has not sent at its steady ``rate`` (drills/workload.py: after a stall it resumes the rate,
    never bursts, so the stream only ends later)."""
    total, first, sent = (int(status.get(k) or 0) for k in ("total", "next_seq", "sent"))
    return max(0.0, (total - first - sent) / rate)


# Quiet and attack windows, interleaved (as the noisy-neighbour drill's): DEFAULT_WINDOWS. Eight
# since stop 65, six judged: a 4 s window holds ~13,000 acks, so one stall of ~250 ms (~500 acks)
# set the p99 of four windows pooled (~52,000: the 520th slowest) wherever it fell, and a median of
# four window ratios moved with two of them. Beside six busy loops such stalls came in quiet, idle
# and attack windows alike, the disk not frozen and the cluster's CPU group not stalled (stop 65:
# per-window ratios 0.11-2.85x in one run, the idle control's 0.47x and 0.99x). Six windows pooled
# need three such stalls to move the p99; the rule and its bound are unchanged.
ROUNDS = 8
# Each window, quiet or attacked, lasts WINDOW_S (stop n's idle control: attack windows of 5-7 s,
# quiet ones of 3.6 s, and a per-window median of 2.66x with nothing sent: the longer side caught
# more of the machine's stalls). Its attack is ATTACK_S, then the drain and the leader's settle:
# stop n, 0.0-0.8 s and 1.3-2.0 s (its refusals held), so ~6.2 s in all, 6.8 s at the most seen.
WINDOW_S = 6.5
ATTACK_S = 4.0
# The drill's last act before each window (the attacker's cgroup and CPUs set, the path read) this
# long before it: in the gap, in no window. Stop m: the acks of the 0.5 s after such acts were the
# slowest of a quiet window.
LEAD_S = 0.5
GAP_S = 0.75  # each gap planned: LEAD_S, the arming waited for, the cgroup writes and the reads
# 205 s at 2,000 msgs/s: the attacks start at 5-15 % of the stream (ATTACKS_FROM), take up to SETUP_S
# to set up, then the windows at most PLAN.needed_s (165 s with a 5 s margin); the drill queue must
# still be written through the last window (checked before the run, and with the stream actually
# left before the first window).
MESSAGES = 410_000
ATTACKS_FROM = (0.05, 0.15)  # the part of the stream acked when the attacks start (Drill.fault_between)
SETUP_S = 8.0  # the attacks' set-up at most, as planned (stops i-n: 2.8-3.7 s beside six busy loops; told)
# After the attacker stopped, the leader may still hold calls it sent: waiting for a turn or paced
# (fair_share.py: each at most max_delay_ms, 2 s) or a refusal held (1-2 s). The window ends once the
# leader's calls in flight are back to their quiet level, within this: all of its work judged
# (stop n: 1.3-2.0 s in 54 windows).
SETTLE_S = 3.0
# Each attack window's drain: the attacker's threads stopped (DRAIN_S of its own) and its reply
# read, within this of the window's end; the whole of it judged as attacked.
PLAN = WindowPlan(rounds=ROUNDS, window_s=WINDOW_S, attack_s=ATTACK_S, drain_s=DRAIN_S + 1.0, settle_s=SETTLE_S,
                  gap_s=GAP_S, margin_s=5.0)

# The attack windows' variants, in turn (cycled over the ROUNDS): ``attack`` (the attacks of the
# run, ``ATTACKS_ENV``, from the attacker placed as a host of its own: its process on one CPU, the
# last, besides its 0.5-core quota), ``unplaced`` (the same attacks from its process on every CPU,
# as before stop g), ``hog`` (the placed attacker's process spins at its CPU quota and calls
# nothing: control_plane_attacks.CONTROLS), each with ``@SHARES`` if wanted: the attacker's cgroup
# at that ``cpu.shares`` during the window (else the drill's, cpu_isolation.MAX_SHARES, as the
# cluster's). Each variant's p99s are pooled over its windows against the same quiet windows; the
# verdict's ratio is the ``attack`` windows', the others are told beside it.
DEFAULT_WINDOWS = "attack,attack,attack,unplaced"  # over 8 rounds: 6 judged windows, 2 unplaced
UNPLACED = "unplaced"
IDLE = "idle"  # a control window: the attacker's process in place, sending nothing
# A measurement (never the acceptance: such a run fails its "windows as the acceptance's" check):
# ``ORDQ_CONTROL_PLANE_WINDOWS=attack,hog,attack@8192,hog`` makes the windows those variants; a
# variant may also name attack kinds (``huge``, ``bound+parking``: only those sent, placed) or
# ``idle``, so that one run tells each kind's cost apart, interleaved with the same quiet windows.
WINDOWS_ENV = "ORDQ_CONTROL_PLANE_WINDOWS"
# Where the leading coordinator runs in a round (its quiet window and its attack window alike): a
# variant ending ``/apart`` has it in a cgroup of its own below the cluster's weight
# (control_plane_placement.LEADER_SHARES), ``/shared`` in the cluster's group; neither: LEADER_APART.
# Apart by default since stop p: in production the coordinators run on hosts of their own, and the
# produce path does not call them, yet in the cluster's group the leader's work under attack slowed
# the drill queue's acks (stop p's probe, seed 3894, 6 windows each: produce ack p99 10.3x pooled,
# per-window median 6.7x with the leader shared; 1.15x and 1.16x apart; each kind alike).
APART, SHARED = "apart", "shared"
LEADER_APART = True


@attrs.frozen
class Variant:
    """One kind of attack window (``WINDOWS_ENV``)."""

    name: str
    kinds: tuple[str, ...]  # what the attacker sends in it
    shares: int | None = None  # its cgroup's cpu.shares then (None: ATTACKER_SHARES placed, else the cluster's)
    placed: bool = True  # its process on one CPU (a host of its own), else on every CPU
    leader_apart: bool = LEADER_APART  # the leading coordinator in a cgroup of its own in this round


def window_variants(attacks: tuple[str, ...], spec: str | None = None) -> tuple[Variant, ...]:
    """The attack windows' variants, in turn (``WINDOWS_ENV``, or ``spec``; else
    ``DEFAULT_WINDOWS``): ``attack`` and ``unplaced`` send ``attacks``, ``idle`` nothing, and
    attack or control kinds joined by ``+`` those only; then ``@SHARES`` and ``/apart`` or
    ``/shared`` (the leader's place) if wanted. ValueError naming a malformed one."""
    spec = (os.environ.get(WINDOWS_ENV, "") if spec is None else spec).strip() or DEFAULT_WINDOWS
    out = []
    for word in (w.strip() for w in spec.split(",")):
        if not word:
            continue
        rest, slash, place = word.partition("/")
        what, at, shares = rest.partition("@")
        named = tuple(what.split("+"))
        if what in ("attack", UNPLACED):
            kinds = attacks
        elif what == IDLE:
            kinds = ()
        elif all(k in (*ATTACKS, *CONTROLS) for k in named):
            kinds = named
        else:
            kinds = None
        if (kinds is None or (at and not (shares.isdigit() and 2 <= int(shares) <= cpu_isolation.MAX_SHARES))
                or (slash and place not in (APART, SHARED))):
            raise ValueError(f"{WINDOWS_ENV}: {word!r} is no window variant (attack, {UNPLACED}, {IDLE}, or kinds "
                             f"of {'+'.join((*ATTACKS, *CONTROLS))}, then @SHARES if wanted: "
                             f"2..{cpu_isolation.MAX_SHARES}, then /{APART} or /{SHARED} if wanted)")
        out.append(Variant(word, kinds, int(shares) if shares else None, placed=what != UNPLACED,
                           leader_apart=place == APART if slash else LEADER_APART))
    return tuple(out)
