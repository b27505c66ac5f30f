"""The ``security-control-plane`` drill's window plan (drills/control_plane.py): how long its
rounds of quiet and attack windows last, the attacker's drain bound included, and whether the
drill queue's stream outlasts them.

Rules: pure (no clock, no process: the drill measures, this decides). Every attack window is
judged from its start to its end, the drain included, and its length is bounded: the attacker's
calls end at the window's end (their deadline, then cancelled) and its threads stop within
``drain_s``. The plan places no window whose end, at that bound, passes the stream's end minus
``margin_s``; when the stream left cannot hold them all, it says so before the first window
(``shortfall``), never after the stream ran out (stop h: run 3811's last window did).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class WindowPlan:
    """ROUNDS of a quiet window, then an attack window (attacks, drain, recovery: all judged)."""

    rounds: int
    quiet_s: float
    attack_s: float  # the attacker sends for this long (its calls' deadline)
    drain_s: float  # then its threads have stopped within this, its reply to the drill included
    recover_s: float  # after the drain, still judged as attacked
    margin_s: float  # the stream still runs at least this long after the last window's end

    @property
    def round_s(self) -> float:
        """One round's longest span: its quiet window and its attack window at the drain bound."""
        return self.quiet_s + self.attack_s + self.drain_s + self.recover_s

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
                f"({self.quiet_s:g} s quiet, {self.attack_s:g} s attacks, {self.drain_s:g} s drain, "
                f"{self.recover_s:g} s recovery) and a {self.margin_s:g} s margin need {self.needed_s:g} s, "
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
