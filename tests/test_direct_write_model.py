"""The direct-write protocol (docs/DESIGN.md §4, "Direct writes"), as a model: a producer that
writes each batch to the master and straight to the slave, the master that forwards it, the
slave's provisional tail (broker_group/direct_tail.py), group commits, a master crash that
loses what it had not synced, and the Seal protocol's decision (coordinator/seal.py
``decide``), in every order Hypothesis finds. The replica logic is the real one
(``SegmentReplica``, ``DirectTail``, ``decide``); only the links and the disks are modelled:
a link is a FIFO whose head is delivered or (for the direct link) lost, a log is a list of
batches with a synced length.

What must hold:
- an honest producer's acked batch (its master synced it and acked it locally, the slave's
  watch covered it) is in the sealed segment, whoever answered the Seal;
- an honest producer never causes a conflict;
- with any producer, an equivocating one too: what the master's LAC covered (what readers
  may have read) is never changed, both copies agree once sealed when both answered, and
  every copy is gap-free in offsets and seqs at every step.
"""

from __future__ import annotations

import collections
import os

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ordq.broker_group.direct_tail import DirectTail, Forward
from ordq.broker_group.replica import Refused, Role, SegmentReplica
from ordq.common.errors import FencedError
from ordq.coordinator.seal import decide
from ordq.wire.transport import ReplicaEnd

EPOCH = 1
STREAM = 7
FIRST_SEQ = 100
# A crash or a Seal only once a few messages were sent: the search spends its steps where they matter
LATE = FIRST_SEQ + 4


@attrs.frozen
class Batch:
    first_seq: int
    count: int
    content: str  # what its messages say; an equivocating producer sends two contents

    def crc(self, offset: int) -> int:  # of the stamped bytes: the offset is in them
        return hash((offset, self.first_seq, self.count, self.content)) & 0xFFFFFFFF


@attrs.define
class Copy:
    """One replica's log of one segment: (first offset, batch) in order, and its synced end."""

    replica: SegmentReplica
    log: list[tuple[int, Batch]] = attrs.field(factory=list)

    @property
    def end(self) -> int:
        return self.log[-1][0] + self.log[-1][1].count if self.log else 0

    def append(self, offset: int, b: Batch) -> None:
        assert offset == self.end
        self.log.append((offset, b))

    def cut(self, offset: int) -> None:
        self.log = [(o, b) for o, b in self.log if o < offset]
        assert self.end == offset

    def lose_unsynced(self) -> None:
        """What a kill -9 leaves: the synced batches (a batch is synced whole or not at all)."""
        self.cut(next((o for o, b in self.log if o + b.count > self.replica.local_synced), self.end))
        self.rescanned()

    def rescanned(self) -> None:
        """The replica's state as a scan of the log finds it (a restart, a reconcile's copy)."""
        seqs = self.messages(self.end)
        self.replica.restored(end=self.end, first_seq=seqs[0][0] if seqs else None,
                              last_seq=seqs[-1][0] if seqs else None)

    def sync(self) -> None:
        self.replica.synced(self.replica.next_offset)

    def messages(self, end: int) -> list[tuple[int, str]]:
        """(seq, content) of each message below ``end``."""
        out = []
        for o, b in self.log:
            for i in range(b.count):
                if o + i < end:
                    out.append((b.first_seq + i, b.content))
        return out

    def tail(self, start: int, end: int) -> tuple[tuple[int, int, int], ...]:
        return tuple((o, b.count, b.crc(o)) for o, b in self.log if start <= o and o + b.count <= end)


