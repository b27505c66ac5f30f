"""The client of the coordinator service (``coordinator/service.py``): how producers and
consumers ask for claims, failovers, rolls, seals, pops, commits, subscriptions.

Guarantee: a call reaches the elected coordinator or fails typed by its own deadline. The
leader's address is the part after the last '@' of the first contender of
``<root>/coordinator/leader`` (ZooKeeper reads are open to every client); it is cached, a
follower's ``ordq-leader`` answer is followed, and a coordinator that does not answer
(UNAVAILABLE, DEADLINE_EXCEEDED without an ordq error) makes the client read the election
again and retry until the deadline — so a killed leader stalls a caller for about one
election. A call unanswered for ``_ELECTION_CHECK_S`` reads the election (then again as often;
in bootstrap mode it asks the other coordinators, never the one serving the call): once it
names another leader the call is cancelled and sent there, so a leader behind a partition,
which never answers nor refuses, stalls a caller for about one election too.
A transient refusal (the coordinator's own ZooKeeper connection reconnecting:
CoordinationUnavailable; its token store unreadable: TokensUnavailable) is retried with the same
backoff until the deadline, as a leader change is. Every request is safe to send twice: the
service applies conditional transitions (a FailOver or Roll already done is followed, a Commit
already written is a ConflictError).

Rules: ``ordq.wire`` (the generated stubs, the wire errors) is imported only inside functions,
so importing this module does not load gRPC.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ordq.common.client_tls import StubCache, TlsFiles, channel, token_metadata
from ordq.common.errors import ConfigError, CoordinationUnavailable, NotCoordinatorLeader, TokensUnavailable

# An admin command (``ordq queue list``) makes a client, asks who leads and sends one Admin call:
# none of attrs, the queue state's classes, the paths, nor the values the other calls answer with
# (issue 42: 0.25 s of CPU). Those are imported where a call needs them; the values
# (``client_values``) on first use of their names here (``__getattr__`` below).
if TYPE_CHECKING:
    from ordq.coordinator.client_values import Claimed as Claimed
    from ordq.coordinator.client_values import Described as Described
    from ordq.coordinator.client_values import Held as Held
    from ordq.coordinator.client_values import Refusal as Refusal
    from ordq.coordinator.paths import Paths
    from ordq.coordinator.state import Cursor, QueueState

_VALUES = frozenset({"Claimed", "Described", "Held", "Refusal"})


def __getattr__(name: str) -> Any:
    if name in _VALUES:  # ``from ordq.coordinator.client import Held``, as before they moved
        from ordq.coordinator import client_values

        return getattr(client_values, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

DEFAULT_TIMEOUT_S = 10.0
_RETRY_PAUSE_S = (0.02, 0.05, 0.1, 0.2)  # between attempts while no coordinator answers
_ELECTION_CHECK_S = 0.5  # a call unanswered this long reads the election again (then every as long)
_ASK_TIMEOUT_S = 2.0  # bootstrap mode: one coordinator's answer to "who leads"


class _Moved:
    """``_answer``: another coordinator leads now (``leader``, as the election named it)."""

    def __init__(self, leader: str) -> None:
        self.leader = leader


# The trailer in which a follower names the leader (coordinator/service.py sets it). Here, not
# imported from the service: that would load the whole coordinator, kazoo included, into clients.
LEADER_METADATA_KEY = "ordq-leader"


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """The coordinator addresses of a bootstrap list ("host:port,host:port" or a sequence);
    ConfigError when it names none or one is not host:port."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out: list[str] = []
    for item in (i.strip() for i in items):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"bad coordinator address {item!r} in the bootstrap list: expected host:port")
        if item not in out:
            out.append(item)
    if not out:
        raise ConfigError("the bootstrap list names no coordinator (host:port[,host:port...])")
    return out


