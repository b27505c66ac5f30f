"""The coordinator service (gRPC ``Coordinator``, DESIGN §5 Coordinator): the one way clients
change a queue's lists, epochs and cursors.

Guarantee: every request is checked against the caller's token for the role its RPC needs on
that queue (a peer with the broker or coordinator certificate may do anything), then applied
as the same CAS transitions of ``ordq.coordinator.state`` the daemon uses — so a refusal changes
nothing, and a request served by a coordinator that just lost its leadership only loses a CAS.
Only the elected process answers; the others refuse with ``NotCoordinatorLeader`` and the
leader's address in the ``ordq-leader`` trailer (``coordinator/client.py`` follows it).

The epoch is bound to who claimed it: Claim stores the SHA-256 of a fresh random key with the
bumped epoch in one write and returns the key to the caller only; FailOver and Roll (and the
brokers, for Produce) refuse that epoch without it.

Rules: imports ``ordq.wire`` (stubs, wire errors, the broker transport) only inside functions,
as ``coordinator/seal.py`` does, so importing this module does not load gRPC; the take-over
and fail-over steps are ``ordq.coordinator.head``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any

import attrs

from ordq.common.errors import (
    AlreadyExists,
    ConfigError,
    ConflictError,
    EpochNotIssued,
    FencedError,
    IllegalTransition,
    NoGroupAvailable,
    NotCoordinatorLeader,
    OrdqError,
    PermissionDenied,
    QueueNotFound,
)
from ordq.common.security import BROKER_CN, COORDINATOR_CN, Credentials, bearer_token, peer_common_name
from ordq.coordinator import state as sm
from ordq.coordinator.admin_api import EVERY_QUEUE, SOME, AdminCall, AdminVerbs, TextAnswer, prepare
from ordq.coordinator.client import LEADER_METADATA_KEY
from ordq.coordinator.fair_share import FairShareConfig, FairTurns, TurnRefused
from ordq.coordinator.head import NO_WRITABLE_GROUP, HeadProtocol, HeadTransport
from ordq.coordinator.lease_desk import LeaseDesk
from ordq.coordinator.leases import Kind
from ordq.coordinator.pacing import URGENT_RPCS, RequestsFirst
from ordq.coordinator.paths import check_name
from ordq.coordinator.refusal_log import RefusalLog
from ordq.coordinator.seal import run_seal
from ordq.coordinator.service_frame import FrameConfig, safe, shown
from ordq.coordinator.service_frame import no_turn as service_frame_no_turn
from ordq.coordinator.service_leases import LeaseCalls, check_lease, leader_address
from ordq.coordinator.state import Cursor, QueueState
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import requests_waited
from ordq.coordinator.store_values import roll_transition
from ordq.coordinator.token_book import TokenBook
from ordq.coordinator.tokens import ANY, TokenRecord, authorize, identify

log = logging.getLogger("ordq.coordinator.service")

# Served without waiting for a fair turn: the calls that keep a lease or a producer's writes
# going. A holder's heartbeat held past ⅔ of its ttl stops it delivering (coordinator/leases.py),
# and a Claim or FailOver may wait seconds for a writable head: in a slot, two of them stalled
# every other caller. Each is cheap to refuse (token first, then its lease or epoch key).
# Not ``Coordinators``: asked with the client certificate alone, it reads ZooKeeper (1 + one per
# coordinator) like any call, so a flood of it takes turns as any caller's (stop h).
NO_TURN = URGENT_RPCS | {"Heartbeat", "Release", "Roll"}

# RPC -> the role its caller needs on the request's queue (Roll with epoch 0 needs admin).
ROLE_OF = {"Claim": "produce", "FailOver": "produce", "Roll": "produce", "Seal": ANY, "Pop": ANY,
           "Commit": "consume", "Subscribe": "consume", "EnsureParkingQueue": "consume", "Describe": ANY}
MAX_SUBSCRIPTIONS_PER_QUEUE = 1_000  # Subscribe refuses a queue's next one (docs/SECURITY.md, Limits)
MAX_WAIT_S = 60.0  # a request's timeout_ms is capped here: a handler thread is never held longer
LONG_ADMIN_S = 2.0  # an admin call this long, from its headers to its answer, logs where its time went

# (store, queue, subscription, start words) -> (cursor, first seq it delivers or None): resolves
# a start target that needs the brokers (latest, seq N, time T); injected by the CLI
# (ordq/commands/coordinator.py) so this package does not import ordq/admin.
Subscriber = Callable[[ZkStore, str, str, Sequence[str]], tuple[Cursor, "int | None"]]


def key_hash(key: str) -> str:
    """What the state keeps of an epoch key (brokers compare the same)."""
    return hashlib.sha256(key.encode()).hexdigest()


def check_epoch_key(st: QueueState, epoch: int, key: str) -> None:
    """FencedError when ``epoch`` was superseded; EpochNotIssued when it is not the current
    one, or is but ``key`` is not the key issued with it (state from before keys: any key)."""
    if epoch < st.producer_epoch:
        raise FencedError(st.queue, epoch, st.producer_epoch)
    if epoch > st.producer_epoch:
        raise EpochNotIssued(st.queue, epoch, st.producer_epoch)
    if st.producer_key is not None and not hmac.compare_digest(key_hash(key), st.producer_key):
        raise EpochNotIssued(st.queue, epoch, st.producer_epoch, key_mismatch=True)


@attrs.define
class ServiceStats:
    calls: dict[str, int] = attrs.field(factory=dict)  # rpc -> requests
    refused: dict[str, int] = attrs.field(factory=dict)  # error type -> refusals
    not_leader: int = 0
    outcomes: dict[tuple[str, str], int] = attrs.field(factory=dict)  # (rpc, "ok" or error type) -> requests
    in_flight: int = 0  # calls in the frame now, from their headers to their answers


class _RequestsCollector:
    """``ordq_coordinator_requests_total{rpc, outcome}`` from the service's stats."""

    def __init__(self, service: CoordinatorService) -> None:
        self._service = service

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("ordq_coordinator_requests", "Coordinator service requests by outcome "
                                     "(ok, or the refusal's error type)", labels=["rpc", "outcome"])
        with self._service._stats_lock:
            outcomes = dict(self._service.stats.outcomes)
        for (rpc, outcome), n in sorted(outcomes.items()):
            family.add_metric([rpc, outcome], n)
        yield family
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily("ordq_coordinator_calls_in_flight", "Coordinator calls in the service's frame "
                                "now, from their headers to their answers (each holds a worker thread)",
                                value=self._service.stats.in_flight)
        turns = self._service.turns.stats  # plain ints, read without the turns' lock
        family = CounterMetricFamily("ordq_coordinator_turns", "Coordinator calls by their fair turn "
                                     "(coordinator/fair_share.py): served (of which waited, reserved: "
                                     "in a slot kept for callers with no other call running), refused, "
                                     "paced (held, asleep, for its caller's CPU share)",
                                     labels=["outcome"])
        for outcome in ("served", "waited", "reserved", "refused"):
            family.add_metric([outcome], getattr(turns, outcome))
        family.add_metric(["paced"], self._service.turns.request_time.stats.throttled)  # held for its CPU share
        yield family


