"""``ordq mirror`` on real processes: two clusters (two roots of one ZooKeeper, each with its
own brokers and coordinator), the mirror as ``ordq mirror run`` processes (issue 40).

What is checked is what the target holds: read back through a consumer of the target, every
source message once, in source order, each copy carrying its source seq in its chain."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordq.common.proc import ManagedProcess
from ordq.mirror.chain import parse_chain
from ordq.sdk import Consumer, ConsumerConfig
from ordq.zk_server import ZkServer
from tests.cluster import Cluster, LoadProducer, wait_acked
from tests.helpers.load import parse_payload
from tests.util import read_metrics, wait_until

pytestmark = pytest.mark.zk


@pytest.fixture
def two(zk_server: ZkServer, zk_root: str, tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    a = Cluster(zk_server, f"{zk_root}/a", tmp_path / "a")
    b = Cluster(zk_server, f"{zk_root}/b", tmp_path / "b")
    try:
        yield a, b
    finally:
        for name, c in (("A", a), ("B", b)):
            for title, text in c.log_sections(30):
                print(f"==== cluster {name}: {title}\n{text}")
        a.close()
        b.close()


def end(c: Cluster, queue: str = "q") -> str:
    return f"{c.hosts}{c.root}/{queue}"


def spawn_mirror(src: Cluster, dst: Cluster, name: str, *extra: str, queue: str = "q",
                 target_queue: str = "q") -> ManagedProcess:
    return src.spawn(name, ["-m", "ordq.cli", "mirror", "run", "--from", end(src, queue), "--to",
                            end(dst, target_queue), "--lease-ttl", "2", "--send-timeout", "1", "--retry-max", "1",
                            "--instance", name, *extra])


def read_copy(c: Cluster, count: int, *, queue: str = "q", sub: str = "check",
              timeout_s: float = 120.0) -> list[tuple[int, bytes, list]]:
    """The first ``count`` messages of ``queue`` on ``c``: (seq, payload, chain)."""
    out: list[tuple[int, bytes, list]] = []
    cfg = ConsumerConfig(zk_hosts=c.hosts, root=c.root, queue=queue, subscription=sub)
    deadline = time.monotonic() + timeout_s
    with Consumer(cfg) as consumer:
        while len(out) < count:
            assert time.monotonic() < deadline, f"only {len(out)} of {count} copies in {timeout_s}s"
            for m in consumer.poll(0.5):
                out.append((m.seq, m.payload, parse_chain(m.headers)))
    return out


def check_copy(copy: list[tuple[int, bytes, list]], n: int, *, hops: int = 1) -> None:
    """Target seq i holds source message i (the payload says which), once, in order."""
    assert [s for s, _, _ in copy] == list(range(n))
    payload_seqs = [parse_payload(p).seq for _, p, _ in copy]
    wrong = [(i, s) for i, s in enumerate(payload_seqs) if s != i]
    assert not wrong, f"first copies out of place (target seq, source message): {wrong[:10]}"
    assert all(parse_payload(p).intact for _, p, _ in copy)
    assert all(len(chain) == hops and chain[-1].seq == i for i, (_, _, chain) in enumerate(copy))


def last_readable(c: Cluster, queue: str = "q") -> int:
    """The queue's last readable seq (waiting while a takeover fences its open segment)."""
    from ordq.sdk.replicas import ReplicaReader, last_readable_seq

    reader = ReplicaReader(c.store, c.transport)  # (not closed: the transport is the cluster's)
    found: list[int] = []

    def read() -> bool:
        st = c.state(queue)
        last = last_readable_seq(st, reader.extents(st))
        if last is not None:
            found.append(last)
        return last is not None

    wait_until(read, timeout_s=30, what=f"{queue}'s last readable seq")
    return found[-1]