class CoordinatorClient:
    """Calls to the elected coordinator. Thread-safe; ``close()`` closes the channels.

    Found either from ``bootstrap`` (coordinator addresses, as Kafka's ``bootstrap.servers``:
    any of them names the others and the leader, ``Coordinators``; clients hold no ZooKeeper
    session) or, for the processes that are the cluster, from ``zk``: a ZkStore, or a kazoo
    client (then give ``paths``) — only read, to find the leader. ``credentials``: TLS files
    and token, as for the brokers."""

    def __init__(self, zk: Any = None, paths: Paths | None = None, credentials: TlsFiles | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, bootstrap: str | Sequence[str] | None = None) -> None:
        if (zk is None) == (bootstrap is None):
            raise TypeError("CoordinatorClient needs either zk or bootstrap")
        self._zk = getattr(zk, "client", zk)
        paths = paths or getattr(zk, "paths", None)
        if zk is not None and paths is None:
            raise TypeError("CoordinatorClient needs paths with a kazoo client")
        self.paths = paths
        self._known = parse_bootstrap(bootstrap) if bootstrap is not None else []
        self._bootstrap = list(self._known)
        self._next = 0  # where the next look for the leader starts in ``_known``
        if credentials is None:
            from ordq.common.security import Credentials

            credentials = Credentials()
        self.credentials: Any = credentials
        self.timeout_s = timeout_s
        self._md = token_metadata(self.credentials)
        self._leader: str | None = None
        self._stubs: StubCache[Any, Any] = StubCache(self._open_channel, self._make_stub, "coordinator client")
        self.resolves = 0  # election reads (tests: how often the leader was looked up)
        self.named = 0  # answers to "who leads" that named a leader (bootstrap mode)

    def close(self) -> None:
        for ch in self._stubs.close():
            ch.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- finding the leader and calling it ------------------------------------------------------

    def leader(self, until: float | None = None) -> str:
        """The elected coordinator's address as the election says now ("" when none leads, or
        none said by ``until``, a ``time.monotonic()`` time: a call's giving up)."""
        self.resolves += 1
        if self._zk is None:
            # The next call goes there without asking again (issue 42: an admin command asked
            # twice, once to say it was connecting and once for its call).
            found = self._ask_leader(until=until)
            if found:
                self._leader = found
            return found
        from ordq.coordinator.service_leases import leader_address

        assert self.paths is not None
        try:
            return leader_address(self._zk, self.paths.coordinator_leader, timeout_s=_bounded(_ASK_TIMEOUT_S, until))
        except Exception:  # noqa: BLE001 - ZooKeeper away: the caller retries until its deadline
            return ""

    def _ask_leader(self, skip: str = "", timeout_s: float = _ASK_TIMEOUT_S, until: float | None = None) -> str:
        """Bootstrap mode: ask the known coordinators in turn (but ``skip``) who contends (the
        leader first), each for ``timeout_s`` at most and all by ``until``; the first answer also
        refreshes the known list. "" when none answers.

        Why ``until``: with every coordinator stopped (SIGSTOP: each accepts and never answers)
        a consumer's Describe of 2 s asked each of two for 2 s first; its main thread, away
        4 s, came back to its Read stream past that stream's deadline, and it read from the
        other replica with a warning every 5 s, the brokers healthy (stop 98)."""
        from ordq.wire.admin_messages import COORDINATORS_REQUEST

        known = list(self._known)
        for i in range(len(known)):
            address = known[(self._next + i) % len(known)]
            if address == skip:
                continue
            each = _bounded(timeout_s, until)
            if each <= 0:
                break
            try:
                res = self._stub(address).Coordinators(COORDINATORS_REQUEST, timeout=each, metadata=self._md)
            except Exception:  # noqa: BLE001 - down or not serving: the next one
                continue
            self._next = (self._next + i) % len(known)
            answered = [a for a in res.addresses if a]
            self._known = answered + [a for a in self._bootstrap if a not in answered]
            self.named += bool(answered)
            return answered[0] if answered else ""
        self._next = (self._next + 1) % max(len(known), 1)
        return ""

    @property
    def coordinators(self) -> list[str]:
        """The coordinator addresses this client knows (bootstrap mode), the leader first once asked."""
        return list(self._known)

    def _open_channel(self, address: str) -> Any:
        from ordq.wire.framing import GRPC_OPTIONS

        # A connection of its own: gRPC shares one between channels alike (plaintext ones, to the
        # same address) unless told not to, and the coordinator bounds the calls in flight on
        # each (``FrameConfig.max_streams_per_connection``): every client of a process would
        # have shared one bound.
        return channel(address, self.credentials, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])

    @staticmethod
    def _make_stub(ch: Any) -> Any:
        return _Stub(ch)

    def _stub(self, address: str) -> Any:
        return self._stubs.get(address)

    def _call(self, method: str, request: Any, timeout_s: float | None, reach_s: float | None = None) -> Any:
        """``method`` on the leader. ``reach_s`` (bootstrap mode): while no leader is known the
        request goes as it is to a known coordinator (a follower's refusal names the leader: one
        round trip, not a "who leads" and then the call, issue 42), and the call gives up after
        ``reach_s`` unless a coordinator has answered by then (anything: the call's answer, a
        refusal, a leader named), however long ``timeout_s`` lets an answer take."""
        import grpc

        from ordq.wire.errors import METADATA_KEY, from_rpc_error

        now = time.monotonic()
        deadline = now + (timeout_s if timeout_s is not None else self.timeout_s)
        reach = Reach(self, now + reach_s) if reach_s is not None and self._zk is None else None
        address = self._leader
        if not address and reach is not None and self._known:
            address = self._known[self._next % len(self._known)]  # presumed; its answer says
        attempt = 0
        last: BaseException | None = None

        def pause(seconds: float) -> None:  # a pause between attempts, never past the call's giving up
            give_up = reach.give_up_at(deadline) if reach is not None else deadline
            time.sleep(min(seconds, max(give_up - time.monotonic(), 0)))

        while True:
            left = (reach.give_up_at(deadline) if reach is not None else deadline) - time.monotonic()
            if left <= 0:
                raise CoordinationUnavailable(f"no coordinator answered {method} in time"
                                              + (f" (last: {last})" if last else "")) from last
            left = deadline - time.monotonic()
            if not address:
                address = self.leader(until=reach.give_up_at(deadline) if reach is not None else deadline)
                if not address:
                    last = CoordinationUnavailable("no coordinator leads (the election is empty)")
                    pause(_RETRY_PAUSE_S[min(attempt, 3)])
                    attempt += 1
                    continue
            try:
                with self._stubs.closed_calls():  # closed under a lease's renewal (sdk/_lease_client.py)
                    call = getattr(self._stub(address), method).future(request, timeout=left, metadata=self._md)
                answer = self._answer(call, address, reach)
                if isinstance(answer, _Moved):
                    last = CoordinationUnavailable(f"coordinator {address} was replaced while the call was in flight")
                    self._leader = address = answer.leader  # sent there, not asked again who leads
                    continue
                self._leader = address
                return answer
            except grpc.RpcError as exc:
                trailing = dict(exc.trailing_metadata() or ())
                code = exc.code()
                if METADATA_KEY in trailing:
                    err = from_rpc_error(exc, address)
                    if reach is not None and (not isinstance(err, NotCoordinatorLeader) or err.leader):
                        reach.heard = True  # alive, and it knows the cluster: no more a question of reaching one
                    if isinstance(err, TokensUnavailable) or (isinstance(err, CoordinationUnavailable)
                                                              and not isinstance(err, NotCoordinatorLeader)):
                        # Its token store is unreadable, or its own ZooKeeper connection is
                        # reconnecting, for a moment: not a refusal; again, with the backoff,
                        # until the deadline (then CoordinationUnavailable naming it).
                        last = err
                        pause(_RETRY_PAUSE_S[min(attempt, 3)])
                        attempt += 1
                        continue
                    hint = trailing.get("ordq-retry-ms")  # a refused turn (coordinator/fair_share.py)
                    if hint is not None and str(hint).isdigit():
                        last = err
                        pause(max(int(str(hint)) / 1000.0, _RETRY_PAUSE_S[min(attempt, 3)]))
                        attempt += 1
                        continue
                    if not isinstance(err, NotCoordinatorLeader):
                        raise err from exc
                    # A follower: go where it points, else read the election again.
                    leader = str(trailing.get(LEADER_METADATA_KEY, ""))
                    address = leader if leader and leader != address else ""
                    last = err
                    if not address:
                        pause(_RETRY_PAUSE_S[min(attempt, 3)])
                        attempt += 1
                    continue
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise from_rpc_error(exc, address) from exc
                # Dead, hung or not yet serving: the election tells who leads once its node goes.
                last = CoordinationUnavailable(f"coordinator {address}: {code.name}: {exc.details()}")
                self._leader = address = ""
                pause(_RETRY_PAUSE_S[min(attempt, 3)])
                attempt += 1

    def _answer(self, call: Any, address: str, reach: Reach | None = None) -> Any:
        """The answer of ``call`` (a gRPC future) to the coordinator at ``address``, raising
        as the call does; ``_Moved`` (the call cancelled) once the election names another
        leader while it waits. A coordinator behind a partition never answers nor refuses:
        without this the call would wait its whole deadline on it, although a standby leads
        one session timeout after the cut. ``reach``: the call is cancelled, and
        CoordinationUnavailable raised, once its bound passes with no coordinator heard (a
        stopped process accepts connections and never answers)."""
        import grpc

        while True:
            try:
                return call.result(timeout=_ELECTION_CHECK_S if reach is None or reach.heard
                                   else max(min(_ELECTION_CHECK_S, reach.at - time.monotonic()), 0.0))
            except grpc.FutureTimeoutError:
                pass
            now = self._leader_elsewhere(address)
            if now and now != address:
                call.cancel()
                return _Moved(now)
            if reach is not None and not reach.heard and time.monotonic() >= reach.at:
                call.cancel()
                raise CoordinationUnavailable(f"coordinator {address} did not answer")

    def _leader_elsewhere(self, address: str) -> str:
        """Who leads, for a call in flight to ``address`` that has not answered yet: the election
        (ZooKeeper mode); in bootstrap mode the other known coordinators' word, never a question
        to ``address`` itself ("" when none of the others answers: no news).

        Why (issue 43): ``address`` is serving the call; asked too, it only says it leads if it
        does, and it answers late when busy: at 10^5 queues a listing's checks waited 8.6 s of
        its 40 s on the busy leader's ZooKeeper connection (py-spy, scale43h), and the answer
        came in meanwhile. A partitioned leader is still left once a standby is elected: the
        standby names itself."""
        if self._zk is not None:
            return self.leader()
        self.resolves += 1
        # Each asked for one check's time at most: the call's answer is taken only once this
        # returns (bench_queues at 10^5, scale43i run 3: a producer's FailOver call took 937 ms).
        return self._ask_leader(skip=address, timeout_s=_ELECTION_CHECK_S)

    @staticmethod
    def _pb() -> Any:
        from ordq.wire import ordq_pb2 as pb

        return pb

    @staticmethod
    def _state(raw: bytes) -> QueueState:
        from ordq.coordinator.state import QueueState

        return QueueState.from_dict(json.loads(raw))

    # -- producer --------------------------------------------------------------------------------

    def claim(self, queue: str, leader: str | Held, *, wait_s: float = 30.0, timeout_s: float | None = None) -> Claimed:
        """As the queue's producer leader (``leader``: the producer lease held, or before leases
        the caller's node in the ZooKeeper election): the next epoch and its key, the open segment
        fenced at it, where seq continues. ``wait_s``: how long the coordinator may wait for a
        writable head (NoGroupAvailable)."""
        from ordq.coordinator.client_values import Claimed, Held

        pb = self._pb()
        if isinstance(leader, Held):
            req = pb.ClaimRequest(queue=queue, generation=leader.generation, lease_key=leader.key,
                                  timeout_ms=_ms(wait_s))
        else:
            req = pb.ClaimRequest(queue=queue, leader_node=leader, timeout_ms=_ms(wait_s))
        res = self._call("Claim", req, timeout_s if timeout_s is not None else wait_s + self.timeout_s)
        last = (res.last_seq, res.last_seg, res.last_offset) if res.has_last else None
        return Claimed(epoch=res.epoch, key=res.epoch_key, gid=res.gid, seg=res.seg, last=last,
                       state=self._state(res.state_json))

    def fail_over(self, queue: str, gid: str, seg: int, epoch: int, key: str, *, wait_s: float = 30.0,
                  timeout_s: float | None = None) -> QueueState:
        """The head ``gid`` failed while writing ``seg``: the state with the new head (the old
        segment is sealed in the background). FencedError when a later epoch took over."""
        pb = self._pb()
        req = pb.HeadRequest(queue=queue, gid=gid, seg=seg, epoch=epoch, epoch_key=key, timeout_ms=_ms(wait_s))
        res = self._call("FailOver", req, timeout_s if timeout_s is not None else wait_s + self.timeout_s)
        return self._state(res.state_json)

    def roll(self, queue: str, gid: str, seg: int, epoch: int = 0, key: str = "", *,
             timeout_s: float | None = None) -> QueueState:
        """Roll the open segment ``seg`` of head ``gid`` (epoch 0: an admin's roll)."""
        pb = self._pb()
        req = pb.HeadRequest(queue=queue, gid=gid, seg=seg, epoch=epoch, epoch_key=key)
        return self._state(self._call("Roll", req, timeout_s).state_json)

    # -- any role --------------------------------------------------------------------------------

    def seal(self, queue: str, seg: int, *, timeout_s: float | None = None) -> QueueState:
        """Seal ``seg`` if it is ``sealing``; BrokerUnavailable when no replica answers."""
        pb = self._pb()
        return self._state(self._call("Seal", pb.SealRequest(queue=queue, seg=seg), timeout_s).state_json)

    def pop(self, queue: str, *, timeout_s: float | None = None) -> QueueState:
        """Drop the head segment if every subscription passed it; the state either way."""
        pb = self._pb()
        return self._state(self._call("Pop", pb.QueueRef(queue=queue), timeout_s).state_json)

    # -- consumer --------------------------------------------------------------------------------

    def commit(self, queue: str, subscription: str, cursor: Cursor, version: int, lease: Held, *,
               timeout_s: float | None = None) -> int:
        """Write the cursor (forward only) if it is still at ``version`` and ``lease`` (the
        subscription's consumer lease) is held; the new version. ConflictError when it moved,
        LeaseLost when the lease is not the caller's any more."""
        pb = self._pb()
        req = pb.CommitRequest(queue=queue, subscription=subscription, version=version,
                               cursor_json=json.dumps(cursor.to_dict()).encode(),
                               generation=lease.generation, lease_key=lease.key)
        return int(self._call("Commit", req, timeout_s).version)

    def subscribe(self, queue: str, subscription: str, start: Sequence[str] = ("earliest",), *,
                  timeout_s: float | None = None) -> tuple[Cursor, int | None]:
        """Create the subscription at ``start`` (earliest | latest | seq N | time T); its
        cursor and the first seq it delivers (None: not known yet). AlreadyExists if it is there."""
        pb = self._pb()
        req = pb.SubscribeRequest(queue=queue, subscription=subscription, start=list(start))
        res = self._call("Subscribe", req, timeout_s)
        from ordq.coordinator.state import Cursor

        return Cursor.from_dict(json.loads(res.cursor_json)), (None if res.starts_at < 0 else res.starts_at)

    def ensure_parking_queue(self, queue: str, subscription: str, *, timeout_s: float | None = None) -> str:
        """Create ``queue.parked.subscription`` when missing; its name."""
        pb = self._pb()
        req = pb.SubscriptionRef(queue=queue, subscription=subscription)
        return str(self._call("EnsureParkingQueue", req, timeout_s).queue)


    # -- leases (coordinator/leases.py) ------------------------------------------------------

    def acquire(self, kind: str, queue: str, sub: str, holder: str, *, ttl_ms: int = 0, wait_ms: int = 0,
                timeout_s: float | None = None, member: Held | None = None) -> Held | Refusal:
        """Ask for a lease (``kind``: producer | consumer | member): Held when granted, else
        who holds it and when to ask again. ``member``: for a group's partition, the member
        lease of the member ``holder`` names (the coordinator grants only to its owner)."""
        from ordq.coordinator.client_values import Held, Refusal

        pb = self._pb()
        req = pb.LeaseRequest(kind=_LEASE_KINDS[kind], queue=queue, subscription=sub, holder=holder,
                              ttl_ms=ttl_ms, wait_ms=wait_ms)
        if member is not None:
            req.generation, req.lease_key = member.generation, member.key
        res = self._call("Acquire", req, timeout_s)
        if not res.granted:
            return Refusal(holder=res.holder, retry_s=res.retry_ms / 1000.0)
        return Held(kind=kind, queue=queue, sub=sub, holder=holder, generation=res.generation, key=res.lease_key,
                    ttl_ms=res.ttl_ms, group_generation=res.group_generation, partitions=tuple(res.partitions))

    def heartbeat(self, lease: Held, *, with_state: bool = False, timeout_s: float | None = None) -> Held:
        """Renew ``lease``: it as the coordinator has it now (a member's partitions may have
        changed). LeaseLost when it is not the caller's any more. ``with_state`` (a consumer
        lease): the answer's ``state_zxid`` is the queue state's stamp, read after the renewal."""
        import attrs

        req = self._lease_request(lease)
        req.with_state = with_state
        res = self._call("Heartbeat", req, timeout_s)
        return attrs.evolve(lease, ttl_ms=res.ttl_ms, group_generation=res.group_generation,
                            partitions=tuple(res.partitions), state_zxid=res.state_zxid)

    def release(self, lease: Held, *, timeout_s: float | None = None) -> None:
        """Give ``lease`` back (a successor may be granted at once)."""
        self._call("Release", self._lease_request(lease), timeout_s)

    def _lease_request(self, lease: Held) -> Any:
        pb = self._pb()
        return pb.LeaseRequest(kind=_LEASE_KINDS[lease.kind], queue=lease.queue, subscription=lease.sub,
                               holder=lease.holder, generation=lease.generation, lease_key=lease.key)

    # -- what a client reads ---------------------------------------------------------------

    def describe(self, queue: str, *, subscription: str = "", with_config: bool = False, with_live: bool = False,
                 timeout_s: float | None = None, reach_s: float | None = None) -> Described:
        """The queue's state (and settings, its groups' live processes, a subscription's
        cursor, as asked) as the coordinator reads them from ZooKeeper now. ``reach_s``: see
        ``_call`` (a client's first call: sent at once, no "who leads" first)."""
        from ordq.coordinator.client_values import Described
        from ordq.coordinator.state import Cursor
        from ordq.coordinator.store_values import LiveInfo, QueueConfig

        pb = self._pb()
        req = pb.DescribeRequest(queue=queue, subscription=subscription, with_config=with_config,
                                 with_live=with_live)
        res = self._call("Describe", req, timeout_s, reach_s)
        live: dict[str, dict[str, LiveInfo]] = {}
        for p in res.live:
            live.setdefault(p.gid, {})[p.role] = LiveInfo(address=p.address, incarnation=p.incarnation, pid=0,
                                                          produce=p.produce)
        return Described(
            state=self._state(res.state_json), version=res.state_version,
            config=QueueConfig(**json.loads(res.config_json)) if with_config else None,
            live=live if with_live else None,
            cursor=Cursor.from_dict(json.loads(res.cursor_json)) if subscription else None,
            cursor_version=res.cursor_version if subscription else -1, zxid=res.state_zxid)

    def describe_topic(self, topic: str, *, timeout_s: float | None = None) -> Any:
        """A keyed topic's config (``coordinator.topics.TopicConfig``); TopicNotFound."""
        from ordq.coordinator.topics import TopicConfig

        res = self._call("Describe", self._pb().DescribeRequest(topic=topic), timeout_s)
        return TopicConfig(**json.loads(res.topic_json))

    def record(self, lease: Held, op: str, body: Any = None, *, timeout_s: float | None = None) -> Any:
        """A subscription record kept by its consumer lease holder (``op``: set_blocked,
        record_parked, update_parked, parked, policy; coordinator/service_leases.py)."""
        pb = self._pb()
        req = pb.RecordRequest(queue=lease.queue, subscription=lease.sub, generation=lease.generation,
                               lease_key=lease.key, op=op, body_json=json.dumps(body).encode())
        return json.loads(self._call("SubscriptionRecord", req, timeout_s).body_json or b"null")


    # -- the admin API (coordinator/admin_api.py) -----------------------------------------------

    def admin(self, verb: str, *, timeout_s: float | None = None, reach_s: float | None = None, **args: Any) -> Any:
        """Run an admin verb (``queue describe``, ``auth create``, ...) on the elected
        coordinator with ``args`` (JSON-able); its result as JSON data. Refusals are typed as
        every other call's (PermissionDenied, QueueNotFound, ...). ``reach_s`` (bootstrap
        mode): sent at once to a known coordinator (a follower names the leader), and
        CoordinationUnavailable when none has answered within ``reach_s``."""
        return self.admin_with_text(verb, timeout_s=timeout_s, reach_s=reach_s, **args)[0]

    def admin_with_text(self, verb: str, *, timeout_s: float | None = None, reach_s: float | None = None,
                        **args: Any) -> tuple[Any, bytes]:
        """``admin``, and the text the verb sent apart from its result (``AdminResponse.text``:
        b"" when none; ``queue list`` asked ``text_apart``)."""
        from ordq.wire.admin_messages import MAX_ARGS_BYTES, admin_request

        raw = json.dumps(args).encode()
        if len(raw) > MAX_ARGS_BYTES:  # the coordinator refuses it unread: say so without sending it
            raise ConfigError(f"admin request too large: {len(raw)} bytes of arguments (at most {MAX_ARGS_BYTES})")
        answer = self._call("Admin", admin_request(verb, raw), timeout_s, reach_s)
        return json.loads(answer.result_json or b"null"), answer.text


