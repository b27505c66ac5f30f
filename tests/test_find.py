"""``ordq find`` and ``find_messages`` (issue 41) against a real ZooKeeper, real broker
processes and a real coordinator: by key and by time across sealed segments and the open
one, which subscriptions have passed each match, index files rebuilt when corrupt or deleted
(the answer unchanged), and a keyed topic searched in the one partition a key routes to.
The pure index (build, encode, lookups) is tested without I/O at the end.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.log import SegmentLog, segment_dir
from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.seg_index import INDEX_FILE, IndexFormatError, build_index, decode_index, encode_index
from ordq.broker_group.shared import Segment, Shared
from ordq.coordinator.topics import partition_of, partition_queue
from ordq.sdk import BatchingConfig, FindResult, TopicProducer, TopicProducerConfig, find_messages
from ordq.wire.batch import Message, encode_batch, stamp_offset
from tests.test_admin_cli import (
    Cluster,
    Q,
    make_cluster,  # noqa: F401 - the fixture the tests take
    take,
)
from tests.util import wait_until

pytestmark = pytest.mark.zk

KEYS = 5


def keyed(c: Cluster, first: int, count: int) -> list[int]:
    """Send ``count`` messages keyed ``k<i % KEYS>`` (payload ``m<i>``); their seqs."""
    with c.producer(batching=BatchingConfig(max_batch_messages=4)) as p:
        futures = [p.send(b"m%d" % i, key=b"k%d" % (i % KEYS)) for i in range(first, first + count)]
        p.flush(timeout_s=30)
        return [f.result().seq for f in futures]


def roll(c: Cluster) -> None:
    """Seal the open segment (a new one opens on the same head) and wait for the seal."""
    before = c.store.load_state(Q)[0].open_segment
    assert before is not None
    c.ok("queue", "roll", Q)
    wait_until(lambda: all(s.status.value == "sealed" for s in c.store.load_state(Q)[0].consume
                           if s.seg <= before.seg), timeout_s=30, what="rolled segment sealed")


def index_files(base: Path) -> list[Path]:
    return sorted(base.rglob(INDEX_FILE))


def sealed_kinds(doc: dict) -> dict:
    """How the sealed segments were answered (the open one, empty here, is ``none``)."""
    return {k: n for k, n in doc["indexes"].items() if k in ("file", "rebuilt", "built")}


def sealed_segments(c: Cluster) -> list[int]:
    return [s.seg for s in c.store.load_state(Q)[0].consume if s.status.value == "sealed"]


def test_find_by_key_and_time_in_sealed_and_open_segments(make_cluster, tmp_path: Path) -> None:  # noqa: F811
    c = make_cluster("g1", "g2")
    seqs = keyed(c, 0, 40)
    roll(c)
    seqs += keyed(c, 40, 40)
    roll(c)
    seqs += keyed(c, 80, 20)  # the open segment: answered from memory
    assert seqs == list(range(100))
    assert len(sealed_segments(c)) == 2
    # each sealed copy (master and slave) built its own index file when it sealed
    wait_until(lambda: len(index_files(tmp_path)) == 4, timeout_s=30, what="index files of 2 sealed segments x 2")

    c.ok("sub", "create", Q, "audit")  # audit has passed nothing (and keeps every segment)
    with c.consumer("billing") as consumer:  # billing has passed seqs 0..49
        got = take(consumer, 50)
    by_seq = {m.seq: m for m in got}

    doc = c.json("find", Q, "--key", "k3")
    assert [m["seq"] for m in doc["matches"]] == [i for i in range(100) if i % KEYS == 3]
    assert {m["seg"] for m in doc["matches"]} == {0, 1, 2}
    assert doc["segments"] == 3 and doc["indexes"] == {"file": 2, "memory": 1}, doc
    for m in doc["matches"]:
        assert m["passed_by"] == (["billing"] if m["seq"] < 50 else [])
        assert m["waiting"] == (["audit"] if m["seq"] < 50 else ["audit", "billing"])
        assert m["gid"] == "g1" and m["read_from"] == "master"
    assert doc["matches"][0]["timestamp_us"] == by_seq[3].timestamp_us

    # --limit: the oldest first; --from-time: only from then on
    assert [m["seq"] for m in c.json("find", Q, "--key", "k3", "--limit", "2")["matches"]] == [3, 8]
    t = c.json("peek", Q, "--seq", "40")["timestamp"]
    later = c.json("find", Q, "--key", "k1", "--from-time", t)["matches"]
    assert [m["seq"] for m in later] == [i for i in range(40, 100) if i % KEYS == 1]

    # --time: the first message at or after T, in a sealed segment and in the open one (the
    # timestamps of all 100, from the key lookups)
    ts = {m["seq"]: m["timestamp_us"] for k in range(KEYS) for m in c.json("find", Q, "--key", f"k{k}")["matches"]}
    assert sorted(ts) == list(range(100))
    for seq in (0, 17, 40, 63, 85, 99):
        at = c.json("peek", Q, "--seq", str(seq))
        first = c.json("find", Q, "--time", at["timestamp"])["matches"]
        assert [m["seq"] for m in first] == [min(s for s in range(100) if ts[s] >= ts[seq])]
    assert c.run("find", Q, "--time", "2100-01-01T00:00:00Z")[0] == 1

    # the table for people
    out = c.ok("find", Q, "--key", "k2", "--limit", "3")
    lines = out.splitlines()
    assert lines[0].split() == ["SEQ", "TIME", "SEG", "OFFSET", "GROUP", "PASSED_BY"]
    assert lines[1].split()[0] == "2" and lines[1].split()[-1] == "billing" and len(lines) == 4

    # the SDK call: the same answer
    found = find_messages(Q, key="k3", zk_hosts=c.zk, root=c.root)
    assert isinstance(found, FindResult)
    assert [m.seq for m in found.matches] == [m["seq"] for m in doc["matches"]]
    assert found.matches[0].passed_by == ("billing",)

    # clear errors, one line each
    assert "no message with key 'nope' (searched 3 segments)" in c.error("find", Q, "--key", "nope")
    assert "unknown queue 'nosuch'" in c.error("find", "nosuch", "--key", "k1")
    assert "give --key or --time" in c.error("find", Q, "--key", "k1", "--time", "1h")
    assert "give a key or a time" in c.error("find", Q)
    assert "a from-time goes with a key" in c.error("find", Q, "--time", "1h", "--from-time", "2h")


def test_a_corrupt_or_deleted_index_is_rebuilt_same_answer(make_cluster, tmp_path: Path) -> None:  # noqa: F811
    c = make_cluster("g1")
    keyed(c, 0, 30)
    roll(c)
    keyed(c, 30, 30)
    roll(c)
    wait_until(lambda: len(index_files(tmp_path)) == 4, timeout_s=30, what="index files of 2 sealed segments x 2")
    before_key = c.json("find", Q, "--key", "k4")
    at = c.json("peek", Q, "--seq", "37")["timestamp"]
    before_time = c.json("find", Q, "--time", at)
    assert [m["seq"] for m in before_key["matches"]] == [i for i in range(60) if i % KEYS == 4]
    files = index_files(tmp_path)
    good = {p: p.read_bytes() for p in files}

    def same(doc: dict, ref: dict) -> bool:
        strip = ("passed_by", "waiting", "read_from")
        return [{k: v for k, v in m.items() if k not in strip} for m in doc["matches"]] == \
            [{k: v for k, v in m.items() if k not in strip} for m in ref["matches"]]

    # corrupt: one byte flipped in each file's arrays, master's and slave's (the CRC catches it)
    for p in files:
        raw = bytearray(p.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        p.write_bytes(bytes(raw))
        with pytest.raises(IndexFormatError):
            decode_index(p.read_bytes())
    key_doc = c.json("find", Q, "--key", "k4")
    assert same(key_doc, before_key) and same(c.json("find", Q, "--time", at), before_time)
    assert sealed_kinds(key_doc) == {"rebuilt": 2}, key_doc["indexes"]
    masters = [p for p in files if p.parts[-4] == "master"]
    assert len(masters) == 2
    for p in masters:  # rewritten, as built at seal
        assert p.read_bytes() == good[p]

    # deleted: rebuilt from the log the same way, then served from the rewritten file
    for p in masters:
        p.unlink()
    key_doc = c.json("find", Q, "--key", "k4")
    assert same(key_doc, before_key) and sealed_kinds(key_doc) == {"rebuilt": 2}, key_doc["indexes"]
    assert all(p.read_bytes() == good[p] for p in masters)
    again = c.json("find", Q, "--key", "k4")
    assert same(again, before_key) and sealed_kinds(again) == {"file": 2}, again["indexes"]

    # a fresh process reads its files; the slave answers when the master is down, from its
    # own (still corrupt) files, rebuilt
    c.groups["g1"].master.kill()
    from_slave = wait_until(lambda: c.json("find", Q, "--key", "k4"), timeout_s=30, what="find from the slave")
    assert same(from_slave, before_key)
    sealed = [m for m in from_slave["matches"] if m["seg"] in (0, 1)]
    assert sealed and all(m["read_from"] == "slave" for m in sealed)
    assert from_slave["indexes"].get("rebuilt", 0) >= 2, from_slave["indexes"]
    assert same(c.json("find", Q, "--time", at), before_time)
    for p in files:
        if p.parts[-4] == "slave":
            assert p.read_bytes() == good[p]


def test_find_in_a_keyed_topic_searches_the_partition_the_key_routes_to(make_cluster) -> None:  # noqa: F811
    c = make_cluster("g1", "g2")
    assert c.run("topic", "create", "pay", "--partitions", "4")[0] == 0
    keys = [f"cust-{i}" for i in range(12)]
    with TopicProducer(TopicProducerConfig(zk_hosts=c.zk, root=c.root, topic="pay")) as p:
        futures = [p.send(b"paid %d" % i, key=keys[i % len(keys)]) for i in range(60)]
        p.flush(timeout_s=30)
        for f in futures:
            f.result()
    for key in ("cust-3", "cust-7"):
        part = partition_queue("pay", partition_of(key.encode(), 4))
        doc = c.json("find", "--topic", "pay", "--key", key)
        assert doc["queue"] == part
        assert len(doc["matches"]) == 5  # sent 60 over 12 keys
        out = c.ok("find", "--topic", "pay", "--key", key)
        assert out.splitlines()[0] == f"key routes to {part}"
        assert find_messages(topic="pay", key=key, zk_hosts=c.zk, root=c.root).queue == part
    assert "find --topic needs a key" in c.error("find", "--topic", "pay", "--time", "1h")
    assert "give a queue or a topic" in c.error("find", Q, "--topic", "pay", "--key", "x")


# -- the index itself, without I/O ---------------------------------------------------------------


def _segment(spec: list[tuple[int, list[tuple[bytes | None, int]]]]) -> tuple[list[bytes], list[Message]]:
    """Batches from [(first_seq, [(key, ts), ...]), ...], offsets stamped in order."""
    batches, flat, offset = [], [], 0
    for first_seq, msgs in spec:
        ms = [Message(payload=b"p", key=k, timestamp_us=ts) for k, ts in msgs]
        batches.append(stamp_offset(encode_batch(ms, epoch=1, first_seq=first_seq), offset))
        flat.extend(ms)
        offset += len(ms)
    return batches, flat


_msgs = st.lists(st.tuples(st.sampled_from([None, b"", b"a", b"b", b"order-1234", b"\xff"]),
                           st.integers(0, 50)), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.lists(_msgs, min_size=1, max_size=25), st.integers(1, 16), st.integers(-1, 52))
def test_lookups_match_a_scan(batch_msgs: list[list[tuple[bytes | None, int]]], block: int, t: int) -> None:
    spec, seq = [], 100
    for msgs in batch_msgs:
        spec.append((seq, msgs))
        seq += len(msgs)
    batches, flat = _segment(spec)
    ix = decode_index(encode_index(build_index(batches, block_messages=block)))  # through the file form
    assert ix.end == len(flat) and ix.first_seq == 100 and ix.log_bytes == sum(map(len, batches))
    for key in (b"", b"a", b"order-1234", b"\xff", b"zzz"):
        candidates = ix.key_offsets(key)
        assert candidates == sorted(candidates)
        # every holder of the key is a candidate (hash collisions may add others: the broker reads back)
        assert {o for o, m in enumerate(flat) if m.key == key} <= set(candidates)
    first = next((o for o, m in enumerate(flat) if m.timestamp_us >= t), None)
    block_range = ix.time_block(t)
    if first is None:
        assert block_range is None
    else:
        assert block_range is not None and block_range[0] <= first < block_range[1]
        # nothing before the block qualifies: the scan of one block finds the first
        assert all(m.timestamp_us < t for m in flat[:block_range[0]])


def test_a_damaged_index_file_is_refused() -> None:
    batches, _ = _segment([(0, [(b"k", 1), (None, 2)]), (2, [(b"j", 3)])])
    raw = encode_index(build_index(batches))
    decode_index(raw)
    rng = random.Random(41)
    for _ in range(200):
        i = rng.randrange(len(raw))
        bad = bytearray(raw)
        bad[i] ^= 1 << rng.randrange(8)
        with pytest.raises(IndexFormatError):
            decode_index(bytes(bad))
    for cut in (0, 10, len(raw) - 1):
        with pytest.raises(IndexFormatError):
            decode_index(raw[:cut])


def sealed_copy(tmp_path: Path) -> tuple[Shared, Segment]:
    """A sealed copy of 12 keyed messages (3 batches), as a broker holds it, and its Shared."""
    data = tmp_path / "data"
    with SegmentLog.open(data, "q", 0, create=True) as lg:
        for first in (0, 4, 8):
            batch = [Message(payload=b"p", key=b"k%d" % (first + i), timestamp_us=1000 + first + i) for i in range(4)]
            lg.append(stamp_offset(encode_batch(batch, epoch=1, first_seq=first), lg.end))
        lg.sync()
    shared = Shared(BrokerConfig(gid="t", role=Role.MASTER, data_dir=data, zk_hosts=""))
    lg = SegmentLog.open(data, "q", 0)
    replica = SegmentReplica("q", 0, Role.MASTER)
    replica.restored(end=lg.synced_end, first_seq=lg.first_seq, last_seq=lg.last_seq)
    replica.seal()
    return shared, Segment(replica=replica, directory=segment_dir(data, "q", 0), log=lg)


def test_a_sealed_copy_is_indexed_a_while_after_its_seal_and_a_stop_does_not_wait(tmp_path: Path) -> None:
    """Guard: ``Finder.sealed`` builds ``build_delay_s`` after the seal, off the path of the next
    segment's first write (docs/BENCHMARKS.md, stop 94). Never sooner; a broker stopping
    meanwhile is not held up by it."""
    from ordq.broker_group.finder import BUILD_DELAY_S, Finder

    assert BUILD_DELAY_S >= 0.5
    shared, s = sealed_copy(tmp_path)
    finder = Finder(shared, build_delay_s=0.3)
    told = time.time()
    finder.sealed(s)
    index = s.directory / INDEX_FILE
    wait_until(index.exists, timeout_s=30, what="the index built")
    assert index.stat().st_mtime >= told + 0.3 - 0.02  # (the file system's clock granularity)
    finder.stop()
    later = Finder(shared, build_delay_s=60)
    index.unlink()
    later.sealed(s)
    started = time.monotonic()
    later.stop()
    assert time.monotonic() - started < 5 and not index.exists()


def test_a_copy_sealed_then_reconciled_to_the_same_end_is_indexed_once(tmp_path: Path) -> None:
    """Guard: ``Finder.index_of`` at a seal keeps the index it built for this copy while its log
    is unchanged. A seal is told twice (the coordinator's Seal, then its Reconcile to the same
    end). Failing first: each broker built a 256 MiB copy's index twice, ~0.4 s of the GIL each,
    beside its event loop (docs/BENCHMARKS.md, stop 94). A Reconcile that changed the log (a
    copy cut back to the sealed end) still has it rebuilt."""
    from ordq.broker_group.finder import Finder

    shared, s = sealed_copy(tmp_path)
    lg = s.log
    assert lg is not None
    finder = Finder(shared)
    first, _ = finder.index_of(s, at_seal=True)  # the Seal
    again, _ = finder.index_of(s, at_seal=True)  # the Reconcile to the same end
    assert finder.stats.built == 1 and again is first and first.end == 12
    lg.truncate(8)  # a Reconcile that cut the copy back to ZooKeeper's end
    cut, _ = finder.index_of(s, at_seal=True)
    assert finder.stats.built == 2 and cut.end == 8
