"""ordq as a Spark Structured Streaming source (PySpark 4's Python data source API).

    from ordq.spark_source import register
    register(spark)
    df = (spark.readStream.format("ordq").option("bootstrap", "127.0.0.1:7600")
          .option("queue", "orders").load())

Guarantee: with a checkpoint, every readable seq of the queue reaches the query once and in
seq order within each micro-batch's partitions (one partition per segment range, partitions
in segment order); a restarted query resumes at the checkpointed offset, so across restarts
no seq is read twice and none is skipped. A missing seq raises ``GapDetected`` (never skipped).

How it reads: directly from the replicas by position (``ordq.sdk.replicas.ReplicaReader``: the
segment's master, or its slave when the master does not answer), like ``ordq peek``. Spark
owns the position: the offset ``{"seg", "offset", "seq"}`` is a ``Cursor`` (read position and
last seq read) kept in Spark's checkpoint, so no subscription, cursor or consumer election is
involved, and nothing here writes to ZooKeeper or the brokers. Like every client it holds no
ZooKeeper session (issue 37): the queue's state and its groups' live processes come from the
coordinator's Describe (``ordq.sdk.replicas.DescribedQueues``), with the cluster's registered
client credentials (or ``bootstrap`` and the credentials registered for it).

On a cluster (executors on other hosts) the credentials travel with the job, never installed
on a worker: ``ship_credentials(spark, ...)`` adds the CA, the client certificate and key and
a file holding the token to the job (``SparkContext.addFile``, what ``spark.files`` and
``--files`` do) and returns the options naming them (``credentialsFrom=job``, ``caFile`` ...);
the driver's planner and every task then read their own copies (``SparkFiles.get``) and look
nothing up on their host.

Rules:
- A micro-batch ends at what is readable: the end of a sealed segment, the LAC of an open one.
  A sealing segment (its master failed; its end is not decided yet) is read up to its LAC and
  never passed: the query waits there until someone seals it (the producer does on failover,
  a consumer or the coordinator otherwise).
- Duplicates by seq (a resend after failover lands in the next segment) are dropped exactly as
  the SDK consumer drops them (``ordq.sdk._consumer_core.DeliveryFilter``: seq <= last read).
- Segments are popped only by subscriptions (``docs/SPARK.md``, "Retention"): a query behind a
  popped segment fails with ``GapDetected`` rather than skip.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ordq.common.errors import BrokerUnavailable, ConfigError, NotFound
from ordq.common.security import Credentials
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.state import Cursor, QueueState, Segment, SegStatus
from ordq.sdk._cluster import check_cluster, open_coordinator, resolve
from ordq.sdk._consumer_core import DeliveryFilter
from ordq.sdk.positions import parse_reset_target, resolve_target
from ordq.sdk.replicas import DescribedQueues, ReplicaReader
from ordq.spark_job import FILE_OPTIONS, failure_reason, job_file, ship_credentials
from ordq.wire.batch import Message, decode_messages, parse_header

__all__ = ["OrdqDataSource", "SourceOptions", "failure_reason", "register", "ship_credentials"]

NAME = "ordq"
SCHEMA = ("seq long, seg long, offset long, key binary, headers array<struct<key: string, value: binary>>, "
          "timestamp timestamp, payload binary")
FETCH_MAX_BYTES = 4 << 20
CHUNK_MESSAGES = 50_000  # per Spark task (a range of one segment)
_OPTIONS = ("bootstrap", "zk", "root", "queue", "start", "rpctimeouts", "replicawaits", "maxrowsperbatch", "untilseq",
            "credentialsfrom", "cafile", "certfile", "keyfile", "tokenfile")
# credentialsFrom: "registered" (the credentials file of the host the planner or task runs on:
# ``ordq up``'s registration, $ORDQ_TOKEN) or "job" (only the files shipped with the job).
CREDENTIALS_FROM = ("registered", "job")


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("ordq")`` available in this session."""
    spark.dataSource.register(OrdqDataSource)


