"""Batches for the tests of the batch format and the segment log: Hypothesis strategies of
messages, and encoded, offset-stamped batches as a master appends them."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ordq.wire.batch import Message, encode_batch, stamp_offset

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

keys = st.none() | st.binary(max_size=12)
headers = st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=8)), max_size=3).map(tuple)
payloads = st.binary(max_size=200) | st.sampled_from([b"", b"\x00" * 1024, b"\xa1" * 64])
messages = st.builds(
    Message, payload=payloads, key=keys, headers=headers, timestamp_us=st.integers(-(2**63), 2**63 - 1)
)
message_lists = st.lists(messages, min_size=1, max_size=8)


def msg(i: int, size: int = 10) -> Message:
    return Message(payload=bytes([i % 251]) * size, key=str(i).encode(), timestamp_us=i)


def build(batches: Sequence[Sequence[Message]], *, epoch: int = 1, first_seq: int = 100) -> list[bytes]:
    """Encoded, offset-stamped batches as the master would append them."""
    out, offset, seq = [], 0, first_seq
    for ms in batches:
        out.append(stamp_offset(encode_batch(ms, epoch=epoch, first_seq=seq), offset))
        offset += len(ms)
        seq += len(ms)
    return out


def flip(raw: bytes, bit: int) -> bytes:
    b = bytearray(raw)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def recrc(raw: bytes, body_patch: dict[int, bytes]) -> bytes:
    """A batch with bytes replaced and the CRC recomputed: valid CRC, broken structure."""
    b = bytearray(raw)
    for at, value in body_patch.items():
        b[at : at + len(value)] = value
    struct.pack_into("<I", b, 4, zlib.crc32(b[16:]))
    return bytes(b)
