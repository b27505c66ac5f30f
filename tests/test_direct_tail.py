"""A slave's provisional tail (broker_group/direct_tail.py) and the Seal's comparison of two
copies' tails (coordinator/seal.py), without I/O. The protocol as a whole:
tests/test_direct_write_model.py."""

from __future__ import annotations

import pytest

from ordq.broker_group.direct_tail import DirectTail, Forward
from ordq.broker_group.replica import Refused, Role, SegmentReplica
from ordq.common.errors import ConfigError, FencedError
from ordq.coordinator.seal import decide, first_difference
from ordq.wire.transport import ReplicaEnd


def slave_with_first_batch() -> tuple[SegmentReplica, DirectTail]:
    """A slave copy holding seqs 10..11 at offsets 0..1, from its master."""
    r, t = SegmentReplica("q", 0, Role.SLAVE, fenced_epoch=3), DirectTail()
    assert t.on_forward(r, 0, 10, 2, crc=1) is Forward.APPEND
    r.accept_replica(3, 0, 10, 2)
    t.appended(2)
    return r, t


def test_a_direct_batch_is_placed_only_where_it_continues_the_copy() -> None:
    empty, t = SegmentReplica("q", 0, Role.SLAVE, fenced_epoch=3), DirectTail()
    assert t.place(empty, 3, 10, 2, crc=1, stream=1) is None  # a segment's first batch is the master's
    r, t = slave_with_first_batch()
    assert t.place(r, 3, 10, 2, crc=1, stream=1) is None  # a duplicate
    assert t.place(r, 3, 13, 1, crc=2, stream=1) is None  # a gap
    p = t.place(r, 3, 12, 3, crc=3, stream=1)
    assert p is not None and (p.first_offset, r.next_offset) == (2, 5)
    assert t.dropped == 2 and [b.first_offset for b in t.provisional] == [2]


def test_a_direct_batch_is_refused_as_a_masters_produce_would_be() -> None:
    r, t = slave_with_first_batch()
    r.fence(4)
    with pytest.raises(FencedError):
        t.place(r, 3, 12, 1, crc=1, stream=1)
    r.seal()
    with pytest.raises(Refused, match="sealed"):
        t.place(r, 4, 12, 1, crc=1, stream=1)


def test_the_masters_forward_confirms_the_same_batch_and_cuts_another() -> None:
    r, t = slave_with_first_batch()
    t.place(r, 3, 12, 1, crc=7, stream=1)
    t.place(r, 3, 13, 2, crc=8, stream=1)
    r.synced(5)
    assert (t.peer_end(r), t.stream_end(r, 1)) == (2, 5)
    assert t.on_forward(r, 2, 12, 1, crc=7) is Forward.CONFIRMED
    assert (t.confirmed_end, t.peer_end(r)) == (3, 3)
    assert t.on_forward(r, 3, 13, 2, crc=9) is Forward.CONFLICT  # other bytes at offset 3
    t.cut(r, 3, 13)
    assert (r.next_offset, r.local_synced, r.last_seq, t.provisional, t.conflicts) == (3, 3, 12, (), 1)
    r.accept_replica(3, 3, 13, 2)
    t.appended(5)
    assert t.confirmed_end == 5


def test_forwards_out_of_order_and_cuts_below_the_confirmed_end_are_refused() -> None:
    r, t = slave_with_first_batch()
    t.place(r, 3, 12, 1, crc=7, stream=1)
    with pytest.raises(ConfigError, match="confirmed to 2"):
        t.on_forward(r, 1, 11, 1, crc=0)
    with pytest.raises(ConfigError, match="cannot cut confirmed"):
        t.cut(r, 1, 11)
    with pytest.raises(ConfigError, match="past provisional"):
        t.appended(4)


def test_a_stream_is_told_only_of_bytes_it_wrote_or_its_master_confirmed() -> None:
    """An earlier stream's provisional batches stop a later stream's end at them: its acks
    never rest on bytes it did not send."""
    r, t = slave_with_first_batch()
    t.place(r, 3, 12, 1, crc=7, stream=1)
    t.place(r, 3, 13, 1, crc=8, stream=2)
    r.synced(4)
    assert (t.stream_end(r, 1), t.stream_end(r, 2), t.stream_end(r, 3)) == (3, 2, 2)
    t.on_forward(r, 2, 12, 1, crc=7)
    assert (t.stream_end(r, 2), t.stream_end(r, 3)) == (4, 3)


def _end(tail: tuple[tuple[int, int, int], ...], tail_from: int = 0) -> ReplicaEnd:
    end = tail[-1][0] + tail[-1][1] if tail else tail_from
    return ReplicaEnd(end=end, first_seq=0, last_seq=end - 1, tail_from=tail_from, tail=tail)


def test_the_seal_compares_tails_past_what_both_copies_know_they_share() -> None:
    a = _end(((4, 2, 11), (6, 1, 12)), tail_from=4)
    assert first_difference(a, _end(((4, 2, 11),), tail_from=4)) is None  # a prefix: not a difference
    assert first_difference(a, _end(((4, 2, 11), (6, 2, 99)), tail_from=4)) == 6
    assert first_difference(a, _end(((6, 1, 12),), tail_from=6)) is None  # below 6 the slave confirmed
    assert first_difference(a, ReplicaEnd(end=7, first_seq=0, last_seq=6)) is None  # no tail reported


def test_when_the_tails_differ_the_masters_copy_is_the_segment() -> None:
    master = _end(((4, 2, 11),), tail_from=4)
    slave = _end(((4, 3, 55), (7, 1, 56)), tail_from=4)  # longer, and different from offset 4
    plan = decide({"master": master, "slave": slave})
    assert (plan.end, plan.copy_to, plan.copy_from, plan.copy_start) == (6, "slave", "master", 4)
    same = decide({"master": master, "slave": _end(((4, 2, 11), (6, 1, 56)), tail_from=4)})
    assert (same.end, same.copy_to, same.copy_start) == (7, "master", None)  # longest, as before
    alone = decide({"master": None, "slave": slave})
    assert (alone.end, alone.copy_to) == (8, None)
