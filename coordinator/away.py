"""When a group whose liveness nodes vanished from ZooKeeper is dead for its idle queues (issue
43: no storm from a slow machine). Pure: no I/O, no clock (``now`` is given), no threads.

Guarantee: only *idle* queues wait here. A queue written lately (the daemon's probe saw its open
segment grow) moves off an absent group at once, as before; a producer moves its own queue at
once too, through the coordinator service (it asks for ``fail_over`` when a write fails). So
the ordering guarantees are untouched: this only decides when the daemon *volunteers* a move
that nobody is waiting for.

Why: at load 35-40 the brokers' 1 s ZooKeeper sessions expired with nothing killed, and the
coordinator moved 13,544 idle heads in one minute, then sealed them for 8 minutes. A liveness
node says "this process held a session"; a session can end while the process lives and
answers. So an absence alone moves only the busy queues; an idle queue moves once the group
has stayed away ``grace_s``, confirmed by the coordinator's own probe (a Health call to each
absent process). A process that refuses the connection is gone for sure: its queues move at
once, as before (a kill -9 is not a slow machine).

Rules:
- A group is "away" while not both of its processes hold their liveness node. Its away time
  counts from when this leadership term first saw it away (the term's first round for one
  already away): a coordinator that starts before its groups register waits for them, and a
  new leader never acts at once on what it has not watched go.
- Verdicts (``verdict``): LIVE (both registered); DEAD (a missing process refused the probe,
  or away past the grace and not every missing process answers, or answering yet away past
  ``max_held_s``); WAIT (away less than the grace); HELD (past the grace, but every missing
  process answered a probe made since it went away, within the last ``grace_s``: a session
  lost, the process alive). Why "within the last grace" and not "the last probe": on the slow
  machine this is for, one probe in a few may time out between answered ones; a process that
  stops answering for a whole grace (hung, cut off) is judged dead.
- ``moves_now``: a queue's head moves off an away group when the verdict is DEAD, or at once
  when the queue is busy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

# An idle queue's head waits this long for its absent group to come back (default of
# ``coordinator run --away-grace``). Why 10 s: ten 1 s sessions; the storm's sessions were
# back in a few seconds (a broker re-registers as soon as ZooKeeper answers it again).
GRACE_S = 10.0
# ... and no longer than this while its processes answer probes but never register again (a
# broker whose registration gave up, or one cut off from ZooKeeper only: writes there are
# refused, so its producers move by themselves; this bounds how long consumers wait on it).
MAX_HELD_S = 300.0


class Probe(enum.Enum):
    """What a Health call to an absent process said."""

    ANSWERED = "answered"  # it answered as this group's role: alive, its session lost
    GONE = "gone"  # the connection was refused, or another process answers there: dead
    SILENT = "silent"  # no answer in time (hung, partitioned, or very slow)


class Verdict(enum.Enum):
    LIVE = "live"
    WAIT = "wait"  # away, within the grace: idle queues stay
    HELD = "held"  # away past the grace, but its processes answer: idle queues stay
    DEAD = "dead"  # idle queues move


@attrs.frozen
class AwayPolicy:
    grace_s: float = GRACE_S
    max_held_s: float = MAX_HELD_S

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.grace_s <= self.max_held_s:
            raise ValueError(f"need 0 <= grace_s ({self.grace_s}) <= max_held_s ({self.max_held_s})")


def verdict(*, live: bool, away_for_s: float, probes: Mapping[str, Probe | None], policy: AwayPolicy) -> Verdict:
    """The verdict on one group. ``probes``: each missing process's role -> the last probe
    answer since the group went away (None: not probed yet, or its address is unknown)."""
    if live:
        return Verdict.LIVE
    if any(p is Probe.GONE for p in probes.values()):
        return Verdict.DEAD
    if away_for_s < policy.grace_s:
        return Verdict.WAIT
    if probes and all(p is Probe.ANSWERED for p in probes.values()) and away_for_s < policy.max_held_s:
        return Verdict.HELD
    return Verdict.DEAD


def moves_now(v: Verdict, *, busy: bool) -> bool:
    """Whether a queue headed by a group with verdict ``v`` moves off it now."""
    return v is Verdict.DEAD or (busy and v is not Verdict.LIVE)


@attrs.define
class AwayTracker:
    """One leadership term's record of absent groups and of the probes of their processes.
    The daemon calls ``observe`` every round, ``record`` with each probe's answer; ``verdicts``
    then says which groups' idle queues move. Counts what it deferred and what came back."""

    policy: AwayPolicy = attrs.field(factory=AwayPolicy)
    away_since: dict[str, float] = attrs.field(factory=dict)  # gid -> first seen away (this term)
    missing: dict[str, frozenset[str]] = attrs.field(factory=dict)  # gid -> roles not registered
    probes: dict[tuple[str, str], tuple[float, Probe]] = attrs.field(factory=dict)  # (gid, role) -> (at, answer)
    answered: dict[tuple[str, str], float] = attrs.field(factory=dict)  # (gid, role) -> its last ANSWERED probe
    dead: set[str] = attrs.field(factory=set)  # away groups already judged DEAD (this absence)
    deferred: dict[str, set[str]] = attrs.field(factory=dict)  # gid -> idle queues kept on it
    returned: int = 0  # absences that ended before the group was judged dead
    kept: int = 0  # idle queues deferred that kept their head: their group came back

    def observe(self, present: Mapping[str, Iterable[str]], roles: Iterable[str], now: float) -> set[str]:
        """``present``: every known group -> its roles registered now. Returns the groups that
        came back (were away, now both registered)."""
        need = frozenset(roles)
        back: set[str] = set()
        for gid, have in present.items():
            missing = need - frozenset(have)
            if not missing:
                if gid in self.away_since:
                    back.add(gid)
                continue
            self.away_since.setdefault(gid, now)
            self.missing[gid] = missing
        gone = {g for g in self.away_since if g not in present}  # groups deleted meanwhile
        for gid in back | gone:
            self._forget(gid, came_back=gid in back)
        return back

    def _forget(self, gid: str, *, came_back: bool) -> None:
        if came_back and gid not in self.dead:
            self.returned += 1
            self.kept += len(self.deferred.get(gid, ()))
        self.away_since.pop(gid, None)
        self.missing.pop(gid, None)
        self.dead.discard(gid)
        self.deferred.pop(gid, None)
        for key in [k for k in self.probes if k[0] == gid]:
            del self.probes[key]
        for key in [k for k in self.answered if k[0] == gid]:
            del self.answered[key]

    def record(self, gid: str, role: str, answer: Probe, at: float) -> None:
        """A probe of ``gid``'s ``role`` answered ``answer``; kept only while the group is away
        and only if sent after it went away (``at``: when the probe was sent)."""
        since = self.away_since.get(gid)
        if since is not None and at >= since:
            self.probes[(gid, role)] = (at, answer)
            if answer is Probe.ANSWERED:
                self.answered[(gid, role)] = max(at, self.answered.get((gid, role), at))

    def verdicts(self, now: float) -> dict[str, Verdict]:
        """The verdict on every away group (groups not listed are LIVE)."""
        out: dict[str, Verdict] = {}
        for gid, since in self.away_since.items():
            probes: dict[str, Probe | None] = {}
            for role in self.missing.get(gid, frozenset()):
                probes[role] = self._probe_of(gid, role, now)
            v = verdict(live=False, away_for_s=now - since, probes=probes, policy=self.policy)
            if v is Verdict.DEAD:
                self.dead.add(gid)
            out[gid] = v
        return out

    def _probe_of(self, gid: str, role: str, now: float) -> Probe | None:
        """What ``verdict`` counts of a missing process: GONE when its last probe was refused;
        ANSWERED when it answered one within the last ``grace_s``; else its last answer (SILENT,
        or an old ANSWERED counted as SILENT), None when never probed."""
        got = self.probes.get((gid, role))
        if got is not None and got[1] is Probe.GONE:
            return Probe.GONE
        last = self.answered.get((gid, role))
        if last is not None and now - last <= self.policy.grace_s:
            return Probe.ANSWERED
        return None if got is None else Probe.SILENT

    def defer(self, gid: str, queue: str) -> bool:
        """Note that ``queue``'s head stays on away ``gid`` for now; True the first time in this absence."""
        seen = self.deferred.setdefault(gid, set())
        if queue in seen:
            return False
        seen.add(queue)
        return True

    def next_change(self, now: float) -> float | None:
        """When the next WAIT verdict runs out of grace (or a HELD one out of ``max_held_s``)."""
        times = [since + self.policy.grace_s for g, since in self.away_since.items() if g not in self.dead]
        times += [since + self.policy.max_held_s for g, since in self.away_since.items() if g not in self.dead]
        later = [t for t in times if t > now]
        return min(later) if later else None
