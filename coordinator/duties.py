"""What the coordinator daemon should do for one queue, decided without I/O.

Rules:
- Pure: from a queue's state and the facts (liveness, cursors, config) to a list of actions.
  The daemon (``coordinator/daemon.py``) carries them out, each as a conditional transition
  or a Seal run, so a stale plan is harmless: its CAS fails and the next round re-plans.
- Correctness never depends on these duties (producers fail over and consumers seal on their
  own); they only make recovery faster and keep the lists tidy.
"""

from __future__ import annotations

import enum

import attrs

from coordinator.state import Facts, QueueState, SegStatus


class Kind(enum.Enum):
    FAIL_OVER = "fail_over"  # the head group lost a process: move writes on at once
    SEAL = "seal"  # complete a sealing segment
    ADMIT = "admit"  # a recovered, drained group joins the send list
    POP = "pop"  # the head segment was read by every subscription
    RETAIN = "retain"  # an operator's retention limit drops the head segment


@attrs.frozen
class Action:
    kind: Kind
    gid: str | None = None
    seg: int | None = None


def plan(state: QueueState, facts: Facts, *, retention_segments: int | None = None) -> list[Action]:
    """Actions for one round, most urgent first."""
    actions: list[Action] = []
    open_seg = state.open_segment
    if open_seg is not None and open_seg.gid not in facts.live_groups:
        actions.append(Action(Kind.FAIL_OVER, gid=open_seg.gid, seg=open_seg.seg))
    actions.extend(
        Action(Kind.SEAL, gid=s.gid, seg=s.seg) for s in state.consume if s.status is SegStatus.SEALING
    )
    actions.extend(Action(Kind.ADMIT, gid=g) for g in state.groups if state.eligible(g, facts))
    head = state.consume[0] if state.consume else None
    if head is not None and head.status is SegStatus.SEALED:
        if facts.cursors and all(c.seg > head.seg for c in facts.cursors.values()):
            actions.append(Action(Kind.POP, gid=head.gid, seg=head.seg))
        elif retention_segments is not None:
            sealed = sum(1 for s in state.consume if s.status is SegStatus.SEALED)
            if sealed > retention_segments:
                actions.append(Action(Kind.RETAIN, gid=head.gid, seg=head.seg))
    return actions
