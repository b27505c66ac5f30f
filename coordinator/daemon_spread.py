"""Heads spread back (issue 43; a part of ``CoordinatorDaemon``, coordinator/daemon.py): the
round's bounded pass after a group returns or is added, and ``ordq group rebalance``. The plan
is the pure ``coordinator/rebalance.py``, written by ``coordinator/head_spread.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ordq.common.errors import CoordinationUnavailable, OrdqError
from ordq.coordinator.away import Verdict
from ordq.coordinator.daemon_gc import collections_held
from ordq.coordinator.daemon_parts import DaemonParts, is_written, log
from ordq.coordinator.daemon_view import DaemonView, QueueEntry, known_state
from ordq.coordinator.head_spread import SpreadResult, spread_heads
from ordq.coordinator.rebalance import even
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_values import StateVersion

# Heads spread back (issue 43, ``coordinator/head_spread.py``): a pass every this often moves at
# most ``rebalance_moves_per_s`` times it idle queues' heads towards an even spread; a group
# gives or receives only once both its processes have been live this long (a group that just
# came back may go again: no churn for a flapping one), and no pass runs while a dead group's
# seals wait for their batches.
# Why 500 a second (stop 74; 50 until then): at 10^5 queues a returning group's share is ~33,000
# heads, ~11 minutes at 50/s, so a kill every two minutes found the heads piled up on fewer
# groups each time (bench_queues, 3 kills: the third group headed 77,917 and its seals took 64 s).
# A dead group's 33,000 moves take ~3 s in batches; 1,000 a pass are ~5 transactions and ~1,000
# seals of the giving groups' empty segments, which ``spread_waits`` lets fall no further behind.
REBALANCE_INTERVAL_S = 2.0
REBALANCE_GRACE_S = 10.0
REBALANCE_MOVES_PER_S = 500.0
# How many passes ran and how many were not run (nothing they read changed) is said at most
# this often, while some are not run.
SPREAD_TOLD_EVERY_S = 60.0


def spread_waits(seal_batches: Mapping[str, Mapping[tuple[str, int], object]], live: frozenset[str] | set[str],
                 max_moves: int) -> bool:
    """Whether a spread pass waits for the seals queued for batches (gid -> segment -> ...): while
    a dead group's (one not live) wait, or more than one pass's worth of moves in all.

    Why not "while any wait" (until 2026-11-30): each pass's moves leave as many sealing
    segments on the giving groups, queued for batches; the next pass, 2 s later, found them
    still waiting and was skipped, so passes came every ~5 s (~20 moves/s at 10^4, against the
    50/s bound). A pass's own seals are of live groups and few (``max_moves``); a backlog larger
    than that means the seals fall behind the moves, and the spread waits for them."""
    if any(waiting and gid not in live for gid, waiting in seal_batches.items()):
        return True  # a dead group's seals first
    return sum(len(waiting) for waiting in seal_batches.values()) > max_moves


def spread_rows(entries: Mapping[str, QueueEntry],
                mine: Callable[[str], tuple[QueueState, StateVersion] | None],
                ) -> list[tuple[str, QueueState, StateVersion]] | None:
    """(queue, state, version) of every queue the daemon knows (``known_state``: its copy, or
    ``mine(queue)``, what this process wrote since), for a spread pass; None while the state of
    any queue not unusable (``problem``) is unknown: not read yet, or being read again.

    Why None and not the known ones (until 2026-11-30): the pass planned on head counts that
    left the unknown queues out. At 10^5 a returning group's 33,333 admits, written by this
    process, each fired its queue's watch, so the pass after them counted only the other
    66,668 queues: those that cannot move to the returning group (it is not in their send
    lists) and whose counts looked uneven by a queue or two (scale43i: one move, g2 -> g3)."""
    rows = []
    for q, entry in list(entries.items()):
        if entry.problem is not None:
            continue
        known = known_state(entry, mine(q))
        if known is None:
            return None
        rows.append((q, *known))
    return rows


def spread_paused(live_since: Mapping[str, float], live: frozenset[str] | set[str],
                  verdicts: Mapping[str, Verdict]) -> bool:
    """Whether a spread pass waits because a group is away and not judged dead yet: one that was
    live at the last pass and is not now (``live_since``: the groups live at the last pass;
    ``live``: those that may take writes now), or one whose verdict is still WAIT or HELD (``away.py``).

    Why (issue 43): a pass between a group's kill and its verdict counted the survivors alone
    and moved a head between them (10^5, scale43j run 2: g2 31,735 / g3 31,733 -> one move, 18 ms
    before g1 was judged dead): churn, and heads taken from the groups about to receive the dead
    one's. A group judged dead does not pause it (its seals do: ``spread_waits``)."""
    if set(live_since) - set(live):
        return True
    return any(v in (Verdict.WAIT, Verdict.HELD) for v in verdicts.values())