@attrs.frozen(kw_only=True)
class SourceOptions:
    """The source's options (names are case-insensitive in Spark)."""

    queue: str
    bootstrap: str | None = None  # the coordinators' addresses; or a cluster `ordq up` registered:
    zk: str | None = None  # its name (ZooKeeper hosts, and root): looked up, never connected to
    root: str = "/ordq"
    start: str = "earliest"  # earliest | latest | seq N | time T: where a new query starts
    rpc_timeout_s: float = 1.0
    # How long read() waits for a replica of a planned segment to answer before the task fails.
    replica_wait_s: float = 30.0
    # Admission control: at most this many stored messages per micro-batch (None: all readable).
    max_rows_per_batch: int | None = None
    # No micro-batch reads past this seq (``ordq verify --follow --until-seq``): the query then
    # stops there, where a first batch of a big queue read its whole row cap first (issue 42).
    until_seq: int | None = None
    # Where the credentials come from (CREDENTIALS_FROM); with "job", the names of the files
    # shipped with the job (SparkFiles): the cluster CA, the client certificate and its key, a
    # file holding the token. None of them: plaintext, no token.
    credentials_from: str = "registered"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token_file: str | None = None

    def credentials(self) -> Credentials | None:
        """The credentials shipped with the job (``credentials_from == "job"``), read from this
        process's copies of the files (``SparkFiles.get``); None: look them up as registered.
        ConfigError naming a file that did not come with the job."""
        if self.credentials_from != "job":
            return None
        ca, cert, key, token = (job_file(getattr(self, f)) for f, _o in FILE_OPTIONS)
        text = None
        if token is not None:
            text = Path(token).read_text(encoding="utf-8").strip() or None
        return Credentials(ca_file=ca, cert_file=cert, key_file=key, token=text)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(_OPTIONS) - {"path"})
        if unknown:
            raise ConfigError(f"unknown ordq source option(s): {', '.join(unknown)} (known: bootstrap, zk, root, "
                              "queue, start, rpcTimeoutS, replicaWaitS, maxRowsPerBatch, untilSeq, "
                              "credentialsFrom, caFile, certFile, keyFile, tokenFile)")
        source = opts.get("credentialsfrom", "registered")
        if source not in CREDENTIALS_FROM:
            raise ConfigError(f"credentialsFrom {source!r}: one of {', '.join(CREDENTIALS_FROM)}")
        files = {field: opts.get(option) or None for field, option in FILE_OPTIONS}
        if source == "job" and not opts.get("bootstrap"):
            raise ConfigError("credentialsFrom 'job' needs .option('bootstrap', 'host:port,...'): a cluster named "
                              "by zk is looked up in the host's credentials file (ship_credentials gives both)")
        if source != "job" and any(files.values()):
            raise ConfigError("caFile, certFile, keyFile and tokenFile name files shipped with the job: give "
                              ".option('credentialsFrom', 'job') with them (ship_credentials gives all of these)")
        if not opts.get("queue"):
            raise ConfigError("the ordq source needs .option('queue', ...)")
        if not opts.get("bootstrap") and not opts.get("zk"):
            raise ConfigError("the ordq source needs .option('bootstrap', 'host:port,...') (the coordinators), "
                              "or .option('zk', ...) naming a cluster `ordq up` registered")
        check_cluster(opts.get("bootstrap") or None, opts.get("zk") or None, opts.get("root", "/ordq"))
        parse_reset_target(opts.get("start", "earliest").split())  # ConfigError when bad
        try:
            return cls(bootstrap=opts.get("bootstrap") or None, zk=opts.get("zk") or None, queue=opts["queue"],
                       root=opts.get("root", "/ordq"),
                       start=opts.get("start", "earliest"),
                       rpc_timeout_s=float(opts.get("rpctimeouts", 1.0)),
                       replica_wait_s=float(opts.get("replicawaits", 30.0)),
                       max_rows_per_batch=_positive_int(opts.get("maxrowsperbatch")),
                       until_seq=int(opts["untilseq"]) if opts.get("untilseq") is not None else None,
                       credentials_from=source, **files)
        except ValueError as exc:
            raise ConfigError(f"ordq source: {exc}") from exc


def _positive_int(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text)
    if value < 1:
        raise ValueError(f"maxRowsPerBatch must be >= 1, not {value}")
    return value


def to_offset(cursor: Cursor) -> dict[str, int]:
    return {"seg": cursor.seg, "offset": cursor.offset, "seq": cursor.last_seq}


def from_offset(offset: Mapping[str, Any]) -> Cursor:
    return Cursor(seg=int(offset["seg"]), offset=int(offset["offset"]), last_seq=int(offset["seq"]))


# -- planning (driver side) ----------------------------------------------------------------------


