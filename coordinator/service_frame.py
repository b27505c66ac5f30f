"""The frame of every coordinator call, before its handler (issue 38): size before body, the
caller before its request, a fair turn per caller, no traceback for bad input.

Guarantees, for every method of the ``Coordinator`` service (the generated handlers are wrapped
here at registration, so a method added later is framed too):
- **Size before body.** The server's receive limit (``server_options``) is the largest
  legitimate request (``LARGE_REQUEST_BYTES`` and a little: a SubscriptionRecord body or Admin
  arguments, at most a ZooKeeper node); gRPC refuses a larger one itself, RESOURCE_EXHAUSTED,
  before it is buffered. A control call's own limit (``SMALL_REQUEST_BYTES``) is checked on the
  raw bytes before they are parsed: ``MessageTooLarge`` (RESOURCE_EXHAUSTED), counted.
- **The caller before its request.** Each unary method is served as a request *stream* (gRPC
  starts it before any message is read): the caller's token is checked on the headers
  (``check_caller``) and its share of the coordinator (``turn``) before the body is read, so an
  unauthenticated call costs its headers, whatever it sends; a slot to work in is taken only once
  the body arrived, so a caller that withholds it holds none.
- **No traceback for bad input.** Bytes that are no protobuf of the call's type become
  ``Undecodable`` (INVALID_ARGUMENT, counted): the deserializer given to gRPC never raises
  (gRPC logs a traceback at ERROR and answers INTERNAL when it does). Any ``OrdqError`` a
  handler raises before its own frame (``_serve``) is answered typed and counted, not as
  ``UNKNOWN`` with gRPC's traceback.

Rules: imports ``grpc`` only inside functions (as service.py); what to do with a refusal
(count, log, abort) is the service's (``refuse``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from ordq.common.errors import ConfigError, InvalidName, MessageTooLarge, OrdqError
from ordq.coordinator.fair_share import TurnRefused

SERVICE = "ordq.v1.Coordinator"
SMALL_REQUEST_BYTES = 64 << 10  # a control call: names, a cursor, a lease key (a few hundred bytes)
LARGE_REQUEST_BYTES = 1 << 20  # ZooKeeper's default node limit (jute.maxbuffer): what a record may hold
LARGE_RPCS = frozenset({"SubscriptionRecord", "Admin"})  # a parked record's body; an admin verb's arguments
# Calls that need no token (a client finds the leader with it): framed, sized and paced all the same,
# counted as any; shown no valid token, charged to ANONYMOUS (service.py ``_Tokens.caller``).
OPEN_RPCS = frozenset({"Coordinators"})
ANONYMOUS = "anonymous"  # the one caller every open call without a valid token is charged to
SHOWN_CHARS = 64  # a caller's name in the log or an answer: cut here, control characters escaped


@attrs.frozen(kw_only=True)
class FrameConfig:
    """The coordinator server's bounds (docs/SECURITY.md, Limits)."""

    small_request_bytes: int = SMALL_REQUEST_BYTES
    large_request_bytes: int = LARGE_REQUEST_BYTES
    # HTTP/2 streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS): a client's
    # calls past it wait in the client's own process. Not lower: at 8 (stop f) the server refused
    # streams the client already counted as closed (RST_STREAM REFUSED_STREAM: UNAVAILABLE, untyped
    # and uncounted; the drill's flood got 230 a round and a 64-thread flood 1,200 a second), and the
    # neighbour's Commit p99 stayed 2.5-3.1x quiet with the attacker's calls down to ~30 a second.
    # What one token may hold is ``FairShareConfig.max_calls_per_caller`` (64, typed, counted).
    max_streams_per_connection: int = 100
    max_metadata_bytes: int = 16 << 10
    # Each stream's HTTP/2 receive window, pinned (no bandwidth probes growing it): what a client
    # may push of a body the coordinator has not asked for yet. gRPC's probes grew it to ~4 MiB a
    # stream, so each Pop refused on its headers (no token) still brought ~4 MiB of a huge body
    # into the leader, decrypted and buffered until the refusal. Control calls are a few hundred
    # bytes; the largest (1 MiB) arrive in steps of it.
    receive_window_bytes: int = 64 << 10
    handshake_timeout_ms: int = 10_000
    max_connections: int = 1_000

    def __attrs_post_init__(self) -> None:
        if not 0 < self.small_request_bytes <= self.large_request_bytes:
            raise ConfigError("request limits must be > 0, the small one at most the large one")
        if min(self.max_streams_per_connection, self.max_metadata_bytes, self.handshake_timeout_ms,
               self.max_connections, self.receive_window_bytes) <= 0:
            raise ConfigError("streams per connection, metadata bytes, handshake timeout, connections, receive "
                              "window must be > 0")

    def limit_of(self, rpc: str) -> int:
        return self.large_request_bytes if rpc in LARGE_RPCS else self.small_request_bytes

    @property
    def receive_limit(self) -> int:
        """gRPC's own limit: the largest call's, and room for the rest of its message."""
        return self.large_request_bytes + (64 << 10)


def server_options(cfg: FrameConfig) -> list[tuple[str, int]]:
    """The coordinator server's channel arguments: answers may be large (a queue's state), requests
    not (``FrameConfig.receive_limit``); connections and streams bounded (as the brokers'); each
    stream's receive window pinned (``FrameConfig.receive_window_bytes``)."""
    from ordq.wire.framing import GRPC_OPTIONS

    return [(k, v) for k, v in GRPC_OPTIONS if k != "grpc.max_receive_message_length"] + [
        ("grpc.max_receive_message_length", cfg.receive_limit),
        ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
        ("grpc.max_metadata_size", cfg.max_metadata_bytes),
        ("grpc.server_handshake_timeout_ms", cfg.handshake_timeout_ms),
        ("grpc.max_allowed_incoming_connections", cfg.max_connections),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", cfg.receive_window_bytes),
    ]


