"""When an idle queue's head moves off a group gone from ZooKeeper (issue 43, coordinator/away.py):
pure decision logic, no I/O. The storm it prevents: at load 35-40 the brokers' sessions expired
with nothing killed and the coordinator moved 13,544 idle heads in a minute."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.coordinator.away import AwayPolicy, AwayTracker, Probe, Verdict, moves_now, verdict
from ordq.coordinator.paths import ROLES

POLICY = AwayPolicy(grace_s=10.0, max_held_s=60.0)
BOTH = {"master", "slave"}


def v(away_for_s: float, **probes: Probe | None) -> Verdict:
    return verdict(live=False, away_for_s=away_for_s, probes=probes, policy=POLICY)


def test_a_live_group_is_live_whatever_was_probed() -> None:
    assert verdict(live=True, away_for_s=1e9, probes={"master": Probe.GONE}, policy=POLICY) is Verdict.LIVE


def test_within_the_grace_an_absent_group_waits_unless_a_process_refused() -> None:
    assert v(0.0) is Verdict.WAIT
    assert v(9.9, master=Probe.SILENT) is Verdict.WAIT
    assert v(9.9, master=Probe.ANSWERED, slave=None) is Verdict.WAIT
    assert v(0.0, master=Probe.GONE) is Verdict.DEAD  # a kill -9: refused at once, moved at once


def test_past_the_grace_only_answering_processes_hold_their_heads() -> None:
    assert v(10.0) is Verdict.DEAD  # nothing to probe (an address never seen): the grace alone
    assert v(10.0, master=None) is Verdict.DEAD
    assert v(10.0, master=Probe.SILENT) is Verdict.DEAD
    assert v(10.0, master=Probe.ANSWERED, slave=Probe.SILENT) is Verdict.DEAD
    assert v(10.0, master=Probe.ANSWERED) is Verdict.HELD
    assert v(59.9, master=Probe.ANSWERED, slave=Probe.ANSWERED) is Verdict.HELD
    assert v(60.0, master=Probe.ANSWERED) is Verdict.DEAD  # answers, never registers again: bounded


def test_a_written_queue_moves_at_once_an_idle_one_only_off_a_dead_group() -> None:
    for verdict_ in Verdict:
        assert moves_now(verdict_, busy=True) is (verdict_ is not Verdict.LIVE)
        assert moves_now(verdict_, busy=False) is (verdict_ is Verdict.DEAD)


def test_the_policy_refuses_a_grace_longer_than_the_hold() -> None:
    with pytest.raises(ValueError, match="grace_s"):
        AwayPolicy(grace_s=20.0, max_held_s=10.0)
    with pytest.raises(ValueError, match="grace_s"):
        AwayPolicy(grace_s=-1.0)


def test_a_coordinator_that_starts_before_its_groups_waits_for_them() -> None:
    """Issue 43: a coordinator started before its groups registered moved all their heads.
    Absent at the term's first round, they are away from then: within the grace, they wait."""
    t = AwayTracker(POLICY)
    t.observe({"g1": set(), "g2": set()}, ROLES, now=100.0)
    assert t.verdicts(100.0) == {"g1": Verdict.WAIT, "g2": Verdict.WAIT}
    assert t.defer("g1", "q1") and not t.defer("g1", "q1")  # counted once
    assert t.next_change(100.0) == 110.0
    back = t.observe({"g1": BOTH, "g2": {"master"}}, ROLES, now=103.0)
    assert back == {"g1"} and t.returned == 1 and t.kept == 1
    assert t.verdicts(109.0) == {"g2": Verdict.WAIT}
    assert t.verdicts(110.0) == {"g2": Verdict.DEAD}  # the slave never came: nothing to probe


