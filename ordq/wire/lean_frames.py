"""The lean links' frames (issue 39): each a 4-byte big-endian length and a protobuf body, on
the producer → master link (ordq/wire/lean_produce.py, broker_group/lean_produce.py) and the
master → slave link (broker_group/lean_link.py). The two messages that carry batches,
``ProduceRequest`` and ``ReplicateRequest``, are encoded here by hand, with one ``join``; so are
their bodies for the gRPC Produce and Replicate calls (``as_is``: the default links).

Why: protobuf's ``SerializeToString`` (upb) costs ~2 ms per MiB of ``bytes`` fields on this
box, 40x a copy (measured 2026-11-30: 1 MiB of batches, 2.0-2.2 ms to serialize, 0.05 ms to
join), and on a lean link it runs on the broker's event loop: a py-spy profile of a pipelined
run showed the master's loop 91 % busy, a quarter of it in serializing replication frames
(docs/BENCHMARKS.md, "The lean links' pipelined rate", issue 39). Parsing stays protobuf's own
(``FromString``, fast: it aliases the bytes).

Guarantee: what ``add_produce_request`` and ``add_replicate_request`` append is byte for byte
the framed ``SerializeToString()`` of the same message (fields in number order, proto3 defaults
left out; tests/test_lean_frames.py checks it against protobuf with hypothesis), so every
reader parses them with the generated classes.

Rules: encoding and reading frames only; no state.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message

from ordq.common.errors import ConfigError
from ordq.wire import varint

HEADER = struct.Struct(">I")
_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    """``n`` as protobuf's varint (a negative int64 as its 64-bit two's complement: 10 bytes)."""
    return varint.encode(n & _U64)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2) with ``tag`` = field number << 3 | 2."""
    return bytes((tag,)) + _varint(len(data)) + data


def _batches(parts: list[bytes], tag: int, batches: Sequence[bytes]) -> None:
    """Each batch as a field ``tag`` (wire type 2); a length's varint inline up to 2 MiB (one
    ``bytes`` per batch: this loop runs once per batch on the loop)."""
    app = parts.append
    for b in batches:
        n = len(b)
        if n < 0x80:
            app(bytes((tag, n)))
        elif n < 0x4000:
            app(bytes((tag, n & 0x7F | 0x80, n >> 7)))
        elif n < 0x200000:
            app(bytes((tag, n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14)))
        else:
            app(bytes((tag,)) + _varint(n))
        app(b)


def frame(msg: Message) -> bytes:
    """Any message as one frame."""
    body = msg.SerializeToString()
    return HEADER.pack(len(body)) + body


def add_produce_request(parts: list[bytes], queue: str, seg: int, epoch: int, epoch_key: str,
                        batches: Sequence[bytes]) -> None:
    """Append the frame of ``ProduceRequest(queue=, seg=, epoch=, batches=, epoch_key=)`` to
    ``parts`` (the caller joins all it writes once: one copy, one TLS record run)."""
    at = len(parts)
    parts.append(b"")  # the header, once the body's size is known
    if queue:
        parts.append(_field(0x0A, queue.encode()))  # 1: queue
    if seg:
        parts.append(b"\x10" + _varint(seg))  # 2: seg
    if epoch:
        parts.append(b"\x18" + _varint(epoch))  # 3: epoch
    _batches(parts, 0x22, batches)  # 4: batches
    if epoch_key:
        parts.append(_field(0x2A, epoch_key.encode()))  # 5: epoch_key
    parts[at] = HEADER.pack(sum(map(len, parts[at + 1:])))


def add_replicate_request(parts: list[bytes], queue: str, seg: int, batches: Sequence[bytes], lac: int) -> None:
    """Append the frame of ``ReplicateRequest(queue=, seg=, batches=, lac=)`` (not a hello)."""
    at = len(parts)
    parts.append(b"")
    if queue:
        parts.append(_field(0x0A, queue.encode()))  # 1: queue
    if seg:
        parts.append(b"\x10" + _varint(seg))  # 2: seg
    _batches(parts, 0x1A, batches)  # 3: batches
    if lac:
        parts.append(b"\x20" + _varint(lac))  # 4: lac
    parts[at] = HEADER.pack(sum(map(len, parts[at + 1:])))


def read_answer_frame(wire: bytes) -> bytes:
    """The frame of ``ReadLinkAnswer(response=FetchResponse.FromString(wire))``: a Read answer
    the read path encoded once (broker_group/answer.py), wrapped without parsing it again."""
    head = b"\x0a" + _varint(len(wire))  # 1: response (a message: its bytes as they are)
    return HEADER.pack(len(head) + len(wire)) + head + wire


def produce_request_body(queue: str, seg: int, epoch: int, epoch_key: str, batches: Sequence[bytes]) -> bytes:
    """``ProduceRequest(...).SerializeToString()``, encoded by hand: the request of a gRPC
    Produce call that sends it ``as_is`` (wire/aio_client.py)."""
    parts: list[bytes] = []
    add_produce_request(parts, queue, seg, epoch, epoch_key, batches)
    return b"".join(parts[1:])  # without the frame's length


def replicate_request_body(queue: str, seg: int, batches: Sequence[bytes], lac: int) -> bytes:
    """``ReplicateRequest(...).SerializeToString()`` (not a hello), encoded by hand: the
    request of a gRPC Replicate call that sends it ``as_is`` (broker_group/replication.py)."""
    parts: list[bytes] = []
    add_replicate_request(parts, queue, seg, batches, lac)
    return b"".join(parts[1:])


def as_is(body: bytes) -> bytes:
    """A gRPC request serializer for a body encoded already (above): on the gRPC links too,
    protobuf's serializer would cost its ~2 ms per MiB on the sender's event loop."""
    return body


def encoded_stream(channel: Any, method: str, response: type[Message]) -> Any:
    """The Broker service's stream-stream ``method`` on a grpc(.aio) ``channel``, as the
    generated stub makes it, but sending requests ``as_is`` (bodies encoded above)."""
    return channel.stream_stream(f"/ordq.v1.Broker/{method}", request_serializer=as_is,
                                 response_deserializer=response.FromString, _registered_method=True)



def frame_length(head: bytes | bytearray, limit: int, what: str) -> int:
    """The body length a frame's header (the first bytes of ``head``) gives; a frame longer
    than ``limit`` is refused (ConfigError) before its body is read."""
    (n,) = HEADER.unpack_from(head)
    if n > limit:
        raise ConfigError(f"bad {what}: a frame of {n} bytes, over the limit of {limit}")
    return int(n)


async def read_frame(reader: asyncio.StreamReader, limit: int, what: str) -> bytes | None:
    """The next frame's body; None at a clean end of stream (between frames). A frame longer
    than ``limit`` is refused (ConfigError) before its body is read."""
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    return await reader.readexactly(frame_length(head, limit, what))
