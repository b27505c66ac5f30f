"""``pacing.in_flight``: requests sent with a bounded number unanswered, the next sent as each
answer comes (issue 43: a dead group's move transactions). Pure: plain callables, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.coordinator.pacing import in_flight


@given(n=st.integers(0, 40), limit=st.integers(1, 10))
def test_answers_come_in_order_and_each_answer_lets_the_next_go_before_it_is_handed_on(n: int, limit: int) -> None:
    events: list[tuple[str, int]] = []
    unanswered: set[int] = set()
    most = 0

    def send(i: int) -> int:
        nonlocal most
        assert events[-1] == ("turn", i)  # before_send came just before its send
        unanswered.add(i)
        most = max(most, len(unanswered))
        events.append(("send", i))
        return i * 10

    def wait(i: int, request: int) -> int:
        assert request == i * 10
        unanswered.remove(i)
        events.append(("answer", i))
        return i

    got = []
    for item, answer in in_flight(range(n), send, wait, limit=limit, before_send=lambda i: events.append(("turn", i))):
        assert item == answer
        # the next request left before this answer was handed on: the pipe stays full
        assert len(unanswered) == min(limit, n - item - 1)
        got.append(answer)
    assert got == list(range(n))
    assert most == min(limit, n)
    # a send after the first `limit` follows the answer of the request `limit` before it
    sends = [i for kind, i in events if kind == "send"]
    for i in sends[limit:]:
        at = events.index(("send", i))
        assert events[at - 2] == ("answer", i - limit), events


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        list(in_flight([1], lambda i: i, lambda i, r: r, limit=0))
