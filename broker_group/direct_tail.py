"""A slave's copies written straight by the producer, before its master's forward of them
(issue 39's next step: the producer writes to both replicas; docs/DESIGN.md §4, "Direct
writes"). Pure: no files, sockets, clocks or threads. Not wired to the broker yet: this is the
slave's decision logic, checked on its own and in the protocol model
(tests/test_direct_write_model.py) before any byte takes this path.

Why: a synchronous send waits for the slave's fdatasync, and today the batch reaches the slave
only through the master (producer → master → slave: two hops and the master's checks before
the slave's sync starts, ~250-340 µs of ~1,000 at 400 msgs/s, docs/BENCHMARKS.md stop 78/79).
Written to the slave directly, both syncs start at once.

Rules:
- A direct batch is placed only where the master would place it: it must continue the copy
  exactly (``first_seq == last_seq + 1``), under the same epoch rules as a master's
  ``place``. Anything else (a duplicate, a gap behind a forward not yet arrived) is dropped:
  the master's forward brings it. Nothing a direct batch does can move a confirmed offset.
- It is *provisional* until the master's forward of the same offsets arrives:
  - the same batch (offset, count, first seq, CRC of the stamped bytes): confirmed, nothing
    written again;
  - anything else: the provisional tail from that offset is cut (it was never confirmed, so
    never counted in the master's LAC, never served to a reader) and the master's batch is
    written. Only an equivocating or broken producer causes this.
- The master learns only confirmed ends (``peer_end``): its LAC, and so what readers see and
  what a resend dedups against, still means "the same bytes synced on both".
- A producer's stream is told the synced end up to the first provisional batch another stream
  wrote (``stream_end``): its acks never rest on bytes it did not send itself.
- A provisional batch that is synced counts in a Seal's end like any other: the producer may
  hold an ack for it (its master synced the same batch, then died before forwarding it).
"""

from __future__ import annotations

import collections
import enum

import attrs

from ordq.broker_group.replica import Placement, SegmentReplica
from ordq.common.errors import ConfigError


@attrs.frozen
class DirectBatch:
    """A batch a producer's stream wrote straight to this slave, not yet matched by a forward."""

    first_offset: int
    count: int
    first_seq: int
    crc: int  # of the batch as stored (offset-stamped)
    stream: int  # the producer's stream (a number the slave gives each direct-write link)

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.count


class Forward(enum.Enum):
    """What a forward from the master does to this copy (``DirectTail.on_forward``)."""

    APPEND = "append"  # past the copy's end: written as today
    CONFIRMED = "confirmed"  # the provisional batch at its offset is the same: nothing to write
    CONFLICT = "conflict"  # the provisional tail from its offset differs: cut it, then append


@attrs.define
class DirectTail:
    """The provisional batches of one segment's slave copy, oldest first, and how far the copy
    is confirmed by its master. Used with the segment's ``SegmentReplica`` (role slave), under
    the broker lock, like the replica itself."""

    confirmed_end: int = 0  # offsets below it came from the master's forwards, or matched one
    _batches: collections.deque[DirectBatch] = attrs.field(factory=collections.deque)
    conflicts: int = 0  # forwards that cut a provisional tail (an equivocating or broken producer)
    dropped: int = 0  # direct batches not at the copy's end (the forward brings them)

    @property
    def provisional(self) -> tuple[DirectBatch, ...]:
        return tuple(self._batches)

    def place(self, replica: SegmentReplica, epoch: int, first_seq: int, count: int, crc: int,
              stream: int) -> Placement | None:
        """A direct batch: its placement (stamp it at ``first_offset`` and append it), or None
        when it is dropped. Raises FencedError / Refused as a master's ``place`` would (a
        fenced epoch, a sealed or frozen copy): the stream stops writing here."""
        p = replica.accept_direct(epoch, first_seq, count)
        if p is None:
            self.dropped += 1
            return None
        self._batches.append(DirectBatch(first_offset=p.first_offset, count=count, first_seq=first_seq,
                                         crc=crc, stream=stream))
        return p

    def on_forward(self, replica: SegmentReplica, first_offset: int, first_seq: int, count: int,
                   crc: int) -> Forward:
        """The master's forward of a batch at ``first_offset``: what the caller does with it.
        APPEND: ``replica.accept_replica`` then ``appended``; CONFIRMED: nothing (answer the
        master once the copy is synced past it); CONFLICT: truncate the log to
        ``first_offset``, ``cut(replica, first_offset, first_seq)``, then as APPEND. Forwards
        come in offset order, so one below the copy's end must start at ``confirmed_end``;
        ConfigError otherwise (a broken link: the caller drops it, as for any bad forward)."""
        if first_offset >= replica.next_offset:
            return Forward.APPEND
        if first_offset != self.confirmed_end:
            raise ConfigError(f"forward at offset {first_offset}, copy confirmed to {self.confirmed_end}")
        head = self._batches[0] if self._batches else None
        if head is not None and (head.first_offset, head.count, head.first_seq, head.crc) == \
                (first_offset, count, first_seq, crc):
            self._batches.popleft()
            self.confirmed_end = head.end_offset
            return Forward.CONFIRMED
        self.conflicts += 1
        return Forward.CONFLICT

    def cut(self, replica: SegmentReplica, offset: int, first_seq: int) -> None:
        """Drop every provisional batch from ``offset`` (a conflict's): the copy then ends
        there, its last seq ``first_seq - 1`` (the forward that follows continues it)."""
        if offset < self.confirmed_end:
            raise ConfigError(f"cannot cut confirmed offsets: {offset} < {self.confirmed_end}")
        while self._batches and self._batches[-1].first_offset >= offset:
            self._batches.pop()
        replica.truncated(offset, last_seq=first_seq - 1 if offset else None)

    def appended(self, end_offset: int) -> None:
        """A forward was appended (APPEND): the copy is confirmed to its end."""
        if self._batches:
            raise ConfigError("a forward appended past provisional batches")
        self.confirmed_end = end_offset

    def peer_end(self, replica: SegmentReplica) -> int:
        """What the slave tells its master it holds: synced and confirmed."""
        return min(replica.local_synced, self.confirmed_end)

    def stream_end(self, replica: SegmentReplica, stream: int) -> int:
        """What ``stream``'s watch is told: the synced end, up to the first provisional batch
        another stream wrote."""
        end = replica.local_synced
        for b in self._batches:
            if b.stream != stream:
                return min(end, b.first_offset)
        return end
