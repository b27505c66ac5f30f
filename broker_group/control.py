"""Control calls on one copy of a segment: Fence, Seal, SegmentInfo (Fence and Seal taken only
from brokers and coordinators: broker_group/auth.py; Reconcile is broker_group/repair.py's).

Guarantee (DESIGN §4-5): Fence and Seal are persisted before they are answered, and answered
only after every batch accepted before them is synced, so the end they report is durable.
"""

from __future__ import annotations

from collections.abc import Callable

from ordq.broker_group.segments import SegmentStore, park, write_meta
from ordq.broker_group.shared import Segment, Shared
from ordq.broker_group.write_path import WritePath
from ordq.common.errors import ConfigError, OrdqError, SegmentNotFound
from ordq.coordinator.paths import check_name
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import SegmentNotWritable

# Segments one SealMany call may name: the coordinator sends 200 (coordinator/seal.py).
MAX_SEAL_MANY = 1000


class Control:
    def __init__(self, shared: Shared, segments: SegmentStore, write: WritePath,
                 on_sealed: Callable[[Segment], None] = lambda s: None) -> None:
        self.shared = shared
        self.segments = segments
        self.write = write
        self.on_sealed = on_sealed  # builds the sealed copy's key and time index (finder.py)

    def fence(self, queue: str, seg: int, epoch: int) -> pb.SegmentEnd:
        self.write.epochs.check(queue, epoch)
        s = self.segments.for_control(queue, seg)
        with self.shared.cv:
            s.replica.fence(epoch)
            self.shared.settle(s)
            end = s.end()
        write_meta(s)
        return end

    def seal(self, queue: str, seg: int) -> pb.SegmentEnd:
        s = self.segments.for_control(queue, seg)
        with self.shared.cv:
            s.replica.freeze("sealed")
            self.shared.settle(s)
            s.replica.seal()
            end = s.end()
            # Producers still waiting for acks in this segment learn it is over now.
            self.write.fail_streams(SegmentNotWritable(self.shared.address, queue, seg, "sealed"),
                                    only=lambda x: x is s and x.replica.lac < x.replica.next_offset)
        write_meta(s)
        park(s)
        self.on_sealed(s)
        return end

    def seal_many(self, request: pb.SealManyRequest) -> pb.SealManyResponse:
        """``seal`` of each segment named, in order; one that cannot be sealed (not held here,
        corrupt, a bad name) is answered with its error, the others go on (issue 43)."""
        if len(request.segments) > MAX_SEAL_MANY:
            raise ConfigError(f"SealMany: at most {MAX_SEAL_MANY} segments a call, not {len(request.segments)}")
        out = pb.SealManyResponse()
        for ref in request.segments:
            try:
                check_name("queue", ref.queue)
                out.results.append(pb.SealManyResult(segment=ref, end=self.seal(ref.queue, ref.seg)))
            except OrdqError as exc:
                out.results.append(pb.SealManyResult(segment=ref, error=f"{type(exc).__name__}: {exc}"))
        return out

    def segment_info(self, queue: str, seg: int) -> pb.SegmentEnd:
        with self.shared.cv:
            s = self.shared.segments.get((queue, seg))
            if s is None:
                raise SegmentNotFound(queue, seg)
            return s.end()

    def open_segments(self) -> pb.OpenSegmentsResponse:
        """Every segment this copy holds that is not sealed, with its ``SegmentInfo``: one
        answer for all queues (the coordinator's probe). In memory only; costs a pass over the
        segments held, none for a queue that wrote nothing here."""
        with self.shared.cv:
            return pb.OpenSegmentsResponse(segments=[
                pb.OpenSegment(queue=s.replica.queue, seg=s.replica.seg, end=s.end())
                for s in self.shared.segments.values() if not s.replica.sealed])
