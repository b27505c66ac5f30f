"""The broker process: a master or a slave of one broker group, serving the gRPC protocol.

Guarantees (DESIGN §4):
- A produce batch is acked only when master and slave have both synced it, and acks return
  in order. The master assigns offsets, writes locally and forwards the same bytes to the
  slave at once; one sync thread group-commits every batch that arrived meanwhile.
- Readers never see past the LAC of an open segment, nor past the end of a sealed one (nor
  past the end ZooKeeper decided, when the reader tells it).
- Fence and Seal are persisted before they are answered, and answered only after every batch
  accepted before them is synced, so the end they report is durable.
- A segment held open before a restart is never appended to again; a segment sealed in
  ZooKeeper is reconciled (truncated past its end, or completed from the peer) before it is
  served past what this copy holds.

Threads: every gRPC call runs on one asyncio loop (ordq/loop.py; the handlers are in
broker_group/dataplane.py): a produce request is checked, placed and forwarded to the slave
in the loop, one sync thread group-commits the master's copy and wakes the loop, the
replication reader releases acks on the loop, the slave appends, syncs and answers on its
loop. Nothing else stands between a request and its ack. Blocking work (ZooKeeper reads, a
segment's creation, Fence/Seal/Reconcile) runs in the loop's worker threads, as does the
reconciler (broker_group/repair.py). Shared state is guarded by one condition variable
``_cv`` (never waited on in the loop; ``changed()`` wakes thread and loop waiters alike); a
segment's log file by its own ``io_lock`` (held across a sync, never together with ``_cv``
waiting on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import grpc
from kazoo.protocol.states import KazooState

from broker_group import log as seglog
from broker_group.answer import Answer, encode
from broker_group.auth import Gate
from broker_group.budget import BudgetConfig, Lease, MemoryBudget, ReadPace, tune_malloc
from broker_group.epochs import EpochGate
from broker_group.errors import SegmentNotWritable, short
from broker_group.framing import GRPC_OPTIONS, REQUEST_BYTES
from broker_group.metrics import BrokerMetrics, count_fetch
from broker_group.repair import Repairer
from broker_group.replica import Placement, Refused, Role, SegmentReplica
from broker_group.request_time import RequestTime, RequestTimeConfig
from broker_group.wire import ordq_pb2 as pb
from coordinator.state import QueueState, SegStatus
from coordinator.store import ZkStore
from coordinator.zk_retry import START_BOUND_S, retry_zk
from ordq.errors import (
    AlreadyExists,
    BrokerUnavailable,
    ClosedError,
    ConfigError,
    CorruptLog,
    CorruptState,
    DiskFull,
    MessageTooLarge,
    OrdqError,
    QueueNotFound,
    SegmentNotFound,
)
from ordq.loop import LoopThread, Signal
from ordq.security import Credentials, server_credentials

log = logging.getLogger("ordq.broker")
T = TypeVar("T")


def server_options(cfg: BrokerConfig) -> list[tuple[str, int]]:
    """The broker's server side: a request holds at most one split's worth of batches (a
    split ends at the first batch past REQUEST_BYTES, and a batch is at most max_batch_bytes),
    not the 256 MiB a channel accepts; a connection carries a bounded number of streams.
    Connections are bounded too (docs/SECURITY.md, Limits): one that has not finished its TLS
    and HTTP/2 handshake within ``handshake_timeout_ms`` is closed (a socket that never sends
    a ClientHello holds a descriptor otherwise); one without calls for ``idle_connection_ms``
    is closed (clients reconnect by themselves); keepalive pings find dead peers of open
    streams; at most ``max_connections`` are accepted. No maximum connection age: it would cut
    a producer's long-lived stream and make it fail over."""
    limit = REQUEST_BYTES + cfg.max_batch_bytes + (1 << 20)
    return [(k, v) for k, v in GRPC_OPTIONS if k != "grpc.max_receive_message_length"] + [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
        ("grpc.max_metadata_size", cfg.max_metadata_bytes),
        ("grpc.server_handshake_timeout_ms", cfg.handshake_timeout_ms),
        ("grpc.max_connection_idle_ms", cfg.idle_connection_ms),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.max_allowed_incoming_connections", cfg.max_connections),
    ]


META_FILE = "meta.json"
FOLDER_FILE = "folder.json"  # the data folder's birth record (see Broker._load_folder)
INCARNATION_FILE = "incarnation"  # in a queue's folder: which creation of the queue its segments belong to
SLAVE_CONNECT_WAIT_S = 1.0
INLINE_READ_MESSAGES = 4096  # a fetch of more messages reads the log in a worker thread, off the loop


@attrs.frozen(kw_only=True)
class BrokerConfig:
    gid: str
    role: Role
    data_dir: Path
    zk_hosts: str
    root: str = "/ordq"
    listen: str = "127.0.0.1:0"
    zk_session_timeout_s: float = 2.0
    max_batch_bytes: int = 16 << 20  # one encoded batch on the wire
    lac_push_ms: float = 20.0  # how soon the slave learns an advanced LAC when no batch carries it
    reconcile_interval_s: float = 1.0
    rpc_timeout_s: float = 5.0  # calls this broker makes to its peer while reconciling
    # Limits (docs/SECURITY.md, Limits): what one client can make this process hold.
    max_fetch_bytes: int = 32 << 20  # one Fetch answer, whatever max_bytes the reader asks
    max_fetch_wait_ms: int = 30_000  # one Fetch long-poll, whatever max_wait_ms the reader asks
    # Master: bytes accepted but not yet synced here and on the slave; past it, produce streams
    # stop being read (gRPC flow control then holds the senders back) until syncs catch up.
    max_inflight_bytes: int = 256 << 20
    max_streams_per_connection: int = 100  # HTTP/2 concurrent streams of one client connection
    max_connections: int = 4096  # accepted at once (gRPC refuses the next)
    handshake_timeout_ms: int = 10_000  # TLS + HTTP/2 handshake of a new connection
    idle_connection_ms: int = 300_000  # a connection without calls this long is closed
    max_metadata_bytes: int = 16 << 10  # request headers (a token is ~50 bytes)
    # Worker threads for the blocking parts of calls (ZooKeeper reads, Fence/Seal/Reconcile), made
    # as needed. Streams and long-polls hold none: they wait on the loop (bench/bench_abandoned.py).
    rpc_workers: int = 512
    # Calls beyond this are refused at once (RESOURCE_EXHAUSTED), not queued without bound.
    max_concurrent_rpcs: int = 1024
    # CRC-check every batch read from a sealed segment before it is sent (docs/BENCHMARKS.md).
    verify_sealed_reads: bool = True
    # What the broker holds for clients at once, in all and per connection/token (budget.py).
    budget: BudgetConfig = attrs.field(factory=BudgetConfig)
    # Each token's share of the broker's loop (request_time.py): one token's calls, refused
    # ones included, cannot take the time its neighbours' produce and acks need.
    request_time: RequestTimeConfig = attrs.field(factory=RequestTimeConfig)
    # A process restarted right after a kill finds its predecessor's liveness node still there
    # until that ZooKeeper session expires: wait this long for it before giving up.
    register_wait_s: float = 30.0
    # What it serves with and shows its peer (ordq/security.py); no CA: plaintext (--insecure).
    credentials: Credentials = attrs.field(factory=Credentials)

    def __attrs_post_init__(self) -> None:
        if self.max_batch_bytes < 1024:
            raise ConfigError("max_batch_bytes must be >= 1024")
        if self.lac_push_ms <= 0 or self.reconcile_interval_s <= 0:
            raise ConfigError("lac_push_ms and reconcile_interval_s must be > 0")
        if min(self.max_fetch_bytes, self.max_fetch_wait_ms, self.max_inflight_bytes, self.max_streams_per_connection,
               self.rpc_workers, self.max_concurrent_rpcs, self.max_connections, self.handshake_timeout_ms,
               self.idle_connection_ms, self.max_metadata_bytes) < 1:
            raise ConfigError("broker limits must be >= 1")


