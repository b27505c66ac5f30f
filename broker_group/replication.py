"""Master → slave replication: the same batches at the same offsets, and the master's LAC.

Guarantee: the slave's copy of a segment is always a prefix of the master's (it refuses a
batch that does not continue it exactly), and the master counts a batch as replicated only
when the slave reports it synced. When the stream breaks, every non-empty segment the master
could still write is frozen and its producers are failed at once: the producer fails over to
a new segment instead of us streaming a catch-up. A new stream therefore only ever carries
segments from offset 0, which keeps "the slave holds everything before what it acks" true by
construction (DESIGN §4 asks for a catch-up on reconnect; freezing is the simpler safe
choice, and after a slave failure the producer fails over anyway, DESIGN §6).

The master pushes its LAC for every segment it forwarded on this stream whenever it moved:
on the next batches, or alone at most every ``lac_push_ms``, so the slave can serve reads up
to it (only a reader of the slave, i.e. while the master is down, waits for it).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from broker_group.errors import SegmentNotWritable, abort
from broker_group.framing import GRPC_OPTIONS, chunks
from broker_group.wire import ordq_pb2 as pb
from broker_group.wire import ordq_pb2_grpc as pb_grpc
from ordq import security
from ordq.errors import OrdqError

if TYPE_CHECKING:
    from broker_group.service import Broker, Segment

log = logging.getLogger("ordq.replication")

# Requests with batches on the wire to the slave at once: one being synced there, one on its way.
MAX_INFLIGHT = 2


class ReplicationLink:
    """The master's one replication stream to its slave (found through ZooKeeper)."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._cv = broker._cv  # one lock for all broker state
        self.connected = False
        self._gen = 0  # bumped on every (re)connect; a stale request generator stops
        self._out: list[tuple[Segment, bytes]] = []
        self._active: dict[tuple[str, int], Segment] = {}
        self._lac_sent: dict[tuple[str, int], int] = {}
        self._inflight = 0  # requests with batches the slave has not answered yet
        # For the lag metrics: (when its oldest batch was forwarded, bytes) of each request
        # with batches the slave has not answered, and the same of what waits in ``_out``.
        self._unanswered: collections.deque[tuple[float, int]] = collections.deque()
        self._out_since = 0.0
        self._out_bytes = 0
        self._address: str | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        store = self.b.require_store()
        path = store.paths.live(self.b.config.gid, "slave")
        store.client.DataWatch(path)(self._on_slave_node)
        self._thread = threading.Thread(target=self._run, name="ordq-replicate", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._gen += 1
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _on_slave_node(self, data: bytes | None, _stat: Any, *_event: Any) -> None:
        import json

        address = json.loads(data.decode())["address"] if data else None
        with self._cv:
            self._address = address
            self._cv.notify_all()

    def forward(self, s: Segment, stamped: bytes) -> None:
        """Caller holds the broker lock: queue a stamped batch for the slave."""
        if not self._out:
            self._out_since = time.monotonic()
        self._out.append((s, stamped))
        self._out_bytes += len(stamped)
        self._active[s.key] = s

    def lag(self, now: float) -> tuple[int, float]:
        """Caller holds the broker lock: (bytes forwarded that the slave has not synced yet,
        seconds since the oldest of them was forwarded)."""
        pending = self._out_bytes + sum(n for _, n in self._unanswered)
        oldest = self._unanswered[0][0] if self._unanswered else self._out_since if self._out else now
        return pending, max(now - oldest, 0.0)

    # -- the stream ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._address is None and not self._stopping:
                    self._cv.wait()
                address = self._address
                if self._stopping or address is None:
                    return
                self._gen += 1
                gen = self._gen
                self._out.clear()
                self._active.clear()
                self._lac_sent.clear()
                self._inflight = 0
                self._unanswered.clear()
                self._out_bytes = 0
            self._stream_once(address, gen)
            with self._cv:
                if self._stopping:
                    return
                self._cv.wait(0.1)  # a short pause before reconnecting (or a new address)

    def _stream_once(self, address: str, gen: int) -> None:
        channel = security.channel(address, self.b.config.credentials, GRPC_OPTIONS)
        try:
            responses = pb_grpc.BrokerStub(channel).Replicate(self._requests(gen))
            for resp in responses:
                with self._cv:
                    if not self.connected:
                        self.connected = True
                        log.info("replicating to slave at %s", address)
                    if resp.synced:  # the answer to one request with batches
                        self._inflight -= 1
                        if self._unanswered:
                            self._unanswered.popleft()
                    for r in resp.synced:
                        s = self.b._segments.get((r.queue, r.seg))
                        if s is not None:
                            s.replica.peer_progress(r.synced_end)
                    self._cv.notify_all()
        except grpc.RpcError as exc:
            log.warning("replication stream to %s broke: %s", address, exc.code() if hasattr(exc, "code") else exc)
        finally:
            channel.close()
            self._broken(gen)

    def _broken(self, gen: int) -> None:
        with self._cv:
            was = self.connected
            self.connected = False
            self._gen += 1  # stops the request generator of this stream
            frozen = []
            for s in self.b._segments.values():
                if s.replica.writable and s.replica.next_offset > 0:
                    s.replica.freeze("the replication stream to the slave broke")
                    frozen.append(s)
            if was:
                self.b.stats.replication_breaks += 1
            self.b.fail_streams(SegmentNotWritable(self.b.address, "*", -1, "the slave is not connected"))
            self._cv.notify_all()
        if frozen:
            log.warning("froze %d segments after the slave stream broke", len(frozen))

    def _requests(self, gen: int) -> Iterator[pb.ReplicateRequest]:
        """The stream's requests. Batches go out while fewer than MAX_INFLIGHT requests
        with batches await the slave's answer; meanwhile new ones gather in ``_out`` and
        leave together, one sync on the slave for all of them (group commit). A moved LAC
        rides on the next batches, or goes alone once ``lac_push_ms`` passed since the last."""
        push_s = self.b.config.lac_push_ms / 1000
        pushed_at = 0.0
        yield pb.ReplicateRequest(hello=True)
        while True:
            with self._cv:
                while True:
                    if gen != self._gen or self._stopping:
                        return
                    lacs = {k: s.replica.lac for k, s in self._active.items()
                            if self._lac_sent.get(k) != s.replica.lac}
                    can_send = bool(self._out) and self._inflight < MAX_INFLIGHT
                    wait = 0.5
                    if lacs and not can_send:
                        # A moved LAC rides on the next batches; alone it waits out lac_push_ms,
                        # so a steady flow of small batches does not cost a message per batch.
                        wait = pushed_at + push_s - time.monotonic()
                    if can_send or wait <= 0:
                        break
                    self._cv.wait(wait)
                out: list[tuple[Segment, bytes]] = []
                since = self._out_since
                if can_send:
                    out, self._out, self._out_bytes = self._out, [], 0
                if lacs:
                    pushed_at = time.monotonic()
                self._lac_sent.update(lacs)
                reqs = list(_requests_for(out, lacs))
                for r in reqs:
                    if r.batches:
                        self._inflight += 1
                        self._unanswered.append((since, sum(map(len, r.batches))))
            yield from reqs


def _requests_for(out: list[tuple[Segment, bytes]], lacs: dict[tuple[str, int], int]) -> Iterator[pb.ReplicateRequest]:
    """Group batches by segment (keeping their order), split by ``chunks``, with each
    segment's LAC on its last request; LAC-only requests for the rest."""
    by_seg: dict[tuple[str, int], list[bytes]] = {}
    for s, b in out:
        by_seg.setdefault(s.key, []).append(b)
    for key, batches in by_seg.items():
        parts = list(chunks(batches))
        for i, chunk in enumerate(parts):
            yield pb.ReplicateRequest(queue=key[0], seg=key[1], batches=chunk,
                                      lac=lacs.get(key, -1) if i == len(parts) - 1 else -1)
    for key, lac in lacs.items():
        if key not in by_seg:
            yield pb.ReplicateRequest(queue=key[0], seg=key[1], lac=lac)


def serve_replicate(broker: Broker, requests: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
                    ) -> Iterator[pb.ReplicateResponse]:
    """Slave side: append and sync what the master sends, then answer with the synced end,
    all in this handler's thread. Exactly one answer per request that carries batches (the
    master counts them), none for a LAC-only request, an empty one for hello."""
    if broker.config.role.value != "slave":
        abort(context, SegmentNotWritable(broker.address, "*", -1, "replication goes to the slave, this is the master"))
    try:
        for req in requests:
            if req.hello:
                yield pb.ReplicateResponse()
                continue
            s = broker.accept_replica(req.queue, req.seg, list(req.batches), req.lac)
            if req.batches:
                with broker._cv:
                    end = s.replica.local_synced
                yield pb.ReplicateResponse(synced=[pb.ReplicaSegment(queue=req.queue, seg=req.seg, synced_end=end)])
    except OrdqError as exc:
        log.error("refused replicated data: %s", exc)
        abort(context, exc)
    except grpc.RpcError:
        return  # the master went away