def test_a_lost_session_of_a_process_that_answers_keeps_the_heads() -> None:
    t = AwayTracker(POLICY)
    t.observe({"g1": BOTH}, ROLES, now=0.0)
    t.observe({"g1": {"slave"}}, ROLES, now=5.0)  # the master's session expired
    t.record("g1", "master", Probe.ANSWERED, at=4.0)  # sent before it went: proves nothing
    assert t.verdicts(15.0) == {"g1": Verdict.DEAD}
    t.record("g1", "master", Probe.ANSWERED, at=14.0)
    assert t.verdicts(15.0) == {"g1": Verdict.HELD}
    t.record("g1", "master", Probe.SILENT, at=16.0)  # one late answer on a slow machine: still held
    assert t.verdicts(17.0) == {"g1": Verdict.HELD}
    assert t.verdicts(24.0) == {"g1": Verdict.HELD}  # answered 10 s ago: within the grace
    assert t.verdicts(24.5) == {"g1": Verdict.DEAD}  # silent for more than a grace: hung, or cut off
    t.observe({"g1": BOTH}, ROLES, now=25.0)
    assert t.returned == 0  # judged dead first: not a return within the grace
    assert t.probes == {} and t.answered == {} and t.away_since == {}


def test_a_refusal_makes_the_group_dead_at_once_and_a_deleted_group_is_forgotten() -> None:
    t = AwayTracker(POLICY)
    t.observe({"g1": {"master"}, "g2": BOTH}, ROLES, now=0.0)
    t.record("g1", "slave", Probe.GONE, at=0.5)
    assert t.verdicts(1.0) == {"g1": Verdict.DEAD}
    t.observe({"g2": BOTH}, ROLES, now=2.0)
    assert t.away_since == {} and t.verdicts(3.0) == {}


# -- a model: random absences, probes and time ------------------------------------------------

STEP = st.one_of(
    st.tuples(st.just("present"), st.sampled_from(["g1", "g2"]),
              st.sets(st.sampled_from(["master", "slave"]))),
    st.tuples(st.just("probe"), st.sampled_from(["g1", "g2"]), st.sampled_from(["master", "slave"]),
              st.sampled_from(list(Probe))),
    st.tuples(st.just("wait"), st.floats(min_value=0.0, max_value=30.0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=40), st.floats(min_value=0.0, max_value=20.0))
def test_an_idle_queue_never_moves_before_the_grace_unless_refused_nor_while_its_processes_answer(
        steps: list[tuple[Any, ...]], grace: float) -> None:
    policy = AwayPolicy(grace_s=grace, max_held_s=grace + 30.0)
    t = AwayTracker(policy)
    now = 0.0
    present = {"g1": set(BOTH), "g2": set(BOTH)}
    away_at: dict[str, float] = {}  # the model: when each group went away
    latest: dict[tuple[str, str], Probe] = {}  # its probes' latest answers since
    answered_at: dict[tuple[str, str], float] = {}  # ... and when each last answered
    for step in steps:
        if step[0] == "present":
            present[step[1]] = set(step[2])
        elif step[0] == "probe":
            _, gid, role, answer = step
            t.record(gid, role, answer, at=now)
            if gid in away_at:
                latest[(gid, role)] = answer
                if answer is Probe.ANSWERED:
                    answered_at[(gid, role)] = now
        else:
            now += step[1]
        back = t.observe(present, ROLES, now)
        for gid, have in present.items():
            if have >= BOTH:
                was_away = away_at.pop(gid, None) is not None
                assert (gid in back) == was_away
                for key in [k for k in latest if k[0] == gid]:
                    del latest[key]
                for key in [k for k in answered_at if k[0] == gid]:
                    del answered_at[key]
            else:
                away_at.setdefault(gid, now)
        for gid, got in t.verdicts(now).items():
            assert gid in away_at
            away_for = now - away_at[gid]
            missing = BOTH - present[gid]
            answers = [latest.get((gid, r)) for r in missing]
            # heard: every missing process answered within the last grace, none refused since
            heard = all(latest.get((gid, r)) is not Probe.GONE and (gid, r) in answered_at
                        and now - answered_at[(gid, r)] <= grace for r in missing)
            if got is Verdict.DEAD:  # never before the grace unless a missing process refused
                assert away_for >= grace or Probe.GONE in answers
                # ... and never while every missing process answers, within the hold
                assert not (heard and away_for < policy.max_held_s)
            else:
                assert Probe.GONE not in answers
                assert got is Verdict.WAIT or heard
                assert got is Verdict.WAIT or away_for >= grace
        assert set(t.verdicts(now)) == set(away_at)
