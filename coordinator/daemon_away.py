"""When an absent group's idle queues move (issue 43; a part of ``CoordinatorDaemon``,
coordinator/daemon.py): each round brings the record of absent groups up to date (the pure
``coordinator/away.py``), probes their missing processes (``coordinator/group_probe.py``) and
tells the round which heads move now; it counts what it put off and what came back.
"""

from __future__ import annotations

from ordq.common.errors import OrdqError
from ordq.coordinator.away import Probe, Verdict, moves_now
from ordq.coordinator.daemon_parts import DaemonParts, log
from ordq.coordinator.daemon_view import DaemonView
from ordq.coordinator.group_probe import GroupProber
from ordq.coordinator.paths import ROLES


class AbsentGroups(DaemonParts):
    """The absent groups' methods."""

    def _judge_groups(self, view: DaemonView, queues: list[str], now: float) -> list[str]:
        """Bring the record of absent groups up to date (``AwayTracker``), probe their missing
        processes, and return ``queues`` with, added, every queue headed by a group judged dead
        since the last round (its idle queues move now) that the copy holds, or that this
        process created and its copy has not read (``DaemonView.take_written``: no read, no
        second pass); those created elsewhere and not read come next (``_unread_of_dead``)."""
        for gid, roles in view.members.items():
            for role, info in roles.items():
                self._addresses[(gid, role)] = info.address
        present = {g: set(view.members.get(g, {})) for g in view.group_versions}
        with self._lock:
            was_dead = set(self._away.dead)
            back = self._away.observe(present, ROLES, now)
            before = self._verdicts
            self._verdicts = verdicts = self._away.verdicts(now)
            missing = {g: set(self._away.missing.get(g, ())) for g in verdicts}
            self.stats.away_groups = len(verdicts)
            self.stats.held_groups = sum(1 for v in verdicts.values() if v is Verdict.HELD)
            self.stats.groups_back = self._away.returned
            self.stats.kept_heads = self._away.kept
        for gid in sorted(back - was_dead):
            log.info("group %s is back within its grace: the idle queues it heads keep their heads", gid)
        if self.pinger is not None:
            if self._prober is None:
                self._prober = GroupProber(self.pinger, self._on_ping)
            for gid, v in verdicts.items():
                for role in sorted(missing[gid]) if v is not Verdict.DEAD else ():
                    address = self._addresses.get((gid, role))
                    if address is not None:
                        self._prober.ask(gid, role, address)
        dead = {g for g, v in verdicts.items() if v is Verdict.DEAD and before.get(g) is not Verdict.DEAD}
        if not dead:
            return queues
        taken = view.take_written()  # the copy's unread queues this process created: moved in this pass too
        log.info("groups %s judged dead (away %s): their idle queues' heads move (%d states taken unread as this "
                 "process created or wrote them)", sorted(dead), {g: v.value for g, v in before.items() if g in dead},
                 len(taken))
        extra = {q for q, e in list(view.entries.items())
                 if e.state is not None and e.state.open_segment is not None and e.state.open_segment.gid in dead}
        with self._lock:
            self._dead_unread |= dead  # and those the copy lacks: ``_unread_of_dead``, after these move
        return sorted(set(queues) | extra)

    def _unread_of_dead(self, view: DaemonView) -> list[str]:
        """Once groups were judged dead: read the queue list and every queue the copy lacks
        (``DaemonView.read_unread``) and return those a dead group heads, to move now too
        (those this process created moved already, in the verdict's pass: ``_judge_groups``).

        Why (issue 43): a queue created while a round runs is listed only at the next round's
        start, and at 10^5 queues a round lasts ~1 min: a kill 5 s after mass creation left
        1,600-2,533 of the dead group's queues out of the moves after its verdict, and they
        moved 77-106 s later (scale43j). Read after the known heads moved, not before: reading
        thousands of queues first would hold back the moves of all the others."""
        with self._lock:
            dead, self._dead_unread = self._dead_unread, set()
        if not dead:
            return []
        taken = view.taken_unread
        try:
            read = view.read_unread(self._wait_turn)
        except OrdqError as exc:
            log.warning("queues of %s the copy lacked not read: left for the next round: %s", sorted(dead), exc)
            return []
        entries = view.entries
        late = [q for q in read if (e := entries.get(q)) is not None and e.state is not None
                and e.state.open_segment is not None and e.state.open_segment.gid in dead]
        if read:
            kept = view.taken_unread - taken
            log.info("%d queues that the copy lacked when %s was judged dead: %d read, %d taken as this process "
                     "created or wrote them; %d of them move", len(read), sorted(dead), len(read) - kept, kept,
                     len(late))
        return late

    def _on_ping(self, gid: str, role: str, answer: Probe, sent: float) -> None:
        with self._lock:
            self._away.record(gid, role, answer, sent)
            self.stats.away_probes[answer.value] = self.stats.away_probes.get(answer.value, 0) + 1
        if answer is Probe.GONE:
            self._wake.set()  # judged dead at once: the next round moves its idle queues

    def _may_move(self, queue: str, gid: str, busy: bool) -> bool:
        """Whether ``queue``'s head moves off absent ``gid`` now (``away.moves_now``); counts
        the idle queues it keeps there (once each per absence)."""
        with self._lock:
            v = self._verdicts.get(gid, Verdict.DEAD)  # a group not tracked (deleted): as before
            if moves_now(v, busy=busy):
                return True
            if self._away.defer(gid, queue):
                self.stats.deferred_moves += 1
        return False
