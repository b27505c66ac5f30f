"""The lean replication link's framing (broker_group/lean_link.py), without sockets: frames
round-trip whatever their split across reads, a clean end between frames is None, a torn one
raises, and a length past the limit is refused before the body is waited for."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.broker_group.lean_link import _replication_hello, frame, read_frame
from ordq.common.errors import ConfigError
from ordq.wire import ordq_pb2 as pb


def _read_all(data: bytes, cuts: list[int], limit: int = 1 << 20) -> list[bytes]:
    async def run() -> list[bytes]:
        reader = asyncio.StreamReader()
        last = 0
        for c in sorted(c % (len(data) + 1) for c in cuts):
            reader.feed_data(data[last:c])
            last = max(last, c)
        reader.feed_data(data[last:])
        reader.feed_eof()
        out = []
        while (body := await read_frame(reader, limit)) is not None:
            out.append(body)
        return out

    return asyncio.run(run())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.integers(0, 2**31), st.lists(st.binary(max_size=300), max_size=4),
                          st.integers(-1, 2**40)), max_size=6),
       st.lists(st.integers(0, 10_000), max_size=5))
def test_frames_round_trip_however_the_bytes_arrive(reqs: list[tuple[str, int, list[bytes], int]],
                                                    cuts: list[int]) -> None:
    msgs = [pb.ReplicateRequest(queue=q, seg=s, batches=b, lac=lac) for q, s, b, lac in reqs]
    data = b"".join(frame(m) for m in msgs)
    assert [pb.ReplicateRequest.FromString(b) for b in _read_all(data, cuts)] == msgs


def test_a_torn_frame_raises_and_a_long_one_is_refused_before_its_body() -> None:
    whole = frame(pb.ReplicateRequest(queue="q", seg=1, batches=[b"x" * 100]))
    with pytest.raises(asyncio.IncompleteReadError):
        _read_all(whole[:-1], [])
    with pytest.raises(asyncio.IncompleteReadError):
        _read_all(whole[:2], [])
    with pytest.raises(ConfigError, match="over the limit"):
        _read_all(whole[:4], [], limit=50)  # only the length arrived: refused on it alone


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40), st.booleans(), st.booleans(), st.text(max_size=20), st.integers(0, 2**40))
def test_no_clients_hello_passes_for_a_masters(token: str, read: bool, local_acks: bool, queue: str,
                                                seg: int) -> None:
    """A slave's lean port tells a master's first frame from a client's hello by the
    ReplicateRequest's ``hello`` (field 5): no field a ProduceLinkHello holds may set it (a
    prototype's hello field 5 made every consumer's watch pass for a master's link, refused on
    its certificate's name)."""
    hello = pb.ProduceLinkHello(token=token, read=read, local_acks=local_acks)
    if seg % 2:
        hello.watch.CopyFrom(pb.ReplicaSegment(queue=queue, seg=seg, synced_end=seg))
    assert _replication_hello(hello.SerializeToString()) is None
    assert _replication_hello(pb.ReplicateRequest(hello=True).SerializeToString()) is not None