@pytest.mark.slow
def test_mirror_copies_in_order_through_a_leader_kill_and_head_master_kills_on_both_sides(
        two: tuple[Cluster, Cluster]) -> None:
    a, b = two
    a.add_groups("g1", "g2")
    b.add_groups("g1", "g2")
    a.create_queue("q")
    b.create_queue("q")
    m1 = spawn_mirror(a, b, "m1")
    m1.wait_for_line("LEADING", timeout_s=60)
    m2 = spawn_mirror(a, b, "m2")
    m2.wait_for_line("STARTED", timeout_s=60)
    n = 6000
    producer = LoadProducer(a, n=n, rate=1500.0, writer="A")
    producer.start()
    wait_acked(producer, 1500)
    m1.kill()  # kill -9 the leader mid-stream: the standby takes over after its lease
    m2.wait_for_line("LEADING", timeout_s=60)
    wait_acked(producer, 3000)
    a.head("q").master.kill()  # the source's head master
    wait_acked(producer, 4000)
    b.head("q").master.kill()  # the target's head master, while the mirror writes
    producer.join(120)
    assert len(producer.acked) == n
    check_copy(read_copy(b, n), n)
    assert last_readable(b) == n - 1  # nothing more than once
    # A restarted instance goes on from what B holds: nothing is copied twice.
    m1 = spawn_mirror(a, b, "m1")
    m1.wait_for_line("STARTED", timeout_s=60)
    m2.kill()
    m1.wait_for_line("LEADING", timeout_s=60)
    wait_until(lambda: "copying from seq" in m1.log_tail(20), timeout_s=30, what="m1 resumed")
    assert f"copying from seq {n}" in m1.log_tail(20)
    assert last_readable(b) == n - 1


def produce(c: Cluster, seqs: range, *, queue: str = "q") -> None:
    """Send the payloads of ``seqs`` (make_payload) to ``queue`` and wait for their acks."""
    from ordq.sdk import Producer, ProducerConfig
    from tests.helpers.load import make_payload

    with Producer(ProducerConfig(zk_hosts=c.hosts, root=c.root, queue=queue, send_timeout_s=1.0)) as p:
        futures = [p.send(make_payload(i, "A", 120)) for i in seqs]
        p.flush(60)
        assert [f.result().seq for f in futures] == list(seqs)


def mirror_metric(url: str, name: str) -> float | None:
    from ordq.common.metrics import value

    return value(read_metrics(url), name)


@pytest.mark.slow
def test_mirror_waits_while_the_target_is_down_and_catches_up_in_order(two: tuple[Cluster, Cluster]) -> None:
    a, b = two
    a.add_groups("g1")
    b.add_groups("g1")
    a.create_queue("q")
    b.create_queue("q")
    m = spawn_mirror(a, b, "m", "--metrics", "127.0.0.1:0")
    url = m.wait_for_line("METRICS ", timeout_s=60).split()[-1]
    m.wait_for_line("LEADING", timeout_s=60)
    # What the mirror exposes: every series docs/alerts.yml names of a mirror, in a form
    # Prometheus's linter accepts.
    from tests.test_metrics import alert_rules, promtool

    exposed = {s.name for s in read_metrics(url)}
    named = {n for rule in alert_rules() for n in re.findall(r"\bordq_mirror_[a-z0-9_]+", rule["expr"])}
    assert named and not named - exposed, named - exposed
    lint = subprocess.run([promtool(), "check", "metrics"], input=urllib.request.urlopen(url, timeout=10).read(),
                          capture_output=True, timeout=60)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    produce(a, range(500))
    wait_until(lambda: mirror_metric(url, "ordq_mirror_copied_messages_total") == 500, timeout_s=60,
               what="the first 500 copied")
    b.groups["g1"].stop()  # the target's brokers go (the link to B, as the mirror sees it)
    produce(a, range(500, 2500))  # the source takes every message while the target is down
    # The mirror waits and says so; the source's backlog shows in its lag.
    wait_until(lambda: "trying again" in m.log_tail(40), timeout_s=90, what="the mirror's retry line")
    wait_until(lambda: (mirror_metric(url, "ordq_mirror_lag_messages") or 0) >= 1000, timeout_s=60,
               what="the lag metric showing the backlog")
    assert mirror_metric(url, "ordq_mirror_copied_messages_total") is not None
    b.groups["g1"].start()
    b.wait_live("g1")
    copy = read_copy(b, 2500, timeout_s=180)
    check_copy(copy, 2500)
    assert last_readable(b) == 2499
    wait_until(lambda: mirror_metric(url, "ordq_mirror_lag_messages") == 0, timeout_s=60, what="lag back to 0")


