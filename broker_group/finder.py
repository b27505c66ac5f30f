"""The broker's key and time lookups (the Find RPC) and the index files behind them.

Guarantees:
- Every sealed segment copy gets an index file (``index.oqx``, broker_group/seg_index.py)
  built from its own log when it seals (Seal, or a Reconcile that brings it to ZooKeeper's
  end), in a thread of its own and ``BUILD_DELAY_S`` later: neither the seal nor the next
  segment's first write is held up by it. Master and slave each build
  theirs from their own copy (the same bytes up to the sealed end); nothing travels.
- An index is used only for the log it describes: a missing file, a bad CRC, or a file whose
  recorded end, bytes or first seq differ from the log's (a copy truncated or completed by a
  reconcile after the file was written) is rebuilt from the log before it answers, and the
  file rewritten. Every answer is read back from the log (key compared, timestamp read), so a
  damaged index costs a rebuild, never a wrong answer.
- The open segment answers from memory: an index kept for it is extended from the log to the
  readable end (the LAC) at each lookup; nothing is added to the write path.
- Never past what a reader may read: the LAC of an open segment, the end of a sealed one, and
  the end ZooKeeper decided when the caller gives it.

Index files are derived data: written by rename, not fsynced (a crash may leave a torn or
empty file, which the CRC and length check reject and the next lookup rebuilds).
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import threading
import time
from collections import OrderedDict
from pathlib import Path

import attrs

from ordq.broker_group.seg_index import (
    INDEX_FILE,
    IndexBuilder,
    IndexFormatError,
    SegmentIndex,
    decode_index,
    encode_index,
    first_at_or_after,
    message_at,
)
from ordq.broker_group.segments import park
from ordq.broker_group.shared import Segment, Shared
from ordq.common.errors import BrokerUnavailable, ConfigError
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import parse_header

log = logging.getLogger("ordq.broker.index")

# A sealed copy's index is built this long after its seal, not at once: a seal comes with the
# next segment's creation on both replicas and the producers' first writes there, and a 256 MiB
# copy's build (~0.4 s holding the GIL beside the loop) doubled that first write when it ran at
# once (docs/BENCHMARKS.md, stop 94). A lookup meanwhile builds it itself.
BUILD_DELAY_S = 1.0

READ_BYTES = 4 << 20  # one read of the log while building or scanning a block
# Sealed segments' indexes kept in memory, least recently used out first: 8 bytes per keyed
# message, so a queue of 10^7 (80 MB) fits; past it each lookup reads and CRC-checks the files.
CACHE_BYTES = 256 << 20
MAX_LIMIT = 10_000


@attrs.define
class IndexStats:
    built: int = 0  # index files written at seal (or reconcile)
    rebuilt: int = 0  # missing, corrupt or stale files rebuilt at a lookup
    loaded: int = 0  # files read and found good
    lookups: int = 0  # Find calls
    build_seconds: float = 0.0  # spent building and writing files


@attrs.define(eq=False)
class _Open:
    """The in-memory index of one open segment copy."""

    segment: Segment
    builder: IndexBuilder
    lock: threading.Lock = attrs.field(factory=threading.Lock)


class Finder:
    def __init__(self, shared: Shared, *, cache_bytes: int = CACHE_BYTES, build_delay_s: float = BUILD_DELAY_S) -> None:
        self.shared = shared
        self.build_delay_s = build_delay_s
        self.stats = IndexStats()
        self._lock = threading.Lock()
        # Sealed copies' indexes, with the identity of the file each was read from or written
        # to: a file replaced, damaged or deleted since is looked at again (one stat a lookup).
        self._sealed: OrderedDict[tuple[str, int], tuple[Segment, SegmentIndex, tuple[int, ...]]] = OrderedDict()
        self._cached_bytes = 0
        self._cache_bytes = cache_bytes
        self._open: dict[tuple[str, int], _Open] = {}
        self._work: queue_mod.Queue[tuple[float, Segment] | None] = queue_mod.Queue()  # (when due, the copy)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- building at seal -------------------------------------------------------------------

    def sealed(self, s: Segment) -> None:
        """A copy was sealed (or reconciled to its sealed end): build its index file
        ``build_delay_s`` from now."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ordq-index", daemon=True)
                self._thread.start()
        self._work.put((time.monotonic() + self.build_delay_s, s))

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None or self.shared.stopping:
                return
            due, s = item
            if self._stopped.wait(max(0.0, due - time.monotonic())):
                return
            try:
                self.index_of(s, at_seal=True)
            except Exception as exc:  # noqa: BLE001 - a lookup will rebuild it; the broker goes on
                log.warning("index of %s/%d not built at seal: %r", *s.key, exc)
            park(s)  # no file descriptor kept for a sealed segment nobody reads (issue 29)

    # -- one segment's index ----------------------------------------------------------------

    def index_of(self, s: Segment, *, at_seal: bool = False) -> tuple[SegmentIndex, str]:
        """The index of ``s`` as its log stands, and where it came from ("file", "rebuilt",
        "built", "memory")."""
        if not s.replica.sealed:
            return self._open_index(s), "memory"
        path = s.directory / INDEX_FILE
        with self._lock:
            hit = self._sealed.get(s.key)
        # Kept for this copy, its file as written or read here, and the log it describes unchanged:
        # used as it is, at a seal too. A seal is told twice, by the coordinator's Seal and then its
        # Reconcile to the same end (stop 94: each broker built a 256 MiB copy's index twice, ~0.4
        # s of the GIL each, beside its loop); a Reconcile that changed the log rebuilds it.
        if hit is not None and hit[0] is s and hit[2] and hit[2] == _identity(path) and self._matches(s, hit[1]):
            with self._lock:
                if s.key in self._sealed:
                    self._sealed.move_to_end(s.key)
            return hit[1], "file"
        ix: SegmentIndex | None = None
        why = "missing"
        if not at_seal:
            try:
                ix = decode_index(path.read_bytes())
                why = "stale" if not self._matches(s, ix) else ""
            except FileNotFoundError:
                pass
            except (OSError, IndexFormatError) as exc:
                why = f"unreadable ({exc})"
            if why:
                ix = None
        source = "file"
        if ix is None:
            started = time.monotonic()
            ix = self._build(s)
            _write(path, ix)
            with self._lock:
                self.stats.build_seconds += time.monotonic() - started
                if at_seal:
                    self.stats.built += 1
                else:
                    self.stats.rebuilt += 1
            if not at_seal:
                log.warning("index of %s/%d %s: rebuilt from the log (%d messages)", *s.key, why, ix.end)
            source = "built" if at_seal else "rebuilt"
        else:
            with self._lock:
                self.stats.loaded += 1
        self._keep(s, ix, _identity(path))
        with self._lock:
            self._open.pop(s.key, None)
        return ix, source

    def _matches(self, s: Segment, ix: SegmentIndex) -> bool:
        lg = s.log
        return lg is not None and ix.end == lg.synced_end and ix.log_bytes == lg.synced_bytes and \
            ix.first_seq == (lg.first_seq if lg.first_seq is not None and lg.synced_end else -1)

    def _keep(self, s: Segment, ix: SegmentIndex, identity: tuple[int, ...]) -> None:
        with self._lock:
            old = self._sealed.pop(s.key, None)
            if old is not None:
                self._cached_bytes -= old[1].nbytes()
            self._sealed[s.key] = (s, ix, identity)
            self._cached_bytes += ix.nbytes()
            while self._cached_bytes > self._cache_bytes and len(self._sealed) > 1:
                _, (_, gone, _) = self._sealed.popitem(last=False)
                self._cached_bytes -= gone.nbytes()

    def _build(self, s: Segment) -> SegmentIndex:
        """From the whole synced log (sealed: it no longer grows). The open segment's builder
        is reused when it still describes this log."""
        with self._lock:
            kept = self._open.get(s.key)
        builder = IndexBuilder()
        if kept is not None and kept.segment is s:
            with kept.lock:
                if self._extendable(s, kept.builder):
                    builder = kept.builder
                    self._extend(s, builder, upto=_synced_end(s))
                    return builder.snapshot()
        self._extend(s, builder, upto=_synced_end(s))
        return builder.snapshot()

    def _open_index(self, s: Segment) -> SegmentIndex:
        with self._lock:
            kept = self._open.get(s.key)
            if kept is None or kept.segment is not s:
                kept = self._open[s.key] = _Open(s, IndexBuilder())
        with self.shared.cv:
            upto = s.replica.readable_end()
        with kept.lock:
            if not self._extendable(s, kept.builder):
                kept.builder = IndexBuilder()
            self._extend(s, kept.builder, upto=upto)
            return kept.builder.snapshot()

    def _extendable(self, s: Segment, builder: IndexBuilder) -> bool:
        """Whether ``builder`` still describes the start of ``s``'s log (a truncation past
        what it indexed, or a log replaced after corruption, would make it lie)."""
        lg = s.log
        return lg is not None and builder.end <= lg.synced_end and lg.bytes_before(builder.end) == builder.log_bytes

    def _extend(self, s: Segment, builder: IndexBuilder, *, upto: int) -> None:
        while builder.end < upto:
            batches = _read(s, builder.end, upto)
            if not batches:
                break
            for raw in batches:
                builder.add(raw)

    # -- the Find RPC -----------------------------------------------------------------------

    def find(self, req: pb.FindRequest) -> pb.FindResponse:
        """Matches in segment then offset order, at most ``limit`` (by time: the first one)."""
        by_key = req.HasField("key")
        limit = 1 if not by_key else (req.limit or 1)
        if limit > MAX_LIMIT:
            raise ConfigError(f"Find: limit {limit} is over {MAX_LIMIT}")
        # Each segment once: a request naming one segment thousands of times (the control
        # calls' size limit bounds how many) would cost a lookup per mention (tests/test_protect.py).
        seen: set[int] = set()
        for ref in req.segments:
            if ref.seg in seen:
                raise ConfigError(f"Find: the request names segment {ref.seg} twice")
            seen.add(ref.seg)
        with self._lock:
            self.stats.lookups += 1
        out = pb.FindResponse()
        for ref in req.segments:
            with self.shared.cv:
                s = self.shared.segments.get((req.queue, ref.seg))
            # nothing was ever written to this copy (a reader compares known ends)
            if s is None or s.recorded is not None:
                out.segments.append(pb.FindSegmentResult(seg=ref.seg, readable_end=0, index="none"))
                continue
            if s.log is None:
                raise BrokerUnavailable(self.shared.address, f"segment {req.queue}/{ref.seg} is corrupt here")
            known_end = ref.known_end if ref.known_end >= 0 else None
            ix, source = self.index_of(s)
            with self.shared.cv:
                upto = min(s.replica.readable_end(known_end), ix.end)
            out.segments.append(pb.FindSegmentResult(seg=ref.seg, readable_end=upto, index=source))
            want = limit - len(out.matches)
            if by_key:
                found = _confirm_key(s, ix.key_offsets(req.key, upto=upto), req.key, req.time_us, upto, want)
            else:
                block = ix.time_block(req.time_us)
                found = [] if block is None or block[0] >= upto else \
                    _first_at_or_after(s, block[0], min(block[1], upto), req.time_us)
            out.matches.extend(pb.FindMatch(seg=ref.seg, offset=o, seq=q, timestamp_us=t) for o, q, t in found)
            park(s)
            if len(out.matches) >= limit:
                break
        return out

    def statistics(self) -> dict[str, object]:
        with self._lock:
            return {**attrs.asdict(self.stats), "cached": len(self._sealed), "cached_bytes": self._cached_bytes,
                    "open": len(self._open)}