@attrs.define(eq=False)
class Segment:
    """One (queue, seg) on this replica: decisions in ``replica``, bytes in ``log``."""

    replica: SegmentReplica
    directory: Path
    log: seglog.SegmentLog | None  # None while corrupt (not served)
    corrupt: CorruptLog | None = None
    pending: list[bytes] = attrs.field(factory=list)  # accepted, not yet appended to the log
    syncing: int = 0  # commits under way (appended or being synced, verdict not yet known)
    io_lock: threading.Lock = attrs.field(factory=threading.Lock)
    reconciled: bool = False  # matches ZooKeeper's sealed end (or nothing to reconcile yet)
    first_write_ms: int = 0  # master: wall clock of the first batch it accepted (0: none yet)

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica.queue, self.replica.seg)

    def settled(self) -> bool:
        """Everything accepted so far has reached a commit's verdict (synced or dropped)."""
        return not self.pending and self.syncing == 0

    def end(self) -> pb.SegmentEnd:
        r = self.replica
        return pb.SegmentEnd(
            end=r.local_synced,
            first_seq=-1 if r.first_seq is None or r.local_synced == 0 else r.first_seq,
            last_seq=-1 if r.last_seq is None or r.local_synced == 0 else r.last_seq,
            sealed=r.sealed, fenced_epoch=r.fenced_epoch,
            bytes=self.log.synced_bytes if self.log is not None else 0, first_write_ms=self.first_write_ms,
            # Why: a master restarted (or whose disk or slave stream failed) never writes this
            # segment again; the coordinator reads this to roll it with no producer around.
            frozen=not r.writable,
        )


@attrs.define(eq=False)
class ProduceStreamState:
    """Acks owed on one produce stream, in order."""

    pending: list[tuple[Segment, Placement]] = attrs.field(factory=list)
    error: OrdqError | None = None
    done: bool = False


