"""The batch format (ordq/wire/batch.py): round trips, the offset stamp outside the CRC, every
corruption detected, splitting a buffer into batches. Pure: no files, no network."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import CorruptLog
from ordq.wire.batch import (
    HEAD_BYTES,
    BatchHeader,
    Message,
    check_messages,
    decode_batch,
    encode_batch,
    parse_header,
    split_batches,
    stamp_offset,
)
from tests.helpers.batches import SETTINGS, build, flip, message_lists, msg, recrc


@SETTINGS
@given(ms=message_lists, epoch=st.integers(0, 2**64 - 1), first_seq=st.integers(0, 2**63))
def test_encode_decode_round_trip(ms: list[Message], epoch: int, first_seq: int) -> None:
    raw = encode_batch(ms, epoch=epoch, first_seq=first_seq)
    header, out = decode_batch(raw)
    assert out == ms
    assert [m.key for m in out] == [m.key for m in ms]  # None stays None, b"" stays b""
    assert header == BatchHeader(length=len(raw), first_offset=0, epoch=epoch, first_seq=first_seq, count=len(ms))
    assert header.last_seq == first_seq + len(ms) - 1
    assert parse_header(raw) == header == check_messages(raw)
    assert decode_batch(memoryview(raw)) == (header, out)  # any bytes-like input


def test_none_key_and_empty_key_differ() -> None:
    a = encode_batch([Message(b"x", key=None)], epoch=0, first_seq=0)
    b = encode_batch([Message(b"x", key=b"")], epoch=0, first_seq=0)
    assert a != b
    assert decode_batch(a)[1][0].key is None
    assert decode_batch(b)[1][0].key == b""


@SETTINGS
@given(ms=message_lists, offset=st.integers(0, 2**64 - 1))
def test_stamp_offset_keeps_the_crc_valid(ms: list[Message], offset: int) -> None:
    raw = encode_batch(ms, epoch=7, first_seq=3)
    stamped = stamp_offset(raw, offset)
    header, out = decode_batch(stamped)
    assert header.first_offset == offset and header.end_offset == offset + len(ms)
    assert out == ms
    assert stamped[:8] == raw[:8] and stamped[16:] == raw[16:]
    assert stamp_offset(stamped, offset) is stamped  # already stamped: no copy


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([], epoch=0, first_seq=0)
    with pytest.raises(ValueError, match="65535"):
        encode_batch([Message(b"", headers=(("n" * 70000, b""),))], epoch=0, first_seq=0)
    with pytest.raises(ValueError):
        stamp_offset(encode_batch([msg(1)], epoch=0, first_seq=0), -1)
    with pytest.raises(CorruptLog):
        stamp_offset(b"\x00" * 10, 1)


def test_every_bit_flip_outside_first_offset_is_detected() -> None:
    """The CRC covers the body; the length field is checked against the size; only the
    stamped first_offset (bytes 8..16) is outside both, and it is checked by the log."""
    raw = encode_batch([msg(1), Message(b"", key=None, headers=(("h", b"v"),))], epoch=2, first_seq=5)
    for bit in range(len(raw) * 8):
        bad = flip(raw, bit)
        if 64 <= bit < 128:
            assert parse_header(bad).first_offset == 1 << (bit - 64)
            continue
        with pytest.raises(CorruptLog) as info:
            decode_batch(bad)
        assert info.value.path == "<wire>"


def test_wrong_length_buffers_are_corrupt() -> None:
    raw = encode_batch([msg(1)], epoch=0, first_seq=0)
    for bad in (raw[:-1], raw + b"\x00", raw[: HEAD_BYTES - 1], b""):
        with pytest.raises(CorruptLog):
            decode_batch(bad)


def test_crc_valid_but_structurally_broken_batch_is_refused() -> None:
    raw = encode_batch([msg(1), msg(2)], epoch=0, first_seq=0)
    key_len_at = HEAD_BYTES + 8
    for bad in (
        recrc(raw, {key_len_at: struct.pack("<i", 500)}),  # key runs past the batch
        recrc(raw, {key_len_at: struct.pack("<i", -2)}),  # no such key length
        recrc(raw, {HEAD_BYTES - 4: struct.pack("<I", 1)}),  # count says 1, two messages follow
    ):
        parse_header(bad)  # the CRC alone cannot see it...
        parse_header(bad, verify_crc=False)
        with pytest.raises(CorruptLog):
            check_messages(bad)  # ...the structure walk can
        with pytest.raises(CorruptLog):
            decode_batch(bad)


@SETTINGS
@given(batches=st.lists(message_lists, min_size=1, max_size=5))
def test_split_batches(batches: list[list[Message]]) -> None:
    raws = build(batches)
    joined = b"".join(raws)
    assert split_batches(joined) == raws
    assert split_batches(memoryview(joined)) == raws
    assert split_batches(bytearray(joined)) == raws
    with pytest.raises(CorruptLog):
        split_batches(joined[:-1])  # a partial batch at the end
    with pytest.raises(CorruptLog):
        split_batches(joined + b"\x00" * 3)  # trailing bytes
    with pytest.raises(CorruptLog):
        split_batches(flip(joined, len(joined) * 8 - 1))  # last payload byte changed


def test_split_batches_empty() -> None:
    assert split_batches(b"") == []


