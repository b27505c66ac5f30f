"""The client of the coordinator service (``coordinator/service.py``): how producers and
consumers ask for claims, failovers, rolls, seals, pops, commits, subscriptions.

Guarantee: a call reaches the elected coordinator or fails typed by its own deadline. The
leader's address is the part after the last '@' of the first contender of
``<root>/coordinator/leader`` (ZooKeeper reads are open to every client); it is cached, a
follower's ``ordq-leader`` answer is followed, and a coordinator that does not answer
(UNAVAILABLE, DEADLINE_EXCEEDED without an ordq error) makes the client read the election
again and retry until the deadline — so a killed leader stalls a caller for about one
election. A call unanswered for ``_ELECTION_CHECK_S`` reads the election (then again as often):
once it names another leader the call is cancelled and sent there, so a leader behind a
partition, which never answers nor refuses, stalls a caller for about one election too.
Every request is safe to send twice: the service applies conditional transitions
(a FailOver or Roll already done is followed, a Commit already written is a ConflictError).

Rules: ``ordq.wire`` (the generated stubs, the wire errors) is imported only inside functions,
so importing this module does not load gRPC.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import attrs

from ordq.common.errors import CoordinationUnavailable, NotCoordinatorLeader, TokensUnavailable
from ordq.common.security import Credentials, StubCache, channel, token_metadata
from ordq.coordinator.paths import Paths
from ordq.coordinator.state import Cursor, QueueState

DEFAULT_TIMEOUT_S = 10.0
_RETRY_PAUSE_S = (0.02, 0.05, 0.1, 0.2)  # between attempts while no coordinator answers
_ELECTION_CHECK_S = 0.5  # a call unanswered this long reads the election again (then every as long)
_MOVED = object()  # _answer: another coordinator leads now


@attrs.frozen
class Claimed:
    """What a Claim gives the producer leader: its epoch and the key that goes with it (a
    secret: sent with every Produce), the head and open segment, and the last stored message
    as (seq, seg, offset) — None for an empty queue; seg and offset -1 when only the seq is known."""

    epoch: int
    key: str = attrs.field(repr=False)
    gid: str
    seg: int
    last: tuple[int, int, int] | None
    state: QueueState


class CoordinatorClient:
    """Calls to the elected coordinator. Thread-safe; ``close()`` closes the channels.

    ``zk``: a ZkStore, or a kazoo client (then give ``paths``) — only read, to find the
    leader. ``credentials``: TLS files and token, as for the brokers."""

    def __init__(self, zk: Any, paths: Paths | None = None, credentials: Credentials | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._zk = getattr(zk, "client", zk)
        paths = paths or getattr(zk, "paths", None)
        if paths is None:
            raise TypeError("CoordinatorClient needs paths with a kazoo client")
        self.paths = paths
        self.credentials = credentials or Credentials()
        self.timeout_s = timeout_s
        self._md = token_metadata(self.credentials)
        self._leader: str | None = None
        self._stubs: StubCache[Any, Any] = StubCache(self._open_channel, self._make_stub, "coordinator client")
        self.resolves = 0  # election reads (tests: how often the leader was looked up)

    def close(self) -> None:
        for ch in self._stubs.close():
            ch.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- finding the leader and calling it ------------------------------------------------------

    def leader(self) -> str:
        """The elected coordinator's address as the election says now ("" when none leads)."""
        from ordq.coordinator.service import leader_address

        self.resolves += 1
        try:
            return leader_address(self._zk, self.paths.coordinator_leader, timeout_s=2.0)
        except Exception:  # noqa: BLE001 - ZooKeeper away: the caller retries until its deadline
            return ""

    def _open_channel(self, address: str) -> Any:
        from ordq.wire.framing import GRPC_OPTIONS

        return channel(address, self.credentials, GRPC_OPTIONS)

    @staticmethod
    def _make_stub(ch: Any) -> Any:
        from ordq.wire import ordq_pb2_grpc as pb_grpc

        return pb_grpc.CoordinatorStub(ch)  # type: ignore[no-untyped-call]

    def _stub(self, address: str) -> Any:
        return self._stubs.get(address)

    def _call(self, method: str, request: Any, timeout_s: float | None) -> Any:
        import grpc

        from ordq.coordinator.service import LEADER_METADATA_KEY
        from ordq.wire.errors import METADATA_KEY, from_rpc_error

        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        address = self._leader
        attempt = 0
        last: BaseException | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CoordinationUnavailable(f"no coordinator answered {method} in time"
                                              + (f" (last: {last})" if last else "")) from last
            if not address:
                address = self.leader()
                if not address:
                    last = CoordinationUnavailable("no coordinator leads (the election is empty)")
                    time.sleep(min(_RETRY_PAUSE_S[min(attempt, 3)], max(left, 0)))
                    attempt += 1
                    continue
            try:
                call = getattr(self._stub(address), method).future(request, timeout=left, metadata=self._md)
                answer = self._answer(call, address)
                if answer is _MOVED:
                    last = CoordinationUnavailable(f"coordinator {address} was replaced while the call was in flight")
                    self._leader = address = ""
                    continue
                self._leader = address
                return answer
            except grpc.RpcError as exc:
                trailing = dict(exc.trailing_metadata() or ())
                code = exc.code()
                if METADATA_KEY in trailing:
                    err = from_rpc_error(exc, address)
                    if isinstance(err, TokensUnavailable):
                        # Its token store is unreadable for a moment: not a refusal; again
                        # until the deadline (then CoordinationUnavailable naming it).
                        last = err
                        time.sleep(min(_RETRY_PAUSE_S[min(attempt, 3)], max(deadline - time.monotonic(), 0)))
                        attempt += 1
                        continue
                    if not isinstance(err, NotCoordinatorLeader):
                        raise err from exc
                    # A follower: go where it points, else read the election again.
                    leader = str(trailing.get(LEADER_METADATA_KEY, ""))
                    address = leader if leader and leader != address else ""
                    last = err
                    if not address:
                        time.sleep(min(_RETRY_PAUSE_S[min(attempt, 3)], max(left, 0)))
                        attempt += 1
                    continue
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise from_rpc_error(exc, address) from exc
                # Dead, hung or not yet serving: the election tells who leads once its node goes.
                last = CoordinationUnavailable(f"coordinator {address}: {code.name}: {exc.details()}")
                self._leader = address = ""
                time.sleep(min(_RETRY_PAUSE_S[min(attempt, 3)], max(deadline - time.monotonic(), 0)))
                attempt += 1

    def _answer(self, call: Any, address: str) -> Any:
        """The answer of ``call`` (a gRPC future) to the coordinator at ``address``, raising
        as the call does; ``_MOVED`` (the call cancelled) once the election names another
        leader while it waits. A coordinator behind a partition never answers nor refuses:
        without this the call would wait its whole deadline on it, although a standby leads
        one session timeout after the cut."""
        import grpc

        while True:
            try:
                return call.result(timeout=_ELECTION_CHECK_S)
            except grpc.FutureTimeoutError:
                pass
            now = self.leader()
            if now and now != address:
                call.cancel()
                return _MOVED

    @staticmethod
    def _pb() -> Any:
        from ordq.wire import ordq_pb2 as pb

        return pb

    @staticmethod
    def _state(raw: bytes) -> QueueState:
        return QueueState.from_dict(json.loads(raw))

    # -- producer --------------------------------------------------------------------------------

    def claim(self, queue: str, leader_node: str, *, wait_s: float = 30.0, timeout_s: float | None = None) -> Claimed:
        """After winning the queue's producer election (``leader_node``: the caller's node in
        it): the next epoch and its key, the open segment fenced at it, where seq continues.
        ``wait_s``: how long the coordinator may wait for a writable head (NoGroupAvailable)."""
        pb = self._pb()
        req = pb.ClaimRequest(queue=queue, leader_node=leader_node, timeout_ms=_ms(wait_s))
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

    def commit(self, queue: str, subscription: str, cursor: Cursor, version: int, holder: str, *,
               timeout_s: float | None = None) -> int:
        """Write the cursor (forward only) if it is still at ``version`` and ``holder`` (the
        caller's lock node) leads the subscription's election; the new version. ConflictError
        when it moved, NotLeader when the holder does not lead."""
        pb = self._pb()
        req = pb.CommitRequest(queue=queue, subscription=subscription, version=version, holder=holder,
                               cursor_json=json.dumps(cursor.to_dict()).encode())
        return int(self._call("Commit", req, timeout_s).version)

    def subscribe(self, queue: str, subscription: str, start: Sequence[str] = ("earliest",), *,
                  timeout_s: float | None = None) -> tuple[Cursor, int | None]:
        """Create the subscription at ``start`` (earliest | latest | seq N | time T); its
        cursor and the first seq it delivers (None: not known yet). AlreadyExists if it is there."""
        pb = self._pb()
        req = pb.SubscribeRequest(queue=queue, subscription=subscription, start=list(start))
        res = self._call("Subscribe", req, timeout_s)
        return Cursor.from_dict(json.loads(res.cursor_json)), (None if res.starts_at < 0 else res.starts_at)

    def ensure_parking_queue(self, queue: str, subscription: str, *, timeout_s: float | None = None) -> str:
        """Create ``queue.parked.subscription`` when missing; its name."""
        pb = self._pb()
        req = pb.SubscriptionRef(queue=queue, subscription=subscription)
        return str(self._call("EnsureParkingQueue", req, timeout_s).queue)


def _ms(seconds: float) -> int:
    return max(1, min(int(seconds * 1000), 2**32 - 1))