class _Tokens:
    """The token records (a TokenBook, as the brokers' Gate): reloaded on every change of
    ``<root>/auth``; a well-formed but unknown token waits for a load made after its call
    arrived before it is refused; TokensUnavailable (retriable), not a refusal, while the
    store cannot be read."""

    def __init__(self) -> None:
        self.book = TokenBook()

    def watch(self, client: Any, root: str) -> None:
        # its first load at start rides out transient ZooKeeper errors (coordinator/zk_retry.py)
        self.book.watch(client, root)

    def check(self, context: Any, queue: str, role: str) -> TokenRecord | None:
        """The caller's record (None: tokens off, or a broker/coordinator peer); else
        PermissionDenied (TokensUnavailable when no token can be judged now)."""
        if peer_common_name(context) in (BROKER_CN, COORDINATOR_CN):
            return None
        token = bearer_token(context)
        self.book.fresh_for(token, self.book.now())  # a token created a moment ago: found
        enforced, records = self.book.current()
        if not enforced:
            return None
        if role == SOME:  # a listing: a valid token with a role on some queue (it sees those)
            rec = identify(records, token, queue, ANY)
            if not any(rec.grants.values()):
                raise PermissionDenied(queue, ANY, f"token {rec.tid} ({rec.name or 'unnamed'}) has no role")
            return rec
        return authorize(records, token, queue, role)

    def caller(self, context: Any, rpc: str) -> str:
        """On a call's headers, before its request is read: who it is charged to (its token's
        hash, else its connection); PermissionDenied when tokens are enforced and it shows no
        valid one. ``OPEN_RPCS`` excepted: such a call showing no valid token while tokens are
        enforced is charged to ``ANONYMOUS``, one caller for all of them, so that neither more
        connections nor made-up tokens buy a client certificate alone more than one share."""
        from ordq.coordinator.service_frame import ANONYMOUS, OPEN_RPCS

        token = bearer_token(context)
        if peer_common_name(context) not in (BROKER_CN, COORDINATOR_CN):
            open_call = rpc in OPEN_RPCS
            if not open_call:  # an open call is not held for a load: an unknown token is anonymous
                self.book.fresh_for(token, self.book.now())
            enforced, records = self.book.current()
            if enforced:
                try:
                    identify(records, token, "", ROLE_OF.get(rpc, ANY))
                except PermissionDenied:
                    if not open_call:
                        raise
                    return ANONYMOUS
        if token:
            return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
        return f"peer:{context.peer()}"