def readable_end(reader: ReplicaReader, st: QueueState, start: Cursor) -> Cursor:
    """How far a query at ``start`` may read now: through every sealed segment, then to the
    LAC of the first segment that is not sealed (open or sealing), never past it. Stays at
    the start of a segment no replica answers for."""
    pos, last = start, start.last_seq
    for segment in st.consume:
        if segment.seg < start.seg:
            continue
        offset = start.offset if segment.seg == start.seg else 0
        if segment.status is SegStatus.SEALED:
            if segment.last_seq is not None:
                last = max(last, segment.last_seq)
            pos = Cursor(seg=segment.seg + 1, offset=0, last_seq=last)
            continue
        extent = reader.extent(st.queue, segment)
        if extent.end is not None:
            if extent.last_seq is not None:
                last = max(last, extent.last_seq)
            pos = Cursor(seg=segment.seg, offset=max(offset, extent.end), last_seq=last)
        break
    return pos


def _spans(st: QueueState, start: Cursor, end: Cursor, first_seqs: Mapping[int, int] | None
           ) -> Iterator[tuple[Segment, int, int | None, int | None]]:
    """Each segment from ``start`` to ``end`` with the offsets read in it: (segment, first,
    stop — None where its end is not known yet —, its first seq if known: sealed, or given
    in ``first_seqs``)."""
    for segment in st.consume:
        if start.seg <= segment.seg <= end.seg:
            first = start.offset if segment.seg == start.seg else 0
            stop = end.offset if segment.seg == end.seg else segment.end
            first_seq = segment.first_seq if segment.first_seq is not None else (first_seqs or {}).get(segment.seg)
            yield segment, first, stop, first_seq


def capped_end(st: QueueState, start: Cursor, end: Cursor, max_rows: int,
               first_seqs: Mapping[int, int] | None = None) -> Cursor:
    """``end``, or the position ``max_rows`` stored messages after ``start`` if that comes first
    (a micro-batch then reads at most ``max_rows`` rows: resends dropped make it fewer). The
    cut's last seq is ``first_seq + offset - 1`` within its segment (seqs are consecutive in a
    segment), or the one before if higher; a segment whose first seq is not known cannot be
    cut inside and is taken whole (or the batch ends before it, if it holds anything)."""
    left, after, taken = max_rows, start.last_seq, False
    for segment, first, stop, first_seq in _spans(st, start, end, first_seqs):
        if stop is None:
            return end  # plan() refuses this; not the cap's business
        if stop - first > left:
            if first_seq is not None:
                cut = first + left
                return Cursor(seg=segment.seg, offset=cut, last_seq=max(after, first_seq + cut - 1))
            if taken:
                return Cursor(seg=segment.seg, offset=first, last_seq=after)
        left -= min(left, stop - first)
        taken = taken or stop > first
        if segment.last_seq is not None:
            after = max(after, segment.last_seq)
    return end


def until_end(st: QueueState, start: Cursor, end: Cursor, until_seq: int,
              first_seqs: Mapping[int, int] | None = None) -> Cursor:
    """``end``, or an earlier position holding no seq past ``until_seq``: ``start`` once it is
    there. A batch then stops at ``until_seq`` (a stored message moves the seq by one at most,
    so ``until_seq - start.last_seq`` rows do not pass it; resends make it fall short, and the
    next batch goes on)."""
    if end.last_seq <= until_seq:
        return end
    left = until_seq - start.last_seq
    return start if left <= 0 else capped_end(st, start, end, left, first_seqs)


def unsealed_first_seqs(reader: ReplicaReader, st: QueueState, first: Cursor, last: Cursor) -> dict[int, int]:
    """The first seq of each unsealed segment between two positions (a replica knows it)."""
    return {s.seg: e.first_seq for s in st.consume
            if first.seg <= s.seg <= last.seg and s.status is not SegStatus.SEALED
            and (e := reader.extent(st.queue, s)).first_seq is not None}


@attrs.frozen
class SegmentRange(InputPartition):  # type: ignore[misc]
    """Messages ``[first_offset, end_offset)`` of one segment; ``after_seq``: the last seq read
    before them (what the duplicate filter starts from)."""

    queue: str
    segment: Segment
    first_offset: int
    end_offset: int
    after_seq: int


