"""ordq errors on the wire: one table maps each error kind to a gRPC status and back.

The server aborts a call with ``await abort(context, exc)``: the gRPC status code says what kind of
failure it is to generic tools, and the trailing metadata ``ordq-error`` carries the kind and
its fields as JSON so the client re-raises the same typed error (``from_rpc_error``). Any
``grpc.RpcError`` without that metadata (the process died, the port is closed, a deadline
passed) becomes ``BrokerUnavailable``: a retriable failure of that replica.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import grpc

from ordq.common.errors import (
    AlreadyExists,
    BrokerUnavailable,
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    CorruptLog,
    DiskFull,
    EpochNotIssued,
    FencedError,
    IllegalTransition,
    LeaseLost,
    MessageTooLarge,
    NoGroupAvailable,
    NotCoordinatorLeader,
    NotLeader,
    OrdqError,
    PermissionDenied,
    QueueNotFound,
    SegmentNotFound,
    SubscriptionNotFound,
    TokensUnavailable,
    WaitTimeout,
)

METADATA_KEY = "ordq-error"
# gRPC refuses a response whose metadata exceeds 8 KiB (the client then sees an untyped
# failure): names echoed in errors are cut to SHORT_CHARS, texts to DETAIL_CHARS.
SHORT_CHARS = 64
DETAIL_CHARS = 1024


def short(text: str, limit: int = SHORT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was (for echoing names)."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


class SegmentNotWritable(BrokerUnavailable):
    """The segment refuses writes: sealed, held open before a restart, or its slave is gone.
    Retriable: the producer fails over to a new segment."""

    def __init__(self, address: str, queue: str, seg: int, why: str) -> None:
        super().__init__(address, f"queue {queue!r} segment {seg} is not writable: {why}")
        self.queue = queue
        self.seg = seg
        self.why = why


class ResourceExhausted(BrokerUnavailable):
    """The broker has no room for this call now: its memory budget (``resource`` "memory",
    broker_group/budget.py) or a Read stream's idle deadline. Retriable: the same call may
    pass once others finished; a reader may ask the other replica meanwhile."""

    def __init__(self, address: str, resource: str, limit: int, why: str) -> None:
        super().__init__(address, f"resource exhausted ({resource}, limit {limit}): {why}")
        self.resource = resource
        self.limit = limit
        self.why = why


# kind -> (status code, builder from fields). Builders take the fields the server sent.
def _fenced(f: dict[str, Any]) -> OrdqError:
    return FencedError(f["queue"], f["epoch"], f["current_epoch"])


def _not_issued(f: dict[str, Any]) -> OrdqError:
    return EpochNotIssued(f["queue"], f["epoch"], f["current_epoch"], key_mismatch=bool(f.get("key_mismatch")))


def _not_writable(f: dict[str, Any]) -> OrdqError:
    return SegmentNotWritable(f.get("address", "?"), f["queue"], f["seg"], f["why"])


def _exhausted(f: dict[str, Any]) -> OrdqError:
    return ResourceExhausted(f.get("address", "?"), f["resource"], f["limit"], f["why"])


def _unavailable(f: dict[str, Any]) -> OrdqError:
    return BrokerUnavailable(f.get("address", "?"), f["detail"])


def _not_found(f: dict[str, Any]) -> OrdqError:
    return SegmentNotFound(f["queue"], f["seg"])


def _too_large(f: dict[str, Any]) -> OrdqError:
    return MessageTooLarge(f["size"], f["limit"], f.get("limit_of", ""))


def _corrupt(f: dict[str, Any]) -> OrdqError:
    return CorruptLog(f["path"], f["position"], f["detail"])


def _disk_full(f: dict[str, Any]) -> OrdqError:
    return DiskFull(f["message"])


def _bad_request(f: dict[str, Any]) -> OrdqError:
    return ConfigError(f["message"])


def _denied(f: dict[str, Any]) -> OrdqError:
    return PermissionDenied(f["queue"], f["role"], f["why"])


# The coordinator service's errors (coordinator/service.py) travel the same way.
def _not_coordinator(f: dict[str, Any]) -> OrdqError:
    return NotCoordinatorLeader(f.get("leader", ""))


def _illegal(f: dict[str, Any]) -> OrdqError:
    return IllegalTransition(f["transition"], f["reason"])


def _conflict(f: dict[str, Any]) -> OrdqError:
    return ConflictError(f["message"])


def _exists(f: dict[str, Any]) -> OrdqError:
    return AlreadyExists(f["message"])


def _queue_not_found(f: dict[str, Any]) -> OrdqError:
    return QueueNotFound(f["queue"])


def _sub_not_found(f: dict[str, Any]) -> OrdqError:
    return SubscriptionNotFound(f["queue"], f["subscription"])


def _no_group(f: dict[str, Any]) -> OrdqError:
    return NoGroupAvailable(f["queue"], f.get("detail", ""))


def _coordination(f: dict[str, Any]) -> OrdqError:
    return CoordinationUnavailable(f["message"])


def _tokens_unavailable(f: dict[str, Any]) -> OrdqError:
    return TokensUnavailable(f["detail"])


def _not_leader(f: dict[str, Any]) -> OrdqError:
    return NotLeader(f["queue"], f["subscription"], f["reason"])


def _lease_lost(f: dict[str, Any]) -> OrdqError:
    return LeaseLost(f["kind"], f["queue"], f["name"], f["reason"])


def _timeout(f: dict[str, Any]) -> OrdqError:
    return WaitTimeout(f["message"])


_KINDS: dict[str, tuple[grpc.StatusCode, Any]] = {
    "not_coordinator": (grpc.StatusCode.UNAVAILABLE, _not_coordinator),
    "illegal": (grpc.StatusCode.FAILED_PRECONDITION, _illegal),
    "conflict": (grpc.StatusCode.ABORTED, _conflict),
    "exists": (grpc.StatusCode.ALREADY_EXISTS, _exists),
    "queue_not_found": (grpc.StatusCode.NOT_FOUND, _queue_not_found),
    "sub_not_found": (grpc.StatusCode.NOT_FOUND, _sub_not_found),
    "no_group": (grpc.StatusCode.UNAVAILABLE, _no_group),
    "coordination": (grpc.StatusCode.UNAVAILABLE, _coordination),
    "tokens_unavailable": (grpc.StatusCode.UNAVAILABLE, _tokens_unavailable),
    "not_leader": (grpc.StatusCode.FAILED_PRECONDITION, _not_leader),
    "lease_lost": (grpc.StatusCode.FAILED_PRECONDITION, _lease_lost),
    "timeout": (grpc.StatusCode.DEADLINE_EXCEEDED, _timeout),
    "fenced": (grpc.StatusCode.FAILED_PRECONDITION, _fenced),
    "epoch_not_issued": (grpc.StatusCode.PERMISSION_DENIED, _not_issued),
    "not_writable": (grpc.StatusCode.UNAVAILABLE, _not_writable),
    "exhausted": (grpc.StatusCode.RESOURCE_EXHAUSTED, _exhausted),
    "unavailable": (grpc.StatusCode.UNAVAILABLE, _unavailable),
    "not_found": (grpc.StatusCode.NOT_FOUND, _not_found),
    "too_large": (grpc.StatusCode.RESOURCE_EXHAUSTED, _too_large),
    "corrupt": (grpc.StatusCode.DATA_LOSS, _corrupt),
    "disk_full": (grpc.StatusCode.RESOURCE_EXHAUSTED, _disk_full),
    "bad_request": (grpc.StatusCode.INVALID_ARGUMENT, _bad_request),
    "denied": (grpc.StatusCode.PERMISSION_DENIED, _denied),
}


def _kind_and_fields(exc: OrdqError) -> tuple[str, dict[str, Any]]:
    if isinstance(exc, FencedError):
        return "fenced", {"queue": exc.queue, "epoch": exc.epoch, "current_epoch": exc.current_epoch}
    if isinstance(exc, EpochNotIssued):
        return "epoch_not_issued", {"queue": exc.queue, "epoch": exc.epoch, "current_epoch": exc.current_epoch,
                                    "key_mismatch": getattr(exc, "key_mismatch", False)}
    if isinstance(exc, SegmentNotWritable):
        return "not_writable", {"address": exc.address, "queue": exc.queue, "seg": exc.seg, "why": exc.why}
    if isinstance(exc, ResourceExhausted):
        return "exhausted", {"address": exc.address, "resource": exc.resource, "limit": exc.limit, "why": exc.why}
    if isinstance(exc, BrokerUnavailable):
        return "unavailable", {"address": exc.address, "detail": str(exc)}
    if isinstance(exc, SegmentNotFound):
        return "not_found", {"queue": exc.queue, "seg": exc.seg}
    if isinstance(exc, MessageTooLarge):
        return "too_large", {"size": exc.size, "limit": exc.limit, "limit_of": exc.limit_of}
    if isinstance(exc, CorruptLog):
        return "corrupt", {"path": exc.path, "position": exc.position, "detail": str(exc)}
    if isinstance(exc, DiskFull):
        return "disk_full", {"message": str(exc)}
    if isinstance(exc, PermissionDenied):
        return "denied", {"queue": exc.queue, "role": exc.role, "why": exc.why}
    if isinstance(exc, TokensUnavailable):
        return "tokens_unavailable", {"detail": exc.detail}
    if isinstance(exc, NotCoordinatorLeader):
        return "not_coordinator", {"leader": exc.leader}
    if isinstance(exc, IllegalTransition):
        return "illegal", {"transition": exc.transition, "reason": exc.reason}
    if isinstance(exc, ConflictError):
        return "conflict", {"message": str(exc)}
    if isinstance(exc, AlreadyExists):
        return "exists", {"message": str(exc)}
    if isinstance(exc, QueueNotFound):
        return "queue_not_found", {"queue": exc.queue}
    if isinstance(exc, SubscriptionNotFound):
        return "sub_not_found", {"queue": exc.queue, "subscription": exc.sub}
    if isinstance(exc, NoGroupAvailable):
        return "no_group", {"queue": exc.queue, "detail": str(exc).partition("for writes: ")[2]}
    if isinstance(exc, CoordinationUnavailable):
        return "coordination", {"message": str(exc)}
    if isinstance(exc, LeaseLost):
        return "lease_lost", {"kind": exc.kind, "queue": exc.queue, "name": exc.subscription, "reason": exc.reason}
    if isinstance(exc, NotLeader):
        return "not_leader", {"queue": exc.queue, "subscription": exc.subscription, "reason": exc.reason}
    if isinstance(exc, WaitTimeout):
        return "timeout", {"message": str(exc)}
    return "bad_request", {"message": str(exc)}


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: OrdqError) -> NoReturn:
    """End the current call (a ``grpc.aio`` handler's) with ``exc``, typed for the client.

    ``exc`` loses its traceback and the errors it was raised from: decided and counted, only
    its text and kind travel on. Kept, they held the frames that raised them, one of which
    holds ``exc`` (the handler's ``except``, a stream's stored error): a cycle that only the
    full collection frees, with every local of those frames (the noisy-neighbour drill's
    spikes: docs/BENCHMARKS.md, stop 86)."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    kind, fields = _kind_and_fields(exc)
    # A name or text the caller sent may be huge: the answer must still fit gRPC's metadata.
    fields = {k: short(v, DETAIL_CHARS) if isinstance(v, str) else v for k, v in fields.items()}
    context.set_trailing_metadata(((METADATA_KEY, json.dumps({"kind": kind, "fields": fields})),))
    await context.abort(_KINDS[kind][0], short(str(exc), DETAIL_CHARS))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def abort_sync(context: grpc.ServicerContext, exc: OrdqError,
               extra: tuple[tuple[str, str], ...] = ()) -> NoReturn:
    """As ``abort``, for a sync ``grpc.server`` handler; ``extra`` trailing metadata rides along
    (the coordinator's ``ordq-leader``)."""
    kind, fields = _kind_and_fields(exc)
    # As ``abort``: what the caller sent may be long; the answer must fit gRPC's metadata.
    fields = {k: short(v, DETAIL_CHARS) if isinstance(v, str) else v for k, v in fields.items()}
    context.set_trailing_metadata(((METADATA_KEY, json.dumps({"kind": kind, "fields": fields})), *extra))
    context.abort(_KINDS[kind][0], short(str(exc), DETAIL_CHARS))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def from_rpc_error(exc: grpc.RpcError, address: str) -> OrdqError:
    """The ordq error a failed call stands for (BrokerUnavailable when it is not one of ours)."""
    meta = {}
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        meta[key] = value
    raw = meta.get(METADATA_KEY)
    ours = _decoded(raw, address) if raw else None
    if ours is not None:
        return ours
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    return BrokerUnavailable(address, f"{name}: {details}")


# -- the same errors on a lean link (issue 39: framed protobuf, no gRPC status) ------------------

def error_json(exc: OrdqError) -> str:
    """``exc`` as the JSON that ``abort`` puts in the ``ordq-error`` trailer (fields cut the same way)."""
    kind, fields = _kind_and_fields(exc)
    fields = {k: short(v, DETAIL_CHARS) if isinstance(v, str) else v for k, v in fields.items()}
    return json.dumps({"kind": kind, "fields": fields})


def from_error_json(raw: str, text: str, address: str) -> OrdqError:
    """The ordq error a lean link's refusal stands for: what ``from_rpc_error`` makes of the
    same trailer (BrokerUnavailable when it is not one of ours)."""
    ours = _decoded(raw, address)
    return ours if ours is not None else BrokerUnavailable(address, f"refused: {short(text, DETAIL_CHARS)}")


def _decoded(raw: str, address: str) -> OrdqError | None:
    """The ordq error an ``ordq-error`` document stands for (None: not one of ours)."""
    try:
        doc = json.loads(raw)
        fields = dict(doc["fields"])
        if doc["kind"] in ("not_writable", "unavailable", "exhausted"):
            fields["address"] = address
        return _KINDS[doc["kind"]][1](fields)  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError):
        return None
