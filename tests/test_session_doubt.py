"""The session guard's decision (``broker_group.shared.session_doubt``), without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ordq.broker_group.shared import SessionView, session_doubt

times = st.floats(min_value=0, max_value=100, allow_nan=False)
maybe = st.none() | times


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
