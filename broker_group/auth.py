"""The broker's gate: every RPC names the role it needs, checked here and nowhere else.

Tokens (coordinator/tokens.py) are loaded from ZooKeeper and reloaded whenever ``<root>/auth``
changes (``ordq auth create|revoke`` touch it), so a revoked token is refused on its next call,
an open produce stream included (every request is checked, not only the first). A peer with a
broker certificate of the cluster (mutual TLS, ordq/security.py) is a broker: it may do
anything, as its own process could.

Transient ZooKeeper errors (connection loss, operation timeout, session moved) while loading
are retried for ``LOAD_DEADLINE_S`` (issue 26: one ConnectionLoss on a busy machine killed a
broker at start). At start an exhausted bound stops the broker with one clear line; while
serving, the gate closes instead (every token refused, broker peers still pass: a revoked
token must not pass because a reload failed) and loads again until it succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError, SessionMovedError
from kazoo.retry import KazooRetry, RetryFailedError

from coordinator.tokens import ANY, TokenRecord, auth_root, authorize, load_tokens
from ordq.errors import CoordinationUnavailable
from ordq.security import BROKER_CN, peer_common_name

log = logging.getLogger("ordq.broker.auth")

LOAD_DEADLINE_S = 30.0  # how long a load rides out transient ZooKeeper errors
RELOAD_AFTER_S = 1.0  # while serving with the gate closed: the next try
# Worth another try; anything else (no permission, bad data) is a definite answer.
TRANSIENT = (ConnectionLoss, OperationTimeoutError, SessionMovedError, SessionExpiredError)


def load_tokens_retrying(client: Any, root: str, deadline_s: float = LOAD_DEADLINE_S) -> dict[str, TokenRecord]:
    """``load_tokens``, retrying transient ZooKeeper errors for up to ``deadline_s``;
    CoordinationUnavailable once that bound is exhausted."""
    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=deadline_s)
    retry.retry_exceptions = TRANSIENT
    try:
        return retry(load_tokens, client, root)
    except RetryFailedError as exc:
        raise CoordinationUnavailable(f"cannot load the tokens under {auth_root(root)}: ZooKeeper did not answer "
                                      f"for {deadline_s:g}s") from exc

# RPC -> the role its caller needs on the request's queue.
ROLE_OF = {"Produce": "produce", "Fetch": "consume", "Read": "consume", "Fence": ANY, "Seal": ANY, "Reconcile": ANY,
           "SegmentInfo": ANY, "Health": ANY}


class Gate:
    def __init__(self) -> None:
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

        deadline = time.monotonic() + deadline_s
        while True:
            try:
                client.DataWatch(auth_root(root))(changed)
                return
            except (*TRANSIENT, RetryFailedError) as exc:  # the watch's own first read
                if time.monotonic() > deadline:
                    raise CoordinationUnavailable(f"cannot watch {auth_root(root)}: ZooKeeper did not answer "
                                                  f"for {deadline_s:g}s") from exc
                time.sleep(0.1)

    def _load_now(self, client: Any, root: str, deadline_s: float = LOAD_DEADLINE_S) -> None:
        retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=deadline_s)
        retry.retry_exceptions = TRANSIENT
        try:
            enforced = retry(client.exists, auth_root(root)) is not None
        except RetryFailedError as exc:
            raise CoordinationUnavailable(f"cannot read {auth_root(root)}: ZooKeeper did not answer "
                                          f"for {deadline_s:g}s") from exc
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

    def check(self, context: grpc.ServicerContext, rpc: str, queue: str) -> None:
        """PermissionDenied unless the caller may make ``rpc`` on ``queue``."""
        with self._lock:
            if not self._enforced:
                return
            records = self._records
        if peer_common_name(context) == BROKER_CN:
            return
        token = None
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer "):]
        authorize(records, token, queue, ROLE_OF[rpc])