class CoordinatorService(LeaseCalls):
    """The ``Coordinator`` servicer and its server. ``is_leader``: whether this process is
    the elected coordinator now, its ZooKeeper connection up (the daemon's ``stats.is_leader``
    and its client's state); ``term``: its leadership term (the daemon's ``stats.term``): the
    leases of a new term are read from ZooKeeper and honoured in full (coordinator/leases.py)."""

    def __init__(self, store: ZkStore, *, is_leader: Callable[[], bool], credentials: Credentials | None = None,
                 transport: HeadTransport | None = None, subscriber: Subscriber | None = None,
                 max_workers: int | None = None, requests_first: RequestsFirst | None = None,
                 term: Callable[[], int] | None = None, frame: FrameConfig | None = None,
                 fair: FairShareConfig | None = None,
                 max_subscriptions_per_queue: int = MAX_SUBSCRIPTIONS_PER_QUEUE,
                 admin: AdminVerbs | None = None) -> None:
        """``requests_first``: shared with this process's daemon, whose idle work waits while
        an urgent request (``pacing.URGENT_RPCS``) is served (``coordinator/pacing.py``).
        ``frame``: the server's bounds (coordinator/service_frame.py); ``fair``: each caller's
        turns (coordinator/fair_share.py); ``max_subscriptions_per_queue``: Subscribe refuses a
        queue's next one (ConfigError naming the setting); ``admin``: the admin API's verbs
        (coordinator/admin_api.py; None: not served)."""
        self.store = store
        self.leases = LeaseDesk(store, term=term if term is not None else (lambda: 0))
        self.requests_first = requests_first
        self.is_leader = is_leader
        self.credentials = credentials or Credentials()
        self._transport = transport
        self._subscriber = subscriber
        self.frame = frame or FrameConfig()
        if max_subscriptions_per_queue < 1:
            raise ConfigError("max_subscriptions_per_queue must be >= 1")
        self.max_subscriptions_per_queue = max_subscriptions_per_queue
        # Each caller's fair turn (coordinator/fair_share.py), its calls charged their ZooKeeper requests.
        self.turns = FairTurns(fair, zk_requests=requests_waited)
        # Calls waiting for a turn, or a refusal, hold a worker: never all of them.
        self._max_workers = max_workers or self.turns.config.threads
        self._admin = admin
        self.stats = ServiceStats()
        self._calls_of: dict[str, int] = {}  # caller -> its calls past check_caller, not yet answered
        self._stats_lock = threading.Lock()
        self._refusal_log = RefusalLog()  # which refusals are logged (coordinator/refusal_log.py)
        self._tokens = _Tokens()
        self._frame_started = threading.local()  # .at: when this thread's call entered the frame
        self._server: Any = None
        self.address = ""
        self._pb: Any = None

    def export_metrics(self, registry: Any) -> None:
        """Serve the request counts in ``registry``: ``ordq_coordinator_requests_total{rpc,
        outcome}`` (outcome ``ok`` or the refusal's error type)."""
        registry.register(_RequestsCollector(self))

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, listen: str = "127.0.0.1:0", *, advertise: str | None = None) -> str:
        """Serve on ``listen`` (port 0: any); returns the address clients dial (``host:port``):
        ``advertise`` (HOST[:PORT]; no port: the one bound), else the listen host and the port
        bound (ordq/common/addresses.py). ConfigError when it cannot bind or advertise."""
        from ordq.common import addresses

        addresses.check(listen, advertise)
        import grpc

        from ordq.coordinator import service_frame
        from ordq.wire import ordq_pb2 as pb

        self._pb = pb
        if self._transport is None:
            from ordq.wire.client import GrpcTransport

            self._transport = GrpcTransport(credentials=self.credentials)
        self._tokens.watch(self.store.client, self.store.paths.root)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                                        thread_name_prefix="ordq-coord-rpc"),
                             options=service_frame.server_options(self.frame),
                             maximum_concurrent_rpcs=4 * self._max_workers)  # past it gRPC refuses at once
        # Every method framed (size, caller, fair turn, typed refusals) before its handler runs.
        service_frame.register(server, service_frame.framed(self, self.frame, self._tokens.caller,
                                                            self._refuse_call, self._turn, self._in_flight))
        if self.credentials.tls:
            from ordq.common.security import server_credentials

            port = server.add_secure_port(listen, server_credentials(self.credentials))
        else:
            port = server.add_insecure_port(listen)
        if port == 0:
            raise ConfigError(f"coordinator service cannot listen on {listen}")
        server.start()
        self._server = server
        self.address = addresses.advertised(listen, advertise, port)
        return self.address

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """A call in the frame (``ordq_coordinator_calls_in_flight``); when it came, per thread
        (``Admin``'s log of a long call)."""
        self._frame_started.at = time.monotonic()
        with self._stats_lock:
            self.stats.in_flight += 1
        try:
            yield
        finally:
            with self._stats_lock:
                self.stats.in_flight -= 1

    @contextlib.contextmanager
    def _turn(self, holder: str, rpc: str, read_body: Callable[[], object]) -> Iterator[None]:
        """The call's fair turn (coordinator/fair_share.py), its body read before it takes a slot;
        ``NO_TURN``: only the body read. Past ``max_calls_per_caller`` of its caller's calls in
        the service at once (whatever their stage), TurnRefused at once."""
        bound = self.turns.config.max_calls_per_caller
        with self._stats_lock:
            mine = self._calls_of.get(holder, 0)
            if mine < bound:
                self._calls_of[holder] = mine + 1
        if mine >= bound:  # held as a refused turn first: answered at once, it came back at once
            self.turns.refuse(holder, TurnRefused(holder, f"{mine} calls of this caller are in the coordinator "
                                                          f"already (at most {bound} at once)", 1_000))
        try:
            with service_frame_no_turn(holder, rpc, read_body) if rpc in NO_TURN else \
                    self.turns.turn(holder, rpc, read_body):
                yield
        finally:
            with self._stats_lock:
                left = self._calls_of.pop(holder) - 1
                if left:
                    self._calls_of[holder] = left

    def stop(self, grace_s: float = 1.0) -> None:
        self._tokens.book.close()
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        if self._transport is not None and hasattr(self._transport, "close"):
            self._transport.close()

    # -- the frame of every call ------------------------------------------------------------

    def _serve(self, rpc: str, queue: str, context: Any, handle: Callable[[TokenRecord | None], Any], *,
               role: str | None = None) -> Any:
        """Count, check the queue's name, the caller's ``role`` on it (default:
        ``ROLE_OF[rpc]``) and leadership, then ``handle(token record)``; every refusal typed on
        the wire. The frame (service_frame.py) checked the request's size and the caller's token
        before its body was read. An open call (``OPEN_RPCS``: who leads) names no queue, needs
        no token and is answered by every coordinator: only counted and typed here."""
        from ordq.coordinator.service_frame import OPEN_RPCS
        from ordq.wire.errors import abort_sync

        with self._stats_lock:
            self.stats.calls[rpc] = self.stats.calls.get(rpc, 0) + 1
        try:
            if rpc in OPEN_RPCS:
                rec = None
            else:
                if not (rpc == "Admin" and queue == EVERY_QUEUE):  # an admin verb about no one queue
                    check_name("queue", queue)  # the name rule first: nothing else sees an unchecked name
                rec = self._tokens.check(context, queue, role or ROLE_OF[rpc])  # the token before any work
                if not self.is_leader():
                    raise NotCoordinatorLeader(self._leader_address())
            first = self.requests_first if rpc in URGENT_RPCS else None
            with first.serving() if first is not None else contextlib.nullcontext():
                answer = handle(rec)
        except OrdqError as exc:
            self._refuse(rpc, queue, context, exc)
        except Exception as exc:  # noqa: BLE001 - a bug: typed, never retried by the client as a blip
            log.exception("%s %s failed", rpc, shown(queue))
            self._count(rpc, exc)
            abort_sync(context, OrdqError(f"coordinator error: {shown(repr(exc), 1024)}"))
        self._outcome(rpc, "ok")
        return answer

    def _refuse(self, rpc: str, queue: str, context: Any, exc: OrdqError) -> Any:
        """Count, log (the caller's names in their shown form only) and answer a refusal typed."""
        from ordq.wire.errors import abort_sync

        exc = safe(exc)
        self._count(rpc, exc)
        extra = ((LEADER_METADATA_KEY, exc.leader),) if isinstance(exc, NotCoordinatorLeader) else ()
        if hasattr(exc, "retry_ms"):  # a refused turn: when to ask again
            from ordq.coordinator.service_frame import RETRY_METADATA_KEY

            extra = ((RETRY_METADATA_KEY, str(exc.retry_ms)),)
        elif not isinstance(exc, NotCoordinatorLeader):
            with self._stats_lock:  # a sample of each kind: a flood of refusals is not a line each
                held = self._refusal_log.admit((rpc, type(exc).__name__), time.monotonic())
            if held is not None:
                log.info("%s %s refused: %s%s", rpc, shown(queue) if queue else "-", shown(str(exc), 1024),
                         f" ({held} more {rpc} refused {type(exc).__name__} since the last such line)"
                         if held else "")
        abort_sync(context, exc, extra)

    def _refuse_call(self, rpc: str, context: Any, exc: OrdqError) -> Any:
        """A refusal by the frame, before ``_serve`` (service_frame.py): counted as any."""
        with self._stats_lock:
            self.stats.calls[rpc] = self.stats.calls.get(rpc, 0) + 1
        self._refuse(rpc, "", context, exc)

    def _outcome(self, rpc: str, outcome: str) -> None:
        with self._stats_lock:
            self.stats.outcomes[(rpc, outcome)] = self.stats.outcomes.get((rpc, outcome), 0) + 1

    def _count(self, rpc: str, exc: BaseException) -> None:
        name = type(exc).__name__
        with self._stats_lock:
            if isinstance(exc, NotCoordinatorLeader):
                self.stats.not_leader += 1
            else:
                self.stats.refused[name] = self.stats.refused.get(name, 0) + 1
        self._outcome(rpc, name)

    def _leader_address(self) -> str:
        try:
            return leader_address(self.store.client, self.store.paths.coordinator_leader)
        except Exception:  # noqa: BLE001 - a refusal must not fail: the client re-reads the election
            return ""

    def _head(self, queue: str, timeout_ms: int) -> HeadProtocol:
        assert self._transport is not None
        wait_s = min(timeout_ms / 1000.0, MAX_WAIT_S) if timeout_ms else 10.0
        return HeadProtocol(self.store, self._transport, queue, no_group_timeout_s=wait_s)

    def _state_json(self, st: QueueState) -> bytes:
        return json.dumps(st.to_dict(), sort_keys=True).encode()

    # -- producer ---------------------------------------------------------------------------

    def Claim(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        return self._serve("Claim", request.queue, context, lambda _rec: self._claim(request))

    def _claim(self, req: Any) -> Any:
        q = req.queue
        # Only the holder of the queue's producer lease claims (issue 37). A node in the old
        # ZooKeeper election proves nothing: anyone with a token could plant one first.
        check_lease(self.leases, Kind.PRODUCER, q, "", req.generation, req.lease_key, "produce")
        key = secrets.token_urlsafe(32)
        digest = key_hash(key)
        # Epoch and key in one write: there is no moment the new epoch is usable without the key.
        st = self.store.apply(q, lambda s, _f: sm.bump_epoch(s, digest))
        epoch = st.producer_epoch
        t = self._head(q, req.timeout_ms).take_over(epoch)
        st, _ = self.store.load_state(q)
        last = t.last
        return self._pb.ClaimResponse(
            epoch=epoch, epoch_key=key, gid=t.gid, seg=t.seg, has_last=last is not None,
            last_seq=last[0] if last else -1, last_seg=last[1] if last else -1, last_offset=last[2] if last else -1,
            state_json=self._state_json(st))

    def FailOver(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("FailOver", request.queue, context, lambda _rec: self._fail_over(request))

    def _fail_over(self, req: Any) -> Any:
        q = req.queue
        st, _ = self.store.load_state(q)
        check_epoch_key(st, req.epoch, req.epoch_key)
        head = self._head(q, req.timeout_ms)
        # fail_over_from checks the epoch again on the very state its CAS writes over.
        st = head.fail_over_from(req.gid, req.seg, req.epoch)
        head.check_epoch(st, req.epoch)
        if st.open_segment is None:
            raise NoGroupAvailable(q, NO_WRITABLE_GROUP)
        return self._pb.HeadResponse(state_json=self._state_json(st))

    def Roll(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("Roll", request.queue, context, lambda rec: self._roll(request, rec))

    def _roll(self, req: Any, rec: TokenRecord | None) -> Any:
        q, epoch = req.queue, req.epoch
        st, _ = self.store.load_state(q)
        if epoch == 0:
            if rec is not None and not rec.allows(q, "admin"):
                raise PermissionDenied(q, "admin", "a roll without the producer's epoch needs the admin role")
        else:
            check_epoch_key(st, epoch, req.epoch_key)
        cfg = self.store.queue_config(q)
        roll = roll_transition(cfg, req.gid, req.seg)
        head = self._head(q, req.timeout_ms)

        def checked_roll(s: QueueState, f: sm.Facts) -> QueueState:
            if epoch:
                head.check_epoch(s, epoch)  # a deposed leader must not roll its successor's segment
            return roll(s, f)

        try:
            st = head.roll(checked_roll, req.seg)
        except IllegalTransition:
            st, _ = self.store.load_state(q)  # rolled or failed over by someone else first: follow it
        return self._pb.HeadResponse(state_json=self._state_json(st))

    # -- any role ---------------------------------------------------------------------------

    def Seal(self, request: Any, context: Any) -> Any:  # noqa: N802
        def seal(_rec: TokenRecord | None) -> Any:
            assert self._transport is not None
            st = run_seal(self.store, self._transport, request.queue, request.seg)
            return self._pb.StateResponse(state_json=self._state_json(st))

        return self._serve("Seal", request.queue, context, seal)

    def Pop(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("Pop", request.queue, context, lambda _rec: self._pop(request.queue))

    def _pop(self, queue: str) -> Any:
        # A Pop that can drop nothing (the head not sealed: an open queue's usual case) is
        # answered from one read of the state. It read every subscription's cursor, the groups'
        # liveness and drain marks first, then the state again: ~8.6 ZooKeeper requests and
        # 7 ms of the coordinator's and ZooKeeper's CPU for a call that changes nothing (issue 38).
        st, _ = self.store.load_state(queue)
        if sm.may_pop(st):
            try:
                st = self.store.apply(queue, lambda s, f: sm.pop(s, f))
            except IllegalTransition:
                st, _ = self.store.load_state(queue)  # nothing to pop: the state as it is
        return self._pb.StateResponse(state_json=self._state_json(st))

    # -- consumer ---------------------------------------------------------------------------

    def Commit(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("Commit", request.queue, context, lambda _rec: self._commit(request))

    def _commit(self, req: Any) -> Any:
        q, sub = req.queue, req.subscription
        check_name("subscription", sub)
        try:
            cursor = Cursor.from_dict(json.loads(req.cursor_json))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"bad cursor: {exc}") from exc
        # Only the holder of the subscription's consumer lease commits (issue 37): the write is
        # conditional on the lease node's version, so a successor's grant fences it.
        _who, lease_version = check_lease(self.leases, Kind.CONSUMER, q, sub, req.generation, req.lease_key,
                                          "consume")
        holder = (self.store.paths.lease(Kind.CONSUMER.value, q, sub), lease_version)
        current, version, st = self.store.cursor_and_state(q, sub)  # one round trip
        if version != req.version:
            raise ConflictError(f"cursor of {q}/{sub} moved since version {req.version}")
        sm.check_commit(st, sub, current, cursor)
        # The write itself is conditional on the version and on the holder's node existing.
        new_version = self.store.commit_cursor(q, sub, cursor, version, holder=holder)
        return self._pb.CommitResponse(version=new_version)

    def Subscribe(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._serve("Subscribe", request.queue, context, lambda _rec: self._subscribe(request))

    def _subscribe(self, req: Any) -> Any:
        q, sub = req.queue, req.subscription
        check_name("subscription", sub)
        words = list(req.start) or ["earliest"]
        # One that exists is refused on one read (issue 38, stop e): creating it again wrote a
        # transaction (the state and the cursor) that ZooKeeper's leader refused, ~5 requests
        # and 6.6 ms of the coordinator's and ZooKeeper's CPU for a call that changes nothing.
        if self.store.has_subscription(q, sub):  # False on a queue that does not exist
            raise AlreadyExists(f"subscription {sub!r} of queue {q!r} already exists")
        # Counted, not listed (a stat read; a queue at its bound has 1,000 names to decode): a
        # flood of Subscribe past the bound kept a turn ~10x longer listing them (issue 38).
        count = self.store.subscription_count(q)  # QueueNotFound
        if count >= self.max_subscriptions_per_queue:
            raise ConfigError(f"queue {q!r} has {count} subscriptions, the most a queue may have "
                              f"(coordinator setting max_subscriptions_per_queue); delete one first")
        if self._subscriber is not None:
            cursor, starts_at = self._subscriber(self.store, q, sub, words)
        elif words == ["earliest"]:
            cursor, starts_at = self.store.create_subscription(q, sub, at="earliest"), None
        else:
            raise ConfigError(f"this coordinator resolves only the start 'earliest', not {' '.join(words)!r}")
        return self._pb.SubscribeResponse(cursor_json=json.dumps(cursor.to_dict()).encode(),
                                          starts_at=-1 if starts_at is None else starts_at)

    def EnsureParkingQueue(self, request: Any, context: Any) -> Any:  # noqa: N802
        def ensure(_rec: TokenRecord | None) -> Any:
            q, sub = request.queue, request.subscription
            check_name("subscription", sub)
            self.store.get_cursor(q, sub)  # only a subscription that exists parks: SubscriptionNotFound
            target = f"{q}.parked.{sub}"
            try:
                self.store.queue_config(target)
            except QueueNotFound:
                st, _ = self.store.load_state(q)  # QueueNotFound for Q itself
                try:
                    self.store.create_queue(target, list(st.groups))
                except AlreadyExists:
                    pass  # created meanwhile
            return self._pb.QueueRef(queue=target)

        return self._serve("EnsureParkingQueue", request.queue, context, ensure)

    # -- the admin API --------------------------------------------------------------------------

    def Admin(self, request: Any, context: Any) -> Any:  # noqa: N802
        """An admin verb (coordinator/admin_api.py): its arguments bounded before they are
        parsed, the caller's token checked for the verb's role before its handler runs."""
        try:
            spec, args, queue = prepare(self._admin, request.verb, request.args_json)
            if spec.needs_tls and not self.credentials.tls:
                raise ConfigError(f"{request.verb}: this cluster is plaintext (--insecure), which takes no tokens: "
                                  "its coordinators carry none, so the brokers would refuse their Fence and Seal "
                                  "(docs/SECURITY.md); make tokens on a TLS cluster")
        except OrdqError as exc:
            refusal = exc

            def refuse(_rec: TokenRecord | None) -> Any:
                raise refusal

            return self._serve("Admin", EVERY_QUEUE, context, refuse, role=SOME)

        def handle(rec: TokenRecord | None) -> Any:
            began = time.monotonic()
            result = spec.handler(AdminCall(self.store, args, rec))
            if spec.changes_tokens:  # a load started after the change: the caller's next call is judged on it
                self._tokens.book.fresh_after(self._tokens.book.now()).result(timeout=MAX_WAIT_S)
            handled = time.monotonic()
            text = b""
            if isinstance(result, TextAnswer):
                result, text = result.data, result.text.encode()
            answer = self._pb.AdminResponse(result_json=json.dumps(result).encode(), text=text)
            done = time.monotonic()
            framed = getattr(self._frame_started, "at", began)
            if done - framed >= LONG_ADMIN_S:  # where a long one went, to the moment gRPC takes its answer
                log.info("Admin %s: %.1f s from its headers to its answer: %.2f s before its handler (its body, "
                         "a turn), the handler %.2f s, its answer (%d bytes of JSON, %d of text) made in %.2f s",
                         shown(request.verb), done - framed, began - framed, handled - began,
                         len(answer.result_json), len(text), done - handled)
            return answer

        return self._serve("Admin", queue, context, handle, role=spec.role)
