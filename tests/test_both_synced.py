"""A batch settles only once the master's ack and the slave's synced end both cover it
(ordq/wire/both_synced.py; issue 39's acks from the slave in one hop). Pure: no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import BrokerUnavailable
from ordq.wire.both_synced import BothSynced
from ordq.wire.transport import Ack


@st.composite
def _stream(draw: st.DrawFn) -> tuple[list[int], list[tuple[str, int]], int]:
    """Batch sizes of one segment, the two answers interleaved as they may arrive, and how many
    of the master's answers came before the stream asked for local acks (acks of both). The
    master acks runs of whole batches in order (merged runs, as ``take_ready_acks`` merges
    them); the slave tells synced ends at batch boundaries, in any order (a later answer may
    name an older end)."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=30))
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(sizes)), max_size=len(sizes)))) | {len(sizes)})
    master = [("master", c) for c in cuts]  # acked through batch c (exclusive), in order
    slave = [("slave", bounds[draw(st.integers(0, len(sizes)))]) for _ in range(draw(st.integers(0, 8)))]
    slave.append(("slave", bounds[-1]))
    events = draw(st.permutations(master + slave))
    # the master's own answers stay in order: re-sort them among their places
    master_places = [i for i, (who, _) in enumerate(events) if who == "master"]
    events = list(events)
    for place, event in zip(master_places, master, strict=True):
        events[place] = event
    return sizes, events, draw(st.integers(0, len(master)))


@given(_stream())
def test_acks_settle_in_order_once_and_only_where_both_cover_them(
        case: tuple[list[int], list[tuple[str, int]], int]) -> None:
    sizes, events, of_both = case
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    both = BothSynced(seg=7)
    master_upto = 0  # offsets the master acked
    slave_upto = 0  # the highest end the slave told
    acked_batches = 0
    answers = 0  # the master's answers so far
    settled: list[Ack] = []
    for who, at in events:
        if who == "master":
            answers += 1
            if at > acked_batches:
                run = Ack(seg=7, first_offset=starts[acked_batches], first_seq=100 + starts[acked_batches],
                          count=starts[at] - starts[acked_batches])
                both.master_acked([run], both=answers <= of_both)
                acked_batches = at
                master_upto = starts[at]
                if answers <= of_both:  # an ack of both replicas' sync says the slave's end too
                    slave_upto = max(slave_upto, master_upto)
        else:
            both.slave_synced(at)
            slave_upto = max(slave_upto, at)
        for ack in both.ready():
            assert ack.first_offset + ack.count <= min(master_upto, slave_upto)  # both cover it
            assert ack.first_offset + ack.count in starts  # whole batches
            settled.append(ack)
    offsets = [o for a in settled for o in range(a.first_offset, a.first_offset + a.count)]
    assert offsets == list(range(starts[-1]))  # every one, in order, once
    assert all(a.first_seq == 100 + a.first_offset for a in settled)
    assert both.held == 0


def test_the_slave_covering_part_of_a_run_settles_its_leading_batches() -> None:
    both = BothSynced(seg=1)
    both.master_acked([Ack(seg=1, first_offset=10, first_seq=50, count=6)])
    both.slave_synced(13)
    assert both.ready() == [Ack(seg=1, first_offset=10, first_seq=50, count=3)]
    assert both.ready() == []
    both.slave_synced(12)  # an older answer after a newer one changes nothing
    assert both.ready() == []
    both.slave_synced(16)
    assert both.ready() == [Ack(seg=1, first_offset=13, first_seq=53, count=3)]


def test_an_ack_of_another_segment_fails_the_stream() -> None:
    with pytest.raises(BrokerUnavailable):
        BothSynced(seg=1).master_acked([Ack(seg=2, first_offset=0, first_seq=0, count=1)])


def test_the_masters_acks_of_both_settle_without_the_slaves_word() -> None:
    """Before the stream asked for local acks, the master's ack means both replicas synced: it
    settles at once, and the local acks after it wait for the slave again."""
    both = BothSynced(seg=2)
    both.master_acked([Ack(seg=2, first_offset=0, first_seq=0, count=4)], both=True)
    assert both.ready() == [Ack(seg=2, first_offset=0, first_seq=0, count=4)]
    both.master_acked([Ack(seg=2, first_offset=4, first_seq=4, count=2)])
    assert both.ready() == []
    both.slave_synced(6)
    assert both.ready() == [Ack(seg=2, first_offset=4, first_seq=4, count=2)]