def plan(st: QueueState, start: Cursor, end: Cursor, *, first_seqs: Mapping[int, int] | None = None,
         chunk_messages: int = CHUNK_MESSAGES) -> list[SegmentRange]:
    """The segment ranges between two offsets, in segment order. A segment whose first seq is
    known (sealed, or given in ``first_seqs``) is cut into ranges of ``chunk_messages`` so that
    Spark reads them in parallel: within a segment seqs are consecutive, so the last seq before
    offset ``o`` is ``first_seq + o - 1`` (or an earlier segment's, if higher: a resend).
    NotFound when a segment the range covers is not sealed yet lies before ``end``."""
    ranges: list[SegmentRange] = []
    after = start.last_seq
    for segment, first, stop, first_seq in _spans(st, start, end, first_seqs):
        if stop is None:
            raise NotFound(f"queue {st.queue!r}: segment {segment.seg} is not sealed but lies before offset {end}")
        step = chunk_messages if first_seq is not None else max(stop - first, 1)
        for lo in range(first, stop, step):
            before = after if lo == first or first_seq is None else max(after, first_seq + lo - 1)
            ranges.append(SegmentRange(st.queue, segment, lo, min(lo + step, stop), before))
        if segment.last_seq is not None:
            after = max(after, segment.last_seq)
    return ranges


# -- reading (executor side) -------------------------------------------------------------------------


@attrs.define
class Rows:
    """Messages of one segment read by one fetch, as columns (``to_arrow`` takes them as
    they are: no tuple per row to build and take apart again)."""

    seqs: list[int] = attrs.field(factory=list)
    offsets: list[int] = attrs.field(factory=list)
    messages: list[Message] = attrs.field(factory=list)

    def add(self, seq: int, offset: int, message: Message) -> None:
        self.seqs.append(seq)
        self.offsets.append(offset)
        self.messages.append(message)


def read_range(reader: ReplicaReader, part: SegmentRange, *, replica_wait_s: float = 30.0,
               clock: Any = time.monotonic, sleep: Any = time.sleep) -> Iterator[Rows]:
    """The messages of one segment range, new seqs only, in order, one ``Rows`` per fetch.
    Waits up to ``replica_wait_s`` for a replica to answer (a failover in progress), then
    BrokerUnavailable; GapDetected when a seq is missing."""
    seen = DeliveryFilter(part.queue, part.after_seq)
    offset, seg = part.first_offset, part.segment.seg
    deadline = clock() + replica_wait_s
    while offset < part.end_offset:
        try:
            res, _role = reader.fetch(part.queue, part.segment, offset, max_bytes=FETCH_MAX_BYTES)
        except BrokerUnavailable:
            if clock() >= deadline:
                raise
            sleep(0.2)
            continue
        if not res.batches:
            if clock() >= deadline:
                raise BrokerUnavailable(f"group {part.segment.gid}",
                                        f"segment {seg} offset {offset} planned readable but not served")
            sleep(0.2)
            continue
        deadline = clock() + replica_wait_s
        out = Rows()
        for raw in res.batches:
            header = parse_header(raw)
            first_off, n = header.first_offset, header.count
            if first_off >= part.end_offset or first_off + n <= offset:
                # A fetch returns whole batches up to its byte limit: the ones past the range
                # belong to the next task (profiled: ~20% of the decoding before this test).
                continue
            messages = decode_messages(raw, header)
            if first_off >= offset and first_off + n <= part.end_offset and seen.admit_run(header.first_seq, n):
                # The whole batch is new and continues the stream exactly (the consumer's fast path).
                out.seqs.extend(range(header.first_seq, header.first_seq + n))
                out.offsets.extend(range(first_off, first_off + n))
                out.messages.extend(messages)
                offset = first_off + n
                continue
            for i, m in enumerate(messages):
                off = first_off + i
                if off < offset or off >= part.end_offset:
                    continue
                seq = header.first_seq + i
                if seen.admit(seq):
                    out.add(seq, off, m)
            offset = max(offset, min(header.end_offset, part.end_offset))
        yield out


def to_arrow(seg: int, got: Rows) -> Any:
    """One pyarrow RecordBatch in SCHEMA's columns (Spark takes it without a row per tuple).
    Built column by column, headers as flat key/value arrays (~5x less CPU than from dicts)."""
    import pyarrow as pa

    payloads, keys, headers, stamps = zip(*got.messages, strict=True)
    ends = [0]
    names: list[str] = []
    values: list[bytes] = []
    for h in headers:
        if h:
            for name, value in h:
                names.append(name)
                values.append(value)
        ends.append(len(names))
    header_col = pa.ListArray.from_arrays(pa.array(ends, pa.int32()), pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())], names=["key", "value"]))
    return pa.RecordBatch.from_arrays([
        pa.array(got.seqs, pa.int64()),
        pa.repeat(pa.scalar(seg, pa.int64()), len(got.seqs)),
        pa.array(got.offsets, pa.int64()),
        pa.array(keys, pa.binary()),
        header_col,
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(payloads, pa.binary()),
    ], names=["seq", "seg", "offset", "key", "headers", "timestamp", "payload"])


