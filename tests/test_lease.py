"""The consumer's lease arithmetic (``ordq.sdk._lease.LeaseClock``), pure: no ZooKeeper, no clock.

The property that makes one active consumer per subscription: whatever the renewals and the
pauses, the lease is never valid at a time when ZooKeeper may already have expired the
session, i.e. later than (send time of the last answered renewal) + the session timeout.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ordq.sdk._lease import RENEW_EVERY, TRUST, LeaseClock

T = 2.0


def test_a_renewal_trusts_two_thirds_of_the_session_from_its_send_time() -> None:
    c = LeaseClock(T)
    assert not c.valid(0.0)  # nothing answered yet
    c.renewed(sent_at=10.0)
    assert c.valid(10.0) and c.valid(10.0 + T * TRUST - 1e-9)
    assert not c.valid(10.0 + T * TRUST)
    assert c.renew_due(10.0 + T * RENEW_EVERY, last_sent=10.0)
    assert not c.renew_due(10.0 + T * RENEW_EVERY / 2, last_sent=10.0)


def test_lost_is_final() -> None:
    c = LeaseClock(T)
    c.renewed(sent_at=1.0)
    c.lose("session expired")
    assert not c.valid(1.0) and c.lost_reason == "session expired"
    c.renewed(sent_at=2.0)  # a late answer cannot revive it
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
