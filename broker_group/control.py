"""Control calls on one copy of a segment: Fence, Seal, SegmentInfo (Fence and Seal taken only
from brokers and coordinators: broker_group/auth.py; Reconcile is broker_group/repair.py's).

Guarantee (DESIGN §4-5): Fence and Seal are persisted before they are answered, and answered
only after every batch accepted before them is synced, so the end they report is durable.
"""

from __future__ import annotations

import concurrent.futures
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
# Meta files of one SealMany synced at once.
SEAL_SYNC_THREADS = 16


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
        s, end = self._seal_in_memory(queue, seg)
        self._persist_seal(s)
        return end

    def _seal_in_memory(self, queue: str, seg: int) -> tuple[Segment, pb.SegmentEnd]:
        s = self.segments.for_control(queue, seg)
        with self.shared.cv:
            s.replica.freeze("sealed")
            self.shared.settle(s)
            s.replica.seal()
            end = s.end()
            # Producers still waiting for acks in this segment learn it is over now.
            self.write.fail_streams(SegmentNotWritable(self.shared.address, queue, seg, "sealed"),
                                    only=lambda x: x is s and x.replica.lac < x.replica.next_offset)
        return s, end

    def _persist_seal(self, s: Segment) -> None:
        """Before the seal is answered: its meta file synced (DESIGN §4: persisted first)."""
        write_meta(s)
        park(s)
        self.on_sealed(s)

    def seal_many(self, request: pb.SealManyRequest) -> pb.SealManyResponse:
        """``seal`` of each segment named, in order; one that cannot be sealed (not held here,
        corrupt, a bad name) is answered with its error, the others go on (issue 43)."""
        if len(request.segments) > MAX_SEAL_MANY:
            raise ConfigError(f"SealMany: at most {MAX_SEAL_MANY} segments a call, not {len(request.segments)}")
        results: list[pb.SealManyResult] = []
        sealed: list[tuple[int, Segment]] = []
        for ref in request.segments:
            try:
                check_name("queue", ref.queue)
                s, end = self._seal_in_memory(ref.queue, ref.seg)
                sealed.append((len(results), s))
                results.append(pb.SealManyResult(segment=ref, end=end))
            except OrdqError as exc:
                results.append(pb.SealManyResult(segment=ref, error=f"{type(exc).__name__}: {exc}"))
        # Why threads: each meta file is synced before the answer (two fsyncs each); at once,
        # the file system commits them together, one after another they cost a sync each
        # (~100-200 ms each on a loaded disk: a dead group's 333 seals took 30-50 s).
        with concurrent.futures.ThreadPoolExecutor(min(SEAL_SYNC_THREADS, max(1, len(sealed))),
                                                   thread_name_prefix="ordq-seal-sync") as pool:
            done = list(pool.map(lambda item: self._persisted_or_error(item[1]), sealed))
        for (i, _s), error in zip(sealed, done, strict=True):
            if error is not None:
                results[i] = pb.SealManyResult(segment=results[i].segment, error=error)
        return pb.SealManyResponse(results=results)

    def _persisted_or_error(self, s: Segment) -> str | None:
        try:
            self._persist_seal(s)
        except OSError as exc:  # not answered as sealed: the caller seals it again later
            return f"{type(exc).__name__}: {exc}"
        return None

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
