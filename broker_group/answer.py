"""A Fetch or Read answer, encoded once by the read path as the bytes gRPC sends.

Guarantee: ``Answer.wire`` is exactly ``FetchResponse(batches=..., readable_end=...,
sealed=...).SerializeToString()`` (protobuf's wire format for those three fields), so every
client parses it as a ``FetchResponse``; the broker registers Fetch and Read with a serializer
that sends these bytes as they are (broker_group/dataplane.py, ``add_servicer``).

Why: an answer of up to ``max_fetch_bytes`` used to live in memory four times while it was
built and sent (the batches read, the protobuf message, its serialisation, gRPC's copy). Built
here with one ``join`` from the batches read, it lives twice (these bytes and gRPC's copy),
which is what the memory budget (broker_group/budget.py) multiplies its charge by.

Rules: no I/O, no gRPC; pure encoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ordq.wire import varint

_BATCH_TAG = b"\x0a"  # field 1 (batches), wire type 2 (length-delimited)
_READABLE_END_TAG = b"\x10"  # field 2 (readable_end), varint
_SEALED_TRUE = b"\x18\x01"  # field 3 (sealed), varint 1


@attrs.frozen
class Answer:
    """One answer: its wire bytes and what the broker needs to know of it afterwards."""

    wire: bytes
    batches: int  # how many batches it carries
    batch_bytes: int  # their total size (what the memory budget charges)
    end_offset: int  # the offset after its last batch (the request's offset when empty)
    readable_end: int
    sealed: bool


def encode(batches: Sequence[bytes], *, offset: int, end_offset: int, readable_end: int, sealed: bool) -> Answer:
    """The answer carrying ``batches`` (read from ``offset``; ``end_offset``: after the last)."""
    parts: list[bytes] = []
    size = 0
    for b in batches:
        parts.append(_BATCH_TAG + varint.encode(len(b)))
        parts.append(b)
        size += len(b)
    if readable_end:  # proto3: a zero (false) field is not sent
        parts.append(_READABLE_END_TAG + varint.encode(readable_end))
    if sealed:
        parts.append(_SEALED_TRUE)
    return Answer(wire=b"".join(parts), batches=len(batches), batch_bytes=size,
                  end_offset=end_offset if batches else offset, readable_end=readable_end, sealed=sealed)


def as_is(wire: bytes) -> bytes:
    """The response serializer of Fetch and Read: the answer is already encoded."""
    return wire
