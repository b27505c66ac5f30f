"""A broker group of real master and slave processes, driven over gRPC with raw streams.

What is checked here is the broker's own contract (DESIGN §4), below the SDK: an ack means
both disks hold the batch; a dead slave stops acks; fence and seal are obeyed by both
replicas; a restarted replica reconciles to the sealed end before it serves it; bad input is
refused with a typed error and the process keeps serving.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ordq.broker_group import lean_link
from ordq.broker_group import log as seglog
from ordq.broker_group.segment_scan import iter_file_batches
from ordq.common.errors import (
    BrokerUnavailable,
    ConfigError,
    EpochNotIssued,
    ExternalProcessError,
    FencedError,
    MessageTooLarge,
    OrdqError,
    SegmentNotFound,
)
from ordq.common.security import Credentials, token_metadata
from ordq.common.security import channel as security_channel
from ordq.coordinator import state as sm
from ordq.coordinator.seal import run_seal
from ordq.coordinator.state import SegStatus
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport
from ordq.wire.errors import SegmentNotWritable, from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS
from ordq.wire.transport import Ack
from tests.helpers.one_group import Group, Q, one_group
from tests.util import wait_until

pytestmark = pytest.mark.zk


@pytest.fixture
def group(zk_server, zk_root, tmp_path: Path) -> Iterator[Group]:
    with one_group(zk_server.connection_string, zk_root, tmp_path) as g:
        yield g


def payload(seq: int) -> bytes:
    return b"%010d|" % seq + bytes([seq % 251]) * 300


def batch(first_seq: int, count: int, epoch: int = 1) -> bytes:
    seqs = range(first_seq, first_seq + count)
    msgs = [Message(payload=payload(s), key=b"k%d" % (s % 7), timestamp_us=s) for s in seqs]
    return encode_batch(msgs, epoch=epoch, first_seq=first_seq)


def stored(data_dir: Path, seg: int = 0) -> list[tuple[int, int]]:
    """(seq, payload crc) of every message in one replica's copy, read from its file."""
    path = seglog.segment_dir(data_dir, Q, seg) / seglog.SEGMENT_FILE
    out = []
    for header, messages in iter_file_batches(path):
        out.extend((header.first_seq + i, zlib.crc32(m.payload)) for i, m in enumerate(messages))
    return out


def produce(g: Group, first_seq: int, batches: int, per_batch: int, *, epoch: int = 1, seg: int = 0) -> list[Ack]:
    stream = g.transport.open_produce(g.address("master"), Q, seg, epoch)
    try:
        for i in range(batches):
            stream.send([batch(first_seq + i * per_batch, per_batch, epoch)])
        acks: list[Ack] = []
        want = first_seq + batches * per_batch - 1
        for ack in stream.acks():
            acks.append(ack)
            if ack.last_seq == want:
                return acks
        raise AssertionError("ack stream ended early")
    finally:
        stream.close()


def test_an_ack_means_both_disks_hold_the_batch(group: Group) -> None:
    acks = produce(group, 0, batches=40, per_batch=25)
    assert acks[0].first_seq == 0 and acks[-1].last_seq == 999
    assert [a.first_offset for a in acks] == sorted(a.first_offset for a in acks)
    expected = [(s, zlib.crc32(payload(s))) for s in range(1000)]
    # Read each replica's file independently of the broker processes.
    assert stored(group.procs.master.data_dir) == expected
    assert stored(group.procs.slave.data_dir) == expected
    res = group.transport.fetch(group.address("slave"), Q, 0, 0, max_bytes=1 << 20, max_wait_ms=1000)
    assert res.readable_end > 0 and not res.sealed  # the slave serves up to the LAC it was pushed


def test_one_send_larger_than_a_request_is_split_not_refused(group: Group) -> None:
    """A producer hands its stream many batches at once when it runs ahead: ~32 MiB in one
    ``send`` once took the master past its request limit (25 MiB), and every failover after
    it hit the same wall. The stream cuts requests the broker takes."""
    big = b"y" * 100_000
    batches = [encode_batch([Message(payload=big, key=None, timestamp_us=s) for s in range(i * 8, i * 8 + 8)],
                            epoch=1, first_seq=i * 8) for i in range(40)]
    assert sum(map(len, batches)) > 30 << 20
    stream = group.transport.open_produce(group.address("master"), Q, 0, 1)
    try:
        stream.send(batches)
        acked = 0
        for ack in stream.acks():
            acked += ack.count
            if acked == 320:
                break
    finally:
        stream.close()
    assert len(stored(group.procs.slave.data_dir)) == 320


