"""Disk is freed on real brokers: the files of segments popped from the consume list (read by
every subscription) go from both replicas, `ordq queue describe` shows bytes per segment and
per group, `queue delete` frees every replica's data, and a queue re-created under the same
name never meets the deleted one's segments (its incarnation tells them apart).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ordq.broker_group.segments import REMOVING
from ordq.sdk import BatchingConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk

PAYLOAD = 1024


def produce(cluster: Cluster, n: int, queue: str = "q") -> None:
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue)) as p:
        futures = [p.send(b"%08d" % i + b"x" * (PAYLOAD - 8)) for i in range(n)]
        futures[-1].result(60)


def consume_all(cluster: Cluster, through_seq: int, queue: str = "q",
                until: Callable[[], bool] = lambda: True) -> list[int]:
    """Read through ``through_seq`` and go on polling (the consumer moves past a drained
    sealed segment on its next read) until ``until()``."""
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue, subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    seqs: list[int] = []
    with Consumer(cfg) as c:
        while not seqs or seqs[-1] < through_seq or not until():
            seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
        c.commit()
    return seqs


def segment_folders(cluster: Cluster, queue: str = "q") -> dict[str, set[int]]:
    """Per replica (g1/master, ...), the segment folders of ``queue`` on its disk."""
    out = {}
    for gid, group in cluster.groups.items():
        for member in (group.master, group.slave):
            qdir = Path(member.data_dir) / queue
            # a folder being removed is renamed "<seg>~removing" first (broker_group/segments.py): still there
            segs = {int(p.name.partition("~")[0]) for p in qdir.iterdir() if p.is_dir()} if qdir.exists() else set()
            out[f"{gid}/{member.role}"] = segs
    return out


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``; a broker may remove or rename files meanwhile (a
    popped segment, a meta file replaced): those count as gone."""
    total = 0
    for folder, _dirs, files in os.walk(path):  # os.walk skips folders that vanish
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def describe(cluster: Cluster, queue: str = "q") -> dict:
    out = cluster.ordq("queue", "describe", queue, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_consumed_segments_leave_both_replicas_and_describe_shows_bytes(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    cluster.start_daemon("coordinator")  # pops segments every subscription has read
    per_segment = 1500
    for _ in range(4):
        produce(cluster, per_segment)
        out = cluster.ordq("queue", "roll", "q")
        assert out.returncode == 0, out.stderr
    view = describe(cluster)
    sealed = [c for c in view["consume"] if c["status"] == "sealed"]
    assert len(sealed) == 4 and all(c["bytes"] > per_segment * PAYLOAD for c in sealed), view["consume"]
    g1 = next(g for g in view["groups"] if g["group"] == "g1")
    assert g1["bytes"] == sum(c["bytes"] for c in view["consume"] if c["gid"] == "g1")
    master_dir = Path(cluster.groups["g1"].master.data_dir)
    before = folder_bytes(master_dir)
    assert before > 4 * per_segment * PAYLOAD

    # Once the consumer has read every sealed segment (and moved past the last one), they are
    # popped (by the consumer and the daemon) and both replicas of g1 remove their files. The
    # last sealed one holds the queue's newest message until a later one is stored (issue 16).
    produce(cluster, 1)
    seqs = consume_all(cluster, 4 * per_segment, until=lambda: len(cluster.state().consume) == 1)
    assert seqs == list(range(4 * per_segment + 1))
    open_seg = cluster.state().consume[0].seg
    wait_until(lambda: segment_folders(cluster)["g1/master"] <= {open_seg}
               and segment_folders(cluster)["g1/slave"] <= {open_seg}, timeout_s=30,
               what=f"only segment {open_seg} left on g1's disks ({segment_folders(cluster)})")
    after = folder_bytes(master_dir)
    assert after < per_segment * PAYLOAD, (before, after)
    print(f"g1 master data folder: {before} bytes before, {after} after the pop")
    assert describe(cluster)["groups"][0]["bytes"] < 2 * PAYLOAD  # the one message in the open segment


def test_queue_delete_frees_every_replica_and_a_recreated_queue_starts_clean(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 500)
    assert segment_folders(cluster)["g1/master"] == {0}
    first = cluster.state().incarnation
    assert cluster.ordq("queue", "delete", "q").returncode == 0
    wait_until(lambda: not any((Path(m.data_dir) / "q").exists()
                               for g in cluster.groups.values() for m in (g.master, g.slave)),
               timeout_s=30, what="the deleted queue's folders gone from every replica")

    # The same name again: a new incarnation, whose consumer reads only its own messages.
    cluster.create_queue()
    assert cluster.state().incarnation != first
    produce(cluster, 300)
    assert consume_all(cluster, 299) == list(range(300))


def test_a_replica_down_during_delete_frees_the_old_queue_when_it_starts(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 500)
    slave = cluster.groups["g1"].slave
    slave.kill()
    assert cluster.ordq("queue", "delete", "q").returncode == 0
    cluster.create_queue(groups=["g2"])  # same name, another group: g1 is not part of it
    produce(cluster, 200)
    assert (Path(slave.data_dir) / "q" / f"{0:012d}").exists()  # the old copy, while it is down
    cluster.restart(slave)
    assert not (Path(slave.data_dir) / "q").exists()  # set aside before it served
    assert consume_all(cluster, 199) == list(range(200))
    # Its files go only once it serves (issue 43: a start at 10^5 queues spent 2.5 minutes
    # removing popped segments' folders before it served): the start sets the folders aside
    # and logs it, and only then (the repair thread) are the files removed.
    removed = f"segment q/{0} removed: its queue was deleted"
    wait_until(lambda: removed in this_start_log(slave.proc.log_path), timeout_s=30,
               what="the deleted queue's segment removed by the repair thread")
    text = this_start_log(slave.proc.log_path)
    assert -1 < text.find("folders of popped segments or deleted queues set aside") < text.index(removed)
    assert not (Path(slave.data_dir) / ("q" + REMOVING)).exists()


def this_start_log(path: Path) -> str:
    """A process's log since its latest start (each start writes a ``=== `` line first)."""
    return path.read_text(errors="replace").rpartition("\n=== ")[2]


def replica_bytes(cluster: Cluster) -> int:
    """The largest data folder among all replicas (bytes)."""
    return max(folder_bytes(Path(m.data_dir)) for g in cluster.groups.values() for m in (g.master, g.slave))


def run_rolling_load(cluster: Cluster, *, n: int, size: int, segment: str, rate: float,
                     daemon: bool = True, settings: tuple[str, ...] = (),
                     consumer_stops_at: int | None = None) -> dict[str, float]:
    """``n`` messages of ``size`` bytes at ``rate`` through a queue whose segments roll at
    ``segment``, a consumer following (and the coordinator, with ``daemon``); returns what was
    measured."""
    from tests.cluster import finish
    from tests.order_check import check_delivery

    cluster.add_groups("g1", "g2")
    out = cluster.ordq("queue", "create", "q", "--segment-bytes", segment, *settings)
    assert out.returncode == 0, out.stderr
    if daemon:
        cluster.start_daemon("coordinator")
    producer = cluster.producer(n=n, rate=rate, size=size)
    until = n - 1 if consumer_stops_at is None else consumer_stops_at
    consumer = cluster.consumer(until=until)
    producer.start()
    consumer.start()
    peak = 0
    # Bytes on disk past what the consumer still has to read: what rolling and popping must
    # keep small. A loaded machine slows the consumer, and what it has not read stays, rightly.
    peak_unneeded = 0
    heads: set[str] = set()  # groups seen holding the open segment
    sealed: dict[int, tuple[int, int]] = {}  # seg -> (bytes, messages) once sealed
    while producer.alive() or consumer.alive():  # sampled while messages flow (the bound is the point)
        unread = (len(producer.acked) - len(consumer.delivered)) * size  # read before the disk: never over
        on_disk = replica_bytes(cluster)
        peak = max(peak, on_disk)
        peak_unneeded = max(peak_unneeded, on_disk - max(unread, 0))
        consume = cluster.state().consume
        heads |= {s.gid for s in consume}
        sealed |= {s.seg: (s.bytes or 0, s.end or 0) for s in consume if s.status.value == "sealed"}
        producer.join(0.05, check=False)
    finish(producer, consumer)
    assert len(producer.acked) == n
    if consumer_stops_at is None:  # (a stopped consumer's part is checked by the consumer itself)
        summary = check_delivery(producer.acked, [consumer.delivered])
        assert summary.acked == summary.delivered == n
    st = cluster.state()
    if consumer_stops_at is None:
        # Pop keeps a segment holding the queue's newest message; after a roll the producer
        # resends what was not yet acked, so two sealed segments may hold it (CI, load ~10:
        # segs 2 and 3 both ended at seq 3999, and "at most 2 left" never came).
        wait_until(lambda: all(s.last_seq in (None, n - 1) for s in cluster.state().consume), timeout_s=30,
                   what="every read segment popped but those holding the newest message")
    sizes = sorted(b for b, _ in sealed.values())
    # Messages stored over the segments seen sealed (resends after rolls and failovers counted
    # again; a segment sealed and popped between two samples is missed, see "sealed_seen").
    stored = sum(end for _, end in sealed.values())
    return {"segments": st.next_seg, "peak_bytes": peak, "peak_unneeded_bytes": peak_unneeded,
            "stored_messages": stored, "stored_per_acked": round(stored / n, 3),
            "total_bytes": n * size, "groups_written": len(heads),
            "sealed_seen": len(sizes), "median_segment_bytes": sizes[len(sizes) // 2] if sizes else 0,
            "max_segment_bytes": sizes[-1] if sizes else 0}


def test_segments_roll_by_size_under_load_and_the_disk_stays_bounded(cluster: Cluster) -> None:
    """A short run (the slow test below does 1 GiB): 16 MB at up to 4 MB/s through 256 KiB
    segments. The producer sends nothing past the size until the segment rolled (it and the
    daemon roll it), so a segment ends within a batch of 256 KiB however long a roll takes;
    popped segments are removed within a reconcile round (1 s)."""
    m = run_rolling_load(cluster, n=16000, size=1024, segment="256KiB", rate=4000)
    print(f"rolling load: {m}")
    # Each one sealed, read and popped. At most 256 KiB + one batch each: 31 or more; 55 at
    # load ~25 (issue 26: before the producer held its sends, 5 at load 9-25, and 12-31 of
    # up to 3.2 MB at load 12-19).
    assert m["segments"] >= 8, m
    # A following consumer keeps the disk small: what it already read is popped and removed
    # while the run goes on (without pops, ~all 16 MB stay). What is read but still on disk
    # is the open segment plus ~1-2 s of traffic (pop through the coordinator, then removal
    # within the broker's reconcile round): 3.4 MB at load ~25 (issue 26: 5.4-9.7 MB at load
    # ~16 and 14.1 MB at load 9-25 with segments of megabytes).
    assert m["peak_unneeded_bytes"] < m["total_bytes"] * 3 / 4, m
    # Resends bounded (issue 39): what rolls resend does not multiply what the queue stores.
    assert m["stored_per_acked"] <= 1.5, m


def test_a_segment_ends_within_a_batch_of_its_size_however_long_its_roll_takes(cluster: Cluster) -> None:
    """The coordinator hangs (SIGSTOP, 2 s, inside its 4 s session) while the producer writes
    1 KiB messages at 4,000/s into 256 KiB segments: nobody can roll. The producer sends
    nothing past the size meanwhile (it holds its sends until the roll), so every segment ends
    within one batch (``max_batch_bytes``) of the size, as when rolls are quick. Failing-first:
    the producer wrote on while the roll was pending, and the segment open during the hang
    held 7.7 MB at load ~20 (issue 26: at load 9-25 the rolling-load test above saw segments of
    3 MB and more, the disk bound it checks passed by them)."""
    from tests.cluster import finish, wait_acked

    cluster.add_groups("g1", "g2")
    out = cluster.ordq("queue", "create", "q", "--segment-bytes", "256KiB")
    assert out.returncode == 0, out.stderr
    coordinator = cluster.start_daemon("coordinator", session_timeout_s=4.0)
    n = 16000
    producer = cluster.producer(n=n, rate=4000, size=1024)
    producer.start()
    wait_acked(producer, 1000)  # rolling by size under way
    coordinator.pause()
    paused = time.monotonic()
    try:
        acked = len(producer.acked)
        wait_until(lambda: time.monotonic() - paused > 2.0, timeout_s=10, interval_s=0.05, what="a 2 s hang")
        during = len(producer.acked) - acked
    finally:
        coordinator.resume()
    finish(producer)
    assert len(producer.acked) == n
    limit = 256 * 1024 + BatchingConfig().max_batch_bytes
    wait_until(lambda: cluster.state().open_segment is not None and cluster.state().consume[-2].status.value
               == "sealed", timeout_s=30, what="the last rolled segment sealed")
    st = cluster.state()
    sizes = {s.seg: s.bytes for s in st.consume if s.status.value == "sealed"}
    print(f"acked during the hang: {during}; sealed segments (bytes): {sizes}")
    assert len(sizes) >= 16, sizes  # 16 MB through 256 KiB segments: rolled again and again
    assert all(b is not None and b <= limit for b in sizes.values()), (limit, sizes)


@pytest.mark.parametrize("roll_to", ["same", "next"])
def test_without_a_coordinator_the_producer_rolls_its_segments(cluster: Cluster, roll_to: str) -> None:
    """No daemon runs: the producer rolls the segment it writes once it holds the size (and
    seals it), the consumer pops what it read; nothing lost. The producer sends nothing past
    the size while the roll is decided and sealed, so a segment ends within a batch of
    256 KiB. With ``--roll-to next`` the segments alternate between the groups as they drain."""
    m = run_rolling_load(cluster, n=4000, size=1024, segment="256KiB", rate=4000, daemon=False,
                         settings=("--roll-to", roll_to))
    print(f"rolling load, producer rolls to {roll_to}: {m}")
    # 4 MB through 256 KiB segments: rolled by size, again and again (12-15 at load ~25;
    # issue 26: before the producer held its sends at the size, CI at load ~15 saw 3 segments
    # of ~1.4 MB).
    assert m["segments"] >= 3, m
    assert m["groups_written"] == (2 if roll_to == "next" else 1), m


def test_retention_by_time_bounds_the_disk_behind_a_stopped_subscription(cluster: Cluster) -> None:
    """The consumer stops early: only retention frees the disk. A segment is dropped a second
    after it was sealed and removed within a reconcile round (1 s): at 2 MB/s for 8 s about
    2.5 s of traffic stays on disk."""
    m = run_rolling_load(cluster, n=16000, size=1024, segment="256KiB", rate=2000,
                         settings=("--retention-time", "1s"), consumer_stops_at=999)
    print(f"rolling load, stopped consumer, retention 1s: {m}")
    assert m["peak_bytes"] < m["total_bytes"] / 2, m


@pytest.mark.slow
def test_one_gib_through_32_mib_segments_keeps_the_disk_bounded(cluster: Cluster) -> None:
    m = run_rolling_load(cluster, n=2**20, size=1024, segment="32MiB", rate=20000)
    print(f"rolling load, 1 GiB: {m}")
    assert m["segments"] >= 25
    assert m["peak_bytes"] < 8 * 32 << 20, m


@pytest.mark.slow
def test_one_gib_behind_a_stopped_subscription_with_retention_keeps_the_disk_bounded(cluster: Cluster) -> None:
    m = run_rolling_load(cluster, n=2**20, size=1024, segment="32MiB", rate=20000,
                         settings=("--retention-time", "2s"), consumer_stops_at=9999)
    print(f"rolling load, 1 GiB, stopped consumer, retention 2s: {m}")
    assert m["peak_bytes"] < 8 * 32 << 20, m


def test_segment_rolls_by_age(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    assert cluster.ordq("queue", "create", "q", "--segment-age", "1s").returncode == 0
    cluster.start_daemon("coordinator")
    produce(cluster, 10)
    wait_until(lambda: cluster.state().consume[0].status.value == "sealed", timeout_s=30,
               what="segment 0 rolled and sealed a second after its first message")
    st = cluster.state()
    assert st.consume[0].end == 10 and st.consume[0].sealed_ms is not None and st.consume[0].bytes > 10 * PAYLOAD
    assert st.open_segment is not None and st.open_segment.gid == "g1"  # same head, next segment
    # An empty open segment never rolls by age: the queue stays quiet.
    assert cluster.state().next_seg == st.next_seg


def test_a_commit_behind_what_retention_dropped_is_taken_and_reading_goes_on(cluster: Cluster) -> None:
    """A consumer read all of segment 0; retention drops it before the consumer's commit of that
    position reaches the coordinator (a commit thread held up on a loaded box: the loaded tier
    saw it at 15:48 on 2026-11-30). The commit moves the cursor forward and skips nothing stored:
    it is taken, not refused as "outside the consume list", and the consumer reads on."""
    from ordq.sdk import CommitConfig

    cluster.add_groups("g1", "g2")
    cluster.create_queue()  # segments roll only when told here (the default age is an hour)
    produce(cluster, 100)
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                         commit=CommitConfig(every_messages=10**6, every_ms=10**9))  # commits when told
    with Consumer(cfg) as c:
        got: list[int] = []
        while len(got) < 100:
            got.extend(m.seq for m in c.poll(max_messages=100 - len(got)))
        assert got == list(range(100))
        assert cluster.ordq("queue", "roll", "q").returncode == 0  # segment 0 sealed: seqs 0..99
        produce(cluster, 50)  # the open segment 1: seqs 100..149
        cluster.start_daemon("coordinator")
        out = cluster.ordq("queue", "update", "q", "--retention-time", "1s")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: cluster.state().trimmed_seq >= 99, timeout_s=30, what="segment 0 dropped by retention")
        c.commit()  # of seg 0's end, now behind the consume list
        more: list[int] = []
        while len(more) < 50:
            more.extend(m.seq for m in c.poll(max_messages=50 - len(more)))
        assert more == list(range(100, 150))
        c.commit()


def test_retention_by_time_overtaking_a_stopped_subscription_is_a_clear_error(cluster: Cluster) -> None:
    from ordq.common.errors import RetentionOvertook

    cluster.add_groups("g1", "g2")
    cluster.create_queue()  # segments roll only when told here (the default age is an hour)
    produce(cluster, 100)
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Consumer(cfg) as c:  # reads 10 and stops
        got: list[int] = []
        while len(got) < 10:
            got.extend(m.seq for m in c.poll(max_messages=10 - len(got)))
        c.commit()
    assert cluster.ordq("queue", "roll", "q").returncode == 0  # segment 0 sealed: seqs 0..99
    produce(cluster, 50)  # the open segment 1: seqs 100..149, never dropped (not sealed)
    cluster.start_daemon("coordinator")
    out = cluster.ordq("queue", "update", "q", "--retention-time", "1s")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: cluster.state().trimmed_seq >= 99, timeout_s=30, what="segment 0 dropped by retention")

    with pytest.raises(RetentionOvertook) as err, Consumer(cfg) as c:
        while True:
            c.poll()
    assert (err.value.next_seq, err.value.oldest_kept_seq, err.value.missed) == (10, 100, 90)
    cli = cluster.ordq("consume", "q", "-s", "s", "--idle-exit", "1")
    assert cli.returncode == 1 and b"Traceback" not in cli.stderr
    assert "90 messages (seqs 10 to 99) were dropped before it read them" in cli.stderr.decode()
    assert "ordq sub reset q s --to earliest" in cli.stderr.decode()
    assert cluster.ordq("sub", "reset", "q", "s", "--to", "earliest").returncode == 0
    again = cluster.ordq("consume", "q", "-s", "s", "--count", "3")
    assert [int(line.split(b"\t")[0]) for line in again.stdout.splitlines()] == [100, 101, 102]