@attrs.define
class BrokerStats:
    batches_in: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    duplicates: int = 0
    syncs: int = 0
    batches_synced: int = 0
    acks: int = 0
    fetches: int = 0
    fetch_batches: int = 0
    fetch_messages: int = 0
    fetch_bytes: int = 0
    replication_breaks: int = 0
    torn_bytes_truncated: int = 0
    corrupt_segments: int = 0
    corrupt_reads: int = 0  # sealed copies found corrupt by a read (set aside, repaired from the peer)
    reconciled: int = 0
    held_back: int = 0  # produce requests that waited for syncs (max_inflight_bytes)
    refused_too_large: int = 0  # batches holding a message over the queue's max_message_bytes
    refused: dict[str, int] = attrs.field(factory=dict)  # requests refused, by error kind (metrics)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.incarnation = uuid.uuid4().hex[:12]
        self.address = ""
        self.stats = BrokerStats()
        self.metrics = BrokerMetrics(self)  # broker_group/metrics.py: served by ``ordq broker run --metrics``
        self._message_limits: dict[str, int] = {}  # queue -> max_message_bytes, read on first use
        # Only the producer epoch ZooKeeper issued may write or fence (broker_group/epochs.py).
        self.epochs = EpochGate(self._issued_epoch)
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        # The sync thread waits on its own condition (same lock): the many ``changed()`` of
        # the data path must not wake it for nothing (a thread switch and the GIL, per batch).
        self._dirty_cv = threading.Condition(lock)
        self._held = 0  # produce requests waiting in _hold_back (a sync's end must wake them)
        self._segments: dict[tuple[str, int], Segment] = {}
        self._dirty: list[Segment] = []
        self._streams: set[ProduceStreamState] = set()
        self._inflight_bytes = 0  # master: accepted, not yet synced here (see max_inflight_bytes)
        self._stopping = False
        self._server: grpc.aio.Server | None = None
        # The loop every call runs on, and the signal its waiters wake on (ordq/loop.py).
        self.loop = LoopThread("ordq-loop", workers=config.rpc_workers)
        self.signal = Signal(self.loop)
        # One memory budget for what calls hold (broker_group/budget.py); its own signal, so
        # that a released answer wakes only the calls waiting for room.
        self.budget = MemoryBudget(config.budget)
        rate = config.budget.read_rate_bytes
        # A bucket of two answers, not the connection's 32 MiB share: a token's 24 Read streams
        # opened at once were all given their first answers at once, and the neighbour queue's
        # acks waited behind that burst (noisy-neighbour drill: the worst acks came in the first
        # 0.5 s of each abuse window). A steady reader's rate is the same either way.
        burst = min(config.budget.holder_bytes, 2 * config.budget.token_answer_bytes)
        self.read_pace = None if rate is None else ReadPace(rate, burst=burst)
        self.room = Signal(self.loop)
        self.request_time = RequestTime(config.request_time)
        self._read_slots: dict[str, list[Any]] = {}  # token -> [lock, users]: see _read_slot
        self._store: ZkStore | None = None
        self._threads: list[threading.Thread] = []
        self.repair = Repairer(self)
        self.gate = Gate(tls=config.credentials.tls)  # who may call what (broker_group/auth.py)
        self.replication: Any = None  # master: broker_group.replication.ReplicationLink
        # Per queue, the first segment opened after this data folder was created; the queues
        # whose older segments of this group still need copying from the peer (a new disk).
        self._born_at: dict[str, int] = {}
        self._refill: set[str] = set()
        # Held while a queue's folder changes hands between incarnations or loses segments,
        # so a segment of a re-created queue is never removed as the deleted queue's.
        self._folder_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> str:
        """Recover the data folder, serve, register liveness; return the bound address."""
        cfg = self.config
        seglog.private_dir(cfg.data_dir)  # data at rest: the broker's user only (docs/SECURITY.md)
        tune_malloc()  # freed answers go back to the system (budget.py)
        # Every ZooKeeper step of the start rides out transient errors for a bounded time
        # (coordinator/zk_retry.py): one ConnectionLoss on a busy machine must not stop a broker.
        self._store = self._retry(lambda: ZkStore.connect(cfg.zk_hosts, cfg.root, timeout_s=cfg.zk_session_timeout_s,
                                                          auth=cfg.credentials.zk_auth, daemon=True),
                                  "connect to ZooKeeper")
        store = self._store
        self._retry(lambda: store.get_group(cfg.gid), "read the group")  # GroupNotFound before we serve anything
        self._retry(self._load_folder, "read the queues for the data folder's record")
        self._recover()
        try:
            self.free_space()  # a deleted queue's or popped segments go before anything is served
        except OrdqError as exc:
            log.warning("freeing the space of deleted queues and popped segments deferred: %s", exc)
        self.gate.watch(self._store.client, cfg.root)  # tokens loaded before anything is served
        self.loop.start()
        try:
            port = self.loop.run(self._bind())
            if port == 0:
                raise ConfigError(f"cannot listen on {cfg.listen}")
            self.address = f"{cfg.listen.rsplit(':', 1)[0]}:{port}"
            self._retry(self._wait_role_free, "wait for the role to be free")
            assert self._server is not None
            self.loop.run(self._server.start())
            if cfg.role is Role.MASTER:
                self._spawn(self._sync_loop, "ordq-sync")
            self._spawn(self.repair.run, "ordq-reconcile")
            if cfg.role is Role.MASTER:
                from broker_group.replication import ReplicationLink

                self.replication = ReplicationLink(self)
                self.replication.start()
            self._retry(self._register, "register liveness")
            store.client.add_listener(self._on_zk_state)
            # a deleted queue: free at once
            self._retry(lambda: store.watch_queue_list(lambda _queues: self.repair.kick.set()), "watch the queues")
        except BaseException:
            self.stop()
            raise
        return self.address

    def _retry(self, call: Callable[[], T], what: str, *, bound_s: float = START_BOUND_S) -> T:
        """``call()`` with transient ZooKeeper errors retried for ``bound_s`` (not past a stop)."""
        cfg = self.config
        return retry_zk(call, f"broker {cfg.gid}/{cfg.role.value}: {what}", bound_s=bound_s, hosts=cfg.zk_hosts,
                        stopped=lambda: self._stopping)

    async def _bind(self) -> int:
        """On the loop: the gRPC server with every handler (broker_group/dataplane.py), bound."""
        from broker_group.dataplane import add_servicer

        cfg = self.config
        self._server = grpc.aio.server(options=server_options(cfg), maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
        add_servicer(self, self._server)
        if cfg.credentials.tls:
            return self._server.add_secure_port(cfg.listen, server_credentials(cfg.credentials))
        return self._server.add_insecure_port(cfg.listen)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _register(self) -> None:
        store = self.require_store()
        store.register_live(self.config.gid, self.config.role.value, self.address, self.incarnation)

    def _wait_role_free(self) -> None:
        """Before serving: wait (up to ``register_wait_s``) while another process is live in
        this role. A killed predecessor's node goes when its ZooKeeper session expires; a live
        process keeps it, and we stop with AlreadyExists, having served nothing."""
        cfg = self.config
        store = self.require_store()
        if store.wait_not_live(cfg.gid, cfg.role.value, timeout_s=0):
            return
        log.warning("%s/%s is still live in ZooKeeper (a previous process's session not yet expired?); "
                    "waiting up to %.0f s for it to go", cfg.gid, cfg.role.value, cfg.register_wait_s)
        if not store.wait_not_live(cfg.gid, cfg.role.value, timeout_s=cfg.register_wait_s):
            raise AlreadyExists(f"a {cfg.role.value} of group {cfg.gid!r} is already live (another process "
                                f"holds the role; waited {cfg.register_wait_s:g} s for it to go)")
        log.info("%s/%s: the previous process's session expired; starting", cfg.gid, cfg.role.value)

    def _on_zk_state(self, state: str) -> None:
        # The ephemeral liveness node dies with an expired session: register again once a
        # new session is up (in a thread: kazoo forbids blocking calls in listeners).
        if state == KazooState.LOST:
            def again() -> None:
                try:
                    self._retry(self._register, "register liveness again after a lost session", bound_s=60.0)
                except OrdqError as exc:
                    log.error("%s", exc)
                    return
                log.info("re-registered liveness after a lost ZooKeeper session")

            threading.Thread(target=again, daemon=True).start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self.changed()
            self._dirty_cv.notify_all()
        self.gate.book.close()
        if self.replication is not None:
            self.replication.stop()
        if self._server is not None:
            try:
                self.loop.run(self._server.stop(grace=0.5), timeout_s=10)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("stopping the gRPC server: %r", exc)
        self.loop.stop()
        self.repair.kick.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._store is not None:
            self._store.close()
        for s in self._segments.values():
            if s.log is not None:
                with s.io_lock:
                    s.log.close()

    def changed(self) -> None:
        """Caller holds _cv: state changed; wake every waiter (threads on ``_cv``, the loop's
        tasks on ``signal``)."""
        self._cv.notify_all()
        self.signal.fire()

    def require_store(self) -> ZkStore:
        if self._store is None:
            raise BrokerUnavailable(self.address, "not started")
        return self._store

    # -- segments -----------------------------------------------------------------------------

    def _load_folder(self) -> None:
        """Read (or write, for a new folder) the data folder's birth record.

        A folder that is empty when first seen (a new broker, or a replaced disk) records, per
        queue, the next segment ZooKeeper will open. Of a segment below that mark it holds no
        copy, and it cannot tell what was acked there: it must not answer Fence or Seal for it
        (``end 0`` would cut off acked messages), and it copies the sealed ones from its peer
        (broker_group/repair.py, ``_refill_round``). A folder that already holds segments but
        no record predates the record: it has seen every segment of its group."""
        cfg = self.config
        path = cfg.data_dir / FOLDER_FILE
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            born: dict[str, int] = {}
            if not any(p.is_dir() for p in cfg.data_dir.iterdir()):
                store = self.require_store()
                for queue in store.list_queues():
                    try:
                        born[queue] = store.load_state(queue)[0].next_seg
                    except QueueNotFound:
                        continue  # deleted meanwhile
            record = {"created": time.time(), "born_at": born}
            _write_json_durably(path, record)
            if any(born.values()):
                log.warning("new data folder for a group with history: segments below %s are copied from the peer "
                            "and not vouched for here", born)
        except ValueError as exc:
            raise ConfigError(f"unreadable {path}: {exc} (it says which segments this folder can vouch for; "
                              "restore it, or empty the folder to start this replica afresh)") from exc
        self._born_at = {q: int(n) for q, n in record.get("born_at", {}).items()}
        self._refill = {q for q, n in self._born_at.items() if n > 0}

    def _vouches_for_absent(self, queue: str, seg: int) -> bool:
        """Can this replica say "nothing acked" of a segment it holds no copy of? Only when
        its data folder existed before the segment was opened: every ack needs its sync."""
        return seg >= self._born_at.get(queue, 0)

    def _recover(self) -> None:
        """Open every segment on disk. Torn tails are truncated (and counted); a corrupt middle
        batch takes that segment out of service; anything not sealed here is never written
        again (its peer may hold synced batches this copy lost)."""
        for qdir in sorted(p for p in self.config.data_dir.iterdir() if p.is_dir()):
            for sdir in sorted(p for p in qdir.iterdir() if p.is_dir() and p.name.isdigit()):
                queue, seg = qdir.name, int(sdir.name)
                meta = _read_meta(sdir)
                replica = SegmentReplica(queue, seg, self.config.role, fenced_epoch=meta.get("fenced_epoch", 0),
                                         sealed=bool(meta.get("sealed", False)))
                segment = Segment(replica=replica, directory=sdir, log=None)
                try:
                    lg = seglog.SegmentLog.open(self.config.data_dir, queue, seg)
                except CorruptLog as exc:
                    log.error("segment %s/%d is corrupt and will not be served: %s", queue, seg, exc)
                    segment.corrupt = exc
                    self.stats.corrupt_segments += 1
                    replica.freeze("corrupt log")
                else:
                    segment.log = lg
                    self.stats.torn_bytes_truncated += lg.recovery.truncated_bytes
                    if lg.recovery.truncated_bytes:
                        log.warning("segment %s/%d: truncated a torn tail of %d bytes", queue, seg,
                                    lg.recovery.truncated_bytes)
                    replica.restored(end=lg.synced_end, first_seq=lg.first_seq, last_seq=lg.last_seq)
                replica.freeze("held open before this broker restarted")
                self._segments[segment.key] = segment

    def _create(self, queue: str, seg: int, fenced_epoch: int) -> Segment:
        """A new, empty, writable segment (or the one another thread created meanwhile)."""
        with self._cv:
            existing = self._segments.get((queue, seg))
            if existing is not None:
                return existing
        directory = seglog.segment_dir(self.config.data_dir, queue, seg)
        with self._folder_lock:
            self._claim_queue_folder(queue)
            lg = seglog.SegmentLog.open(self.config.data_dir, queue, seg, create=True)
        replica = SegmentReplica(queue, seg, self.config.role, fenced_epoch=fenced_epoch)
        segment = Segment(replica=replica, directory=directory, log=lg)
        _write_meta(segment)
        with self._cv:
            existing = self._segments.setdefault((queue, seg), segment)
            self.changed()  # a fetch may be waiting for it
        if existing is not segment:
            lg.close()
        return existing

    def _claim_queue_folder(self, queue: str) -> None:
        """Before a new segment of ``queue`` is stored: the queue's folder belongs to the
        incarnation ZooKeeper shows (files of a deleted queue of the same name go first)."""
        st, _ = self.require_store().load_state(queue)
        held = _folder_incarnation(self.config.data_dir / queue)
        if held == st.incarnation:
            return
        if held is not None:
            self._drop_segments(queue, lambda seg: True, "an earlier queue of the same name was deleted")
        seglog.private_dir(self.config.data_dir / queue)
        _write_json_durably(self.config.data_dir / queue / INCARNATION_FILE, st.incarnation)

    def free_space(self) -> None:
        """Remove the files of every segment no queue needs any more: popped from its consume
        list (read by every subscription, or dropped by retention), or of a deleted queue."""
        for qdir in sorted(p for p in self.config.data_dir.iterdir() if _is_queue_folder(p)):
            with self._folder_lock:
                try:
                    st: QueueState | None = self.require_store().load_state(qdir.name)[0]
                except QueueNotFound:
                    st = None
                except CorruptState as exc:  # that queue's problem: keep its files, free the others'
                    log.warning("not freeing space of %s: %s", qdir.name, exc)
                    continue
                held = _folder_incarnation(qdir)
                if st is None or (held is not None and held != st.incarnation):
                    self._drop_segments(qdir.name, lambda seg: True, "its queue was deleted")
                    shutil.rmtree(qdir, ignore_errors=True)
                    continue
                low = st.consume[0].seg if st.consume else st.next_seg
                self._drop_segments(qdir.name, lambda seg: seg < low,  # noqa: B023 - called at once
                                    "read by every subscription or past retention")

    def _drop_segments(self, queue: str, which: Callable[[int], bool], why: str) -> None:
        with self._cv:
            gone = [s for (q, seg), s in self._segments.items() if q == queue and which(seg)]
            for s in gone:
                del self._segments[s.key]
        for s in gone:
            with s.io_lock:
                if s.log is not None:
                    s.log.close()
                shutil.rmtree(s.directory, ignore_errors=True)
            log.info("segment %s/%d removed: %s", queue, s.key[1], why)

    def _zk_segment(self, queue: str, seg: int) -> tuple[Any, int]:
        """(the ZooKeeper view of the segment or None, the queue's producer epoch)."""
        st, _ = self.require_store().load_state(queue)
        return st.segment(seg), st.producer_epoch

    def segment_for_write(self, queue: str, seg: int, epoch: int) -> Segment:
        """Master: the segment a producer writes; created only if ZooKeeper says it is this
        group's open segment, fenced at the queue's current epoch (so a stale producer that
        never saw the takeover cannot write to a segment opened after it)."""
        with self._cv:
            s = self._segments.get((queue, seg))
        if s is not None:
            return s
        z, producer_epoch = self._zk_segment(queue, seg)
        if z is None or z.gid != self.config.gid or z.status is not SegStatus.OPEN:
            raise SegmentNotWritable(self.address, queue, seg, "not this group's open segment in ZooKeeper")
        s = self._create(queue, seg, producer_epoch)
        self._message_limits.pop(queue, None)  # a new segment reads the queue's config again
        with self._cv:
            s.replica.check_epoch(epoch)
        return s

    def segment_for_control(self, queue: str, seg: int, *, to_copy: bool = False) -> Segment:
        """Fence/Seal/Reconcile target: created empty when ZooKeeper places it on this group
        but nothing was ever written here. Without a copy of a segment opened before this
        data folder existed, only a copy into it (``to_copy``) is allowed: Fence and Seal get
        BrokerUnavailable, so the Seal protocol decides from the peer (or waits for it)."""
        with self._cv:
            s = self._segments.get((queue, seg))
        if s is not None:
            return s
        z, _ = self._zk_segment(queue, seg)
        if z is None or z.gid != self.config.gid:
            raise SegmentNotFound(queue, seg)
        if not to_copy and not self._vouches_for_absent(queue, seg):
            raise BrokerUnavailable(
                self.address, f"holds no copy of {queue}/{seg}, which was opened before this broker's data folder "
                "existed (a new disk): it cannot tell what was acked there; ask its peer")
        return self._create(queue, seg, 0)

    def segment_for_replica(self, queue: str, seg: int) -> Segment:
        with self._cv:
            s = self._segments.get((queue, seg))
        return s if s is not None else self._create(queue, seg, 0)

    # -- the write path -----------------------------------------------------------------------

    def _issued_epoch(self, queue: str) -> tuple[int, str | None]:
        """The queue's producer epoch and its key hash as ZooKeeper holds them now (synced)."""
        store = self.require_store()
        store.producer_epoch(queue)  # syncs: a claim another client just made is seen
        st, _ = store.load_state(queue)
        return st.producer_epoch, st.producer_key

    def _write_ready(self, queue: str, seg: int, epoch: int, key: str = "") -> bool:
        """Can a produce request for (queue, seg, epoch, key) be taken on the loop without a
        ZooKeeper read (its segment exists, its epoch, key and message limit are known)?"""
        return (self.epochs.knows(queue, epoch, key) and queue in self._message_limits
                and (queue, seg) in self._segments)

    def _prepare_write(self, queue: str, seg: int, epoch: int, key: str = "") -> None:
        """In a worker thread: the ZooKeeper reads a produce request may need first (the
        epoch ZooKeeper issued and its key, the segment's creation, the queue's message limit)."""
        self.epochs.check(queue, epoch, key)
        self.segment_for_write(queue, seg, epoch)
        if queue not in self._message_limits:
            self._message_limits[queue] = self.require_store().queue_config(queue).max_message_bytes

    async def accept_produce(self, stream: ProduceStreamState, req: pb.ProduceRequest) -> None:
        """Master, on the loop: place each batch, queue it for the slave and the local sync."""
        if self.config.role is not Role.MASTER:
            raise ConfigError(f"this is the slave of group {self.config.gid}: producers write to the master")
        headers = [self._checked_header(raw) for raw in req.batches]
        # The epoch key on every request, not only the first: nothing is stored without it.
        while not self._write_ready(req.queue, req.seg, req.epoch, req.epoch_key):
            await self.loop.run_blocking(self._prepare_write, req.queue, req.seg, req.epoch, req.epoch_key)
        s = self._segments[(req.queue, req.seg)]
        self._check_message_sizes(req.queue, req.batches)
        link = self.replication
        # Just after start the slave stream may still be connecting: a short wait spares
        # the producer a needless failover. A broken stream fails producers by itself.
        deadline = time.monotonic() + SLAVE_CONNECT_WAIT_S
        while link is not None and not link.connected and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self.signal.wait(left)
        if link is None or not link.connected:
            raise SegmentNotWritable(self.address, req.queue, req.seg, "the slave is not connected")
        await self._hold_back(link)
        resent = False  # a batch already stored and synced here: its ack may be due at once
        with self._cv:
            for raw, h in zip(req.batches, headers, strict=True):
                if h.epoch != req.epoch:
                    raise ConfigError(f"batch epoch {h.epoch} differs from the stream's epoch {req.epoch}")
                try:
                    p = s.replica.place(req.epoch, h.first_seq, h.count)
                except Refused as exc:
                    raise self._refused(s, exc) from None
                if p.duplicate:
                    self.stats.duplicates += 1
                    resent = True
                else:
                    stamped = seglog.stamp_offset(raw, p.first_offset)
                    if not s.first_write_ms:  # the segment's age, for rolling by age
                        s.first_write_ms = int(time.time() * 1000)
                    s.pending.append(stamped)
                    self._inflight_bytes += len(stamped)
                    link.forward(s, stamped)
                    self.stats.batches_in += 1
                    self.stats.messages_in += h.count
                    self.stats.bytes_in += len(raw)
                stream.pending.append((s, p))
            if s.pending and s not in self._dirty:
                self._dirty.append(s)
            self._dirty_cv.notify()  # the sync thread
            if resent:
                self.signal.fire()
        link.wake.fire()  # the sender writes these to the slave as soon as this task yields

    async def accept_replica(self, queue: str, seg: int, batches: list[bytes], lac: int) -> Segment:
        """Slave, on the loop: append the master's batches at the master's offsets and sync
        them right here (the handler answers right after: no thread hand-off on the slave's
        side of an ack); learn the master's LAC. The master sends the batches that queued up
        while earlier ones were synced together: one group commit."""
        headers = [self._checked_header(raw) for raw in batches]
        s = self._segments.get((queue, seg))
        if s is None:
            s = await self.loop.run_blocking(self.segment_for_replica, queue, seg)
        accepted: list[bytes] = []
        with self._cv:
            # The master's LAC counts only what this copy reported synced: one past what this
            # copy holds (with this request's batches) is not a LAC but a lie, and taking it
            # would let readers of this copy see batches the master never had acked.
            # (A sealed copy no longer reads up to a LAC: nothing to check there.)
            most = s.replica.next_offset + sum(h.count for h in headers)
            if lac > most and not s.replica.sealed:
                raise ConfigError(f"replicated LAC {lac} of {short(queue)}/{seg} is past this copy's end {most}")
            if lac >= 0:
                s.replica.peer_progress(lac)
                self.changed()
            if s.replica.sealed:
                # Sealed here first (the Seal protocol reached us before these in-flight
                # batches): ignore them; the protocol copies any difference from the master.
                return s
            for raw, h in zip(batches, headers, strict=True):
                try:
                    s.replica.accept_replica(h.epoch, h.first_offset, h.first_seq, h.count)
                except Refused as exc:
                    raise self._refused(s, exc) from None
                accepted.append(raw)
                self.stats.batches_in += 1
                self.stats.messages_in += h.count
                self.stats.bytes_in += len(raw)
            if not accepted:
                return s
            s.syncing += 1
        self._commit(s, accepted)
        return s

    def _check_message_sizes(self, queue: str, batches: Sequence[bytes]) -> None:
        """Master: refuse a batch holding a message over the queue's ``max_message_bytes``
        (the SDK checks before sending; this stops any other client). A batch no longer than
        the limit cannot hold a larger message, so only longer ones are walked."""
        limit = self._message_limits[queue]
        for raw in batches:
            if len(raw) > limit:
                largest = seglog.largest_message(raw)
                if largest > limit:
                    self.stats.refused_too_large += 1
                    raise MessageTooLarge(largest, limit, f"queue {queue!r} max_message_bytes")

    def _checked_header(self, raw: bytes) -> seglog.BatchHeader:
        """CRC and structure of a batch from the network. The master also walks the message
        lengths (a CRC-valid batch from a buggy encoder must not reach the log, where every
        reader would trip on it); the slave trusts what its master checked."""
        if len(raw) > self.config.max_batch_bytes:
            raise MessageTooLarge(len(raw), self.config.max_batch_bytes)
        check = seglog.check_messages if self.config.role is Role.MASTER else seglog.parse_header
        try:
            return check(raw)
        except (CorruptLog, ValueError) as exc:
            raise ConfigError(f"malformed batch: {exc}") from exc

    def _refused(self, s: Segment, exc: Refused) -> OrdqError:
        if exc.kind == "not_writable":
            return SegmentNotWritable(self.address, s.replica.queue, s.replica.seg, exc.why)
        return ConfigError(f"queue {s.replica.queue!r} segment {s.replica.seg}: {exc.why}")

    def _sync_loop(self) -> None:
        """Master: group commit. One write + fdatasync per segment covers every batch that
        arrived while the previous sync ran; nothing is acked before it."""
        while True:
            with self._cv:
                while not self._dirty and not self._stopping:
                    self._dirty_cv.wait()
                if self._stopping:
                    return
                work = [(s, s.pending) for s in self._dirty]
                for s, _ in work:
                    s.pending = []
                    s.syncing += 1
                self._dirty.clear()
            for s, batches in work:
                self._commit(s, batches, inflight=sum(map(len, batches)))

    async def _hold_back(self, link: Any) -> None:
        """While more than ``max_inflight_bytes`` wait for a sync here or on the slave, do not
        take this request (its stream is not read meanwhile: the sender is held back by gRPC
        flow control, and the broker's memory stays bounded)."""
        limit = self.config.max_inflight_bytes
        waited = False
        try:
            while not self._stopping:
                with self._cv:
                    if self._inflight_bytes + link.lag(time.monotonic())[0] <= limit:
                        return
                    if not waited:
                        self.stats.held_back += 1
                        self._held += 1
                        waited = True
                await self.signal.wait(0.05)
        finally:
            if waited:
                with self._cv:
                    self._held -= 1

    def _commit(self, s: Segment, batches: list[bytes], *, inflight: int = 0) -> None:
        """Append ``batches`` (checked when they arrived) to ``s``'s log and fdatasync them,
        then count them synced (and ``inflight`` bytes no longer in flight). The caller
        counted this commit in ``s.syncing``. A failed write cuts the log back to what is
        durable and freezes the segment."""
        error: OrdqError | None = None
        end = None
        try:
            # The log is locked to append and write, and again to count the sync, but not
            # across the fdatasync: fetches read the synced prefix meanwhile (Fence, Seal and
            # Reconcile wait for ``syncing`` to drop, so nothing truncates it in between).
            with s.io_lock:
                assert s.log is not None
                started = time.perf_counter()
                for b in batches:
                    s.log.append(b, verify_crc=False)
                written = s.log.begin_sync()
            failed = None
            if written is not None:
                try:
                    os.fdatasync(written.fd)
                except OSError as exc:
                    failed = exc
            with s.io_lock:
                end = s.log.end_sync(written, failed) if written is not None else s.log.synced_end
            self.metrics.fsync_seconds.observe(time.perf_counter() - started)
        except (DiskFull, OSError, ValueError, CorruptLog, ClosedError) as exc:
            error = exc if isinstance(exc, OrdqError) else DiskFull(f"write failed: {exc}")
            log.error("segment %s/%d: write failed, segment frozen: %s", *s.key, error)
            self._drop_unsynced(s)
        with self._cv:
            s.syncing -= 1
            self._inflight_bytes -= inflight
            lac = s.replica.lac
            if error is None and end is not None:
                s.replica.synced(end)
                self.stats.syncs += 1
                self.stats.batches_synced += len(batches)
            else:
                self._fail_segment(s, error or DiskFull("write failed"))
            if error is not None or s.replica.lac != lac or self._held:
                self.changed()
            else:
                # Usually the slave's answer, not this sync, moves the LAC: waking the loop
                # for nothing would cost a wake-up per batch. Fence/Seal wait here on _cv.
                self._cv.notify_all()

    @staticmethod
    def _drop_unsynced(s: Segment) -> None:
        """After a failed group commit, forget batches appended but not synced, so the log ends
        exactly at what is durable (a later reconcile appends from there)."""
        with s.io_lock:
            if s.log is None:
                return
            try:
                s.log.truncate(s.log.synced_end)
            except (OrdqError, OSError, ValueError) as exc:
                log.error("segment %s/%d: cannot drop unsynced batches: %s", *s.key, exc)

    def _fail_segment(self, s: Segment, error: OrdqError) -> None:
        """The disk refused a write: stop writing this segment and fail its producers (they
        fail over; nothing half-written is served because the log truncated to synced)."""
        s.replica.freeze(f"write failed: {error}")
        if s.log is not None:
            s.replica.next_offset = s.replica.local_synced  # what was dropped never existed
        for stream in self._streams:
            if any(seg is s for seg, _ in stream.pending) and stream.error is None:
                stream.error = error

    def fail_streams(self, error: OrdqError, *, only: Callable[[Segment], bool] | None = None) -> None:
        """Caller holds _cv. Fail every produce stream (that waits on a matching segment)."""
        for stream in self._streams:
            if stream.error is None and (only is None or any(only(seg) for seg, _ in stream.pending)):
                stream.error = error
        self.changed()

    def take_ready_acks(self, stream: ProduceStreamState) -> list[pb.Ack]:
        """Caller holds _cv: the acks at the head of the stream whose batches the LAC covers,
        contiguous runs merged into one ack."""
        out: list[pb.Ack] = []
        n = 0
        for s, p in stream.pending:
            if s.replica.lac < p.end_offset:
                break
            n += 1
            prev = out[-1] if out else None
            if (prev is not None and prev.seg == s.replica.seg and prev.first_offset + prev.count == p.first_offset
                    and prev.first_seq + prev.count == p.first_seq):
                prev.count += p.count
            else:
                out.append(pb.Ack(seg=s.replica.seg, first_offset=p.first_offset, first_seq=p.first_seq,
                                  count=p.count))
        if n:
            del stream.pending[:n]
            self.stats.acks += n
        return out

    # -- control --------------------------------------------------------------------------------

    def _settle(self, s: Segment) -> None:
        """Caller holds _cv: wait until every accepted batch was synced or dropped."""
        while not s.settled():
            self._cv.wait(0.5)

    def fence(self, queue: str, seg: int, epoch: int) -> pb.SegmentEnd:
        self.epochs.check(queue, epoch)
        s = self.segment_for_control(queue, seg)
        with self._cv:
            s.replica.fence(epoch)
            self._settle(s)
            end = s.end()
        _write_meta(s)
        return end

    def seal(self, queue: str, seg: int) -> pb.SegmentEnd:
        s = self.segment_for_control(queue, seg)
        with self._cv:
            s.replica.freeze("sealed")
            self._settle(s)
            s.replica.seal()
            end = s.end()
            # Producers still waiting for acks in this segment learn it is over now.
            self.fail_streams(SegmentNotWritable(self.address, queue, seg, "sealed"),
                              only=lambda x: x is s and x.replica.lac < x.replica.next_offset)
        _write_meta(s)
        return end

    def segment_info(self, queue: str, seg: int) -> pb.SegmentEnd:
        with self._cv:
            s = self._segments.get((queue, seg))
            if s is None:
                raise SegmentNotFound(queue, seg)
            return s.end()

    def reconcile(self, queue: str, seg: int, end: int) -> pb.SegmentEnd:
        """Bring this copy of a sealed segment to ``end``, ZooKeeper's (broker_group/repair.py)."""
        return self.repair.reconcile(queue, seg, end)

    # -- the read path ----------------------------------------------------------------------------

    def lease(self, holders: Sequence[str]) -> Lease:
        """A call's share of the memory budget, charged to ``holders`` (budget.holders_of)."""
        return Lease(self.budget, self.room, holders, self.address, self.read_pace)

    async def fetch(self, req: pb.FetchRequest, lease: Lease | None = None, *,
                    wait_s: float | None = None) -> Answer:
        """On the loop: whole batches from (seg, offset) up to the LAC or the sealed end,
        long-polling (on ``signal``) while nothing is readable. With a ``lease`` the answer
        is charged to it (shorter when the budget has less room; waiting up to ``wait_s``
        for room, then ResourceExhausted); the caller releases it once the answer is sent."""
        self.stats.fetches += 1
        known_end = req.known_end if req.known_end >= 0 else None
        deadline = time.monotonic() + min(req.max_wait_ms, self.config.max_fetch_wait_ms) / 1000.0
        key = (req.queue, req.seg)
        s = self._segments.get(key)
        while s is None and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self.signal.wait(left)
            s = self._segments.get(key)
        if s is None:
            return await self.loop.run_blocking(self._fetch_absent, req)
        r = s.replica
        while True:
            with self._cv:
                if s.corrupt is not None:
                    raise s.corrupt
                if (r.sealed and known_end is not None and req.offset >= r.local_synced
                        and r.local_synced < known_end):
                    self.repair.kick.set()
                    raise BrokerUnavailable(self.address, f"this copy of {req.queue}/{req.seg} holds "
                                            f"{r.local_synced} of its sealed end {known_end}; "
                                            "reconciling from the peer")
                upto = r.readable_end(known_end)
                sealed = r.sealed
            left = deadline - time.monotonic()
            if upto > req.offset or sealed or self._stopping or left <= 0:
                break
            await self.signal.wait(left)
        if upto <= req.offset:
            return encode([], offset=req.offset, end_offset=req.offset, readable_end=upto, sealed=sealed)
        max_bytes = min(max(req.max_bytes, 1), self.config.max_fetch_bytes)
        if lease is not None:
            max_bytes = await lease.acquire(max_bytes, wait_s=wait_s)
        # Read on the loop when the log is free (page cache: microseconds for what a
        # follower asks); behind a sync holding it, or for a long read, in a worker, which
        # also encodes the answer: a 32 MiB answer's join held the loop (and with it every
        # neighbour's produce and ack) for tens of ms (issue 25, the noisy-neighbour drill).
        # A sealed segment's bytes may have rotted since they were written and scanned:
        # they are CRC-checked on the way out (docs/BENCHMARKS.md, "Outbound CRC check").
        verify = sealed and self.config.verify_sealed_reads
        try:
            if upto - req.offset <= INLINE_READ_MESSAGES and s.io_lock.acquire(blocking=False):
                try:
                    batches, answer = self._answer(self._read_locked(s, req.offset, max_bytes, upto, verify),
                                                   req.offset, upto, sealed)
                finally:
                    s.io_lock.release()
            else:
                token = lease.token if lease is not None else None
                async with self._read_slot(token):
                    batches, answer, took = await self.loop.run_blocking(self._read_answer, s, req.offset,
                                                                         max_bytes, upto, sealed, verify)
                # A worker's read and encoding hold the GIL the loop needs: charged to the token
                # as its loop time is (request_time.py).
                self.request_time.charge(token, took, time.monotonic())
        except CorruptLog as exc:
            self._set_aside(s, exc)
            raise
        if lease is not None:
            lease.settle(answer.batch_bytes)
            # Its copies into gRPC and its encryption on the way out: charged as its bytes.
            rt = self.request_time
            rt.charge(lease.token, rt.config.byte_cost_s(answer.batch_bytes), time.monotonic())
        count_fetch(self.stats, batches)
        return answer

    @contextlib.asynccontextmanager
    async def _read_slot(self, token: str | None) -> AsyncIterator[None]:
        """One worker at a time builds a token's answers (the group's peers: no limit). Each
        worker building an answer takes the GIL from the loop in turns: one token's 24 Read
        streams opened at once had 8 answers built in parallel (its 32 MiB share), and the
        neighbour queue's acks waited 5-8x their quiet p99 (noisy-neighbour drill)."""
        if token is None:
            yield
            return
        slot = self._read_slots.get(token)
        if slot is None:
            slot = self._read_slots[token] = [asyncio.Lock(), 0]
        slot[1] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1] -= 1
            if not slot[1]:
                del self._read_slots[token]

    @staticmethod
    def _answer(batches: list[bytes], offset: int, upto: int, sealed: bool) -> tuple[list[bytes], Answer]:
        end = seglog.parse_header(batches[-1], verify_crc=False).end_offset if batches else offset
        return batches, encode(batches, offset=offset, end_offset=end, readable_end=upto, sealed=sealed)

    def _read_answer(self, s: Segment, offset: int, max_bytes: int, upto: int, sealed: bool,
                     verify: bool) -> tuple[list[bytes], Answer, float]:
        """In a worker: the answer, and the CPU seconds this thread spent on it."""
        t0 = time.thread_time()
        batches, answer = self._answer(self._read(s, offset, max_bytes, upto, verify), offset, upto, sealed)
        return batches, answer, time.thread_time() - t0

    def _read(self, s: Segment, offset: int, max_bytes: int, upto: int, verify: bool) -> list[bytes]:
        with s.io_lock:
            return self._read_locked(s, offset, max_bytes, upto, verify)

    @staticmethod
    def _read_locked(s: Segment, offset: int, max_bytes: int, upto: int, verify: bool) -> list[bytes]:
        if s.log is None:  # set aside as corrupt since the check
            raise s.corrupt or BrokerUnavailable("?", f"segment {s.key} is not served")
        return s.log.read(offset, max_bytes=max_bytes, upto=upto, verify_crc=verify)

    def _set_aside(self, s: Segment, exc: CorruptLog) -> None:
        """A served read found bytes that no longer match their CRC: take this copy out of
        service (every later read of it is refused with ``exc``, so readers go to the peer),
        count it, say so, and have the reconciler rebuild it from the peer (its rename keeps
        the bad file as evidence). Only a sealed copy is checked, and only a sealed one can
        be rebuilt: its end is decided in ZooKeeper."""
        with s.io_lock:  # never together with _cv (module docstring)
            if s.log is None:
                return  # set aside already (another reader found it first)
            s.log.close()
            s.log = None
        with self._cv:
            s.corrupt = exc
            s.reconciled = False
            s.replica.freeze("corrupt log")
            self.stats.corrupt_segments += 1
            self.stats.corrupt_reads += 1
            self.changed()
        log.error("segment %s/%d: a served read found corrupt bytes (%s); this copy is not served and is "
                  "being repaired from the peer", *s.key, exc)
        self.repair.kick.set()

    def _fetch_absent(self, req: pb.FetchRequest) -> Answer:
        """In a worker thread: a fetch of a segment this replica holds no copy of."""
        z, _ = self._zk_segment(req.queue, req.seg)
        if z is None or z.gid != self.config.gid:
            raise SegmentNotFound(req.queue, req.seg)
        if z.status is SegStatus.SEALED and z.end:
            # Sealed with messages, yet no copy here (this replica restarted on an empty
            # disk): the reader must go to the peer, not wait here for data that never comes.
            raise BrokerUnavailable(self.address, f"holds no copy of sealed segment {req.queue}/{req.seg} "
                                    f"({z.end} messages): read it from the peer")
        return encode([], offset=req.offset, end_offset=req.offset, readable_end=0,
                      sealed=z.status is SegStatus.SEALED and not z.end)

    # -- health ----------------------------------------------------------------------------------

    def count_refused(self, exc: OrdqError) -> None:
        with self._cv:
            self.stats.refused[type(exc).__name__] = self.stats.refused.get(type(exc).__name__, 0) + 1

    def health(self) -> pb.HealthResponse:
        with self._cv:
            stats = attrs.asdict(self.stats)
            stats["segments"] = len(self._segments)
            stats["epoch_lookups"] = self.epochs.lookups
            stats["epoch_key_refusals"] = self.epochs.key_refusals
            stats["budget"] = attrs.asdict(self.budget.stats)
            stats["request_time"] = attrs.asdict(self.request_time.stats)
            stats["corrupt"] = [f"{q}/{n}" for (q, n), s in self._segments.items() if s.corrupt is not None]
            connected = bool(self.replication is not None and self.replication.connected)
        return pb.HealthResponse(gid=self.config.gid, role=self.config.role.value, incarnation=self.incarnation,
                                 slave_connected=connected, stats_json=json.dumps(stats))