def test_a_killed_slave_stops_acks_with_a_retriable_error(group: Group) -> None:
    stream = group.transport.open_produce(group.address("master"), Q, 0, 1)
    acked: list[Ack] = []
    sent = 0
    try:
        for _ in range(20):
            stream.send([batch(sent, 10)])
            sent += 10
        acks = stream.acks()
        while not acked or acked[-1].last_seq < 99:
            acked.append(next(acks))
        group.procs.slave.kill()
        with pytest.raises(OrdqError) as err:
            while True:
                stream.send([batch(sent, 10)])
                sent += 10
                acked.append(next(acks))
        assert err.value.retriable, err.value
        assert isinstance(err.value, BrokerUnavailable)
    finally:
        stream.close()
    # Everything acked, before or after the kill, is on the dead slave's disk.
    on_slave = {seq for seq, _ in stored(group.procs.slave.data_dir)}
    assert all(s in on_slave for a in acked for s in range(a.first_seq, a.last_seq + 1))
    # The master refuses further writes to the segment: the producer must fail over.
    with pytest.raises(SegmentNotWritable):
        produce(group, sent, batches=1, per_batch=1)


def test_fence_refuses_lower_epochs_on_both_replicas(group: Group) -> None:
    produce(group, 0, batches=5, per_batch=10, epoch=1)
    group.store.apply(Q, lambda st, _f: sm.bump_epoch(st))  # a new leader's epoch, issued by ZooKeeper
    ends = {role: group.transport.fence(group.address(role), Q, 0, 2) for role in ("master", "slave")}
    assert ends["master"] == ends["slave"]
    assert (ends["master"].end, ends["master"].last_seq) == (50, 49)
    with pytest.raises(FencedError) as err:
        produce(group, 50, batches=1, per_batch=10, epoch=1)
    assert (err.value.epoch, err.value.current_epoch) == (1, 2)
    assert not err.value.retriable
    for role in ("master", "slave"):
        with pytest.raises(FencedError):
            group.transport.fence(group.address(role), Q, 0, 1)
    # The new epoch continues the same segment at the next seq.
    acks = produce(group, 50, batches=2, per_batch=10, epoch=2)
    assert acks[0].first_offset == 50


def test_seal_stops_writes_on_both_and_they_report_the_same_end(group: Group) -> None:
    produce(group, 0, batches=7, per_batch=10)
    ends = [group.transport.seal(group.address(role), Q, 0) for role in ("master", "slave")]
    assert ends[0] == ends[1] and ends[0].end == 70 and ends[0].last_seq == 69
    with pytest.raises(SegmentNotWritable):
        produce(group, 70, batches=1, per_batch=1)
    for role in ("master", "slave"):
        res = group.transport.fetch(group.address(role), Q, 0, 0, max_bytes=1 << 20, max_wait_ms=0)
        assert res.sealed and res.readable_end == 70
        decoded = [batch_format.decode_batch(b) for b in res.batches]
        seqs = [h.first_seq + i for h, ms in decoded for i in range(len(ms))]
        assert seqs == list(range(70))


def _diverge(group: Group) -> None:
    """Leave the master 30 messages ahead of its slave: 50 acked, then the slave is paused
    and 3 more batches reach only the master's disk (never acked)."""
    produce(group, 0, batches=5, per_batch=10)
    group.procs.slave.pause()
    stream = group.transport.open_produce(group.address("master"), Q, 0, 1)
    try:
        stream.send([batch(50 + 10 * i, 10) for i in range(3)])
        wait_until(lambda: len(stored(group.procs.master.data_dir)) == 80, what="master synced 80")
    finally:
        stream.close()


def _fail_over_and_seal(group: Group) -> int:
    group.store.apply(Q, lambda st, f: sm.fail_over(st, "g1", 0, f))
    st = run_seal(group.store, GrpcTransport(rpc_timeout_s=1.0, credentials=group.transport.credentials), Q, 0)
    seg = st.segment(0)
    assert seg is not None and seg.status is SegStatus.SEALED and seg.end is not None
    return seg.end