class Undecodable(ConfigError):
    """A request that is no protobuf of its call's type (INVALID_ARGUMENT, counted as such)."""


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """A caller's text as it may reach a log line or an answer: cut (``wire.errors.short``)
    and with control characters (a new line forging a log line) escaped."""
    from ordq.wire.errors import short

    cut = short(str(text), limit)
    return cut if cut.isprintable() else cut.encode("unicode_escape").decode("ascii")


def safe(exc: OrdqError) -> OrdqError:
    """``exc`` with the caller's text in it cut: an invalid name is echoed in its short form."""
    if isinstance(exc, InvalidName) and len(str(exc)) > 4 * SHOWN_CHARS + 200:
        from ordq.coordinator.paths import NAME_RULE

        return InvalidName(exc.kind, shown(exc.name), NAME_RULE)
    return exc


RETRY_METADATA_KEY = "ordq-retry-ms"  # a RESOURCE_EXHAUSTED refusal's hint: when to ask again


def exhausted(exc: TurnRefused) -> OrdqError:
    """The wire's ResourceExhausted for a refused turn, carrying its ``retry_ms`` hint."""
    from ordq.wire.errors import ResourceExhausted

    out = ResourceExhausted("coordinator", "turns", exc.retry_ms, exc.why + f"; retry in {exc.retry_ms} ms")
    out.retry_ms = exc.retry_ms  # type: ignore[attr-defined]
    return out


class _Bad:
    """What the deserializer hands over instead of raising (gRPC would log a traceback)."""

    def __init__(self, error: OrdqError) -> None:
        self.error = error


# (context, rpc) -> who the call is charged to (a token's hash, else its connection); raises
# PermissionDenied when the call needs a token and shows none that is valid.
CheckCaller = Callable[[Any, str], str]
# (rpc, context, exc) -> never returns: counts, logs (shown forms only) and aborts the call typed.
Refuse = Callable[[str, Any, OrdqError], Any]
# (holder, rpc, read the body) -> a context manager around the call's work: its fair turn
# (fair_share.py), which reads the request's body once the caller's share let the call in and
# before it takes a slot (a caller that withholds its body holds no slot).
Turn = Callable[[str, str, Callable[[], object]], contextlib.AbstractContextManager[Any]]


def no_turn(_holder: str, _rpc: str, read_body: Callable[[], object]) -> contextlib.AbstractContextManager[Any]:
    read_body()
    return contextlib.nullcontext()


# () -> a context manager around each call in the frame, from its headers to its answer: the
# service counts the calls in flight there (``ordq_coordinator_calls_in_flight``).
InFlight = Callable[[], contextlib.AbstractContextManager[Any]]


def framed(servicer: Any, cfg: FrameConfig, check_caller: CheckCaller, refuse: Refuse,
           turn: Turn = no_turn, in_flight: InFlight = contextlib.nullcontext) -> dict[str, Any]:
    """The generated handlers of ``servicer``, each framed (see the module doc)."""
    from ordq.wire import ordq_pb2_grpc as pb_grpc

    captured = _Handlers()
    pb_grpc.add_CoordinatorServicer_to_server(servicer, captured)  # type: ignore[no-untyped-call]
    return {name: _frame(name, h, cfg, check_caller, refuse, turn, in_flight) for name, h in captured.handlers.items()}


def register(server: Any, handlers: dict[str, Any]) -> None:
    import grpc

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _frame(rpc: str, handler: Any, cfg: FrameConfig, check_caller: CheckCaller, refuse: Refuse,
           turn: Turn, in_flight: InFlight) -> Any:
    assert not handler.request_streaming and not handler.response_streaming, rpc  # all unary today
    behavior = handler.unary_unary
    parse = handler.request_deserializer
    limit = cfg.limit_of(rpc)

    def deserialize(raw: bytes) -> Any:
        if len(raw) > limit:
            return _Bad(MessageTooLarge(len(raw), limit, f"a {rpc} request"))
        try:
            return parse(raw)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError (and anything like it): typed
            return _Bad(Undecodable(f"bad {rpc} request: {type(exc).__name__}: {shown(str(exc), 200)}"))

    def unary(requests: Iterator[Any], context: Any) -> Any:
        body: list[Any] = []

        def read_body() -> None:
            request = next(requests, None)
            if request is None:  # gRPC refused the body itself (past its receive limit), or none came
                raise Undecodable(f"bad {rpc} request: none arrived whole (none sent, or over the "
                                  f"server's receive limit of {cfg.receive_limit} bytes)")
            if isinstance(request, _Bad):
                raise request.error
            body.append(request)

        with in_flight():
            try:
                holder = check_caller(context, rpc)  # on the headers: nothing of the body read yet
                # The body is read inside the turn, once the caller's share let the call in and
                # before it takes a slot: read with the slot held, three callers each withholding
                # one body held every slot until their deadlines, and no other call was answered.
                with turn(holder, rpc, read_body):
                    return behavior(body[0], context)
            except TurnRefused as exc:  # no fair turn now: typed RESOURCE_EXHAUSTED, with its hint
                refuse(rpc, context, exhausted(exc))
            except OrdqError as exc:  # raised before the handler's own frame (``_serve``) caught it
                refuse(rpc, context, exc)

    return handler._replace(request_streaming=True, unary_unary=None, stream_unary=unary,
                            request_deserializer=deserialize)


class _Handlers:
    """Stands in for the server while the generated code registers the handlers."""

    handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        assert service == SERVICE, service
        self.handlers = handlers