# -- the Spark classes ---------------------------------------------------------------------------------


@attrs.define
class Clients:
    """What the source reads the cluster with: the coordinators (the queue's state and live
    processes) and the replicas, with the cluster's client credentials."""

    coord: CoordinatorClient
    store: DescribedQueues
    reader: ReplicaReader
    bootstrap: str  # the coordinators' addresses it reached
    credentials: Credentials  # what it presents

    @classmethod
    def open(cls, o: SourceOptions) -> Clients:
        from ordq.wire.client import GrpcTransport

        coord, credentials = open_coordinator(o.bootstrap, o.zk, o.root, o.credentials())
        store = DescribedQueues(coord)
        transport = GrpcTransport(rpc_timeout_s=o.rpc_timeout_s, credentials=credentials)
        return cls(coord, store, ReplicaReader(store, transport),  # type: ignore[arg-type]
                   resolve(o.bootstrap, o.zk, o.root), credentials)

    def close(self) -> None:
        self.reader.close()
        self.coord.close()

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OrdqDataSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("ordq")``; options: see ``SourceOptions`` and docs/SPARK.md."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> OrdqStreamReader:
        return OrdqStreamReader(SourceOptions.parse(self.options))


class OrdqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Plans micro-batches on the driver (one ZooKeeper client, kept) and reads segment
    ranges in the tasks (a client per task)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._clients: Clients | None = None
        self._target: Cursor | None = None  # availableNow: what was readable when the query started

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_clients": None, "_target": None}  # clients do not travel

    def prepareForTriggerAvailableNow(self) -> None:
        store, reader = self._connect()
        st, _ = store.load_state(self.options.queue)
        origin = Cursor(seg=min((s.seg for s in st.consume), default=st.next_seg), offset=0, last_seq=-1)
        self._target = readable_end(reader, st, origin)

    def _connect(self) -> tuple[DescribedQueues, ReplicaReader]:
        if self._clients is None:
            self._clients = Clients.open(self.options)
        return self._clients.store, self._clients.reader

    def initialOffset(self) -> dict[str, int]:
        store, reader = self._connect()
        st, _ = store.load_state(self.options.queue)
        target = parse_reset_target(self.options.start.split())
        cursor, _loc = resolve_target(store, reader, st, target)  # type: ignore[arg-type]
        return to_offset(cursor)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_rows_per_batch
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit | None = None) -> dict[str, int]:
        store, reader = self._connect()
        st, _ = store.load_state(self.options.queue)
        first = from_offset(start)
        end = readable_end(reader, st, first)
        if self._target is not None and (self._target.seg, self._target.offset) < (end.seg, end.offset):
            # availableNow reads to what was readable at its start, in batches of the row cap.
            t = self._target
            end = first if (t.seg, t.offset) <= (first.seg, first.offset) else attrs.evolve(
                t, last_seq=max(t.last_seq, first.last_seq))
        capped = isinstance(limit, ReadMaxRows)  # ReadAllAvailable (e.g. availableNow) takes everything
        until = self.options.until_seq
        if capped or (until is not None and end.last_seq > until):
            first_seqs = unsealed_first_seqs(reader, st, first, end)
            if isinstance(limit, ReadMaxRows):
                end = capped_end(st, first, end, limit.max_rows, first_seqs)
            if until is not None:
                end = until_end(st, first, end, until, first_seqs)
        return to_offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SegmentRange]:
        store, reader = self._connect()
        st, _ = store.load_state(self.options.queue)
        first, last = from_offset(start), from_offset(end)
        # The first seq of an unsealed segment (a replica knows it) lets its range be split.
        return plan(st, first, last, first_seqs=unsealed_first_seqs(reader, st, first, last))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentRange):
            raise TypeError(f"not an ordq segment range: {partition!r}")
        o = self.options
        with Clients.open(o) as clients:
            clients.store.load_state(partition.queue)  # the groups' live processes
            for got in read_range(clients.reader, partition, replica_wait_s=o.replica_wait_s):
                if got.seqs:
                    yield to_arrow(partition.segment.seg, got)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the checkpoint is the cursor: nothing to write on ordq's side

    def stop(self) -> None:
        if self._clients is not None:
            self._clients.close()
        self._clients = None