def test_a_restarted_longer_replica_truncates_to_the_sealed_end(group: Group) -> None:
    _diverge(group)
    # Kill the paused slave too, so the batches in flight to it die with it, then bring
    # only the slave back: the seal sees only its shorter copy.
    group.procs.slave.kill()
    group.procs.master.kill()
    wait_until(lambda: not group.store.live_members("g1"), what="both liveness nodes gone")
    group.procs.slave.start()
    end = _fail_over_and_seal(group)  # only the slave answers: its end is the end
    assert end == 50
    group.procs.master.start()
    wait_until(lambda: len(stored(group.procs.master.data_dir)) == 50, what="master truncated to the end")
    info = group.transport.segment_info(group.address("master"), Q, 0)
    assert info.sealed and info.end == 50
    res = group.transport.fetch(group.address("master"), Q, 0, 0, max_bytes=1 << 20, max_wait_ms=0, known_end=50)
    assert res.readable_end == 50
    assert stored(group.procs.master.data_dir) == stored(group.procs.slave.data_dir)


def test_a_restarted_shorter_replica_copies_up_to_the_sealed_end_before_serving_it(group: Group) -> None:
    _diverge(group)
    group.procs.slave.kill()
    wait_until(lambda: "slave" not in group.store.live_members("g1"), what="slave's liveness gone")
    end = _fail_over_and_seal(group)  # only the master answers: its longer copy is the end
    assert end == 80
    group.procs.slave.start()
    slave = group.address("slave")

    def served() -> bool:
        try:
            res = group.transport.fetch(slave, Q, 0, 60, max_bytes=1 << 20, max_wait_ms=0, known_end=80)
        except BrokerUnavailable:
            return False  # still short: it refuses rather than read short
        return res.readable_end == 80 and bool(res.batches)

    wait_until(served, what="slave serves the sealed end")
    assert stored(group.procs.slave.data_dir) == stored(group.procs.master.data_dir)
    assert len(stored(group.procs.slave.data_dir)) == 80


def test_bad_input_gets_a_typed_error_and_the_broker_keeps_serving(group: Group) -> None:
    t, master, slave = group.transport, group.address("master"), group.address("slave")

    def refused(address: str, batches: list[bytes], seg: int = 0, epoch: int = 1) -> OrdqError:
        stream = t.open_produce(address, Q, seg, epoch)
        try:
            stream.send(batches)
            with pytest.raises(OrdqError) as err:
                next(stream.acks())
            return err.value
        finally:
            stream.close()

    assert isinstance(refused(slave, [batch(0, 1)]), ConfigError)  # producers write to the master
    assert isinstance(refused(master, [b"\x00" * 64]), ConfigError)  # malformed
    bad_crc = bytearray(batch(0, 3))
    bad_crc[-1] ^= 0xFF
    assert isinstance(refused(master, [bytes(bad_crc)]), ConfigError)
    huge = encode_batch([Message(payload=b"x" * (17 << 20))], epoch=1, first_seq=0)
    assert isinstance(refused(master, [huge]), MessageTooLarge)
    assert isinstance(refused(master, [batch(0, 1)], seg=7), SegmentNotWritable)  # not the open segment
    produce(group, 0, batches=1, per_batch=5)
    assert "gap" in str(refused(master, [batch(9, 1)]))  # seq 5..8 missing
    with pytest.raises(SegmentNotFound):
        t.fetch(master, Q, 42, 0, max_bytes=1024, max_wait_ms=0)
    # A resend of a stored, synced range is acked with its original offsets.
    again = produce(group, 0, batches=1, per_batch=5)
    assert again == [Ack(seg=0, first_offset=0, first_seq=0, count=5)]
    for role in ("master", "slave"):
        assert t.health(group.address(role)).role == role
    assert group.procs.master.alive() and group.procs.slave.alive()


