"""Who counts as another tenant for a token's read rate (issue 39, stop 69): a real TLS master
with tokens enforced and a read rate of 1 MiB/s, read by a hand-made client holding a consume
token for one queue. Beside only its own queue's producer (a token of its own) its reads are not
paced: one application's two ends. Beside a token active on another queue they are: the guard is
``RequestTime.others_active``, asked with the queue read (broker_group/budget.py ``ReadPace``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from ordq.common.metrics import value
from ordq.common.security import Credentials, register
from ordq.coordinator.tokens import create_token, touch
from ordq.sdk import Producer, ProducerConfig
from ordq.wire.batch import parse_header
from ordq.wire.client import GrpcTransport
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import read_metrics

MESSAGES = 2_500  # ~2.5 MiB: five times the read rate's bucket (two answers of 256 KiB)
PAYLOAD = b"x" * 1000


def _paced(cluster: Cluster) -> float:
    url = cluster.groups["g1"].master.metrics_url
    assert url is not None
    return value(read_metrics(url), "ordq_broker_read_paced_total") or 0.0


@contextmanager
def _writing(cluster: Cluster, creds: Credentials, queue: str) -> Iterator[None]:
    """A producer of ``queue`` with ``creds`` sending a message every 20 ms until the block ends:
    its token active on the master all along."""
    stop = threading.Event()
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue, credentials=creds)
    with Producer(cfg) as p:
        p.send(b"first")
        p.flush()

        def run() -> None:
            while not stop.wait(0.02):
                p.send(b"tick")

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(timeout=10)
            p.flush()


def _read(creds: Credentials, address: str, seg: int, offset: int = 0, want: int | None = None) -> tuple[int, int]:
    """Read queue q's segment from ``offset`` in answers of up to 4 MiB: to its readable end,
    or, given ``want``, until that many bytes came (long-polling for them); returns the bytes
    read and the offset reached."""
    transport = GrpcTransport(credentials=creds)
    got = 0
    try:
        while want is None or got < want:
            res = transport.fetch(address, "q", seg, offset, max_bytes=4 << 20, max_wait_ms=0 if want is None else 1000)
            if not res.batches:
                if want is None:
                    break
                continue
            got += sum(map(len, res.batches))
            offset = parse_header(res.batches[-1], verify_crc=False).end_offset
    finally:
        transport.close()
    return got, offset


def _tenants(cluster: Cluster) -> tuple[Credentials, Credentials, Credentials]:
    """g1 with a read rate of 1 MiB/s, queues q and n, and three tokens: q's producer's, a
    producer's of n (another tenant) and a consume-only one for q (the reader)."""
    cluster.add_groups("g1", extra_args={"master": ["--read-rate", "1"]})
    cluster.create_queue("q")
    cluster.create_queue("n")
    tokens = {name: create_token(cluster.store.client, cluster.root, grants, name)[1]
              for name, grants in (("admin", {"*": ["admin"]}), ("consume", {"q": ["consume"]}),
                                   ("produce", {"q": ["produce"]}), ("neighbour", {"n": ["produce"]}))}
    touch(cluster.store.client, cluster.root)
    admin = attrs.evolve(cluster.credentials, token=tokens["admin"])
    register(cluster.hosts, cluster.root, admin)
    own, neighbour, reader = (attrs.evolve(admin, token=tokens[k]) for k in ("produce", "neighbour", "consume"))
    return own, neighbour, reader


def test_a_readers_rate_holds_beside_another_queues_token_not_beside_its_own_producer(cluster: Cluster) -> None:
    own, neighbour, reader = _tenants(cluster)
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", credentials=own)) as p:
        for _ in range(MESSAGES):
            p.send(PAYLOAD)
        p.flush()
    master = cluster.store.live_members("g1")["master"].address
    seg = cluster.state("q").consume[0].seg

    with _writing(cluster, own, "q"):  # q's own producer, a token of its own, writing
        before = _paced(cluster)
        assert _read(reader, master, seg)[0] >= MESSAGES * len(PAYLOAD)
        assert _paced(cluster) == before  # one application: no answer waited for the rate

    with _writing(cluster, neighbour, "n"):  # another queue's token, writing
        before, started = _paced(cluster), time.monotonic()
        assert _read(reader, master, seg)[0] >= MESSAGES * len(PAYLOAD)
        took = time.monotonic() - started
        assert _paced(cluster) > before  # another tenant: the reader waits for its rate
        # ~2.5 MiB at 1 MiB/s, less the bucket's 512 KiB: about 2 s, at least 1 s
        assert took >= 1.0, took


BURST = 4_000  # ~4 MiB written at once: four times the read rate of 1 MiB/s


def test_a_reader_keeping_up_with_its_queue_is_not_paced_beside_another_tenant(cluster: Cluster) -> None:
    """Stop 70: the read rate paces reading back what a queue holds, not keeping up with it. A
    consumer tailing q while q's producer writes 4 MiB at once, beside another queue's token,
    reads it all without one answer waiting for its 1 MiB/s rate (``ReadPace.fresh``:
    what a token reads of a queue is free up to twice what was written to it meanwhile); the
    same reader reading q back from the start is paced (the test above)."""
    own, neighbour, reader = _tenants(cluster)
    with _writing(cluster, neighbour, "n"), \
            Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", credentials=own)) as p:
        p.send(b"first")
        p.flush()
        master = cluster.store.live_members("g1")["master"].address
        seg = cluster.state("q").consume[0].seg
        _, offset = _read(reader, master, seg)  # the reader's first read: "first"
        before = _paced(cluster)
        for _ in range(BURST):
            p.send(PAYLOAD)
        p.flush()  # all acked: readable
        _read(reader, master, seg, offset, want=BURST * len(PAYLOAD))
        assert _paced(cluster) == before  # nothing waited: what it read had just been written
