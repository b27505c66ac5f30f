"""Each caller's turns at the coordinator service (coordinator/fair_share.py): the slot book as
pure accounting (hypothesis), and ``FairTurns`` on threads: no gRPC, no ZooKeeper."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.coordinator.fair_share import FairShareConfig, FairTurns, SlotBook
from tests.util import wait_until

HOLDERS = ("flooder", "neighbour", "third")


@settings(deadline=None)  # pure and fast; at load 60 one example was descheduled for 455 ms
@given(st.integers(1, 3), st.integers(0, 2), st.integers(1, 4),
       st.lists(st.one_of(st.tuples(st.just("arrive"), st.sampled_from(HOLDERS)),
                          st.tuples(st.just("leave"), st.integers(0, 10))), max_size=80))
def test_the_slot_book_runs_a_callers_first_call_beside_another_callers_many(
        slots: int, reserved: int, callers: int, steps: list[tuple[str, object]]) -> None:
    """Calls arrive and end in any order while ``callers`` call; a call that does not fit waits,
    and every end hands the free slots to the oldest waiting calls that fit (as
    ``FairTurns._grant``). Then, at every step: at most slots + reserved run, each holder's count
    adds up and is at most its cap; a call started past the shared slots only when its caller ran
    nothing; and no waiting call fits (nobody waits while a slot it may take is free)."""
    book = SlotBook(slots, reserved)
    running: list[str] = []
    waiting: list[str] = []

    def start(holder: str) -> None:
        had = book.running_of.get(holder, 0)
        if book.take(holder):
            assert had == 0, f"{holder} took a reserved slot while running {had}"
        running.append(holder)

    def grant() -> None:
        while (fitting := [h for h in waiting if book.fits(h, callers)]):
            waiting.remove(fitting[0])
            start(fitting[0])

    for what, arg in steps:
        if what == "arrive":
            assert isinstance(arg, str)
            if book.fits(arg, callers):
                assert not any(book.fits(h, callers) for h in waiting)
                start(arg)
            else:
                waiting.append(arg)
        elif running:
            assert isinstance(arg, int)
            holder = running.pop(arg % len(running))
            book.release(holder)
            grant()
        assert book.running == len(running) <= slots + reserved
        if 1 < callers <= slots + reserved:  # every caller's part fits beside the others' at once
            assert callers * book.cap(callers) <= slots + reserved
        assert book.running_of == {h: running.count(h) for h in set(running)}
        assert all(n <= book.cap(callers) for n in book.running_of.values())
        assert not any(book.fits(h, callers) for h in waiting)


def test_a_caller_alone_gets_every_shared_slot_and_no_reserved_one() -> None:
    book = SlotBook(2, 1)
    assert book.take("a") is False and book.take("a") is False
    assert not book.fits("a")  # its third call waits: the reserved slot is for the others
    assert book.fits("b") and book.take("b") is True
    assert not book.fits("b") and not book.fits("c")  # the reserved slot is taken
    book.release("a")  # two run (one each): the free slot is only for a caller running nothing
    assert not book.fits("a") and not book.fits("b") and book.fits("c")
    book.release("b")
    assert book.fits("a") and book.fits("b")
    with pytest.raises(ConfigError):
        FairShareConfig(reserved_slots=-1)


def test_while_several_call_each_runs_at_most_its_part_of_every_slot() -> None:
    book = SlotBook(2, 1)
    assert [book.cap(n) for n in (1, 2, 3, 4)] == [2, 1, 1, 1]
    book.take("flooder")
    assert book.fits("flooder", callers=1) and not book.fits("flooder", callers=2)
    assert book.fits("neighbour", callers=2) and book.fits("consumer", callers=3)
    assert [SlotBook(4, 2).cap(n) for n in (1, 2, 3, 4, 6, 7)] == [4, 3, 2, 1, 1, 1]


@pytest.fixture
def turns() -> Iterator[FairTurns]:
    # The clock stands still: every caller that called is active (``active_s``), however slowly
    # a loaded machine runs the threads.
    yield FairTurns(FairShareConfig(slots=2, reserved_slots=1, hold_refused_ms=0, max_delay_ms=30_000),
                    clock=lambda: 100.0)


class _Call:
    """One call of ``holder`` on a thread of its own: inside its turn until ``end``."""

    def __init__(self, turns: FairTurns, holder: str) -> None:
        self.entered = threading.Event()
        self._end = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(turns, holder), daemon=True)
        self._thread.start()

    def _run(self, turns: FairTurns, holder: str) -> None:
        with turns.turn(holder):
            self.entered.set()
            self._end.wait(30)

    def end(self) -> None:
        self._end.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_a_neighbours_call_starts_at_once_beside_a_flood_holding_every_shared_slot(turns: FairTurns) -> None:
    """The drill's case (security-control-plane): a flooder holds both slots and has more calls
    waiting; a neighbour's call starts at once in the reserved slot; its second call (while the
    first runs) waits like anyone's, and is served before the flooder's when a slot frees (it
    used less). The flood never runs more than the shared slots."""
    flood = [_Call(turns, "flooder") for _ in range(2)]
    for c in flood:
        assert c.entered.wait(10)
    more = _Call(turns, "flooder")
    wait_until(lambda: "flooder" in turns._waiting, timeout_s=10, what="the flooder's third call waiting")
    first = _Call(turns, "neighbour")
    assert first.entered.wait(10), "the neighbour's call waited behind the flood"
    assert turns.stats.reserved == 1
    second = _Call(turns, "neighbour")
    wait_until(lambda: "neighbour" in turns._waiting, timeout_s=10, what="the neighbour's second call waiting")
    first.end()  # grants under the lock as it leaves: the reserved slot, to the neighbour alone
    assert second.entered.wait(10), "the freed slot went to the flooder"
    assert turns.stats.reserved == 2 and "flooder" in turns._waiting and not more.entered.is_set()
    flood[0].end()  # two run (a flooder's, the neighbour's): the flood's third still does not fit
    assert "flooder" in turns._waiting and not more.entered.is_set()
    flood[1].end()
    assert more.entered.wait(10)
    for c in (second, more):
        c.end()
    assert turns.slots.running == 0 and not turns.slots.running_of
    assert turns.stats.served == 5 and turns.stats.refused == 0


def _called_lately(turns: FairTurns, *callers: str) -> None:
    """Each of ``callers`` made one call that ended: they count as calling lately."""
    for who in callers:
        call = _Call(turns, who)
        assert call.entered.wait(10)
        call.end()


def _flood_running_one_call(turns: FairTurns) -> tuple[_Call, _Call]:
    """The flooder's first call running and its second waiting, though a shared slot is free."""
    flood = _Call(turns, "flooder")
    assert flood.entered.wait(10)
    more = _Call(turns, "flooder")
    wait_until(lambda: "flooder" in turns._waiting, timeout_s=10, what="the flooder's second call waiting")
    assert turns.slots.running == 1
    return flood, more


