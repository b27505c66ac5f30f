"""The broker's gate: every RPC names what its caller must be, checked here and nowhere else.

Two kinds of caller (DESIGN §7, "who may do what"):
- **Clients** (producers, consumers, the CLI) carry a token (``authorization: Bearer``);
  tokens (coordinator/tokens.py) are loaded from ZooKeeper and reloaded whenever
  ``<root>/auth`` changes (``ordq auth create|revoke`` touch it), so a revoked token is refused
  on its next call, an open produce stream included (every request is judged, not only the
  first: ``stream_check`` keeps a stream's verdict for a queue only while the token copy is
  the one it was judged on, ``TokenBook.generation``; issue 39: judged whole, the check of
  every request cost the data path). A client may make the data calls its token's role on
  the queue allows.
- **The cluster** (``CLUSTER``): brokers and coordinators, known by the subject of their
  verified certificate (``ordq-broker``, ``ordq-coordinator``; mutual TLS, ordq/common/security.py).
  Only they may make the control calls that change what a replica holds or will take (Fence,
  Seal, Reconcile, Replicate): a token of any role is not enough, as Kafka keeps LeaderAndIsr
  behind ``CLUSTER_ACTION``. They may make every other call too, as their own process could.

A queue name outside the naming rule is refused before anything else (a typed InvalidName,
its echo truncated: a 5,000-character name must not make the error itself too long for gRPC's
metadata).

The token copy itself is a ``TokenBook`` (coordinator/token_book.py): loaded at start
(transient ZooKeeper errors ridden out for ``LOAD_DEADLINE_S``; an exhausted bound stops the
broker with one clear line), reloaded on change, refreshed before a well-formed but unknown
token is refused (``needs_refresh``: a token used the moment ``auth create`` printed it), and,
while a reload fails, answering TokensUnavailable (retriable) for every client token instead
of a refusal; broker peers still pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from ordq.common.errors import InvalidName, PermissionDenied, TokensUnavailable
from ordq.common.security import BROKER_CN, COORDINATOR_CN, bearer_token, peer_common_name
from ordq.coordinator.paths import NAME_RULE, check_name
from ordq.coordinator.token_book import LOAD_DEADLINE_S, TokenBook
from ordq.coordinator.tokens import ANY, authorize, identify
from ordq.wire.errors import short

log = logging.getLogger("ordq.broker.auth")

CLUSTER = "cluster"  # not a token role: only a broker or coordinator certificate has it
CLUSTER_CNS = frozenset({BROKER_CN, COORDINATOR_CN})
ALL_QUEUES = "*"  # the "queue" of calls that name none (Health, a Replicate stream)

# RPC -> what its caller needs on the request's queue: a token role, or CLUSTER.
ROLE_OF = {"Produce": "produce", "Fetch": "consume", "Read": "consume", "SegmentInfo": ANY, "Health": ANY,
           "Fence": CLUSTER, "Seal": CLUSTER, "Reconcile": CLUSTER, "Replicate": CLUSTER, "OpenSegments": CLUSTER,
           "Find": "consume", "SealMany": CLUSTER}


class Gate:
    """``check`` raises PermissionDenied (or InvalidName) unless the caller may make the call.

    ``tls``: whether the broker serves mutual TLS. On a plaintext broker (``--insecure``) no
    peer has an identity: the control calls then need what they needed before identities
    existed (any token role on the queue when tokens are enforced; Replicate nothing)."""

    def __init__(self, *, tls: bool, book: TokenBook | None = None) -> None:
        self._tls = tls
        self.book = book or TokenBook()

    def watch(self, client: Any, root: str, *, deadline_s: float = LOAD_DEADLINE_S) -> None:
        """Load the tokens now and again on every change of ``<root>/auth``. At start,
        CoordinationUnavailable when ZooKeeper did not answer for ``deadline_s``."""
        self.book.watch(client, root, deadline_s=deadline_s)

    def needs_refresh(self, context: grpc.ServicerContext, rpc: str) -> bool:
        """Whether the caller's token is well formed but unknown here: then await
        ``book.fresh_after(arrived)`` before ``check_caller`` judges it (it may have been
        created a moment ago and the watch not fired yet)."""
        if ROLE_OF[rpc] == CLUSTER or (self._tls and peer_common_name(context) in CLUSTER_CNS):
            return False
        try:
            return self.book.unknown(bearer_token(context))
        except TokensUnavailable:
            return False  # check_caller answers it

    def check_caller(self, context: grpc.ServicerContext, rpc: str) -> None:
        """What can be refused from the call's headers alone, before its request is read
        (a 25 MiB body with a bad token costs the broker the body's first flow-control window,
        not the body): PermissionDenied (queue ``*``: the request naming it was never read)
        for a client certificate calling what only the cluster may, and, when tokens are
        enforced, for no token, an unknown or revoked one, or one without the call's role on
        any queue. ``check`` decides the rest once the request is read."""
        role = ROLE_OF[rpc]
        cn = peer_common_name(context) if self._tls else None
        if cn in CLUSTER_CNS:
            return
        if role == CLUSTER:
            if self._tls:
                raise PermissionDenied(ALL_QUEUES, CLUSTER, f"only brokers and coordinators (certificate "
                                       f"{BROKER_CN!r} or {COORDINATOR_CN!r}) may call {rpc}; the peer's "
                                       f"certificate is {cn!r}")
            return  # plaintext: decided with the request (check)
        enforced, records = self.book.current()  # TokensUnavailable while unreadable: retriable
        if not enforced:
            return
        rec = identify(records, bearer_token(context), ALL_QUEUES, role)  # known, not revoked: else refused
        if not any(role == ANY or "admin" in have or role in have for have in rec.grants.values()):
            raise PermissionDenied(ALL_QUEUES, role, f"token {rec.tid} ({rec.name or 'unnamed'}) has the role on "
                                   "no queue")

    def check(self, context: grpc.ServicerContext, rpc: str, queue: str) -> None:
        """PermissionDenied unless the caller may make ``rpc`` on ``queue``."""
        self._judge(peer_common_name(context) if self._tls else None, bearer_token(context), rpc, queue)

    def stream_check(self, context: grpc.ServicerContext, rpc: str) -> Callable[[str], None]:
        """``check`` for each request of one stream (``rpc``: Produce): the same verdict, but a
        pass is kept for the queue it was given on while the token copy is the same
        (``TokenBook.generation``): a revoke, any reload, or the copy turning unreadable makes
        the next request judged again. A refusal is never kept. The peer's certificate and the
        token are the stream's, read once."""
        cn = peer_common_name(context) if self._tls else None
        token = bearer_token(context)
        book = self.book
        passed: tuple[str, int] | None = None  # (queue, generation) of the last pass

        def check(queue: str) -> None:
            nonlocal passed
            generation = book.generation  # read before judging: a reload meanwhile is seen next time
            if passed is not None and passed[1] == generation and passed[0] == queue:
                return
            passed = None
            self._judge(cn, token, rpc, queue)
            passed = (queue, generation)

        return check

    def _judge(self, cn: str | None, token: str | None, rpc: str, queue: str) -> None:
        if queue != ALL_QUEUES:
            try:
                check_name("queue", queue)
            except InvalidName:
                raise InvalidName("queue", short(queue), NAME_RULE) from None
        role = ROLE_OF[rpc]
        if cn in CLUSTER_CNS:
            return  # a broker or coordinator: anything its own process could do
        if role == CLUSTER:
            if self._tls:
                # The check that matters: whatever token it carries, a client certificate
                # never truncates, seals, fences or feeds a replica.
                raise PermissionDenied(queue, CLUSTER, f"only brokers and coordinators (certificate {BROKER_CN!r} or "
                                       f"{COORDINATOR_CN!r}) may call {rpc}; the peer's certificate is {cn!r}")
            if rpc == "Replicate":
                return  # plaintext: a slave cannot tell its master from anyone (as before)
            role = ANY
        enforced, records = self.book.current()
        if not enforced:
            return
        authorize(records, token, queue, role)
