"""Control calls on one copy of a segment: Fence, Seal, SegmentInfo (Fence and Seal taken only
from brokers and coordinators: broker_group/auth.py; Reconcile is broker_group/repair.py's).

Guarantee (DESIGN §4-5): Fence and Seal are persisted before they are answered, and answered
only after every batch accepted before them is synced, so the end they report is durable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ordq.broker_group.segments import SegmentStore, park, write_metas
from ordq.broker_group.shared import Segment, Shared
from ordq.broker_group.write_path import WritePath
from ordq.common.errors import ConfigError, OrdqError, SegmentNotFound
from ordq.coordinator.paths import check_name
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import SegmentNotWritable
from ordq.wire.transport import MAX_SEAL_MANY


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
        self.segments.write_meta(s)
        return end

    def seal(self, queue: str, seg: int) -> pb.SegmentEnd:
        s, end = self._seal_in_memory(queue, seg)
        self._persist_seal(s)
        return end

    def _seal_in_memory(self, queue: str, seg: int, segment: Segment | None = None) -> tuple[Segment, pb.SegmentEnd]:
        s = segment if segment is not None else self.segments.for_control(queue, seg)
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
        self.segments.write_meta(s)
        self._sealed(s)

    def _sealed(self, s: Segment) -> None:
        park(s)
        if s.recorded is None:  # no folder, nothing to index: it is empty
            self.on_sealed(s)

    def seal_many(self, request: pb.SealManyRequest) -> pb.SealManyResponse:
        """``seal`` of each segment named, in order; one that cannot be sealed (not held here,
        corrupt, a bad name) is answered with its error, the others go on (issue 43).

        What it costs: the segments this copy never held (an idle queue's, never written here)
        are read from ZooKeeper in one pipelined pass and sealed empty as records, no folder
        each: one append and one ``fdatasync`` of the data folder's book for all of them
        (``sealed_book.py``). The segments held here get their new meta files with one
        ``DurableBatch`` (a sync of each file and folder at once). Nothing is answered as sealed
        before both are durable: a seal acked survives a power cut."""
        if len(request.segments) > MAX_SEAL_MANY:
            raise ConfigError(f"SealMany: at most {MAX_SEAL_MANY} segments a call, not {len(request.segments)}")
        results: list[pb.SealManyResult] = []
        named: list[tuple[str, int] | None] = []
        for ref in request.segments:
            try:
                check_name("queue", ref.queue)
                named.append((ref.queue, ref.seg))
            except OrdqError as exc:
                named.append(None)
                results.append(pb.SealManyResult(segment=ref, error=f"{type(exc).__name__}: {exc}"))
                continue
            results.append(pb.SealManyResult(segment=ref))
        batch = self.segments.new_batch()
        try:
            found = self.segments.for_control_many([k for k in named if k is not None], batch)
            sealed: list[tuple[int, Segment]] = []
            for i, key in enumerate(named):
                if key is None:
                    continue
                got = found[key]
                try:
                    if isinstance(got, OrdqError):
                        raise got
                    s, end = self._seal_in_memory(*key, segment=got)
                except OrdqError as exc:
                    results[i] = pb.SealManyResult(segment=results[i].segment, error=f"{type(exc).__name__}: {exc}")
                    continue
                sealed.append((i, s))
                results[i] = pb.SealManyResult(segment=results[i].segment, end=end)
            try:
                write_metas([s for _i, s in sealed if s.recorded is None], batch)
                booked = self.segments.book_seals([s for _i, s in sealed])
            except OSError as exc:  # not answered as sealed: the caller seals them again later
                for i, _s in sealed:
                    results[i] = pb.SealManyResult(segment=results[i].segment, error=f"{type(exc).__name__}: {exc}")
                return pb.SealManyResponse(results=results)
        finally:
            batch.close()
        with self.shared.cv:
            self.shared.stats.seal_many_calls += 1
            self.shared.stats.seal_many_segments += len(sealed)
            self.shared.stats.seal_many_syncs += batch.syncs + booked
        for _i, s in sealed:
            self._sealed(s)
        return pb.SealManyResponse(results=results)

    def segment_info(self, queue: str, seg: int) -> pb.SegmentEnd:
        with self.shared.cv:
            s = self.shared.segments.get((queue, seg))
            if s is None:
                raise SegmentNotFound(queue, seg)
            return s.end()

    def open_segments(self, include: Iterable[pb.SegmentRef] = ()) -> pb.OpenSegmentsResponse:
        """Every segment this copy holds that is not sealed, and those of ``include`` it holds
        sealed, each with its ``SegmentInfo``: one answer for all queues (the coordinator's
        probe; a listing's extents). In memory only; costs a pass over the segments held, none
        for a queue that wrote nothing here."""
        with self.shared.cv:
            held = self.shared.segments
            out = [pb.OpenSegment(queue=s.replica.queue, seg=s.replica.seg, end=s.end())
                   for s in held.values() if not s.replica.sealed]
            for ref in include:
                s = held.get((ref.queue, ref.seg))
                if s is not None and s.replica.sealed:
                    out.append(pb.OpenSegment(queue=ref.queue, seg=ref.seg, end=s.end()))
            return pb.OpenSegmentsResponse(segments=out, included=True)