def test_with_three_callers_a_flood_runs_one_call_and_the_others_start_at_once(turns: FairTurns) -> None:
    """The drill's three callers: a flooder, the neighbour committing, the drill's consumer. Once
    all three called, the flood runs one call at a time (its part of 2 + 1 slots), so the
    neighbour's and the consumer's calls both start at once beside it."""
    _called_lately(turns, "neighbour", "consumer")
    flood, more = _flood_running_one_call(turns)
    others = [_Call(turns, who) for who in ("neighbour", "consumer")]
    for c in others:
        assert c.entered.wait(10), "a caller within its part waited behind the flood"
    assert not more.entered.is_set()
    flood.end()
    assert more.entered.wait(10)
    for c in [*others, more]:
        c.end()
    assert turns.slots.running == 0 and turns.stats.refused == 0


def test_with_two_callers_a_flood_runs_one_call_and_the_neighbour_runs_beside_it_alone(turns: FairTurns) -> None:
    """The flood test's case (tests/test_coordinator_defences.py: one flooder, one neighbour
    committing). With each caller's part rounded up (2 of the 3 slots while two call) the flood
    kept both shared slots, and the neighbour's Commit ran in the reserved slot beside two of its
    Describes: at load 17-29 its p99 was 2.2x quiet (320 against 147 ms). Rounded down, the
    flood runs one call while the neighbour called lately, and the neighbour's call runs in a
    shared slot beside that one alone; the reserved slot stays free for a third caller."""
    _called_lately(turns, "neighbour")
    flood, more = _flood_running_one_call(turns)
    neighbour = _Call(turns, "neighbour")
    assert neighbour.entered.wait(10), "the neighbour waited behind the flood"
    assert turns.slots.running_of == {"flooder": 1, "neighbour": 1} and turns.stats.reserved == 0
    neighbour.end()
    assert "flooder" in turns._waiting  # its part is one call while the neighbour calls lately
    flood.end()
    assert more.entered.wait(10)
    more.end()
    assert turns.slots.running == 0 and turns.stats.refused == 0