def _read_meta(directory: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((directory / META_FILE).read_text()))
    except FileNotFoundError:
        return {}
    except ValueError:
        log.warning("unreadable %s in %s: treating the segment as not sealed", META_FILE, directory)
        return {}


# One meta write at a time: concurrent Fence/Seal calls on a segment (a producer's seal and a
# consumer's at once) shared the tmp file, and the second rename failed (FileNotFoundError).
_META_LOCK = threading.Lock()


def _write_meta(s: Segment) -> None:
    """Persist fence and seal state (atomic rename, synced) before they are acted on."""
    with _META_LOCK:  # the state is read under it too, so the last write holds the latest
        r = s.replica
        _write_json_durably(s.directory / META_FILE,
                            {"fenced_epoch": r.fenced_epoch, "sealed": r.sealed, "sealed_end": r.sealed_end})


def _is_queue_folder(path: Path) -> bool:
    """Only folders this broker made count (anything else in the data folder is left alone)."""
    return path.is_dir() and ((path / INCARNATION_FILE).exists() or any(
        p.is_dir() and p.name.isdigit() for p in path.iterdir()))


def _folder_incarnation(qdir: Path) -> str | None:
    """The incarnation a queue's folder belongs to; None: no record (a folder from before
    records were kept, or none yet)."""
    try:
        return str(json.loads((qdir / INCARNATION_FILE).read_text()))
    except FileNotFoundError:
        return None


def _write_json_durably(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON: temporary file synced, renamed, folder synced."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(obj).encode())
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
