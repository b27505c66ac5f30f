"""The coordinator's ``Admin`` and ``Coordinators`` calls without protobuf: what an admin command
(``ordq queue list``, ``ordq auth create``, ...) sends and reads (issue 42: importing the
generated modules, ``ordq_pb2`` and ``ordq_pb2_grpc``, was a quarter of such a command's CPU, as
much again as the work it asked for).

The four messages are small and fixed in proto/ordq/wire/ordq.proto: ``AdminRequest {string verb
= 1; bytes args_json = 2}``, ``AdminResponse {bytes result_json = 1; bytes text = 2}``, ``CoordinatorsRequest {}``
and ``CoordinatorsResponse {repeated string addresses = 1}``. Every other call still goes
through the generated stubs.

Guarantee: ``admin_request`` gives the bytes ``ordq_pb2.AdminRequest(...).SerializeToString()``
gives; the readers accept whatever protobuf may send for their message (fields in any order,
repeated, unknown fields skipped) and raise ValueError for bytes that are not one
(tests/test_admin_messages.py checks both against the generated module, with hypothesis).

Rules: no imports beyond the standard library; no I/O.
"""

from __future__ import annotations

from ordq.wire import varint

ADMIN_METHOD = "/ordq.v1.Coordinator/Admin"
COORDINATORS_METHOD = "/ordq.v1.Coordinator/Coordinators"
COORDINATORS_REQUEST = b""  # CoordinatorsRequest {}: no field
MAX_ARGS_BYTES = 1 << 20  # an admin verb's arguments (JSON): the coordinator refuses more unread

_LEN = 2  # wire type of a length-delimited field (string, bytes)


class AdminAnswer:
    """An AdminResponse: ``result_json``, the verb's result as JSON, and ``text``, what the
    caller prints as it is (b"" when absent)."""

    __slots__ = ("result_json", "text")

    def __init__(self, result_json: bytes = b"", text: bytes = b"") -> None:
        self.result_json = result_json
        self.text = text


class CoordinatorsAnswer:
    """A CoordinatorsResponse: ``addresses``, every coordinator contending, the leader first."""

    __slots__ = ("addresses",)

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field; proto3 leaves an empty one out."""
    return varint.encode(number << 3 | _LEN) + varint.encode(len(value)) + value if value else b""


def admin_request(verb: str, args_json: bytes) -> bytes:
    """An AdminRequest, serialized."""
    return _field(1, verb.encode()) + _field(2, args_json)


def as_bytes(request: bytes | object) -> bytes:
    """A request as it goes on the wire: bytes as they are, a generated message serialized
    (tests send ``ordq_pb2.AdminRequest`` through the same call)."""
    if isinstance(request, bytes):
        return request
    return request.SerializeToString()  # type: ignore[attr-defined,no-any-return]


def _fields(data: bytes, lengths: tuple[int, ...] = (1,)) -> list[tuple[int, int, bytes | int]]:
    """(number, wire type, value) of each field of a message, in order; ValueError when the
    bytes are not a message, or a field of ``lengths`` is not length-delimited."""
    out: list[tuple[int, int, bytes | int]] = []
    at = 0
    while at < len(data):
        key, at = varint.decode(data, at)
        number, kind = key >> 3, key & 7
        if not 0 < number < 1 << 29:  # protobuf's field numbers: 1 to 2^29 - 1, a key fits 32 bits
            raise ValueError(f"field number {number} out of range")
        value: bytes | int
        if kind == 0:
            value, at = varint.decode(data, at)
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            if at + size > len(data):
                raise ValueError("truncated fixed-width field")
            value, at = data[at:at + size], at + size
        elif kind == _LEN:
            size, at = varint.decode(data, at)
            if at + size > len(data):
                raise ValueError("truncated length-delimited field")
            value, at = data[at:at + size], at + size
        else:  # groups (3, 4) are not in proto3; 6 and 7 are not wire types
            raise ValueError(f"unexpected wire type {kind}")
        if number in lengths and kind != _LEN:  # every field these messages have is length-delimited
            raise ValueError(f"field {number} of wire type {kind}")
        out.append((number, kind, value))
    return out


def read_admin_answer(data: bytes) -> AdminAnswer:
    """An AdminResponse from its bytes (the last of each field wins, as protobuf's parser does)."""
    answer = AdminAnswer()
    for number, _kind, value in _fields(data, (1, 2)):
        if number == 1 and isinstance(value, bytes):
            answer.result_json = value
        elif number == 2 and isinstance(value, bytes):
            answer.text = value
    return answer


def read_coordinators_answer(data: bytes) -> CoordinatorsAnswer:
    """A CoordinatorsResponse from its bytes; ValueError when an address is not UTF-8."""
    return CoordinatorsAnswer([value.decode() for number, _kind, value in _fields(data)
                               if number == 1 and isinstance(value, bytes)])