def _synced_end(s: Segment) -> int:
    assert s.log is not None
    return s.log.synced_end


def _read(s: Segment, offset: int, upto: int) -> list[bytes]:
    with s.io_lock:
        if s.log is None:
            raise BrokerUnavailable("", f"segment {s.key[0]}/{s.key[1]} was set aside meanwhile")
        return s.log.read(offset, max_bytes=READ_BYTES, upto=upto)


def _confirm_key(s: Segment, offsets: list[int], key: bytes, from_us: int, upto: int,
                 limit: int) -> list[tuple[int, int, int]]:
    """(offset, seq, timestamp) of the candidates that do hold ``key``, read from the log."""
    found: list[tuple[int, int, int]] = []
    i = 0
    while i < len(offsets) and len(found) < limit:
        # one read per batch: it holds every candidate up to its end
        [raw] = _read_one(s, offsets[i], upto)
        end = parse_header(raw, verify_crc=False).end_offset
        while i < len(offsets) and offsets[i] < end:
            seq, ts, got = message_at(raw, offsets[i])
            if got == key and ts >= from_us and len(found) < limit:
                found.append((offsets[i], seq, ts))
            i += 1
    return found


def _read_one(s: Segment, offset: int, upto: int) -> list[bytes]:
    with s.io_lock:
        if s.log is None:
            raise BrokerUnavailable("", f"segment {s.key[0]}/{s.key[1]} was set aside meanwhile")
        got = s.log.read(offset, max_bytes=1, upto=upto)
    if not got:
        raise BrokerUnavailable("", f"segment {s.key[0]}/{s.key[1]}: offset {offset} not readable")
    return got[:1]


def _first_at_or_after(s: Segment, start: int, stop: int, t_us: int) -> list[tuple[int, int, int]]:
    offset = start
    while offset < stop:
        batches = _read(s, offset, stop)
        if not batches:
            break
        for raw in batches:
            hit = first_at_or_after(raw, t_us)
            if hit is not None:
                return [hit]
            offset = parse_header(raw, verify_crc=False).end_offset
    return []


def _identity(path: Path) -> tuple[int, ...]:
    """Which file ``path`` is now (inode, size, mtime); () when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _write(path: Path, ix: SegmentIndex) -> None:
    # a name of this thread's own: a lookup and the seal's build may write the same index at once
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = encode_index(ix)
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
    os.replace(tmp, path)
