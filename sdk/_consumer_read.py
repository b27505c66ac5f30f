"""The consumer's reading: the segment under its read position, from the master of the
segment's group or its slave, decoded into the messages to hand out.

Guarantee: what ``read_round`` returns continues the stream exactly (new seqs only, in order);
a missing seq raises ``GapDetected`` (``RetentionOvertook`` when retention dropped it), never a
skip; a corrupt batch is read again from the other replica, and raised when both are bad. At
the end of a ``sealing`` segment it asks the coordinator to seal it; at the end of a sealed one
it moves the read position to the next segment (``segment_done``: the consumer commits and pops).

Rules: owns the read position (``cursor``, the seq ``filter``) and what the metrics show of
reading; hands out nothing and commits nothing itself (``moved`` and ``segment_done`` are the
consumer's); checks the lease only to tell a deposed consumer from one overtaken by retention.
What it knows of the queue comes from the coordinator's Describe (``QueueView``), read again
when a replica or a segment's end says the state changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ordq.common.errors import (
    BrokerUnavailable,
    CorruptLog,
    GapDetected,
    OrdqError,
    PermissionDenied,
    RetentionOvertook,
)
from ordq.common.stages import stamp
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.state import Cursor, QueueState, Segment, SegStatus
from ordq.sdk._consumer_core import DeliveryFilter
from ordq.sdk._consumer_types import ConsumerConfig, ConsumerStats, Delivered, new_delivered
from ordq.sdk._queue_view import QueueView
from ordq.wire.batch import BatchHeader, Message, decode_batch
from ordq.wire.transport import BrokerTransport, FetchResult, Reader

log = logging.getLogger("ordq.consumer")


def _header_seqs(decoded: list[tuple[BatchHeader, list[Message]]]) -> list[int]:
    """Stage stamps' keys (ordq/common/stages.py): the batches' first seqs."""
    return [h.first_seq for h, _ in decoded]


class SegmentReader:
    """Reads the queue from ``start`` on, one read round at a time."""

    def __init__(self, config: ConsumerConfig, view: QueueView, transport: BrokerTransport,
                 coordinator: CoordinatorClient, stats: ConsumerStats, *, start: Cursor,
                 moved: Callable[[Cursor], None], segment_done: Callable[[int | None], None],
                 lease_confirmed: Callable[[], bool]) -> None:
        self.config = config
        self._view = view
        self._transport = transport
        self._reads: Reader | None = None  # one Read stream kept open between fetches
        self._coord = coordinator  # seals
        self._stats = stats
        self._on_moved = moved
        self._segment_done = segment_done
        self._lease_confirmed = lease_confirmed
        self.cursor = start  # where the next read starts (past dropped duplicates too)
        self.filter = DeliveryFilter(config.queue, last_seq=start.last_seq)
        # For the metrics (sdk/metrics.py): the last fetch's (seg, readable end), the timestamp
        # of the newest message read, since when no replica of the current segment answers.
        self.read_end = (-1, 0)
        self.read_ts_us = 0
        self.stalled_since: float | None = None
        # (seg, address) of the replica that last failed a read of that segment (corrupt, not
        # served, down): the other one is asked first until the cursor leaves the segment.
        self._avoid: tuple[int, str] | None = None
        self._served_by = ""  # address of the replica that answered the last fetch

    def close(self) -> None:
        if self._reads is not None:
            self._reads.close()

    @property
    def link_fallbacks(self) -> int:
        """Masters' lean links that could not be opened so far (their reads went over gRPC)."""
        return self._reads.link_fallbacks if self._reads is not None else 0

    def unread(self) -> int:
        """Messages stored past the read position (the metrics' lag, but for what is read and
        not handed out): readable in the current segment past it, and the messages of the
        sealed segments after it (a later segment still open or sealing counts 0 here)."""
        cur = self.cursor
        lag = 0
        seg, end = self.read_end
        if seg == cur.seg:
            lag += max(end - cur.offset, 0)
        st = self._view.cached()
        if st is not None:
            lag += sum(x.end or 0 for x in st.consume if x.seg > cur.seg and x.status is SegStatus.SEALED)
        return lag

    def rejoined(self, cursor: Cursor) -> None:
        """The lease was granted again: read on from the committed ``cursor``, and deliver
        every seq after its ``last_seq`` again (the filter reset there: what a successor
        committed past our last delivered seq is not a gap, what we delivered past the cursor
        is not a duplicate)."""
        self.cursor = cursor
        self.filter.last_seq = cursor.last_seq
        self._avoid = None

    def rewind(self, cursor: Cursor) -> None:
        """Read on from ``cursor`` (keyed delivery ended: from the first message not finished)."""
        if cursor != self.cursor:
            self.cursor = cursor
            self.filter.last_seq = cursor.last_seq

    def read_round(self, timeout_s: float | None) -> list[Delivered]:
        view = self._view
        st = view.state()
        cur = self.cursor
        segment = st.segment(cur.seg)
        wait_ms = self.config.fetch_wait_ms if timeout_s is None else int(timeout_s * 1000)
        if segment is None:
            head = st.consume[0].seg if st.consume else st.next_seg
            if cur.seg < head:
                # Dropped by retention before we read it: resume at the head. If it held seqs
                # we have not delivered, the seq filter sees the gap there (a resend may have
                # put some of them in the next segment too): never a silent skip.
                self._move(Cursor(seg=head, offset=0, last_seq=self.filter.last_seq))
                return []
            later = next((s.seg for s in st.consume if s.seg > cur.seg), None)
            if later is not None:
                # A segment sealed empty, dropped from the middle of the list (state.drop_empty):
                # nothing was in it; on to the next one the list holds (the seq filter checks).
                self._move(Cursor(seg=later, offset=0, last_seq=self.filter.last_seq))
                return []
            view.wait_change(wait_ms)  # the next segment does not exist yet
            return []
        if segment.status is SegStatus.SEALED and cur.offset >= (segment.end or 0):
            self._advance(st, segment)
            return []
        res = self._fetch(segment, cur.offset, max_wait_ms=wait_ms)
        if res is None:
            return []
        self.read_end = (segment.seg, res.readable_end)
        last_before = self.filter.last_seq
        try:
            try:
                delivered = self._deliver(segment, res.batches)
            except CorruptLog as exc:
                # A copy that rotted (or bytes damaged on the way): the same range from the
                # other replica. Both bad: raised (never skipped).
                bad = self._served_by
                log.warning("queue %s seg %d: broker %s sent a corrupt batch reading from offset %d (%s); "
                            "reading the same range from the other replica", self.config.queue, segment.seg, bad,
                            cur.offset, exc)
                self._avoid = (segment.seg, bad)
                res = self._fetch(segment, cur.offset, max_wait_ms=0, skip=bad)
                if res is None:
                    return []
                delivered = self._deliver(segment, res.batches)
        except GapDetected as gap:
            # A consumer frozen past its lease resumes behind a successor that read, committed
            # and popped on: the "gap" is the successor's progress. Its lease is gone (it rejoins:
            # LeaseGone), not overtaken by retention (whose advice, a reset to earliest, redelivers all).
            if not self._lease_confirmed():
                # Not sure yet: read this again later. The filter admitted the seqs before the
                # gap, which were never handed out: forget them, or the reread drops them.
                self.filter.last_seq = last_before
                return []
            self._stats.gaps += 1
            if gap.expected_seq <= st.trimmed_seq:  # the missing seqs were in popped segments
                raise RetentionOvertook(self.config.queue, self.config.subscription, gap.expected_seq,
                                        gap.got_seq) from gap
            raise
        if delivered:
            self.read_ts_us = delivered[-1].timestamp_us
        if res.batches:
            view.reading()
        else:
            if segment.status is SegStatus.SEALING:
                self._seal(segment)  # at its readable end: decide the end ourselves
            elif res.sealed:
                view.mark_changed()  # the replica knows more than our cached state
            elif segment.status is SegStatus.OPEN:
                view.idle()  # at the end of an open segment: has the state moved on? (no watch)
        return delivered

    def _deliver(self, segment: Segment, batches: list[bytes]) -> list[Delivered]:
        """Decode what a fetch returned into the messages to hand out (new seqs only, in order)
        and move the read position past them. Audit rows are written when handed out."""
        cur = self.cursor
        out: list[Delivered] = []
        offset = cur.offset
        limit = segment.end if segment.status is SegStatus.SEALED else None
        seg = segment.seg
        # Every batch decoded (CRC checked) before anything moves: a corrupt one raises with
        # the filter and the cursor untouched, so the range can be read again elsewhere.
        decoded = [decode_batch(raw) for raw in batches]
        stamp("C.read", _header_seqs, decoded)
        for header, messages in decoded:
            first_off, first_seq, n = header.first_offset, header.first_seq, header.count
            if (first_off >= offset and (limit is None or first_off + n <= limit)
                    and self.filter.admit_run(first_seq, n)):
                # Fast path: the whole batch is new and continues the stream exactly.
                out.extend(new_delivered(Delivered, (first_seq + i, seg, first_off + i, m[0], m[1], m[2], m[3]))
                           for i, m in enumerate(messages))
                offset = first_off + n
                continue
            for i, m in enumerate(messages):
                off = first_off + i
                if off < offset or (limit is not None and off >= limit):
                    continue
                offset = off + 1
                seq = first_seq + i
                if not self.filter.admit(seq):
                    continue
                out.append(new_delivered(Delivered, (seq, seg, off, m.payload, m.key, m.headers, m.timestamp_us)))
        self.cursor = Cursor(seg=segment.seg, offset=offset, last_seq=self.filter.last_seq)
        return out

    def _advance(self, st: QueueState, segment: Segment) -> None:
        """Done with a sealed segment: move the read position on, to the next segment the list
        holds (not ``seg + 1``: segments sealed empty may have been dropped between, and the
        pop of this one would leave a cursor committed there before the new head); the consumer
        commits it and tries to pop."""
        self._move(Cursor(seg=st.after(segment.seg), offset=0, last_seq=self.filter.last_seq))
        self._stats.segments_done += 1
        self._view.mark_changed()
        self._segment_done(segment.last_seq)

    def _move(self, cursor: Cursor) -> None:
        """The read position moved on without delivering anything (next segment, or past a
        segment dropped by retention)."""
        self.cursor = cursor
        self._on_moved(cursor)

    def _seal(self, segment: Segment) -> None:
        """At the end of a sealing segment: ask the coordinator to seal it (DESIGN §5)."""
        try:
            self._view.learnt(self._coord.seal(self.config.queue, segment.seg))
            self._stats.seals_run += 1
        except BrokerUnavailable:
            # Both processes of the group are down: wait at this segment until one returns.
            self._view.wait_change(self.config.fetch_wait_ms)

    def _fetch(self, segment: Segment, offset: int, *, max_wait_ms: int,
               max_bytes: int | None = None, skip: str | None = None) -> FetchResult | None:
        """Read from the master, or the slave when the master is down (or refused the read:
        a corrupt copy, not served there); None when neither answers (the caller waits at
        this segment: consumers never skip it). ``skip``: an address not to ask this time.
        A replica that failed a read of this segment is asked last until the cursor moves on."""
        view = self._view
        if self._reads is None:
            self._reads = self._transport.reader()
        reads = self._reads
        members = view.replicas(segment.gid)
        errors: list[tuple[str, str]] = []
        denied: list[PermissionDenied] = []
        avoid = self._avoid[1] if self._avoid is not None and self._avoid[0] == segment.seg else None
        master = members.get("master")
        roles = ("slave", "master") if master is not None and master.address == avoid else ("master", "slave")
        for role in roles:
            info = members.get(role)
            if info is None:
                view.mark_stale(segment.gid)  # look again next time: it may be back
                continue
            if info.address == skip:
                continue
            try:
                res = reads.fetch(info.address, self.config.queue, segment.seg, offset,
                                  max_bytes=max_bytes or self.config.fetch_max_bytes, max_wait_ms=max_wait_ms,
                                  known_end=segment.end if segment.status is SegStatus.SEALED else None,
                                  link=info.produce)  # a master's lean link carries its Read streams too
                self.stalled_since = None
                self._served_by = info.address
                if errors and self._avoid != (segment.seg, errors[0][0]):
                    self._avoid = (segment.seg, errors[0][0])
                    log.warning("queue %s seg %d: read from offset %d refused by %s; read from the %s at %s "
                                "instead", self.config.queue, segment.seg, offset, "; ".join(e for _, e in errors),
                                role, info.address)
                return res
            except OrdqError as exc:
                errors.append((info.address, f"{role} {info.address}: {exc}"))
                view.mark_stale(segment.gid)
                if isinstance(exc, PermissionDenied):
                    denied.append(exc)
        if denied and len(denied) == len(errors):
            # Every replica asked refused this consumer's token (revoked, or without the
            # consume role): final, as for the producer; waiting would only spin (issue 24).
            # One replica refusing while the other failed otherwise is not final: a broker
            # whose token reload failed refuses every token until it loads again.
            raise denied[0]
        if self.stalled_since is None:
            self.stalled_since = time.monotonic()
        log.info("queue %s seg %d: no replica readable (%s)", self.config.queue, segment.seg,
                 "; ".join(e for _, e in errors) or "none live")
        view.wait_change(max(max_wait_ms, 50))
        return None
