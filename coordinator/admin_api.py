"""The coordinator's admin API (issue 37): the admin CLI's verbs (queues, subscriptions, topics,
tokens, describe, list) served by the elected coordinator, so that the CLI holds no ZooKeeper
session.

A verb is a row of a table: the role its caller needs, on which queue (an argument of the
verb, or every queue), and its handler. The handlers are the admin library the CLI ran against
ZooKeeper before (``ordq/admin``, ``sdk/replicas.py``, ``coordinator/store*.py``): this package
may not import them, so the table is injected into ``CoordinatorService`` at start
(``ordq/commands/coordinator.py``), as the ``subscriber`` is.

Guarantee: a request's arguments over ``MAX_ARGS_BYTES`` are refused before they are parsed
(typed, ConfigError), and a request over ``MAX_REQUEST_BYTES`` before it is even received whole;
the caller's token is checked for the verb's role (in the service's frame, ``_serve``) before
the handler runs; a listing (``SOME``) shows only the queues the token has a role on.

Rules: no I/O here but what a handler does; no gRPC (the service frames the call).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ordq.common.errors import ConfigError, PermissionDenied
from ordq.coordinator.paths import check_name
from ordq.coordinator.tokens import ANY, TokenRecord
from ordq.coordinator.topics import partition_queue
from ordq.wire.admin_messages import MAX_ARGS_BYTES  # a verb's arguments (JSON): larger is refused unread

# Any request to the coordinator service: gRPC itself refuses a larger one while reading it,
# before a byte of it is a Python object (RESOURCE_EXHAUSTED). No coordinator RPC carries
# more than an admin verb's arguments; the service's answers are not bounded by it. Measured
# (tests/test_admin_api.py): 2 MiB requests refused after gRPC had received and decoded them
# still grew a coordinator's RSS by ~44 MB (buffers in each handler thread's malloc arena).
MAX_REQUEST_BYTES = MAX_ARGS_BYTES + (64 << 10)
EVERY_QUEUE = "*"  # the scope of a verb that names no queue (tokens, topics' records, listings)
SOME = "some"  # the role of a listing: a valid token with any role on some queue; it sees those queues


@attrs.frozen
class AdminCall:
    """One admin request as its handler sees it: the store, the verb's arguments, and the
    caller's token record (None: tokens are not enforced, or a cluster peer calls)."""

    store: Any  # ZkStore
    args: Mapping[str, Any]
    token: TokenRecord | None

    def may_read(self, queue: str) -> bool:
        """Whether the caller has any role on ``queue`` (what a listing shows)."""
        return self.token is None or self.token.allows(queue, ANY)

    def require(self, queue: str, role: str = ANY) -> None:
        """PermissionDenied unless the caller has ``role`` on ``queue`` (a verb that reads
        more queues than the one it was authorised on: a topic's partitions)."""
        if self.token is not None and not self.token.allows(queue, role):
            raise PermissionDenied(queue, role, f"token {self.token.tid} ({self.token.name or 'unnamed'}) "
                                   "lacks the role")

    def arg(self, name: str, default: Any = ...) -> Any:
        """The argument ``name``; ConfigError when it is missing and has no default."""
        if name in self.args:
            return self.args[name]
        if default is ...:
            raise ConfigError(f"admin verb argument {name!r} missing")
        return default


@attrs.frozen
class TextAnswer:
    """A verb's result with text its caller prints as it is (``AdminResponse.text``): sent apart
    from the JSON of ``data``, so that it is neither escaped nor parsed (issue 43: ``queue list
    --json``'s ~20 MB of rows at 10^5 queues, escaped into a JSON string and parsed back)."""

    data: Any
    text: str


Handler = Callable[[AdminCall], Any]  # -> the result, as JSON-able data (or a TextAnswer)


def on_arg(name: str, kind: str = "queue") -> Callable[[Mapping[str, Any]], str]:
    """The scope of a verb about one queue: its argument ``name`` (a topic: its partition 0)."""
    def scope(args: Mapping[str, Any]) -> str:
        value = args.get(name)
        if not isinstance(value, str):
            raise ConfigError(f"admin verb argument {name!r} missing")
        check_name(kind, value)
        return partition_queue(value, 0) if kind == "topic" else value
    return scope


def everywhere(_args: Mapping[str, Any]) -> str:
    return EVERY_QUEUE


@attrs.frozen
class AdminVerb:
    """``role``: "admin", ANY (any role on the queue) or SOME (a listing); ``scope``: the queue
    the role is needed on, from the arguments (``EVERY_QUEUE`` for none); ``changes_tokens``:
    a token created or revoked is in force at this coordinator when the verb answers (the
    caller's next command, such as a revoked token's, is judged on it)."""

    role: str
    scope: Callable[[Mapping[str, Any]], str]
    handler: Handler
    changes_tokens: bool = False  # answered once this coordinator's own copy of the tokens has the change
    # Refused by a plaintext coordinator: a token made there turns tokens on, and its coordinators
    # carry none, so the brokers would refuse their Fence and Seal (and nobody would hold the
    # admin role to revoke it: a plaintext cluster has no admin token).
    needs_tls: bool = False


AdminVerbs = Mapping[str, AdminVerb]


def prepare(verbs: AdminVerbs | None, verb: str, raw: bytes) -> tuple[AdminVerb, dict[str, Any], str]:
    """The verb's row, its arguments and the queue its role is checked on; ConfigError for an
    unknown verb, arguments over ``MAX_ARGS_BYTES`` (refused before they are parsed) or not a
    JSON object."""
    if verbs is None:
        raise ConfigError("this coordinator does not serve the admin API")
    if len(raw) > MAX_ARGS_BYTES:
        raise ConfigError(f"admin request too large: {len(raw)} bytes of arguments (at most {MAX_ARGS_BYTES})")
    spec = verbs.get(verb)
    if spec is None:
        raise ConfigError(f"unknown admin verb {verb[:64]!r}")
    try:
        args = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ConfigError(f"admin verb {verb!r}: arguments are not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ConfigError(f"admin verb {verb!r}: arguments must be a JSON object")
    return spec, args, spec.scope(args)