class DirectWrites(RuleBasedStateMachine):
    @initialize(honest=st.booleans())
    def start(self, honest: bool) -> None:
        self.honest = honest
        self.master = Copy(SegmentReplica("q", 0, Role.MASTER, fenced_epoch=EPOCH))
        self.slave = Copy(SegmentReplica("q", 0, Role.SLAVE, fenced_epoch=EPOCH))
        self.tail = DirectTail()
        self.next_seq = FIRST_SEQ
        self.to_master: collections.deque[Batch] = collections.deque()
        self.direct: collections.deque[Batch] = collections.deque()
        self.forwards: collections.deque[tuple[int, Batch]] = collections.deque()
        self.placed: dict[int, tuple[int, Batch]] = {}  # first seq -> where the master placed it
        self.local_acked = 0  # the master's local acks, as the producer read them (an offset)
        self.watched = 0  # the slave's end, as the producer's watch read it
        self.master_alive = True
        self.sealed: list[tuple[int, str]] | None = None
        self.served: list[tuple[int, str]] = []  # what readers may have read (under the LAC)

    # -- the producer ----------------------------------------------------------------------

    @precondition(lambda self: self.sealed is None)
    @rule(count=st.integers(1, 3), lie=st.booleans())
    def send(self, count: int, lie: bool) -> None:
        b = Batch(self.next_seq, count, f"m{self.next_seq}")
        self.next_seq += count
        self.to_master.append(b)
        self.direct.append(attrs.evolve(b, content="other") if lie and not self.honest else b)


    # -- the master --------------------------------------------------------------------------

    @precondition(lambda self: self.to_master and self.master_alive)
    @rule()
    def master_takes(self) -> None:
        b = self.to_master.popleft()
        try:
            p = self.master.replica.place(EPOCH, b.first_seq, b.count)
        except (Refused, FencedError):
            return
        assert not p.duplicate
        self.master.append(p.first_offset, b)
        self.placed[b.first_seq] = (p.first_offset, b)
        self.forwards.append((p.first_offset, b))

    @precondition(lambda self: self.master_alive and self.sealed is None)
    @rule()
    def master_syncs(self) -> None:
        self.master.sync()


    @precondition(lambda self: self.master_alive and self.sealed is None and self.next_seq >= LATE)
    @rule()
    def master_crashes(self) -> None:
        """kill -9: what it had not synced is gone; what it sent the slave may still arrive."""
        self.master.lose_unsynced()
        self.master_alive = False

    # -- the slave ---------------------------------------------------------------------------

    @precondition(lambda self: self.direct)
    @rule(lose=st.booleans())
    def slave_takes_direct(self, lose: bool) -> None:
        b = self.direct.popleft()
        if lose:
            return
        r = self.slave.replica
        try:
            p = self.tail.place(r, EPOCH, b.first_seq, b.count, b.crc(r.next_offset), STREAM)
        except (Refused, FencedError):
            return
        if p is not None:
            self.slave.append(p.first_offset, b)

    @precondition(lambda self: self.forwards)
    @rule()
    def slave_takes_forward(self) -> None:
        offset, b = self.forwards.popleft()
        r = self.slave.replica
        if r.sealed:
            return  # sealed first: the protocol copies any difference
        what = self.tail.on_forward(r, offset, b.first_seq, b.count, b.crc(offset))
        if what is Forward.CONFIRMED:
            return
        if what is Forward.CONFLICT:
            assert not self.honest, "an honest producer caused a conflict"
            self.slave.cut(offset)
            self.tail.cut(r, offset, b.first_seq)
        r.accept_replica(EPOCH, offset, b.first_seq, b.count)
        self.slave.append(offset, b)
        self.tail.appended(offset + b.count)

    @precondition(lambda self: self.sealed is None)
    @rule()
    def slave_syncs(self) -> None:
        self.slave.sync()

    # -- the Seal protocol -------------------------------------------------------------------

    def _reply(self, c: Copy, tail_from: int) -> ReplicaEnd:
        c.sync()  # a Seal waits for the commits in flight
        c.replica.seal()
        end = c.replica.local_synced
        last = c.messages(end)
        start = min(tail_from, end)
        return ReplicaEnd(end=end, first_seq=last[0][0] if last else None, last_seq=last[-1][0] if last else None,
                          tail_from=start, tail=c.tail(start, end))

    @precondition(lambda self: self.sealed is None and self.next_seq >= LATE)
    @rule()
    def seal(self) -> None:
        replies: dict[str, ReplicaEnd | None] = {
            "master": self._reply(self.master, self.master.replica.lac) if self.master_alive else None,
            "slave": self._reply(self.slave, self.tail.confirmed_end),
        }
        plan = decide(replies)
        copies = {"master": self.master, "slave": self.slave}
        winner = copies[plan.copy_from] if plan.copy_from else copies["master" if self.master_alive else "slave"]
        if plan.copy_to is not None:
            to = copies[plan.copy_to]
            start = to.end if plan.copy_start is None else plan.copy_start
            to.cut(start)
            for o, b in winner.log:
                if start <= o < plan.end:
                    to.append(o, b)
            to.rescanned()
        self.sealed = winner.messages(plan.end)
        assert len(self.sealed) == plan.end
        if self.master_alive:
            assert self.master.messages(plan.end) == self.slave.messages(plan.end), "sealed copies differ"
        assert self.sealed[:len(self.served)] == self.served, "the seal changed what readers read"
        if self.honest:
            for seq, (offset, b) in self.placed.items():
                if offset + b.count <= min(self.local_acked, self.watched):
                    for i in range(b.count):
                        assert self.sealed[offset + i] == (seq + i, b.content), f"acked seq {seq + i} lost"

    @rule()
    def time_passes(self) -> None:
        """Nothing happens (after a Seal, the run may have nothing left to do)."""

    # -- at every step ---------------------------------------------------------------------

    @invariant()
    def answers_arrive(self) -> None:
        """Every answer may arrive at once (the strongest belief each side can hold): the
        producer reads the master's local acks and its watch, the master the slave's end."""
        self.watched = max(self.watched, self.tail.stream_end(self.slave.replica, STREAM))
        if not self.master_alive:
            return
        self.local_acked = max(self.local_acked, self.master.replica.local_synced)
        self.master.replica.peer_progress(self.tail.peer_end(self.slave.replica))
        served = self.master.messages(self.master.replica.lac)
        assert served[:len(self.served)] == self.served, "what the LAC covered changed"
        self.served = served

    @invariant()
    def copies_are_gap_free(self) -> None:
        for c in (self.master, self.slave):
            seqs = [s for s, _ in c.messages(c.end)]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
            assert c.end == c.replica.next_offset
            assert c.replica.local_synced <= c.end

    @invariant()
    def the_slave_never_claims_what_it_has_not_confirmed(self) -> None:
        if self.master_alive:
            end = self.tail.peer_end(self.slave.replica)
            assert self.slave.messages(end) == self.master.messages(end)[:len(self.slave.messages(end))]


