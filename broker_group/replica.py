"""What one replica knows about one segment, and the decisions it makes, without I/O.

Rules:
- Pure: no gRPC, files, ZooKeeper, clocks or threads. The broker service (``server.py``)
  feeds it events (a produce batch arrived, the log synced, the peer synced, fence, seal) and
  carries out the answers; it holds the broker lock while it does.
- Offsets are assigned here, in arrival order, gap-free. ``next_offset`` runs ahead of what is
  on disk (``local_synced``) and on the peer (``peer_synced``); only ``lac``, the minimum of
  the two on a master, is ever acked or served to readers of an open segment.
- A batch is refused unless its epoch is at least the fenced epoch and its first seq
  continues the segment. A resend of a range this segment already holds is answered with the
  original offsets, and the caller acks it only once ``lac`` covers it: a dedup that trusted
  an unsynced copy would ack data that a crash can still lose (the Pulsar/NATS dedup bugs).

Writability (``writable``) is lost for good when the segment is sealed, when it was held open
before this process restarted, when the replication stream to the slave broke (the producer
fails over rather than have us stream a catch-up), or when the disk refused a write.
"""

from __future__ import annotations

import enum

import attrs

from ordq.common.errors import ConfigError, FencedError

_COUNT_MASK = (1 << 32) - 1  # a batch's count (a uint32 on the wire) in its ``SegmentReplica._batches`` entry


class Role(enum.Enum):
    MASTER = "master"
    SLAVE = "slave"


@attrs.frozen
class Placement:
    """Where an accepted batch goes: its offsets, and whether it is new or a resend."""

    first_offset: int
    count: int
    first_seq: int
    duplicate: bool

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.count


class Refused(Exception):
    """A batch or command the segment must refuse; ``kind`` tells the service which error."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind  # "not_writable" | "bad_request"
        self.why = why


@attrs.define
class SegmentReplica:
    queue: str
    seg: int
    role: Role
    fenced_epoch: int = 0
    sealed: bool = False
    sealed_end: int | None = None
    writable: bool = True
    not_writable_why: str = ""
    next_offset: int = 0
    first_seq: int | None = None
    last_seq: int | None = None  # seq of the last accepted message
    local_synced: int = 0
    # master: what the slave synced; slave: the LAC the master pushed. Either way the LAC is
    # the minimum of this and local_synced.
    peer_synced: int = 0
    # first_seq -> first_offset << 32 | count of batches accepted in this incarnation, for
    # resends. One int, not a tuple: a tuple a batch is a container the garbage collector
    # counts and walks (the master's young collections in the noisy-neighbour drill were
    # (int, int) tuples of this dict, ~95 %, stop 67); a dict of ints alone it never tracks.
    _batches: dict[int, int] = attrs.field(factory=dict)

    # -- reads ---------------------------------------------------------------------------

    @property
    def lac(self) -> int:
        """Last add confirmed, as a count: messages durable on both replicas."""
        return min(self.local_synced, self.peer_synced)

    def readable_end(self, known_end: int | None = None) -> int:
        """How far a reader may read: the LAC of an open segment, the end of a sealed one
        (never past the end ZooKeeper decided, ``known_end``, when the reader knows it)."""
        end = self.local_synced if self.sealed else self.lac
        if known_end is not None:
            end = min(end, known_end)
        return end

    # -- writes ---------------------------------------------------------------------------

    def check_epoch(self, epoch: int) -> None:
        if epoch < self.fenced_epoch:
            raise FencedError(self.queue, epoch, self.fenced_epoch)

    def place(self, epoch: int, first_seq: int, count: int) -> Placement:
        """Master: where a produce batch goes (new offsets, or the original ones of a resend).

        Raises FencedError for a lower epoch, Refused otherwise."""
        self.check_epoch(epoch)
        if not self.writable:
            raise Refused("not_writable", self.not_writable_why)
        if count < 1:
            raise Refused("bad_request", "empty batch")
        if self.last_seq is not None and first_seq <= self.last_seq:
            known = self._batches.get(first_seq)
            if known is None or known & _COUNT_MASK != count:
                raise Refused(
                    "bad_request",
                    f"seqs {first_seq}..{first_seq + count - 1} overlap stored seqs up to {self.last_seq} "
                    "but are not a batch this segment holds",
                )
            return Placement(first_offset=known >> 32, count=count, first_seq=first_seq, duplicate=True)
        if self.last_seq is not None and first_seq != self.last_seq + 1:
            raise Refused("bad_request", f"seq gap: segment ends at seq {self.last_seq}, batch starts at {first_seq}")
        # The epoch of an accepted write becomes the fence: an older producer that is still
        # connected can never interleave with it.
        self.fenced_epoch = epoch
        return self._accept(first_seq, count)

    def accept_replica(self, epoch: int, first_offset: int, first_seq: int, count: int) -> Placement:
        """Slave: a replicated batch must continue this copy exactly.

        No epoch check here, on purpose: the master is the only writer of a slave and already
        refused every fenced producer before it forwarded a batch. A producer takeover compares
        the two replicas' ends after fencing both and fails over if they differ, so a batch the
        master accepted just before its fence may still land here without harm; refusing it
        would tear down replication of every queue on the group at each takeover."""
        if not self.writable:
            raise Refused("not_writable", self.not_writable_why)
        if first_offset != self.next_offset:
            raise Refused("bad_request", f"replicated batch at offset {first_offset}, copy ends at {self.next_offset}")
        if self.last_seq is not None and first_seq != self.last_seq + 1:
            raise Refused("bad_request", f"replicated seq {first_seq} does not follow {self.last_seq}")
        self.fenced_epoch = max(self.fenced_epoch, epoch)
        return self._accept(first_seq, count)

    def _accept(self, first_seq: int, count: int) -> Placement:
        placement = Placement(first_offset=self.next_offset, count=count, first_seq=first_seq, duplicate=False)
        self._batches[first_seq] = self.next_offset << 32 | count
        self.next_offset += count
        if self.first_seq is None:
            self.first_seq = first_seq
        self.last_seq = first_seq + count - 1
        return placement

    def synced(self, end: int) -> None:
        if end < self.local_synced or end > self.next_offset:
            raise ConfigError(f"segment {self.seg}: synced end {end} outside [{self.local_synced}, {self.next_offset}]")
        self.local_synced = end

    def peer_progress(self, end: int) -> None:
        self.peer_synced = max(self.peer_synced, end)

    # -- control ---------------------------------------------------------------------------

    def fence(self, epoch: int) -> None:
        """Refuse every epoch below ``epoch`` from now on (FencedError if already higher)."""
        self.check_epoch(epoch)
        self.fenced_epoch = epoch

    def freeze(self, why: str) -> None:
        """No more writes to this segment, for good."""
        if self.writable:
            self.writable = False
            self.not_writable_why = why

    def seal(self) -> None:
        """Sealed at what is durable here; the caller waits for pending syncs first."""
        self.freeze("sealed")
        if not self.sealed:
            self.sealed = True
            self.sealed_end = self.local_synced

    def restored(self, *, end: int, first_seq: int | None, last_seq: int | None) -> None:
        """State found on disk at start (or after a reconcile rewrote the copy)."""
        self.next_offset = self.local_synced = end
        self.first_seq, self.last_seq = first_seq, last_seq
        self._batches.clear()
        if self.sealed:
            self.sealed_end = end
