"""The coordinator daemon's duty round (a part of ``CoordinatorDaemon``, coordinator/daemon.py):
plan and act on each queue that changed or has a duty due (``duties.plan``), probe the head
masters of their open segments, and move a dead group's heads in batched transactions.

Guarantee: as the daemon's (coordinator/daemon.py): every change is a conditional transition
or a Seal run, so a plan made on stale copies only loses a CAS.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping

from ordq.common.errors import CorruptState, IllegalTransition, OrdqError
from ordq.coordinator import state as sm
from ordq.coordinator.daemon_gc import collections_held
from ordq.coordinator.daemon_parts import BUG_RETRY_S, RETRY_S, WRITTEN_S, DaemonParts, is_written, log, urgent_first
from ordq.coordinator.daemon_view import DaemonView, latest_state
from ordq.coordinator.duties import Action, Kind, Limits, OpenSegment, next_due_ms, plan
from ordq.coordinator.group_moves import Move, MovePhases, batches, plan_moves, transactions
from ordq.coordinator.pacing import in_slices
from ordq.coordinator.store import Known
from ordq.coordinator.store_values import LiveInfo, QueueConfig, StateVersion, roll_transition

# Queues planned (and acted on) at once when a round has several. Few: the duties are never
# urgent for correctness (producers and consumers fail over and seal on their own, through
# the coordinator service in this same process), and every thread more takes the GIL from
# the service's answer to a producer (10,000 queues: bench/bench_queues.py).
ROUND_WORKERS = 4
# Queues handed to the round pool at once; between two slices the daemon waits while the
# service answers a producer's FailOver (``coordinator/pacing.py``).
ROUND_SLICE = 250
# A dead group's heads: at most this many move transactions sent and not yet answered, the
# next sent as each answer comes (``ZkStore.stream_batches``): ZooKeeper commits them in order,
# with one log sync for those that arrive together, and builds the next while one is answered
# (each ~200 queues, ~250 KB at most: 2 MB in flight at most). Until 2026-12-02 4 were sent,
# then all 4 awaited (stop and go). A producer's FailOver on this process's session waits
# behind those in flight (no idle one is sent while the service answers it: ``_wait_turn``).
MOVES_IN_FLIGHT = 8
# The sweep (``DaemonView.sweep_share``) reads every queue once per ``sweep_interval_s``, but
# no more than this many queues a second (two reads each): at 10^4 queues 33/s (the 5 min
# stand), at 10^5 a pass every ~8 min at ~400 reads/s, not 200,000 reads at once.
SWEEP_MAX_PER_S = 200.0
# A round this long says in one line where its time went (issue 43: at 10^5 queues the leader
# was silent for 71 s after a group's return, and nothing told a long re-read from a long plan).
LONG_ROUND_S = 5.0


class DutyRound(DaemonParts):
    """The duty round's methods."""

    def round(self) -> None:
        """Plan (and act on) every queue that changed or has a duty due; see the module doc."""
        started = time.monotonic()
        self.stats.rounds += 1
        view = self.view or self._new_term()
        view.sweep_share(started, self.sweep_interval_s, SWEEP_MAX_PER_S)  # the safety net, a share a round
        self.stats.sweeps = view.sweep_passes
        if self.prober is not None and started >= self._next_probe:
            self._next_probe = started + self.interval_s
            self._probe(view)
        moved: set[str] = set()  # moved between two slices of this round: not planned again in it
        reads, held_s = view.reads, self._held_s()
        try:
            queues = view.refresh(started, pause=lambda: self._between_slices(view, moved))
        except OrdqError as exc:
            self.stats.errors += 1
            log.warning("coordinator round: %s", exc)
            return
        finally:
            self.stats.zk_reads = view.reads
        refreshed = time.monotonic()
        queues = self._judge_groups(view, queues, refreshed)  # (judged between slices too: later)
        late = self._unread_of_dead(view)
        if late:
            queues = sorted(set(queues) | set(late))
        if moved:
            queues = [q for q in queues if q not in moved]
        if len(queues) > 1:
            queues = urgent_first(queues, self._written, started)
            queues = self._move_dead_heads(queues, view, started)
            # Why a pool: after a head master dies every queue it headed fails over, each a
            # ZooKeeper write waiting for its commit; in parallel they share the server's syncs.
            # Why slices: handing 10,000 queues to the pool at once holds the GIL for ~0.5 s
            # on a loaded box (a future each); between slices a producer's FailOver goes first.
            pool = self._pool()
            self._tidy = []  # the idle queues' pops and admits of this round, written in batches
            try:
                for part in in_slices(queues, ROUND_SLICE, lambda: self._between_slices(view, moved)):
                    if self._stop.is_set():
                        break  # stop() shut the pool down
                    list(pool.map(self._guarded_round, [q for q in part if q not in moved] if moved else part))
                    self._write_tidy(view)
            finally:
                self._tidy = None
        else:
            for queue in queues:
                self._guarded_round(queue)
        self.stats.planned += len(queues)
        self.stats.zk_reads = view.reads
        self._spread_pass(view, time.monotonic())
        if view.list_changes != self._list_seen:  # queues deleted: forget them (not every round: O(queues))
            self._list_seen = view.list_changes
            for gone in set(self.stats.corrupt) - set(view.entries):
                del self.stats.corrupt[gone]
            for gone in set(self.stats.queues) - set(view.entries):
                with self._lock:
                    self.stats.drop_queue(gone)
        ended = time.monotonic()
        self.metrics.round_seconds.observe(ended - started)
        if ended - started >= LONG_ROUND_S:
            log.info("a round of %.1f s: %d reads in %.1f s (and what came between their slices), %d queues planned "
                     "in %.1f s; idle work held %.1f s for urgent requests meanwhile (every thread)", ended - started,
                     view.reads - reads, refreshed - started, len(queues), ended - refreshed, self._held_s() - held_s)

    def _held_s(self) -> float:
        """Seconds idle jobs have waited for urgent requests so far (``RequestsFirst.held_s``)."""
        return self.requests_first.held_s if self.requests_first is not None else 0.0

    def _between_slices(self, view: DaemonView, moved: set[str]) -> None:
        """Between two slices of the round's re-reads and of its queues: a producer's urgent
        request first (``_wait_turn``), then the groups read again if their watch fired, and the
        heads of a group judged dead meanwhile move at once, in batches, and leave the rest of
        the round (``moved``).

        Why (issue 43): a group's liveness node going away makes every queue it serves dirty,
        and a kill is judged dead (its probe refused) only after that round began; its heads
        then waited for the whole round's per-queue planning of every queue (10^4 queues: the
        3,333-4,000 heads all moved in 6-12 s, the goal is 10 s). And a re-read of every queue
        (the sweep; a new term) is minutes at 10^5 queues (~1,000 reads/s): a kill during one
        waited for all of it (10^5: 346 s, docs/BENCHMARKS.md)."""
        self._wait_turn()
        try:
            view.refresh_groups()  # a liveness watch that fired during a long re-read (a sweep)
        except OrdqError as exc:
            log.debug("groups not read between slices: %s", exc)
        self._move_between_slices(self._judge_groups(view, [], time.monotonic()), view, moved)
        self._move_between_slices(self._unread_of_dead(view), view, moved)
        # Heads spread back between slices too: at 10^5 a returning group's round (its ~33,000
        # admits, then their re-reads and pops) lasts 20-50 s, and a pass only at each round's
        # end moved 100 heads (one pass) or none in the 60 s after it came back (scale43i).
        # After the moves: a dead group's seals they queued hold the spread (``spread_waits``).
        self._spread_pass(view, time.monotonic())

    def _move_between_slices(self, queues: list[str], view: DaemonView, moved: set[str]) -> None:
        """Move the heads of ``queues`` off dead groups now, in batches, adding them to ``moved``;
        those left (and one queue alone: the per-queue way) are planned next round."""
        if len(queues) >= 2:
            now = time.monotonic()
            left = set(self._move_dead_heads(urgent_first(queues, self._written, now), view, now))
            moved.update(q for q in queues if q not in left)
            view.mark(left)
        elif queues:
            view.mark(queues)

    def _move_dead_heads(self, queues: list[str], view: DaemonView, now: float) -> list[str]:
        """Fail over, in batched transactions, every queue of ``queues`` whose head group is
        dead (``group_moves``), written queues first; return the queues left for the per-queue
        round (those not moved here). A moved queue's seal is queued with its move
        (``_seal_moved``); an idle queue's batch starts once the last transaction is answered
        (``_start_seal_batches``). One queue alone goes the per-queue way (no batch to gain).
        No cyclic garbage collection meanwhile: a full one walks every queue's copy (daemon_gc.py)."""
        with collections_held():
            return self._move_dead_heads_now(queues, view, now)

    def _move_dead_heads_now(self, queues: list[str], view: DaemonView, now: float) -> list[str]:
        started, cpu_started = time.monotonic(), time.process_time()
        phases = MovePhases(redone=-self.store.batches_redone, revalidations=-self.store.revalidations,
                            queue_events=-view.queue_events)
        entries = view.entries
        live = view.live
        mine = view.written.snapshot()  # what this process wrote, under one lock (not one a queue)
        rows = []
        for q in queues:
            entry = entries.get(q)
            known = latest_state(entry, mine.get(q)) if entry is not None else None
            if entry is None or known is None:
                continue
            st, at = known
            open_seg = st.open_segment
            if open_seg is None or open_seg.gid in live:
                continue  # its head is live: nothing to move (the facts of every queue cost ~30 µs each)
            rows.append((q, st, at, view.facts(entry, st)))
        planned, thread_cpu = time.monotonic(), time.thread_time()
        phases.rows_s = planned - started
        busy = {q for q, *_ in rows if is_written(q, self._written, now)}
        moves = [m for m in plan_moves(rows, busy)
                 if m.before.open_segment is not None and self._may_move(m.queue, m.before.open_segment.gid, m.busy)]
        if len(moves) < 2:
            return queues
        parts = batches(moves)
        phases.plan_s, phases.plan_cpu_s = time.monotonic() - planned, time.thread_time() - thread_cpu
        # The busy queues' small batches first (``plan_moves``' order), then the idle ones, at
        # most MOVES_IN_FLIGHT transactions in flight (a producer's FailOver first before each
        # idle one: pacing.py).
        with self._lock:
            self._moving += 1  # the idle seals these moves queue wait for their last transaction
        try:
            moved = self._write_moves(parts, view, phases)
        finally:
            with self._lock:
                self._moving -= 1
            self._start_seal_batches()
        if moved:
            phases.total_s, phases.process_cpu_s = time.monotonic() - started, time.process_time() - cpu_started
            phases.redone += self.store.batches_redone
            phases.revalidations += self.store.revalidations
            phases.queue_events += view.queue_events
            log.info("moved %d heads off dead groups in batches (%d busy) %s", len(moved), len(busy & moved),
                     phases.line())
        return [q for q in queues if q not in moved]

    def _write_moves(self, parts: list[list[Move]], view: DaemonView, phases: MovePhases) -> set[str]:
        """Write the moves' transactions, ``MOVES_IN_FLIGHT`` in flight at most, and queue each
        moved queue's seal as its transaction is answered; the queues moved. ``phases``: where
        the time went, added to."""
        moved: set[str] = set()

        def before_send(i: int) -> None:
            if not parts[i][0].busy:  # a written queue's producer may be waiting on it: never held
                turn = time.monotonic()
                self._wait_turn()
                phases.turns_s += time.monotonic() - turn

        writing, thread_cpu, turns_s = time.monotonic(), time.thread_time(), phases.turns_s
        sealing_s = sealing_cpu_s = 0.0
        phases.in_flight = MOVES_IN_FLIGHT
        answers = self.store.stream_batches([[(m.queue, m.version, m.after) for m in part] for part in parts],
                                            view.group_versions, limit=MOVES_IN_FLIGHT, before_send=before_send)
        try:
            for part, (done, _left) in zip(parts, answers, strict=False):  # (fewer answers: stopping)
                phases.transactions += 1
                sealing, sealing_cpu = time.monotonic(), time.thread_time()
                moved.update(done)
                written = set(done)
                self._seal_moved([m for m in part if m.queue in written])
                with self._lock:
                    if done:
                        self.stats.move_batches += 1
                        self.stats.batched_moves += len(done)
                        self.stats.actions[Kind.FAIL_OVER.value] = self.stats.actions.get(Kind.FAIL_OVER.value, 0) \
                            + len(done)
                sealing_s += time.monotonic() - sealing
                sealing_cpu_s += time.thread_time() - sealing_cpu
                if self._stop.is_set():
                    break
        except OrdqError as exc:  # those not answered yet: left to the per-queue rounds
            with self._lock:
                self.stats.errors += 1
            log.warning("moving %d heads off a dead group: %s", sum(len(p) for p in parts[phases.transactions:]), exc)
        finally:
            answers.close()
            phases.seals_s += sealing_s
            phases.writes_s += time.monotonic() - writing - sealing_s - (phases.turns_s - turns_s)
            phases.writes_cpu_s += time.thread_time() - thread_cpu - sealing_cpu_s
        return moved

    def _seal_moved(self, moves: list[Move]) -> None:
        """Queue the seal of each moved queue's old segment at once, on the state the move
        wrote (its version one more than the one it was planned on: the write checked it).
        Why (issue 43): waiting for the moved queues' watches, their re-read and the next round
        to plan them took 61 s at 10^5 queues before the first seal batch (bench_queues,
        scale43g). A state that moved again meanwhile loses the seal's version check, and the
        seal is done one by one, reading afresh, as any batch's leftover."""
        for m in moves:
            sealing = m.before.open_segment
            if sealing is not None:
                self._seal_later(m.queue, Action(Kind.SEAL, gid=sealing.gid, seg=sealing.seg),
                                 known=(m.after, m.version.next()))

    def _tidy_later(self, queue: str, action: Action, known: Known, later_stored: bool) -> bool:
        """An idle queue's pop or admit planned on the round's copies (``known``), kept for a
        batched write (``_write_tidy``) when the round collects them; False: write it now, alone.
        Why (issue 43): after a group's failure every queue it headed pops its segment sealed
        empty, and admits the group again once it returns: at 10^5 queues ~33,000 of each,
        one write each at 50-115/s (minutes), while heads cannot spread back to a group not
        admitted yet. The transition is the same one, on the same copies, version-checked."""
        tidy = self._tidy
        if tidy is None or action.kind not in (Kind.POP, Kind.ADMIT):
            return False
        if action.kind is Kind.POP:
            after = sm.pop(known.state, known.facts, later_stored=later_stored)
        else:
            assert action.gid is not None
            after = sm.admit(known.state, action.gid, known.facts)
        with self._lock:
            tidy.append((queue, known.version, after, action.kind))
        return True

    def _write_tidy(self, view: DaemonView) -> None:
        """Write the pops and admits ``_tidy_later`` kept, in batched transactions, each state
        against the version it was planned on. One not written (its version moved, or ZooKeeper
        did not answer: then no watch fires) is planned again next round."""
        with self._lock:
            tidy, self._tidy = self._tidy or [], []
        if not tidy:
            return
        started = time.monotonic()
        kinds = {q: kind for q, _v, _st, kind in tidy}
        written: list[str] = []
        left: list[str] = []
        try:
            for done, lost in self.store.apply_batches(transactions([(q, v, st) for q, v, st, _k in tidy]),
                                                       view.group_versions):
                written += done
                left += lost
        except OrdqError as exc:
            with self._lock:
                self.stats.errors += 1
            log.warning("%d pops and admits of idle queues deferred: %s", len(tidy), exc)
            view.reread([q for q, *_ in tidy])
            return
        view.reread(left)
        counts: dict[str, int] = {}
        for q in written:
            counts[kinds[q].value] = counts.get(kinds[q].value, 0) + 1
        with self._lock:
            for kind, n in counts.items():
                self.stats.actions[kind] = self.stats.actions.get(kind, 0) + n
        log.info("%s of idle queues written in batches (%d left for the next round) in %.2f s",
                 ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none",
                 len(left), time.monotonic() - started)

    def _guarded_round(self, queue: str) -> None:
        """One queue's round; whatever it raises is counted and logged, and the queue planned
        again later (a corrupt state: when it is written again, which fires its watch)."""
        # Why: whatever one queue does (corrupt state, a bug), every other queue is served.
        retry_s: float | None = None
        self._idle_waits_turn(queue)
        try:
            self._queue_round(queue)
            with self._lock:
                self.stats.corrupt.pop(queue, None)  # restored
        except CorruptState as exc:
            with self._lock:
                self.stats.errors += 1
                self.stats.corrupt_seen += 1
                if self.stats.corrupt.get(queue) != exc.detail:
                    log.error("queue %s: %s", queue, exc)  # once per distinct problem, not per round
                self.stats.corrupt[queue] = exc.detail
        except OrdqError as exc:
            with self._lock:
                self.stats.errors += 1
            retry_s = RETRY_S
            log.warning("queue %s: %s", queue, exc)
        except Exception:  # noqa: BLE001 - a bug in one queue's round must not end the leadership
            with self._lock:
                self.stats.errors += 1
                self.stats.unexpected += 1
            retry_s = BUG_RETRY_S
            log.exception("queue %s: unexpected error in the duty round", queue)
        if retry_s is not None and self.view is not None:
            self.view.schedule(queue, time.monotonic() + retry_s)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(ROUND_WORKERS, thread_name_prefix="ordq-duty")
        return self._executor

    def _probe(self, view: DaemonView) -> None:
        """Ask every live head master of all its open segments (one call each); mark the
        queues whose answer changed. A master that does not answer keeps its queues' last answer."""
        assert self.prober is not None
        heard: dict[str, tuple[int, OpenSegment]] = {}
        silent: set[str] = set()
        for gid, address in sorted(view.masters.items()):
            self.stats.probes += 1
            try:
                answer = self.prober(address)
            except OrdqError as exc:
                silent.add(gid)
                log.debug("group %s: open segments not probed: %s", gid, exc)
                continue
            for (queue, seg), info in answer.items():
                entry = view.entries.get(queue)
                open_seg = entry.state.open_segment if entry is not None and entry.state is not None else None
                if open_seg is not None and open_seg.seg == seg and open_seg.gid == gid:
                    heard[queue] = (seg, info)
        for queue, (seg, info) in self._open.items():
            entry = view.entries.get(queue)
            open_seg = entry.state.open_segment if entry is not None and entry.state is not None else None
            if open_seg is not None and open_seg.seg == seg and open_seg.gid in silent:
                heard.setdefault(queue, (seg, info))
        changed = {q for q in set(heard) | set(self._open) if heard.get(q) != self._open.get(q)}
        now = time.monotonic()
        for q in changed:
            seg_info = heard.get(q)
            before = self._open.get(q)
            if seg_info is not None and seg_info[1].bytes > (before[1].bytes if before and before[0] == seg_info[0]
                                                              else 0):
                self._written[q] = now
        if len(self._written) > 2 * len(heard) + 1000:  # forget the long quiet ones (bounded memory)
            self._written = {q: t for q, t in self._written.items() if now - t <= WRITTEN_S}
        self._open = heard
        view.mark(changed)

    def _queue_round(self, queue: str) -> None:
        view = self.view
        assert view is not None
        entry = view.entries.get(queue)
        if entry is None:
            return  # deleted
        if entry.problem is not None:
            raise entry.problem
        if entry.state is None or entry.config is None:
            return  # not read yet: marked again when it is
        st, cfg = entry.state, entry.config
        facts = view.facts(entry)
        before = self.stats.queues.get(queue, {}).get("send")
        if before and before[0] != st.head:
            open_seg = st.open_segment
            self.stats.failovers.append({"at_ms": int(time.time() * 1000), "queue": queue, "from": before[0],
                                         "to": st.head, "seg": open_seg.seg if open_seg else None})
        seen = {
            "send": list(st.send),
            "segments": len(st.consume),
            "epoch": st.producer_epoch,
            "live_groups": sorted(facts.live_groups),
            "sealing": sum(1 for c in st.consume if c.status is sm.SegStatus.SEALING),
            # unconsumed segments whose group has not both processes live: consumers may wait there
            "not_live": sum(1 for c in st.consume if c.gid not in facts.live_groups),
        }
        if self.stats.queues.get(queue) != seen:
            with self._lock:
                self.stats.set_queue(queue, seen)  # the per-queue series are rendered again
        limits = Limits(retention_segments=cfg.retention_segments, retention_time_s=cfg.retention_time_s,
                        retention_bytes=cfg.retention_bytes, segment_bytes=cfg.segment_bytes,
                        segment_age_s=cfg.segment_age_s)
        open_seg = st.open_segment
        probed = self._open.get(queue)
        open_info = None
        if open_seg is not None and open_seg.gid in facts.live_groups and self.prober is not None:
            # what its master said of this very segment; holding none of it: nothing written yet
            open_info = probed[1] if probed is not None and probed[0] == open_seg.seg else OpenSegment(0, None)
        now_ms = int(time.time() * 1000)
        due = next_due_ms(st, limits, open_info=open_info)
        if due is not None:
            view.schedule(queue, time.monotonic() + max(0.0, (due - now_ms) / 1000))
        # the first write of this round goes against these copies (no re-read; versions checked)
        known: Known | None = Known(state=st, version=entry.at, facts=facts,
                                    group_versions=view.group_versions)
        for action in plan(st, facts, limits, now_ms=now_ms, open_info=open_info):
            # An absent group may be back soon: only a written queue moves off it at once. One
            # out of disk space is live, and full until an operator acts: every queue moves.
            if action.kind is Kind.FAIL_OVER and action.gid not in facts.disk_full and not self._may_move(
                    queue, action.gid or "", is_written(queue, self._written, time.monotonic())):
                continue
            if action.kind is Kind.SEAL:
                self._seal_later(queue, action, known=(st, entry.at))
                continue
            if action.kind is Kind.DROP_EMPTY and entry.cursors is None:
                continue  # planned without the cursors (the view reads them once the head is sealed)
            # A pop reads the cursors itself, unless the view read them after this state copy and
            # found none (daemon_view.py): then only the state's version is checked, and a
            # subscription created since wrote the state (create_subscription), so the write
            # fails and the pop is planned again with it. One write per pop of a segment sealed
            # empty, not a read of the state, the subscriptions and the groups first (issue 43:
            # thousands of them after a group's failure).
            pop_known = action.kind is not Kind.POP or entry.cursors == {}
            try:
                if (known is not None and pop_known and not is_written(queue, self._written, time.monotonic())
                        and self._tidy_later(queue, action, known, action.later_stored)):
                    break  # the rest of its plan comes once the batch is written (its watch)
                self._do(queue, action, cfg, known if pop_known else None)
            except IllegalTransition:
                with self._lock:
                    self.stats.conflicts[action.kind.value] = self.stats.conflicts.get(action.kind.value, 0) + 1
                continue  # someone else acted first: its write fires our watch, planned again
            finally:
                known = None  # the state moved on: later actions read it afresh
            with self._lock:
                self.stats.actions[action.kind.value] = self.stats.actions.get(action.kind.value, 0) + 1

    def _do(self, queue: str, action: Action, cfg: QueueConfig, known: Known | None = None,
            seal_known: tuple[tuple[sm.QueueState, StateVersion] | None, Mapping[str, LiveInfo] | None] = (None, None),
            ) -> None:
        """``known``: the copies the action was planned on, for transitions that read no cursors;
        ``seal_known``: a seal's (state, version) and the segment group's members, the same."""
        log.info("queue %s: %s %s seg %s", queue, action.kind.value, action.gid, action.seg)
        if action.kind is Kind.FAIL_OVER:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, lambda s, f: sm.fail_over(s, gid, seg, f), known=known)
        elif action.kind is Kind.ADMIT:
            assert action.gid is not None
            gid = action.gid
            self.store.apply(queue, lambda s, f: sm.admit(s, gid, f), known=known)
        elif action.kind is Kind.POP:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, later_stored=later), known=known)
        elif action.kind is Kind.ROLL:
            assert action.gid is not None and action.seg is not None
            gid, seg = action.gid, action.seg
            self.store.apply(queue, roll_transition(cfg, gid, seg), known=known)
            # its state write fires our watch: the rolled segment is sealed in the next round
        elif action.kind is Kind.DROP_EMPTY:
            assert action.seg is not None
            seg = action.seg
            self.store.apply(queue, lambda s, f: sm.drop_empty(s, seg, f))  # reads the cursors afresh
        elif action.kind is Kind.RETAIN:
            later = action.later_stored
            self.store.apply(queue, lambda s, f: sm.pop(s, f, retention=True, later_stored=later))
        elif action.kind is Kind.SEAL and self.sealer is not None:
            assert action.seg is not None
            started, outcome = time.monotonic(), "failed"
            try:
                state_known, members = seal_known
                self.sealer(queue, action.seg, known=state_known, members=members)
                outcome = "sealed"
            finally:
                self.metrics.seal_seconds.labels(outcome=outcome).observe(time.monotonic() - started)
