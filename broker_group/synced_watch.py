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
no lock. A watcher that reads nothing is cut once ``BUFFER_LIMIT`` bytes wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ordq.wire import ordq_pb2 as pb
from ordq.wire.lean_frames import frame

log = logging.getLogger("ordq.broker")

BUFFER_LIMIT = 64 << 10  # ~2,000 answers unread: the producer takes nothing, its link is cut


class Watch:
    """One producer's watch of (queue, seg) on one connection."""

    def __init__(self, queue: str, seg: int, writer: asyncio.StreamWriter) -> None:
        self.queue, self.seg = queue, seg
        self._writer = writer
        self.sent = -1  # the last end told

    def offer(self, end: int) -> None:
        """Tell ``end`` if it is past what was told (an answer is a few dozen bytes, written
        at once)."""
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
        self._writer.write(frame(pb.ProduceLinkAnswer(synced=pb.ReplicaSegment(queue=self.queue, seg=self.seg,
                                                                                synced_end=end))))


class SyncedWatches:
    """The slave's watches by segment."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], set[Watch]] = {}

    def add(self, watch: Watch) -> None:
        self._by_key.setdefault((watch.queue, watch.seg), set()).add(watch)

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
            for watch in self._by_key.get(key, ()):
                watch.offer(end)
