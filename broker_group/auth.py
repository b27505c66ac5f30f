"""The broker's gate: every RPC names the role it needs, checked here and nowhere else.

Tokens (coordinator/tokens.py) are loaded from ZooKeeper and reloaded whenever ``<root>/auth``
changes (``ordq auth create|revoke`` touch it), so a revoked token is refused on its next call,
an open produce stream included (every request is checked, not only the first). A peer with a
broker certificate of the cluster (mutual TLS, ordq/security.py) is a broker: it may do
anything, as its own process could.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from coordinator.tokens import ANY, TokenRecord, auth_root, authorize, load_tokens
from ordq.security import BROKER_CN, peer_common_name

log = logging.getLogger("ordq.broker.auth")

# RPC -> the role its caller needs on the request's queue.
ROLE_OF = {"Produce": "produce", "Fetch": "consume", "Read": "consume", "Fence": ANY, "Seal": ANY, "Reconcile": ANY,
           "SegmentInfo": ANY, "Health": ANY}


class Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._enforced = False
        self._records: dict[str, TokenRecord] = {}

    def watch(self, client: Any, root: str) -> None:
        """Load the tokens now and again on every change of ``<root>/auth``."""
        def changed(data: bytes | None, _stat: Any, *_event: Any) -> None:
            records = load_tokens(client, root) if data is not None else {}
            with self._lock:
                self._enforced, self._records = data is not None, records
            log.info("tokens %s: %d loaded", "enforced" if data is not None else "not enforced", len(records))

        client.DataWatch(auth_root(root))(changed)

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
