"""Protobuf's base-128 varint, for the few messages ordq writes or reads without the generated
module: the broker's Read answers on the hot path (broker_group/answer.py) and the admin
commands' calls (ordq/wire/admin_messages.py).

Rules: the standard library only; no I/O.
"""

from __future__ import annotations


def encode(n: int) -> bytes:
    """``n`` (>= 0) as a varint: seven bits a byte, lowest first, the high bit set on all but the last."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode(data: bytes, at: int) -> tuple[int, int]:
    """The varint starting at ``data[at]`` and the offset after it; ValueError when it is cut
    short or longer than ten bytes."""
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")
