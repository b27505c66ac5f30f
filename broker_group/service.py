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

The parts, each in its module: the segments held and the data folder (segments.py), the write
path (write_path.py), the read path (read_path.py), control calls (control.py), replication
(replication.py), reconciliation and repair (repair.py), the gRPC handlers (dataplane.py),
metrics (metrics.py); what they share is in shared.py. This module starts, wires and stops them.

Threads: every gRPC call runs on one asyncio loop (ordq/common/loop.py; the handlers are in
broker_group/dataplane.py): a produce request is checked, placed and forwarded to the slave
in the loop, one sync thread group-commits the master's copy and wakes the loop, the
replication reader releases acks on the loop, the slave appends, syncs and answers on its
loop. Nothing else stands between a request and its ack. Blocking work (ZooKeeper reads, a
segment's creation, Fence/Seal/Reconcile) runs in the loop's worker threads, as does the
reconciler (broker_group/repair.py). Shared state is guarded by one condition variable
(``Shared.cv``, never waited on in the loop; ``changed()`` wakes thread and loop waiters alike);
a segment's log file by its own ``io_lock`` (held across a sync, never together with ``cv``
waiting on it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import attrs
import grpc
from kazoo.protocol.states import KazooState

from ordq.broker_group import lean_link
from ordq.broker_group import log as seglog
from ordq.broker_group.auth import CLUSTER_CNS, Gate
from ordq.broker_group.budget import tune_malloc
from ordq.broker_group.config import LINK_PORT_OFFSET, BrokerConfig, server_options
from ordq.broker_group.control import Control
from ordq.broker_group.dataplane import Parts, add_servicer
from ordq.broker_group.finder import Finder
from ordq.broker_group.lean_produce import LeanProduceServer
from ordq.broker_group.loop_lag import LoopLagProbe
from ordq.broker_group.metrics import BrokerMetrics
from ordq.broker_group.mount_options import online_discard_warning
from ordq.broker_group.quorum_probe import QuorumProbe
from ordq.broker_group.read_path import ReadPath
from ordq.broker_group.repair import Repairer
from ordq.broker_group.replica import Role
from ordq.broker_group.replication import ReplicationLink, frame_limit, replicate_requests
from ordq.broker_group.request_time import RequestTime
from ordq.broker_group.segments import SegmentStore
from ordq.broker_group.shared import Shared
from ordq.broker_group.token_calls import OpenCalls
from ordq.broker_group.write_path import WritePath
from ordq.common import addresses
from ordq.common.errors import AlreadyExists, ConfigError, OrdqError
from ordq.common.security import server_credentials
from ordq.common.version import VERSION
from ordq.coordinator.store import WATCH_SESSION_S, ZkStore
from ordq.coordinator.store_base import close_all
from ordq.coordinator.zk_retry import START_BOUND_S, retry_zk
from ordq.wire import lean_produce
from ordq.wire import ordq_pb2 as pb

log = logging.getLogger("ordq.broker")
T = TypeVar("T")


class StartSteps:
    """How long each step of a start took, as one line: ``done(name)`` ends the step begun
    when the previous one ended."""

    def __init__(self) -> None:
        self.began = self._last = time.monotonic()
        self.steps: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.steps.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {took:.2f} s" for name, took in self.steps)
        return f"{self._last - self.began:.2f} s ({parts})"


class Broker:
    """One broker process: its parts, wired; ``start()`` serves, ``stop()`` ends."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.shared = Shared(config)
        self.segments = SegmentStore(self.shared)
        self.finder = Finder(self.shared)  # key and time indexes, the Find RPC (finder.py)
        self.repair = Repairer(self.shared, self.segments, on_sealed=self.finder.sealed)
        self.request_time = RequestTime(config.request_time)  # each token's share of the loop
        self.read = ReadPath(self.shared, self.segments, self.repair.kick, self.request_time)
        # broker_group/metrics.py: served by ``ordq broker run --metrics``
        self.metrics = BrokerMetrics(self.shared, self.read.budget, self.request_time, lambda: self.write.replication)
        self.write = WritePath(self.shared, self.segments, self.metrics.fsync_seconds)
        self._quorum_probe: QuorumProbe | None = None
        self.control = Control(self.shared, self.segments, self.write, on_sealed=self.finder.sealed)
        self.gate = Gate(tls=config.credentials.tls)  # who may call what (broker_group/auth.py)
        self.parts = Parts(shared=self.shared, gate=self.gate, write=self.write, read=self.read,
                           control=self.control, repair=self.repair, request_time=self.request_time,
                           health=self.health, finder=self.finder, calls=OpenCalls(config.max_calls_per_token))
        self._server: grpc.aio.Server | None = None
        self._lean: lean_link.LeanServer | None = None  # a slave's end of the lean replication link
        self._lean_address: str | None = None
        self._produce_link: LeanProduceServer | None = None  # the lean link of producers and readers (issue 39)
        self._produce_address: str | None = None
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        return self.shared.address

    @property
    def incarnation(self) -> str:
        return self.shared.incarnation

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> str:
        """Recover the data folder, serve, register liveness; return the bound address."""
        cfg = self.config
        # Each step before serving, timed into one log line (issue 43: a start at 10^5 queues
        # took minutes, and which step held it was guessed from other lines' timestamps).
        steps = StartSteps()
        seglog.private_dir(cfg.data_dir)  # data at rest: the broker's user only (docs/SECURITY.md)
        tune_malloc()  # freed answers go back to the system (budget.py)
        # Every ZooKeeper step of the start rides out transient errors for a bounded time
        # (coordinator/zk_retry.py): one ConnectionLoss on a busy machine must not stop a broker.
        store = self._retry(lambda: ZkStore.connect(cfg.zk_hosts, cfg.root, timeout_s=cfg.zk_session_timeout_s,
                                                    auth=cfg.credentials.zk_auth, daemon=True),
                            "connect to ZooKeeper")
        self.shared.store = store
        # free_space's state watches (one per queue folder held: ~33,000 at 10^5 queues) on a
        # session of their own, not the one that holds this broker's liveness (WATCH_SESSION_S
        # says why: a slave after its master's return at 10^5); its loss costs a full scan.
        self.shared.watch_session = self._retry(
            lambda: ZkStore.connect(cfg.zk_hosts, cfg.root, timeout_s=WATCH_SESSION_S,
                                    auth=cfg.credentials.zk_auth, daemon=True),
            "connect to ZooKeeper (the watch session)")
        self._retry(lambda: store.get_group(cfg.gid), "read the group")  # GroupNotFound before we serve anything
        self._retry(self.segments.load_folder, "read the queues for the data folder's record")
        steps.done("zookeeper")
        self.segments.recover()
        steps.done(f"recover {len(self.shared.segments)} segments")
        try:
            # A deleted queue's or popped segments are set aside before anything is served; their
            # files go in the repair thread's rounds (segments.py, ``finish_removals``), as do
            # what removals cut short left (``recover``).
            self.segments.free_space()
            if self.segments.set_aside_count():
                log.info("%d folders of popped segments or deleted queues set aside; their files go once serving",
                         self.segments.set_aside_count())
        except OrdqError as exc:
            log.warning("freeing the space of deleted queues and popped segments deferred: %s", exc)
        steps.done("free space")
        if (warning := online_discard_warning(cfg.data_dir)) is not None:
            log.warning("%s", warning)
        self.gate.watch(store.client, cfg.root)  # tokens loaded before anything is served
        steps.done("tokens")
        self.shared.loop.start()
        self.shared.loop.call_soon(LoopLagProbe(self.shared.loop.loop, self.metrics.loop_lag_seconds).start)
        try:
            port = self.shared.loop.run(self._bind())
            if port == 0:
                raise ConfigError(f"cannot listen on {cfg.listen}")
            self.shared.address = addresses.advertised(cfg.listen, cfg.advertise, port)
            self._retry(self._wait_role_free, "wait for the role to be free")
            assert self._server is not None
            self.shared.loop.run(self._server.start())
            if cfg.role is Role.MASTER:
                self._spawn(self.write.sync_loop, "ordq-sync")
            if cfg.role is Role.MASTER:
                self.write.replication = ReplicationLink(self.shared, self.write)
                self.write.replication.start()
            if lean_produce.wanted():
                # Unless ORDQ_PRODUCE_LINK=grpc: the lean link of producers and readers (a master's
                # produce streams, a slave's synced-end watches, Read streams)
                self._produce_link = LeanProduceServer(self.parts, cfg.credentials,
                                                       handshake_timeout_s=cfg.handshake_timeout_ms / 1000)
                if cfg.role is Role.MASTER:
                    self._produce_address = self._serve_link(self._produce_link, "produce")
            if cfg.role is Role.SLAVE and lean_link.wanted():
                # One port: the master's replication, and the clients' connections beside it
                clients = self._produce_link.serve if self._produce_link is not None else None
                self._lean = lean_link.LeanServer(
                    cfg.credentials, CLUSTER_CNS, frame_limit(self.shared),
                    lambda requests, send: replicate_requests(self.shared, self.write, requests, send),
                    self.shared.count_refused, handshake_timeout_s=cfg.handshake_timeout_ms / 1000, clients=clients)
                self._lean_address = self._serve_link(self._lean, "replication")
                if clients is not None:
                    self._produce_address = self._lean_address
            steps.done("serve")
            self._retry(self._register, "register liveness")
            steps.done("register")
            log.info("started: %s", steps)
            # Reconciliation, and the removals the start left for later, once serving
            self._spawn(self.repair.run, "ordq-reconcile")
            self._spawn(self.shared.disk_room.run, "ordq-disk-room")
            self.shared.quorum_heard(time.monotonic())  # registering went through the quorum
            store.client.add_listener(self._on_zk_state)
            if cfg.role is Role.MASTER:  # only a master's writes are guarded
                self._quorum_probe = QuorumProbe(self.shared, store.client)
                self._spawn(self._quorum_probe.run, "ordq-quorum-probe")
            # a deleted queue: free at once
            self._retry(lambda: store.watch_queue_list(lambda _queues: self.repair.kick.set()), "watch the queues")
        except BaseException:
            self.stop()
            raise
        return self.shared.address

    def _retry(self, call: Callable[[], T], what: str, *, bound_s: float = START_BOUND_S) -> T:
        """``call()`` with transient ZooKeeper errors retried for ``bound_s`` (not past a stop)."""
        cfg = self.config
        return retry_zk(call, f"broker {cfg.gid}/{cfg.role.value}: {what}", bound_s=bound_s, hosts=cfg.zk_hosts,
                        stopped=lambda: self.shared.stopping)

    async def _bind(self) -> int:
        """On the loop: the gRPC server with every handler (broker_group/dataplane.py), bound."""
        cfg = self.config
        self._server = grpc.aio.server(options=server_options(cfg), maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
        add_servicer(self.parts, self._server)
        if cfg.credentials.tls:
            return self._server.add_secure_port(cfg.listen, server_credentials(cfg.credentials))
        return self._server.add_insecure_port(cfg.listen)

    def _serve_link(self, server: lean_link.TaskServer, what: str) -> str | None:
        """Bind this broker's lean link (``link_listen``, else the gRPC port + LINK_PORT_OFFSET)
        and return the address to publish for it. A default port that is taken or past 65535
        leaves the link off (logged; clients use gRPC); an explicit ``link_listen`` that cannot
        be bound stops the start (ConfigError)."""
        cfg = self.config
        bind = cfg.link_bind()
        if bind is None:
            log.warning("no lean %s link: the gRPC port + %d is no port (set link_listen); clients use gRPC",
                        what, LINK_PORT_OFFSET)
            return None
        host, port = addresses.split_host_port(bind)
        try:
            bound = self.shared.loop.run(server.start(host, port or 0))
        except OSError as exc:
            if cfg.link_listen is not None:
                raise ConfigError(f"cannot listen on link_listen {bind}: {exc}") from exc
            log.warning("no lean %s link: cannot listen on %s (%s; set link_listen); clients use gRPC", what, bind,
                        exc)
            return None
        return cfg.link_advertised(self.shared.address, bound)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _register(self) -> None:
        store = self.shared.require_store()
        full = self.shared.disk_room.full
        store.register_live(self.config.gid, self.config.role.value, self.shared.address, self.shared.incarnation,
                            replication=self._lean_address, produce=self._produce_address, disk_full=full)
        self.shared.disk_room.registered(full)

    def _wait_role_free(self) -> None:
        """Before serving: wait (up to ``register_wait_s``) while another process is live in
        this role. A killed predecessor's node goes when its ZooKeeper session expires; a live
        process keeps it, and we stop with AlreadyExists, having served nothing."""
        cfg = self.config
        store = self.shared.require_store()
        if store.wait_not_live(cfg.gid, cfg.role.value, timeout_s=0):
            return
        log.warning("%s/%s is still live in ZooKeeper (a previous process's session not yet expired?); "
                    "waiting up to %.0f s for it to go", cfg.gid, cfg.role.value, cfg.register_wait_s)
        if not store.wait_not_live(cfg.gid, cfg.role.value, timeout_s=cfg.register_wait_s):
            raise AlreadyExists(f"a {cfg.role.value} of group {cfg.gid!r} is already live (another process "
                                f"holds the role; waited {cfg.register_wait_s:g} s for it to go)")
        log.info("%s/%s: the previous process's session expired; starting", cfg.gid, cfg.role.value)

    def _on_zk_state(self, state: str) -> None:
        # The session guard: a master takes no write while ZooKeeper has been silent for a
        # third of the session (Shared.session_doubtful) unless kazoo reconnects on the same
        # session meanwhile (a write waits for that, WritePath.confirm_session), nor after its
        # session was lost until it registered again; its segments then fail over (the
        # coordinator already moved writes on when the session expired). kazoo calls this in
        # its connection thread, in the order the states came: a reconnect after an expiry
        # comes as LOST, then CONNECTED on the new session.
        shared = self.shared
        now = time.monotonic()
        with shared.cv:
            since = shared.zk_silent_since
            if state == KazooState.CONNECTED and since is not None and not shared.zk_session_lost:
                # kazoo resumes a session only if ZooKeeper still holds it: it was alive just now.
                shared.zk_silent_since = None
                log.info("ZooKeeper connection back, same session, %.2f s after it was suspended", now - since)
            elif state != KazooState.CONNECTED and since is None:
                shared.zk_silent_since = now
                if not shared.stopping:
                    log.info("ZooKeeper connection %s", state.lower())
            if state == KazooState.LOST:
                shared.zk_session_lost = True
            shared.changed()  # writes waiting for the session's fate (WritePath.confirm_session)
        # The ephemeral liveness node dies with an expired session: register again once a
        # new session is up (in a thread: kazoo forbids blocking calls in listeners). Not
        # when this process closed the session itself: it is stopping.
        if state == KazooState.LOST and not shared.stopping:
            if self.write.replication is not None:
                with shared.cv:
                    self.write.freeze_writable("the ZooKeeper session expired")

            def again() -> None:
                try:
                    self._retry(self._register, "register liveness again after a lost session", bound_s=60.0)
                except OrdqError as exc:
                    log.error("%s", exc)
                    return
                with shared.cv:
                    shared.zk_session_lost = False
                    shared.zk_silent_since = None
                    shared.changed()
                log.info("re-registered liveness after a lost ZooKeeper session")

            threading.Thread(target=again, daemon=True).start()

    def stop(self) -> None:
        if self._quorum_probe is not None:
            self._quorum_probe.stop()
        self.shared.disk_room.stop()
        with self.shared.cv:
            self.shared.stopping = True
            self.shared.changed()
            self.write.stop()
        self.gate.book.close()
        if self.write.replication is not None:
            self.write.replication.stop()
        if self._lean is not None:
            try:
                self.shared.loop.run(self._lean.stop(), timeout_s=5)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("stopping the replication link: %r", exc)
        if self._produce_link is not None:
            try:
                self.shared.loop.run(self._produce_link.stop(), timeout_s=5)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("stopping the produce link: %r", exc)
        if self._server is not None:
            try:
                self.shared.loop.run(self._server.stop(grace=0.5), timeout_s=10)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("stopping the gRPC server: %r", exc)
        self.shared.loop.stop()
        self.repair.kick.set()
        self.finder.stop()
        # The sessions first: a thread in a ZooKeeper call (a reconcile round's reads) ends with
        # the session, not at its call's timeout (5 s a thread while ZooKeeper does not answer)
        close_all([self.shared.watch_session, self.shared.store])
        for t in self._threads:
            t.join(timeout=5)
        # A copy taken under the lock: a repair round still running (its join timed out) may
        # drop segments meanwhile (scale43f's 10^5 run: "dictionary changed size during
        # iteration" ended a slave's `ordq down` with a traceback).
        with self.shared.cv:
            held = list(self.shared.segments.values())
        for s in held:
            if s.log is not None:
                with s.io_lock:
                    s.log.close()
        self.segments.book.close()

    # -- health ----------------------------------------------------------------------------------

    def health(self) -> pb.HealthResponse:
        with self.shared.cv:
            stats = attrs.asdict(self.shared.stats)
            stats["segments"] = len(self.shared.segments)
            stats["epoch_lookups"] = self.write.epochs.lookups
            stats["epoch_key_refusals"] = self.write.epochs.key_refusals
            stats["budget"] = attrs.asdict(self.read.budget.stats)
            stats["request_time"] = attrs.asdict(self.request_time.stats)
            stats["token_calls"] = self.parts.calls.statistics()
            stats["corrupt"] = [f"{q}/{n}" for (q, n), s in self.shared.segments.items() if s.corrupt is not None]
            # the session guard: why a master would hold writes now ("" if it would not), how many wait
            stats["session_doubt"] = self.shared.session_doubtful(time.monotonic()) or ""
            stats["session_waiting"] = self.shared.session_waiting
        stats["index"] = self.finder.statistics()
        stats["version"] = VERSION  # `ordq status` shows each process's
        with self.shared.cv:
            connected = bool(self.write.replication is not None and self.write.replication.connected)
        return pb.HealthResponse(gid=self.config.gid, role=self.config.role.value, incarnation=self.shared.incarnation,
                                 slave_connected=connected, stats_json=json.dumps(stats))