class Reach:
    """A call's bound on reaching a coordinator (``CoordinatorClient._call``'s ``reach_s``):
    ``at``, the monotonic time it gives up unless ``heard``; heard once a coordinator answered
    it, refused it knowing the leader, or named the leader when asked."""

    def __init__(self, client: CoordinatorClient, at: float) -> None:
        self.at = at
        self._client = client
        self._named = client.named
        self._heard = False

    @property
    def heard(self) -> bool:
        return self._heard or self._client.named != self._named

    @heard.setter
    def heard(self, value: bool) -> None:
        self._heard = value

    def give_up_at(self, deadline: float) -> float:
        return deadline if self.heard else min(deadline, self.at)


class _Stub:
    """The coordinator service's methods on one channel, each made on first use: ``Admin`` and
    ``Coordinators`` without protobuf (ordq/wire/admin_messages.py: an admin command loads
    neither the generated messages nor the stubs, issue 42), every other from the generated stub."""

    def __init__(self, ch: Any) -> None:
        self._ch = ch

    def __getattr__(self, name: str) -> Any:  # only for a method not made yet
        from ordq.wire import admin_messages as light

        if name == "Admin":
            method = self._ch.unary_unary(light.ADMIN_METHOD, request_serializer=light.as_bytes,
                                          response_deserializer=light.read_admin_answer)
        elif name == "Coordinators":
            method = self._ch.unary_unary(light.COORDINATORS_METHOD, request_serializer=light.as_bytes,
                                          response_deserializer=light.read_coordinators_answer)
        elif name.startswith("_"):
            raise AttributeError(name)
        else:
            generated = self.__dict__.get("_generated")
            if generated is None:
                from ordq.wire import ordq_pb2_grpc as pb_grpc

                generated = self._generated = pb_grpc.CoordinatorStub(self._ch)  # type: ignore[no-untyped-call]
            method = getattr(generated, name)
        setattr(self, name, method)
        return method


_LEASE_KINDS = {"producer": 1, "consumer": 2, "member": 3}


def _bounded(timeout_s: float, until: float | None) -> float:
    """``timeout_s``, cut to what is left before ``until`` (monotonic; None: not cut)."""
    return timeout_s if until is None else min(timeout_s, until - time.monotonic())


def _ms(seconds: float) -> int:
    return max(1, min(int(seconds * 1000), 2**32 - 1))

