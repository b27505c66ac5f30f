"""Acks settled from two answers: the master's "synced here" and the slave's synced end (issue 39).

A produce stream that watches its segment on the slave (ordq/wire/lean_produce.py) asks the
master for acks after the master's own sync (``local_acks``) and reads the slave's synced end
from the slave itself. A batch is acked to the application only when both cover it, which is
what an ack has always meant (DESIGN §4: synced on both replicas); the slave's answer just
reaches the producer in one hop instead of through the master.

Guarantee: ``ready`` returns, in order, exactly the master's acks (or their leading parts, cut at
a batch boundary: the slave's end always falls on one, its copy being a prefix of the
master's) that lie below the highest synced end the slave told (or an ack of both told: until
the stream asks for local acks, the master's acks mean both); nothing is returned twice.

Rules: pure; no I/O, no clock.
"""

from __future__ import annotations

import collections

from ordq.common.errors import BrokerUnavailable
from ordq.wire.transport import Ack


class BothSynced:
    """The master's acks of one stream's segment ``seg`` held until the slave's end covers them."""

    def __init__(self, seg: int) -> None:
        self.seg = seg
        self.slave_end = 0  # the highest synced end the slave told (offsets below it are synced there)
        self._held: collections.deque[Ack] = collections.deque()

    def master_acked(self, acks: list[Ack], *, both: bool = False) -> None:
        """The master synced these (in order); ``both``: its acks of both replicas' sync (a stream
        not yet asking for local acks), which say the slave's end too."""
        for ack in acks:
            if ack.seg != self.seg:
                raise BrokerUnavailable(f"segment {self.seg}", f"an ack of segment {ack.seg} on its stream")
        self._held.extend(acks)
        if both and acks:
            self.slave_synced(acks[-1].first_offset + acks[-1].count)

    def slave_synced(self, end: int) -> None:
        """The slave's copy of ``seg`` is synced up to ``end`` (answers may come in any order)."""
        self.slave_end = max(self.slave_end, end)

    @property
    def held(self) -> int:
        """Acks of the master not yet covered by the slave."""
        return len(self._held)

    def ready(self) -> list[Ack]:
        """The acks both cover now, in order (removed from what is held)."""
        out: list[Ack] = []
        end = self.slave_end
        held = self._held
        while held:
            ack = held[0]
            stop = ack.first_offset + ack.count
            if stop <= end:
                out.append(held.popleft())
                continue
            if ack.first_offset < end:  # a merged run the slave covers in part: its leading batches
                n = end - ack.first_offset
                out.append(Ack(seg=ack.seg, first_offset=ack.first_offset, first_seq=ack.first_seq, count=n))
                held[0] = Ack(seg=ack.seg, first_offset=end, first_seq=ack.first_seq + n, count=ack.count - n)
            break
        return out