class SpreadBack(DaemonParts):
    """The spread's methods."""

    def _settled_live(self, view: DaemonView, now: float) -> frozenset[str]:
        """Groups that may take writes (``DaemonView.writable``) for ``REBALANCE_GRACE_S`` at least."""
        live = view.writable
        for g in set(self._live_since) - live:
            del self._live_since[g]
        for g in live:
            self._live_since.setdefault(g, now)
        return frozenset(g for g in live if now - self._live_since[g] >= REBALANCE_GRACE_S)

    def _spread_pass(self, view: DaemonView, now: float) -> None:
        with self._lock:
            paused = spread_paused(self._live_since, view.writable, self._verdicts)
        settled = self._settled_live(view, now)
        if self.rebalance_moves_per_s <= 0 or now < self._next_spread or paused:
            return
        self._next_spread = now + REBALANCE_INTERVAL_S
        max_moves = int(self.rebalance_moves_per_s * REBALANCE_INTERVAL_S)
        with self._lock:
            waits = spread_waits(self._seal_batches, view.live, max_moves)
            waiting = sum(len(w) for w in self._seal_batches.values())
        if waits != self._spread_waited:  # said once a change: why no head spreads back now
            self._spread_waited = waits
            log.info("heads spread back %s (%d seals wait for batches)", "waits for the seals" if waits else "resumes",
                     waiting)
        if waits:
            return
        # What the pass reads, as of now (before its rows): the copies, this process's writes,
        # the settled groups. Unchanged since a pass that found the heads even: this one would
        # find them even again (which queues are busy decides only which move, not whether).
        # Why (issue 43): at 10^5 queues a pass costs the leader ~0.45-0.75 s of CPU, every 2 s
        # even when nothing changed (scale43q).
        inputs = (view.copy_changes, self.store.written.changes, settled)
        self._tell_spread_passes(now)
        if inputs == self._spread_even_at:
            self.stats.spread_skipped += 1
            return
        try:
            result = self._spread(view, settled, now, max_moves=max_moves, dry_run=False)
        except OrdqError as exc:
            log.warning("spreading heads: %s", exc)
            return
        self.stats.spread_passes += 1
        even_now = not self._spread_unread and not result.moves and even(result.before)
        self._spread_even_at = inputs if even_now else None
        if result.moves:
            log.info("spread %d idle queues' heads back: %s -> %s", len(result.moves), result.before, result.after)

    def _tell_spread_passes(self, now: float) -> None:
        """Once per ``SPREAD_TOLD_EVERY_S`` at most: the passes run and not run since the last
        such line, if any was not run (issue 43: the skip is seen in the leader's log)."""
        st = self.stats
        if self._spread_told is None:
            self._spread_told = (now, st.spread_passes, st.spread_skipped)
            return
        at, passes, skipped = self._spread_told
        if now - at < SPREAD_TOLD_EVERY_S:
            return
        if st.spread_skipped > skipped:
            log.info("heads spread back: %d passes in %.0f s, %d more not run (nothing they read changed since a "
                     "pass found the heads even)", st.spread_passes - passes, now - at, st.spread_skipped - skipped)
        self._spread_told = (now, st.spread_passes, st.spread_skipped)

    def _spread(self, view: DaemonView, live: frozenset[str], now: float, *, max_moves: int,
                dry_run: bool, fresh: bool = False) -> SpreadResult:
        # No cyclic collection while the pass's rows live (daemon_gc.py): its ~4 containers a
        # queue die by reference counting at its end, and none of them is promoted.
        with collections_held():
            return self._spread_held(view, live, now, max_moves=max_moves, dry_run=dry_run, fresh=fresh)

    def _spread_held(self, view: DaemonView, live: frozenset[str], now: float, *, max_moves: int,
                     dry_run: bool, fresh: bool) -> SpreadResult:
        if fresh:
            # The states as they are now, not the view's copies: just after moves (and the
            # pops of the empty segments they leave) those copies are being re-read, and
            # leaving them out made the groups look uneven (a dry run right after a rebalance
            # planned one more move; the heavy tier's test_heads_spread, at load 7-11).
            got = self.store.load_states(sorted(view.entries))
            rows = [(q, v[0], v[1]) for q, v in got.items() if isinstance(v, tuple)]
        else:
            # what this process wrote, under one lock (not one a queue: 10^5 a pass)
            known = spread_rows(view.entries, self.store.written.snapshot().get)
            if (known is None) != self._spread_unread:  # said once a change (issue 43: a silent 71 s)
                self._spread_unread = known is None
                log.info("heads spread back %s", "waits: queue states are being read" if known is None
                         else "has every queue's state")
            if known is None:
                return SpreadResult(before={}, after={}, moves=[], left=[], dry_run=dry_run, busy=0)
            rows = known
        written = dict(self._written)  # (a copy: ``rebalance`` runs on the service's thread)
        busy = {q for q in written if is_written(q, written, now)}  # the few written, not every row
        result = spread_heads(self.store, rows, live, busy, view.group_versions, max_moves=max_moves,
                              dry_run=dry_run, wait_turn=self._wait_turn)
        if result.moves and not dry_run:
            with self._lock:
                self.stats.spread_moves += len(result.moves)
                self.stats.spread_batches += result.transactions
        return result

    def rebalance(self, *, max_moves: int, dry_run: bool) -> SpreadResult:
        """``ordq group rebalance``: spread idle queues' heads over the live groups now (every
        group that may take writes, without the grace period), at most ``max_moves``; with
        ``dry_run`` only the plan. CoordinationUnavailable when this coordinator does not lead."""
        view = self.view
        if view is None or not self.stats.is_leader:
            raise CoordinationUnavailable("this coordinator does not lead (or has not read the queues yet)")
        return self._spread(view, frozenset(view.writable), time.monotonic(), max_moves=max_moves,
                            dry_run=dry_run, fresh=True)
