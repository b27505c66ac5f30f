"""The session guard's decision (``broker_group.shared.session_doubt``), without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ordq.broker_group.shared import SessionView, doubt_wait_until, session_doubt

times = st.floats(min_value=0, max_value=100, allow_nan=False)
maybe = st.none() | times


def test_a_write_reaching_a_master_that_lost_its_session_waits_a_session_for_it_to_register_again() -> None:
    """Default tier (stop 83, test_failover_infra, the quorum lost 7.5 s, 1 s sessions): g2's
    master lost its session to a hiccup before the outage and registered again only 137 ms
    after the producer's failover reached it; its new segment's write was refused at once (a
    lost session: no wait at all), and the producer failed over a second time. Now such a
    write waits up to a session from its own start (taken only once registered again)."""
    lost = SessionView(silent_since=10.0, lost=True, quorum_heard_at=None, timeout_s=1.0)
    assert doubt_wait_until(13.0, lost, waiting_since=13.0) == 14.0  # was 12.0: refused at once
    assert doubt_wait_until(10.5, lost, waiting_since=10.5) == 12.0  # the two sessions past the doubt


@given(now=times, silent=maybe, heard=maybe, lost=st.booleans(), timeout=st.floats(min_value=0.2, max_value=60))
def test_a_master_in_no_doubt_holds_a_session_the_quorum_vouched_for(now, silent, heard, lost, timeout) -> None:
    view = SessionView(silent_since=silent, lost=lost, quorum_heard_at=heard, timeout_s=timeout)
    why, since = session_doubt(now, view)
    if why is None:
        assert not lost and since is None
        # the quorum answered a probe sent less than half a session ago: the leader cannot
        # have expired the session (it could only after a whole one)
        assert heard is None or now - heard <= timeout / 2 < timeout
        assert silent is None or now - silent <= timeout / 3
    elif not lost:
        assert since is not None and since <= now


def test_the_doubt_names_its_cause_and_starts_when_the_first_limit_passed() -> None:
    view = SessionView(silent_since=None, lost=False, quorum_heard_at=10.0, timeout_s=1.0)
    assert session_doubt(10.4, view) == (None, None)
    why, since = session_doubt(10.7, view)
    assert why is not None and "quorum not heard for 0.7 s" in why and since == 10.5
    both = SessionView(silent_since=10.1, lost=False, quorum_heard_at=10.0, timeout_s=1.0)
    why, since = session_doubt(10.7, both)
    assert why is not None and "silent" in why and since == 10.1
    assert "expired" in (session_doubt(0.0, SessionView(None, True, None, 1.0))[0] or "")


def test_a_write_reaching_a_connected_master_as_the_quorum_returns_waits_for_the_next_probe() -> None:
    """Default tier (test_failover_infra, the quorum lost for 7.5 s, 1 s sessions): the producer
    failed over to g2 as the quorum came back, and g2, connected all along but with its last
    probe answered 3 s before, refused the write at once (its doubt began 2.5 s before, past two
    sessions): a second failover. Connected, a write now waits at least a session from its own
    start for the next probe (every eighth of a session); silent, the bound is as before."""
    quorum_only = SessionView(silent_since=None, lost=False, quorum_heard_at=10.0, timeout_s=1.0)
    assert doubt_wait_until(13.0, quorum_only, waiting_since=13.0) == 14.0  # was 12.5: refused at once
    silent = SessionView(silent_since=10.0, lost=False, quorum_heard_at=10.0, timeout_s=1.0)
    assert doubt_wait_until(13.0, silent, waiting_since=13.0) == 12.0


@given(now=times, silent=maybe, heard=maybe, lost=st.booleans(), timeout=st.floats(min_value=0.2, max_value=60),
       waited=st.floats(min_value=0, max_value=10))
def test_a_write_waits_at_most_two_sessions_past_the_doubt_or_one_past_its_own_start(
        now, silent, heard, lost, timeout, waited) -> None:
    view = SessionView(silent_since=silent, lost=lost, quorum_heard_at=heard, timeout_s=timeout)
    since = session_doubt(now, view)[1]
    until = doubt_wait_until(now, view, waiting_since=now - waited)
    assert until >= (since or 0.0) + 2 * timeout
    assert until <= max((since or 0.0) + 2 * timeout, now - waited + timeout)