@pytest.mark.slow
def test_shapes_mirror_of_a_mirror_two_mirrors_from_one_source_and_a_loop_refused(
        zk_server: ZkServer, zk_root: str, tmp_path: Path) -> None:
    clusters = [Cluster(zk_server, f"{zk_root}/{n}", tmp_path / n) for n in "abc"]
    a, b, c = clusters
    try:
        for x in clusters:
            x.add_groups("g1")
        a.create_queue("q")
        a.create_queue("back")
        b.create_queue("q")
        c.create_queue("q")
        c.create_queue("direct")
        ab = spawn_mirror(a, b, "ab")
        bc = spawn_mirror(b, c, "bc")  # a mirror of a mirror
        ac = spawn_mirror(a, c, "ac", target_queue="direct")  # a second mirror of the same source
        for m in (ab, bc, ac):
            m.wait_for_line("LEADING", timeout_s=90)
        produce(a, range(300))
        check_copy(read_copy(b, 300), 300)
        check_copy(read_copy(c, 300, queue="direct"), 300)
        two_hops = read_copy(c, 300)
        check_copy(two_hops, 300, hops=2)
        ids = [parse_chain_ids(chain) for _, _, chain in two_hops]
        assert all(i == [f"{a.hosts}{a.root}", f"{b.hosts}{b.root}"] for i in ids)
        assert all(chain[0].seq == i for i, (_, _, chain) in enumerate(two_hops))  # A's seq kept in the chain
        # B -> A: B's copies came from A: refused, nothing written to A.
        loop = a.spawn("ba", ["-m", "ordq.cli", "mirror", "run", "--from", end(b), "--to", end(a, "back"),
                              "--lease-ttl", "2", "--instance", "ba"])
        wait_until(lambda: loop.returncode is not None, timeout_s=90, what="the looping mirror's exit")
        assert loop.returncode == 1
        assert "mirror loop refused" in loop.log_tail(10), loop.log_tail(10)
        assert a.state("back").consume[-1].first_seq is None
        res = a.ordq("mirror", "run", "--from", end(a), "--to", end(a, "back"))
        assert res.returncode == 1 and b"to itself would loop" in res.stderr, res.stderr
    finally:
        for name, x in zip("ABC", clusters, strict=True):
            for title, text in x.log_sections(30):
                print(f"==== cluster {name}: {title}\n{text}")
            x.close()


def parse_chain_ids(chain: list) -> list[str]:
    return [h.cluster for h in chain]


@pytest.mark.slow
def test_a_leader_paused_past_its_lease_is_fenced_and_waits_as_a_standby(two: tuple[Cluster, Cluster]) -> None:
    a, b = two
    a.add_groups("g1")
    b.add_groups("g1")
    a.create_queue("q")
    b.create_queue("q")
    m1 = spawn_mirror(a, b, "m1")
    m1.wait_for_line("LEADING", timeout_s=60)
    m2 = spawn_mirror(a, b, "m2")
    m2.wait_for_line("STANDBY", timeout_s=60)
    n = 5000
    producer = LoadProducer(a, n=n, rate=1500.0, writer="A")
    producer.start()
    wait_acked(producer, 1500)
    m1.pause()  # SIGSTOP: past its lease (2 s) the standby takes over and fences it
    m2.wait_for_line("LEADING", timeout_s=60)
    wait_acked(producer, 3000)
    m1.resume()  # it finds itself fenced and waits as a standby; nothing of it is written twice
    wait_until(lambda: "another instance leads now" in m1.log_tail(60), timeout_s=60, what="m1 fenced")
    producer.join(120)
    check_copy(read_copy(b, n), n)
    assert last_readable(b) == n - 1
