"""The broker's pure per-segment decisions (broker_group/replica.py), without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.broker_group.replica import Placement, Refused, Role, SegmentReplica
from ordq.common.errors import FencedError


def master() -> SegmentReplica:
    return SegmentReplica("q", 0, Role.MASTER, fenced_epoch=1)


def test_offsets_are_assigned_gap_free_and_seqs_must_continue() -> None:
    r = master()
    assert r.place(1, 10, 5) == Placement(first_offset=0, count=5, first_seq=10, duplicate=False)
    assert r.place(1, 15, 3).first_offset == 5
    assert (r.next_offset, r.first_seq, r.last_seq) == (8, 10, 17)
    with pytest.raises(Refused, match="gap"):
        r.place(1, 19, 1)


def test_a_resend_of_a_stored_batch_gets_its_original_offsets_and_nothing_else_does() -> None:
    r = master()
    r.place(1, 0, 4)
    r.place(1, 4, 4)
    again = r.place(1, 4, 4)
    assert again.duplicate and again.first_offset == 4
    assert r.next_offset == 8  # nothing new stored
    with pytest.raises(Refused, match="overlap"):
        r.place(1, 2, 4)  # straddles two stored batches: not a resend of one


def test_what_a_segment_keeps_for_resends_is_nothing_the_garbage_collector_walks() -> None:
    """Stop 67: the master's young collections in the noisy-neighbour drill were ~95 % the
    (first_offset, count) tuples it kept per accepted batch, one container a batch for the
    segment's life. Kept as one int each, the dict holds nothing the collector tracks, and
    a resend still gets its original offsets, whatever their size (counts are uint32)."""
    import gc

    r = master()
    seq = 0
    for count in (1, 3, (1 << 32) - 1):
        r.place(1, seq, count)
        seq += count
    big_first = r.next_offset
    r.place(1, seq, 2)
    assert not gc.is_tracked(r._batches)
    again = r.place(1, seq, 2)
    assert (again.duplicate, again.first_offset, again.count) == (True, big_first, 2)
    with pytest.raises(Refused, match="overlap"):
        r.place(1, seq, 3)  # the same first seq with another count is not that batch
    assert r.place(1, 1, 3).first_offset == 1


def test_lac_is_the_minimum_of_both_copies_and_only_it_is_readable() -> None:
    r = master()
    r.place(1, 0, 10)
    r.synced(10)
    assert r.lac == 0 and r.readable_end() == 0  # the slave has nothing yet
    r.peer_progress(6)
    assert r.lac == 6 and r.readable_end() == 6
    r.peer_progress(3)  # a stale report never moves it back
    assert r.lac == 6


def test_fence_refuses_lower_epochs_and_a_write_raises_the_fence() -> None:
    r = master()
    r.fence(3)
    with pytest.raises(FencedError) as err:
        r.place(2, 0, 1)
    assert (err.value.epoch, err.value.current_epoch) == (2, 3)
    r.place(4, 0, 1)  # a newer producer writes: every older one is fenced from now on
    with pytest.raises(FencedError):
        r.place(3, 1, 1)
    with pytest.raises(FencedError):
        r.fence(3)


def test_seal_freezes_at_the_synced_end_and_refuses_writes() -> None:
    r = master()
    r.place(1, 0, 5)
    r.synced(5)
    r.seal()
    assert r.sealed and r.sealed_end == 5 and not r.writable
    with pytest.raises(Refused) as err:
        r.place(1, 5, 1)
    assert err.value.kind == "not_writable"
    assert r.readable_end() == 5 and r.readable_end(known_end=3) == 3


def test_a_slave_copy_must_continue_exactly() -> None:
    r = SegmentReplica("q", 0, Role.SLAVE)
    r.accept_replica(1, 0, 0, 4)
    with pytest.raises(Refused, match="offset"):
        r.accept_replica(1, 5, 4, 1)
    with pytest.raises(Refused, match="seq"):
        r.accept_replica(1, 4, 7, 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["new", "resend", "gap", "sync", "peer", "fence"]),
                          st.integers(1, 20)), max_size=60))
def test_random_histories_keep_the_segment_consistent(ops: list[tuple[str, int]]) -> None:
    """Whatever arrives, offsets stay gap-free, stored seqs stay contiguous, a resend never
    grows the segment, and the LAC never exceeds either copy nor moves back."""
    r = master()
    stored: list[tuple[int, int]] = []  # (first_seq, count) as placed
    epoch, lac_seen = 1, 0
    for op, n in ops:
        next_seq = (r.last_seq + 1) if r.last_seq is not None else 100
        try:
            if op == "new":
                p = r.place(epoch, next_seq, n)
                assert p.first_offset == sum(c for _, c in stored) and not p.duplicate
                stored.append((next_seq, n))
            elif op == "resend" and stored:
                fs, c = stored[n % len(stored)]
                before = r.next_offset
                p = r.place(epoch, fs, c)
                assert p.duplicate and r.next_offset == before
            elif op == "gap" and stored:  # an empty segment takes any first seq: it cannot know
                r.place(epoch, next_seq + n, 1)
                raise AssertionError("a gapped batch was accepted")
            elif op == "sync":
                r.synced(min(r.next_offset, r.local_synced + n))
            elif op == "peer":
                r.peer_progress(min(r.next_offset, r.peer_synced + n))
            elif op == "fence":
                epoch += 1
                r.fence(epoch)
        except Refused as exc:
            assert op == "gap", exc
        assert r.lac <= r.local_synced and r.lac <= r.peer_synced and r.lac >= lac_seen
        lac_seen = r.lac
        assert r.next_offset == sum(c for _, c in stored)
        if stored:
            assert r.last_seq == stored[-1][0] + stored[-1][1] - 1
