"""The lean links' hand-encoded frames (ordq/wire/lean_frames.py), and the gRPC calls' requests
encoded the same way, are protobuf's own bytes."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.broker_group.answer import encode
from ordq.wire import ordq_pb2 as pb
from ordq.wire.lean_frames import (
    add_produce_request,
    add_replicate_request,
    frame,
    produce_request_body,
    read_answer_frame,
    replicate_request_body,
)

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
# small batches as drawn; a size alone for the large ones (a varint of 2 and 3 bytes, past 2 MiB
# the general case), made in the test: hypothesis would print megabytes on a failure
BATCHES = st.lists(st.one_of(st.binary(max_size=300), st.sampled_from([20_000, (1 << 21) + 1])), max_size=6)


def made(drawn: list[bytes | int]) -> list[bytes]:
    return [b if isinstance(b, bytes) else b"y" * b for b in drawn]


@settings(max_examples=60, deadline=None)  # megabytes through protobuf: ~2 ms per MiB, more at load
@given(queue=st.text(max_size=40), seg=U64, epoch=U64, epoch_key=st.text(max_size=40), drawn=BATCHES)
def test_a_produce_request_is_protobufs_bytes(queue: str, seg: int, epoch: int, epoch_key: str,
                                              drawn: list[bytes | int]) -> None:
    batches = made(drawn)
    parts: list[bytes] = [b"before"]
    add_produce_request(parts, queue, seg, epoch, epoch_key, batches)
    want = pb.ProduceRequest(queue=queue, seg=seg, epoch=epoch, epoch_key=epoch_key, batches=batches)
    assert b"".join(parts) == b"before" + frame(want)
    # the gRPC Produce call's request (wire/aio_client.py sends it as it is)
    assert produce_request_body(queue, seg, epoch, epoch_key, batches) == want.SerializeToString()


@settings(max_examples=60, deadline=None)  # megabytes through protobuf: ~2 ms per MiB, more at load
@given(queue=st.text(max_size=40), seg=U64, lac=I64, drawn=BATCHES, more=st.lists(U64, max_size=3))
def test_replicate_requests_are_protobufs_bytes(queue: str, seg: int, lac: int, drawn: list[bytes | int],
                                                more: list[int]) -> None:
    batches = made(drawn)
    parts: list[bytes] = []
    add_replicate_request(parts, queue, seg, batches, lac)
    for n in more:  # several frames in one write, each with its own length
        add_replicate_request(parts, queue, n, [], -1)
    data = b"".join(parts)
    want = [pb.ReplicateRequest(queue=queue, seg=seg, batches=batches, lac=lac)]
    want += [pb.ReplicateRequest(queue=queue, seg=n, lac=-1) for n in more]
    assert data == b"".join(frame(m) for m in want)
    assert replicate_request_body(queue, seg, batches, lac) == want[0].SerializeToString()  # the gRPC call's
    (n,) = struct.unpack(">I", data[:4])
    assert pb.ReplicateRequest.FromString(data[4:4 + n]) == want[0]


@settings(max_examples=60, deadline=None)
@given(drawn=BATCHES, readable_end=U64, sealed=st.booleans())
def test_a_read_answer_on_the_link_is_protobufs_bytes(drawn: list[bytes | int], readable_end: int,
                                                      sealed: bool) -> None:
    """The lean link's Read answer wraps the read path's encoded answer as it is (no parse)."""
    batches = made(drawn)
    wire = encode(batches, offset=0, end_offset=0, readable_end=readable_end, sealed=sealed).wire
    want = pb.ReadLinkAnswer(response=pb.FetchResponse(batches=batches, readable_end=readable_end, sealed=sealed))
    assert read_answer_frame(wire) == frame(want)
    assert pb.ReadLinkAnswer.FromString(read_answer_frame(wire)[4:]).HasField("response")
