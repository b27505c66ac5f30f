"""A lease holder's arithmetic (``ordq.sdk._lease_client.LeaseClock``), pure: no coordinator, no clock.

The property that makes one holder at a time: whatever the renewals and the pauses, the lease
is never valid at a time when the coordinator may already count it expired, i.e. later than
(send time of the last answered renewal) + the ttl (the coordinator adds its margin on top:
coordinator/leases.py, tests/test_leases.py).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ordq.sdk._lease_client import CLIENT_TRUST as TRUST
from ordq.sdk._lease_client import RENEW_EVERY, LeaseClock

T = 2.0


def test_a_renewal_trusts_two_thirds_of_the_session_from_its_send_time() -> None:
    c = LeaseClock(T)
    assert not c.valid(0.0)  # nothing answered yet
    c.renewed(sent_at=10.0)
    assert c.valid(10.0) and c.valid(10.0 + T * TRUST - 1e-9)
    assert not c.valid(10.0 + T * TRUST)
    assert c.renew_due(10.0 + T * RENEW_EVERY, last_sent=10.0)
    assert not c.renew_due(10.0 + T * RENEW_EVERY / 2, last_sent=10.0)


def test_lost_stays_lost_until_the_next_grant() -> None:
    c = LeaseClock(T)
    c.renewed(sent_at=1.0)
    c.lose("session expired")
    assert not c.valid(1.0) and c.lost_reason == "session expired"
    c.renewed(sent_at=2.0)  # a late answer cannot revive it (a new grant makes a new clock)
    assert not c.valid(2.0)
    c.lose("another reason")
    assert c.lost_reason == "session expired"


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5)), max_size=30), st.floats(0, 200))
def test_never_valid_past_the_session_of_the_last_answered_renewal(renewals: list[tuple[float, float]],
                                                                    now: float) -> None:
    """Renewals sent at any times, answered after any delays (a paused process answers late):
    at any ``now``, valid implies now < last answered send time + the session timeout."""
    c = LeaseClock(T)
    answered: list[float] = []
    for sent, delay in sorted(renewals):
        if sent + delay <= now:  # the answer arrived before now
            c.renewed(sent_at=sent)
            answered.append(sent)
    if c.valid(now):
        assert answered and now < max(answered) + T
    else:
        assert not answered or now >= max(answered) + T * TRUST
