"""A slave's watches of synced ends: producers told, in one hop, how far this copy of their
segment is synced (issue 39).

Why: a synchronous send's ack went producer → master → slave → master → producer, and the
master's part of the way back (reading the slave's answer, moving the LAC, waking the produce
stream, writing the ack) is a hop and a wake-up on the critical path. A producer that watches
its segment here (the lean link's ``watch`` hello, broker_group/lean_produce.py) gets the
slave's synced end straight from the slave, at the moment the slave answers its master
(replication.py ``_answer``); its produce stream to the master asks for acks after the master's
own sync (``local_acks``), and it settles a batch once both cover it (ordq/wire/lean_produce.py).

Guarantee: a watch's answer is this copy's synced end at that moment, never more: a producer
that settles on it and on the master's local ack has its batch synced on both replicas (the
slave's copy is a prefix of the master's, replication.py), as DESIGN §4 asks of every ack.
A watch reads nothing but that end, so the token it needs is the produce role on its queue.

Rules: on the broker's loop only (registered by the link's handler, pushed by ``_answer``):
no lock. A watcher that reads nothing is cut once ``BUFFER_LIMIT`` bytes wait for it. A segment
holds at most ``WATCHES_PER_SEGMENT`` watches: each costs the slave's loop a TLS write at every
commit of that segment, so without a bound one token's calls (256) watching its own segment
would turn each of its commits into ~256 writes on the loop every queue of the group shares.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import ResourceExhausted
from ordq.wire.lean_frames import frame

log = logging.getLogger("ordq.broker")

BUFFER_LIMIT = 64 << 10  # ~2,000 answers unread: the producer takes nothing, its link is cut
# One producer writes a segment, with one watch per stream; the slack is for a stream reopened
# before the slave saw its old connection close (a host gone without a FIN: TCP keepalive, ~80 s).
# A watch refused leaves its producer on the master's acks: slower, never wrong.
WATCHES_PER_SEGMENT = 4


class Watch:
    """One producer's watch of (queue, seg) on one connection."""

    def __init__(self, queue: str, seg: int, writer: asyncio.StreamWriter) -> None:
        self.queue, self.seg = queue, seg
        self._writer = writer
        self.sent = -1  # the last end told

    def offer(self, end: int, answer: bytes | None = None) -> None:
        """Tell ``end`` if it is past what was told (an answer is a few dozen bytes, written
        at once; ``answer``: its frame, made once for all the segment's watchers)."""
        if end <= self.sent:
            return
        transport = self._writer.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > BUFFER_LIMIT:
            log.warning("synced-end watch of %s/%d: its producer reads nothing; cut", self.queue, self.seg)
            transport.abort()
            return
        self.sent = end
        self._writer.write(answer if answer is not None else synced_answer(self.queue, self.seg, end))


def synced_answer(queue: str, seg: int, end: int) -> bytes:
    """The frame that tells a watcher of (queue, seg) its synced end ``end``."""
    return frame(pb.ProduceLinkAnswer(synced=pb.ReplicaSegment(queue=queue, seg=seg, synced_end=end)))


class SyncedWatches:
    """The slave's watches by segment."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], set[Watch]] = {}

    def add(self, watch: Watch, address: str) -> None:
        """Hold ``watch``; ResourceExhausted when its segment holds ``WATCHES_PER_SEGMENT``
        already (``address``: this broker's, for the error)."""
        key = (watch.queue, watch.seg)
        held = self._by_key.get(key, set())
        if len(held) >= WATCHES_PER_SEGMENT:
            raise ResourceExhausted(address, "synced-end watches", WATCHES_PER_SEGMENT,
                                    f"{watch.queue}/{watch.seg} is watched {len(held)} times already")
        held.add(watch)
        self._by_key[key] = held

    def remove(self, watch: Watch) -> None:
        key = (watch.queue, watch.seg)
        held = self._by_key.get(key)
        if held is not None:
            held.discard(watch)
            if not held:
                del self._by_key[key]

    def __len__(self) -> int:
        return sum(map(len, self._by_key.values()))

    def push(self, ends: Mapping[tuple[str, int], int]) -> None:
        """These segments' synced ends now: told to their watchers."""
        if not self._by_key:
            return
        for key, end in ends.items():
            watches = self._by_key.get(key)
            if watches:
                answer = synced_answer(key[0], key[1], end)
                for watch in watches:
                    watch.offer(end, answer)