def test_what_runs_before_the_slot_holds_none_and_its_failure_is_a_refusal() -> None:
    """``before_slot`` (the frame reads the request's body there) runs with no slot taken: a
    caller waiting in it keeps no other call out; what it raises is raised, no slot is left
    taken and nothing is counted served."""
    turns = FairTurns(FairShareConfig(slots=1, reserved_slots=0))
    inside, release = threading.Event(), threading.Event()

    def withholder() -> None:
        with turns.turn("withholder", "", lambda: (inside.set(), release.wait(10))):
            pass

    waiter = threading.Thread(target=withholder, daemon=True)
    waiter.start()
    try:
        assert inside.wait(10)
        with turns.turn("neighbour"):  # the only slot is free although the withholder's call is in
            assert turns.slots.running_of == {"neighbour": 1}
    finally:
        release.set()
        waiter.join(10)

    def bad_body() -> None:
        raise ConfigError("no body")

    served = turns.stats.served
    with pytest.raises(ConfigError), turns.turn("neighbour", "", bad_body):
        pytest.fail("the call ran without its body")
    assert turns.slots.running == 0 and turns.stats.served == served


def test_a_refusal_of_a_call_that_took_no_turn_is_held_counted_and_charged() -> None:
    """``FairTurns.refuse`` (the service's bound on a caller's calls at once): the refusal is held
    ``hold_refused_ms`` first (answered at once, the caller asks again at once), counted, and
    raised; past ``max_held`` of the caller's refusals held at once, answered at once."""
    from ordq.coordinator.fair_share import TurnRefused

    slept: list[float] = []
    turns = FairTurns(FairShareConfig(hold_refused_ms=700, max_held=1), sleep=slept.append, spread=lambda: 0.5)
    with pytest.raises(TurnRefused):
        turns.refuse("flooder", TurnRefused("flooder", "too many", 1_000))
    assert slept == [0.7] and turns.stats.refused == 1
    turns._held["flooder"] = 1  # one of its refusals held now: the next is answered at once
    with pytest.raises(TurnRefused):
        turns.refuse("flooder", TurnRefused("flooder", "too many", 1_000))
    assert slept == [0.7] and turns.stats.refused == 2


def test_a_floods_held_refusals_are_answered_spread_over_the_hold_not_at_once() -> None:
    """A flood's calls arrive together and are refused together; held each exactly
    ``hold_refused_ms``, they were answered, and came back, together: a wave each second
    (drill security-control-plane, stop j). Each is held ``hold_refused_ms`` times a factor from
    [0.5, 1.5) now: its holds average ``hold_refused_ms`` and spread over the whole second."""
    import random

    from ordq.coordinator.fair_share import TurnRefused

    slept: list[float] = []
    turns = FairTurns(FairShareConfig(hold_refused_ms=1000, max_held=64), sleep=slept.append,
                      spread=random.Random(38).random)
    for _ in range(64):
        with pytest.raises(TurnRefused):
            turns.refuse("flooder", TurnRefused("flooder", "too many", 1_000))
    assert len(slept) == 64 and min(slept) >= 0.5 and max(slept) < 1.5
    assert max(slept) - min(slept) > 0.8 and 0.9 < sum(slept) / len(slept) < 1.1
    assert len({round(s, 2) for s in slept}) > 40  # not a few waves either