TestDirectWrites = DirectWrites.TestCase
TestDirectWrites.settings = settings(max_examples=int(os.environ.get("MODEL_EXAMPLES", 400)), stateful_step_count=60,
                                     deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the dangers one by one, in the order that shows each (the search above may miss them) --

def play(honest: bool, *steps: str) -> DirectWrites:
    """Run the model through ``steps`` ("send", "send lie", "direct", "direct lost", "forward",
    "master", "sync master", "sync slave", "crash", "seal"), checking every invariant after
    each step, as Hypothesis does."""
    m = DirectWrites()
    m.start(honest=honest)
    calls = {"send": lambda: m.send(1, False), "send lie": lambda: m.send(1, True),
             "direct": lambda: m.slave_takes_direct(False), "direct lost": lambda: m.slave_takes_direct(True),
             "forward": m.slave_takes_forward, "master": m.master_takes, "sync master": m.master_syncs,
             "sync slave": m.slave_syncs, "crash": m.master_crashes, "seal": m.seal}
    for step in steps:
        calls[step]()
        m.answers_arrive()
        m.copies_are_gap_free()
        m.the_slave_never_claims_what_it_has_not_confirmed()
    return m


FOUR = ("send",) * 4  # LATE: enough sent for a crash or a Seal


def test_a_lost_direct_batch_never_lets_a_later_one_take_its_offset() -> None:
    """The first direct batch is lost on the way; the second must not land at offset 0 of an
    empty copy, where the master put the first: each would then say "offset 1 synced" of a
    different message, and the producer would count the first acked on a slave without it."""
    m = play(True, *FOUR, "direct lost", "direct", "sync slave", "master", "sync master", "crash", "seal")
    assert m.sealed == [] and m.local_acked == 1 and m.watched == 0


def test_what_the_master_is_told_is_only_what_its_forwards_confirmed() -> None:
    """A provisional batch (here another than the master's) never counts in the master's LAC,
    so readers never see it."""
    m = play(False, *FOUR[:-1], "send lie", "master", "forward", "direct", "direct", "direct", "direct",
             "sync slave", "master", "master", "master", "sync master")
    assert m.tail.peer_end(m.slave.replica) == 1 and m.master.replica.lac == 1
    assert [b.first_seq for b in m.tail.provisional] == [101, 102, 103]


def test_a_forward_of_other_bytes_cuts_the_provisional_tail() -> None:
    m = play(False, "send", "send lie", *FOUR[2:], "master", "forward", "direct", "direct", "direct", "direct",
             "sync slave", "master", "forward")
    assert m.tail.conflicts == 1
    assert m.slave.messages(m.slave.end) == [(100, "m100"), (101, "m101")]  # 102, 103 cut with it


def test_an_equivocating_producer_cannot_leave_two_sealed_copies_that_differ() -> None:
    m = play(False, "send", "send lie", *FOUR[2:], "master", "forward", "direct", "direct", "direct", "direct",
             "sync slave", "master", "master", "master", "sync master", "seal")
    assert m.sealed == [(100, "m100"), (101, "m101"), (102, "m102"), (103, "m103")]
    assert m.slave.messages(m.slave.end) == m.sealed


def test_an_honest_producers_batch_acked_on_a_provisional_copy_survives_its_master() -> None:
    """The point of it all: the slave synced the producer's own copy before the master's
    forward came, the master synced and acked, then died; the Seal keeps the batch."""
    m = play(True, *FOUR, "master", "forward", "direct", "direct", "sync slave", "master", "sync master",
             "crash", "seal")
    assert m.local_acked == 2 and m.watched == 2 and m.tail.confirmed_end == 1
    assert m.sealed == [(100, "m100"), (101, "m101")]
