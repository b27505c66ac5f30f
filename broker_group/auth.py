"""The broker's gate: every RPC names what its caller must be, checked here and nowhere else.

Two kinds of caller (DESIGN §7, "who may do what"):
- **Clients** (producers, consumers, the CLI) carry a token (``authorization: Bearer``);
  tokens (coordinator/tokens.py) are loaded from ZooKeeper and reloaded whenever
  ``<root>/auth`` changes (``ordq auth create|revoke`` touch it), so a revoked token is refused
  on its next call, an open produce stream included (every request is checked, not only the
  first). A client may make the data calls its token's role on the queue allows.
- **The cluster** (``CLUSTER``): brokers and coordinators, known by the subject of their
  verified certificate (``ordq-broker``, ``ordq-coordinator``; mutual TLS, ordq/security.py).
  Only they may make the control calls that change what a replica holds or will take (Fence,
  Seal, Reconcile, Replicate): a token of any role is not enough, as Kafka keeps LeaderAndIsr
  behind ``CLUSTER_ACTION``. They may make every other call too, as their own process could.

A queue name outside the naming rule is refused before anything else (a typed InvalidName,
its echo truncated: a 5,000-character name must not make the error itself too long for gRPC's
metadata).

Transient ZooKeeper errors (connection loss, operation timeout, session moved) while loading
are retried for ``LOAD_DEADLINE_S`` (issue 26: one ConnectionLoss on a busy machine killed a
broker at start). At start an exhausted bound stops the broker with one clear line; while
serving, the gate closes instead (every token refused, broker peers still pass: a revoked
token must not pass because a reload failed) and loads again until it succeeds.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from broker_group.errors import short
from coordinator.paths import NAME_RULE, check_name
from coordinator.tokens import ANY, TokenRecord, auth_root, authorize, identify, load_tokens
from coordinator.zk_retry import retry_zk
from ordq.errors import CoordinationUnavailable, InvalidName, PermissionDenied
from ordq.security import BROKER_CN, COORDINATOR_CN, bearer_token, peer_common_name

log = logging.getLogger("ordq.broker.auth")

LOAD_DEADLINE_S = 30.0  # how long a load rides out transient ZooKeeper errors
RELOAD_AFTER_S = 1.0  # while serving with the gate closed: the next try


def load_tokens_retrying(client: Any, root: str, deadline_s: float = LOAD_DEADLINE_S) -> dict[str, TokenRecord]:
    """``load_tokens``, retrying transient ZooKeeper errors for up to ``deadline_s``
    (coordinator/zk_retry.py); CoordinationUnavailable once that bound is exhausted."""
    return retry_zk(lambda: load_tokens(client, root), f"cannot load the tokens under {auth_root(root)}",
                    bound_s=deadline_s)


CLUSTER = "cluster"  # not a token role: only a broker or coordinator certificate has it
CLUSTER_CNS = frozenset({BROKER_CN, COORDINATOR_CN})
ALL_QUEUES = "*"  # the "queue" of calls that name none (Health, a Replicate stream)

# RPC -> what its caller needs on the request's queue: a token role, or CLUSTER.
ROLE_OF = {"Produce": "produce", "Fetch": "consume", "Read": "consume", "SegmentInfo": ANY, "Health": ANY,
           "Fence": CLUSTER, "Seal": CLUSTER, "Reconcile": CLUSTER, "Replicate": CLUSTER}


class Gate:
    """``check`` raises PermissionDenied (or InvalidName) unless the caller may make the call.

    ``tls``: whether the broker serves mutual TLS. On a plaintext broker (``--insecure``) no
    peer has an identity: the control calls then need what they needed before identities
    existed (any token role on the queue when tokens are enforced; Replicate nothing)."""

    def __init__(self, *, tls: bool) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._enforced = False
        self._records: dict[str, TokenRecord] = {}

    def watch(self, client: Any, root: str, *, deadline_s: float = LOAD_DEADLINE_S) -> None:
        """Load the tokens now and again on every change of ``<root>/auth``. At start,
        CoordinationUnavailable when ZooKeeper did not answer for ``deadline_s``."""
        # The first load here, not in the watch's first call: kazoo logs a traceback for an
        # exception raised there, and the broker must stop with one clear line.
        self._load_now(client, root, deadline_s)

        def changed(data: bytes | None, _stat: Any, *_event: Any) -> None:
            try:
                records = load_tokens_retrying(client, root, deadline_s) if data is not None else {}
            except CoordinationUnavailable as exc:
                self._close_gate(client, root, exc)
                return
            with self._lock:
                self._enforced, self._records = data is not None, records
            log.info("tokens %s: %d loaded", "enforced" if data is not None else "not enforced", len(records))

        retry_zk(lambda: client.DataWatch(auth_root(root))(changed),  # the watch's own first read
                 f"cannot watch {auth_root(root)}", bound_s=deadline_s)

    def _load_now(self, client: Any, root: str, deadline_s: float = LOAD_DEADLINE_S) -> None:
        enforced = retry_zk(lambda: client.exists(auth_root(root)), f"cannot read {auth_root(root)}",
                            bound_s=deadline_s) is not None
        records = load_tokens_retrying(client, root, deadline_s) if enforced else {}
        with self._lock:
            self._enforced, self._records = enforced, records

    def _close_gate(self, client: Any, root: str, exc: Exception) -> None:
        """A reload failed while serving: refuse every token until one succeeds."""
        with self._lock:
            self._enforced, self._records = True, {}
        log.error("tokens: %s; refusing every client token until they load", exc)

        def again() -> None:
            try:
                self._load_now(client, root)
            except CoordinationUnavailable as err:
                self._close_gate(client, root, err)
                return
            log.info("tokens loaded again: %d", len(self._records))

        timer = threading.Timer(RELOAD_AFTER_S, again)
        timer.daemon = True
        timer.start()

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
        with self._lock:
            if not self._enforced:
                return
            records = self._records
        rec = identify(records, bearer_token(context), ALL_QUEUES, role)  # known, not revoked: else refused
        if not any(role == ANY or "admin" in have or role in have for have in rec.grants.values()):
            raise PermissionDenied(ALL_QUEUES, role, f"token {rec.tid} ({rec.name or 'unnamed'}) has the role on "
                                   "no queue")

    def check(self, context: grpc.ServicerContext, rpc: str, queue: str) -> None:
        """PermissionDenied unless the caller may make ``rpc`` on ``queue``."""
        if queue != ALL_QUEUES:
            try:
                check_name("queue", queue)
            except InvalidName:
                raise InvalidName("queue", short(queue), NAME_RULE) from None
        role = ROLE_OF[rpc]
        cn = peer_common_name(context) if self._tls else None
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
        with self._lock:
            if not self._enforced:
                return
            records = self._records
        authorize(records, bearer_token(context), queue, role)