def test_a_corrupt_middle_batch_is_reported_never_served_and_repaired_from_the_peer(group: Group) -> None:
    produce(group, 0, batches=6, per_batch=10)
    end = _fail_over_and_seal(group)
    assert end == 60
    group.procs.slave.stop()
    path = seglog.segment_dir(group.procs.slave.data_dir, Q, 0) / seglog.SEGMENT_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # a payload byte of a middle batch: its CRC no longer matches
    path.write_bytes(bytes(raw))
    group.procs.slave.start()
    slave = group.address("slave")
    # Reported on start; then the reconciler sets the bad file aside and copies from the master.
    assert "corrupt" in group.procs.slave.log_tail(40)
    wait_until(lambda: group.transport.segment_info(slave, Q, 0).end == 60, what="slave repaired")
    res = group.transport.fetch(slave, Q, 0, 0, max_bytes=1 << 20, max_wait_ms=0, known_end=60)
    assert res.readable_end == 60
    assert stored(group.procs.slave.data_dir) == stored(group.procs.master.data_dir)
    assert list(path.parent.glob("segment.log.corrupt-*")), "the corrupt copy is kept as evidence"


def test_a_broker_restarted_at_once_after_kill_9_waits_for_its_old_session_then_serves(
        group: Group, zk_server, zk_root) -> None:
    old = group.store.live_members("g1")["slave"].incarnation
    group.procs.slave.kill()
    # Started while ZooKeeper still shows the killed slave live (its session lives ~1 s more):
    # it must wait for the old node to go, not exit.
    assert group.store.live_members("g1")["slave"].incarnation == old
    group.procs.slave.start()
    assert group.store.live_members("g1")["slave"].incarnation == group.procs.slave.incarnation != old
    acks = produce(group, 0, batches=2, per_batch=5)
    assert acks[-1].last_seq == 9
    assert len(stored(group.procs.slave.data_dir)) == 10
    # A second process for a role that really is live gives up with a clear error.
    run = subprocess.run(
        [sys.executable, "-m", "ordq.cli", "--zk", zk_server.connection_string, "--root", zk_root, "broker", "run",
         "--group", "g1", "--role", "slave", "--data", str(group.procs.slave.data_dir.parent / "dup"),
         "--register-wait", "0.5", "--insecure"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "already live" in run.stderr
    assert group.store.live_members("g1")["slave"].incarnation == group.procs.slave.incarnation


def _read_all(group: Group, role: str, end: int) -> list[int]:
    res = group.transport.fetch(group.address(role), Q, 0, 0, max_bytes=1 << 24, max_wait_ms=0, known_end=end)
    return [h.first_seq + i for b in res.batches for h, ms in [batch_format.decode_batch(b)] for i in range(len(ms))]


def test_a_replica_on_a_new_disk_copies_the_sealed_segments_it_never_had(group: Group) -> None:
    produce(group, 0, batches=5, per_batch=10)
    group.procs.slave.destroy()  # kill -9 and lose the disk
    wait_until(lambda: "slave" not in group.store.live_members("g1"), what="slave's liveness gone")
    assert _fail_over_and_seal(group) == 50  # decided by the master alone
    group.procs.slave.start()  # an empty data folder
    wait_until(lambda: stored(group.procs.slave.data_dir) == stored(group.procs.master.data_dir),
               what="the new slave copied segment 0 from the master")
    assert len(stored(group.procs.slave.data_dir)) == 50
    group.procs.master.kill()  # the group's only other copy is gone: the new disk serves it all
    wait_until(lambda: "master" not in group.store.live_members("g1"), what="master's liveness gone")
    assert _read_all(group, "slave", 50) == list(range(50))


def test_a_replica_on_a_new_disk_never_decides_a_segment_it_did_not_see(group: Group) -> None:
    """Master down, slave back on an empty disk: its 'end 0' would drop 50 acked messages.
    It refuses to answer Seal for the segment, so the seal waits for the master."""
    produce(group, 0, batches=5, per_batch=10)
    group.procs.master.kill()
    group.procs.slave.destroy()
    wait_until(lambda: not group.store.live_members("g1"), what="both liveness nodes gone")
    group.procs.slave.start()
    group.store.apply(Q, lambda st, f: sm.fail_over(st, "g1", 0, f))
    with pytest.raises(BrokerUnavailable):
        group.transport.seal(group.address("slave"), Q, 0)
    with pytest.raises(BrokerUnavailable):
        run_seal(group.store, GrpcTransport(rpc_timeout_s=1.0, credentials=group.transport.credentials), Q, 0)
    seg = group.store.load_state(Q)[0].segment(0)
    assert seg is not None and seg.status is SegStatus.SEALING  # undecided, not cut to 0
    group.procs.master.start()
    st = run_seal(group.store, GrpcTransport(rpc_timeout_s=1.0, credentials=group.transport.credentials), Q, 0)
    seg = st.segment(0)
    assert seg is not None and seg.status is SegStatus.SEALED and seg.end == 50
    # The copy's bytes reach the disk before the copy is marked sealed and served: wait for the reads.
    wait_until(lambda: _read_all(group, "slave", 50) == list(range(50)), what="the new slave serves segment 0")
    assert len(stored(group.procs.slave.data_dir)) == 50


# -- a rogue writer: a hand-made client (the generated stubs) claiming an epoch ZooKeeper never issued.
# Before broker_group/epochs.py a broker took any epoch at least its fence: such a client could
# write into the open segment and fence the real leader out.


def _refused(g: Group, address: str, call: str, request: object, creds: Credentials | None = None) -> grpc.RpcError:
    """The call made by a client with a valid certificate (an insider past TLS), or with ``creds``."""
    channel = security_channel(address, creds or g.client, GRPC_OPTIONS)
    stub = pb_grpc.BrokerStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as err:
            if call == "Produce":
                list(stub.Produce(iter([request]), timeout=10))
            else:
                getattr(stub, call)(request, timeout=10)
        return err.value
    finally:
        channel.close()


def _health(g: Group, role: str) -> dict[str, object]:
    return dict(json.loads(g.transport.health(g.address(role)).stats_json))


@pytest.fixture
def lean_group(zk_server, zk_root, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Group]:
    """``group`` replicating on the lean link (the default, named whatever the caller's
    environment says: the master commits on its loop only when the link writes at once)."""
    monkeypatch.setenv(lean_link.ENV, "lean")
    with one_group(zk_server.connection_string, zk_root, tmp_path) as g:
        yield g


def test_a_lone_small_request_is_committed_on_the_loop_also_behind_one_the_slave_holds(
        lean_group: Group) -> None:
    """Synchronous sends (one request in flight at a time) are committed on each broker's loop,
    with no hand-off to a sync thread (issue 39; the master's sync thread did every one before),
    but for the second after a slow group commit (broker_group/loop_sync.py: a congested disk
    must not hold the loop). So is a request sent while another, synced on the master, is
    unanswered by the slave (stop 93: until then it went to the sync thread), and neither is
    acked before the slave answers."""
    g = lean_group
    stream = g.transport.open_produce(g.address("master"), Q, 0, 1)
    acks = stream.acks()
    seq = 0
    try:
        deadline = time.monotonic() + 30
        while min(_health(g, role)["loop_commits"] for role in ("master", "slave")) < 5:
            assert time.monotonic() < deadline, "lone requests were not committed on the loop"
            stream.send([batch(seq, 10)])
            seq += 10
            assert next(acks).last_seq == seq - 1
        for role in ("master", "slave"):
            st = _health(g, role)
            assert st["syncs"] == seq // 10  # one commit a send
            assert st["loop_commits"] == st["syncs"] or st["slow_syncs"] > 0, (role, st)  # else a slow disk
        before = _health(g, "master")
        g.procs.slave.pause()
        try:
            stream.send([batch(seq, 10)])  # alone: on the loop, after it went to the slave
            wait_until(lambda: _health(g, "master")["syncs"] == before["syncs"] + 1, what="the master synced it")
            stream.send([batch(seq + 10, 10)])  # behind the first, which the paused slave has not answered
            wait_until(lambda: _health(g, "master")["syncs"] == before["syncs"] + 2, what="the master synced it")
            after = _health(g, "master")
            on_loop = after["loop_commits"] - before["loop_commits"]
            assert on_loop == 2 or after["slow_syncs"] > before["slow_syncs"], after  # both, but after a slow sync
            assert after["acks"] == before["acks"]  # nothing acked while the slave holds them
        finally:
            g.procs.slave.resume()
        seq += 20
        assert _last_ack(acks, seq - 1) == seq - 1
    finally:
        stream.close()
    expected = [(s, zlib.crc32(payload(s))) for s in range(seq)]
    assert stored(g.procs.master.data_dir) == expected
    assert stored(g.procs.slave.data_dir) == expected


def _last_ack(acks: Iterator[Ack], last_seq: int) -> int:
    """Read ``acks`` until one covers ``last_seq``; return its last seq."""
    for ack in acks:
        if ack.last_seq >= last_seq:
            return ack.last_seq
    raise AssertionError("ack stream ended early")


def test_a_claimed_epoch_zookeeper_never_issued_is_refused_and_the_leader_goes_on(group: Group) -> None:
    produce(group, 0, batches=5, per_batch=10, epoch=1)  # the real leader, epoch 1 from ZooKeeper
    before = {role: stored(getattr(group.procs, role).data_dir) for role in ("master", "slave")}
    master = group.address("master")

    rogue = pb.ProduceRequest(queue=Q, seg=0, epoch=7, batches=[batch(50, 10, epoch=7)])
    err = _refused(group, master, "Produce", rogue)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    typed = from_rpc_error(err, master)
    assert isinstance(typed, EpochNotIssued) and (typed.epoch, typed.current_epoch) == (7, 1)
    assert not typed.retriable
    for role in ("master", "slave"):  # nor may a coordinator fence the real leader out with it
        err = _refused(group, group.address(role), "Fence", pb.FenceRequest(queue=Q, seg=0, epoch=7),
                       group.transport.credentials)
        assert isinstance(from_rpc_error(err, role), EpochNotIssued)
        assert group.transport.segment_info(group.address(role), Q, 0).fenced_epoch == 1

    after = {role: stored(getattr(group.procs, role).data_dir) for role in ("master", "slave")}
    assert after == before  # nothing stored
    assert _health(group, "master")["refused"] == {"EpochNotIssued": 2}
    assert _health(group, "slave")["refused"] == {"EpochNotIssued": 1}

    lookups = _health(group, "master")["epoch_lookups"]
    acks = produce(group, 50, batches=20, per_batch=10, epoch=1)  # the leader is unaffected
    assert acks[0].first_offset == 50 and acks[-1].last_seq == 249
    assert _health(group, "master")["epoch_lookups"] == lookups  # the hot path reads no ZooKeeper
    assert [seq for seq, _ in stored(group.procs.slave.data_dir)] == list(range(250))


def test_read_streams_each_range_once_from_where_the_last_ended_until_quiet(group: Group) -> None:
    produce(group, 0, batches=7, per_batch=10)
    ch = security_channel(group.address("master"), group.transport.credentials, GRPC_OPTIONS)
    md = token_metadata(group.transport.credentials)

    def read(offset: int) -> list[pb.FetchResponse]:
        req = pb.FetchRequest(queue=Q, seg=0, offset=offset, max_bytes=1, max_wait_ms=200, known_end=-1,
                              stream_ms=10_000)
        return list(pb_grpc.BrokerStub(ch).Read(req, metadata=md, timeout=30))

    try:
        answers = read(15)  # from the batch holding offset 15 (seq 10), one batch per answer
        *full, quiet = answers
        decoded = [batch_format.decode_batch(a.batches[0]) for a in full]
        seqs = [h.first_seq + i for h, ms in decoded for i in range(len(ms))]
        assert all(len(a.batches) == 1 and not a.sealed for a in full) and seqs == list(range(10, 70))
        assert not quiet.batches and quiet.readable_end == 70 and not quiet.sealed  # then the stream ended
        group.transport.seal(group.address("master"), Q, 0)
        [last] = read(70)
        assert not last.batches and last.sealed and last.readable_end == 70
    finally:
        ch.close()


def test_a_broker_killed_between_a_segment_folder_and_its_log_starts_again(group: Group) -> None:
    """A kill -9 while a segment was being created (the bench's 1,000 idle queues: the daemon
    seals ~300 of them on a killed group's slave and restarted master at once) can leave its
    folder without ``segment.log``. Such a copy holds nothing: the broker starts, recovers it
    as the empty copy it would have been a moment later, and never writes it (held open
    before the restart). Before, the start failed with "queue 'q' has no segment 7"."""
    produce(group, 0, batches=1, per_batch=5)  # the queue's folder exists
    group.procs.master.kill()
    cut_short = seglog.segment_dir(group.procs.master.data_dir, Q, 7)
    cut_short.mkdir(mode=0o700)
    wait_until(lambda: "master" not in group.store.live_members("g1"), what="master's liveness gone")
    group.procs.master.start()
    assert (cut_short / seglog.SEGMENT_FILE).exists()
    info = group.transport.segment_info(group.address("master"), Q, 7)
    assert info.end == 0 and info.frozen
    assert len(stored(group.procs.master.data_dir)) == 5  # segment 0 as it was


def test_a_removal_cut_short_leaves_no_segment_folder_without_its_log(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: ``remove_folder`` (broker_group/segments.py) renames a popped segment's folder out
    of the way before deleting its files. Failing first: ``drill all`` killed a head master (-9)
    while it removed a popped segment (roll-under-failover pops every 0.25 s); the folder was
    left with its meta file and no log, which refuses a start (the next test), and the master
    never came back: every later drill failed "broker-g1-master exited with code 1"."""
    from ordq.broker_group import file_removal, segments

    folder = tmp_path / "q" / "7"
    folder.mkdir(parents=True)
    (folder / seglog.SEGMENT_FILE).write_bytes(b"x")
    (folder / "meta.json").write_text("{}")

    def killed_midway(path: Path, ignore_errors: bool = False) -> None:
        if path.exists():
            (path / seglog.SEGMENT_FILE).unlink()  # the log first, then the kill
            raise SystemExit("kill -9")

    monkeypatch.setattr(file_removal.shutil, "rmtree", killed_midway)
    with pytest.raises(SystemExit):
        segments.remove_folder(folder)
    assert not folder.exists()  # no segment folder to recover at the next start
    # what is left is named as set aside: the next start leaves it to its repair thread (next test)
    assert [p.name for p in (tmp_path / "q").iterdir()] == ["7" + segments.REMOVING]


def test_a_broker_finishes_the_removals_a_kill_left_half_done(group: Group) -> None:
    """What a kill -9 inside ``remove_folder`` leaves (a renamed segment folder, a renamed queue
    folder, each holding part of its files) is never opened as a segment, and is removed once
    the broker serves, by its repair thread: issue 43, a start after ``ordq down`` at 10^5
    queues removed 2,389 and 6,961 such folders one after another before it served. Failing
    first: the start removed them before its "started:" line."""
    produce(group, 0, batches=1, per_batch=5)
    group.procs.master.kill()
    data = Path(group.procs.master.data_dir)
    half = data / Q / "3~removing"
    half.mkdir()
    (half / "meta.json").write_text("{}")
    gone_queue = data / "old~removing" / "0"
    gone_queue.mkdir(parents=True)
    (gone_queue / "meta.json").write_text("{}")
    wait_until(lambda: "master" not in group.store.live_members("g1"), what="master's liveness gone")
    group.procs.master.start()
    wait_until(lambda: not half.exists() and not gone_queue.parent.exists(), what="the leftovers removed")
    assert len(stored(group.procs.master.data_dir)) == 5  # segment 0 as it was
    removed = "left by a removal cut short"
    wait_until(lambda: removed in group.procs.master.proc.log_path.read_text(errors="replace"),
               what="the removal logged")
    text = group.procs.master.proc.log_path.read_text(errors="replace").rpartition("\n=== ")[2]
    assert -1 < text.find("started: ") < text.find(removed), text[-2000:]  # this start's log


def test_a_segment_folder_whose_log_is_gone_is_not_recovered_as_an_empty_copy(group: Group) -> None:
    """Only an empty folder is a creation cut short: the log is made before anything else in
    it. A folder that holds its meta file but no log lost a log that may have held acked
    batches; an empty copy of it could let a seal with its peer away cut them off. The broker
    refuses to start on it, as it did before cut-short folders were recovered."""
    produce(group, 0, batches=1, per_batch=5)
    group.procs.master.kill()
    lost = seglog.segment_dir(group.procs.master.data_dir, Q, 7)
    lost.mkdir(mode=0o700)
    (lost / "meta.json").write_text(json.dumps({"fenced_epoch": 1, "sealed": False, "sealed_end": None}))
    wait_until(lambda: "master" not in group.store.live_members("g1"), what="master's liveness gone")
    with pytest.raises(ExternalProcessError):
        group.procs.master.start()
    assert not (lost / seglog.SEGMENT_FILE).exists()
    (lost / "meta.json").unlink()  # as an operator would after looking: now a cut-short creation
    group.procs.master.start()
    assert group.transport.segment_info(group.address("master"), Q, 7).end == 0
