"""A position (``latest``, a seq) counts every message acked before it is resolved.

A replica's readable end (its LAC) can trail what it stores by a step: the slave tells the
producer its synced end itself (broker_group/synced_watch.py) while the master learns it on its
link's next step, and a slave learns the LAC ``lac_push_ms`` after its master. A position
resolved in that moment from the readable end alone fell short of the acked end; the model test
(tests/test_model_user_api.py) met it now and then under load: a new subscription at ``latest``
whose cursor was 255 messages short. Here the moment is held open: the slave paused, the
master stores a batch it cannot yet make readable; the position waits for it (bounded,
``SETTLE_MS``), not past it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from ordq.sdk import Producer, ProducerConfig, SendFuture
from ordq.sdk.positions import latest_cursor
from ordq.sdk.replicas import ReplicaReader, locate_seq
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk


@contextlib.contextmanager
def stored_not_readable(cluster: Cluster, producer: Producer, reader: ReplicaReader,
                        stored: int) -> Iterator[SendFuture]:
    """g1's slave paused while the producer's next message is stored on the master only (its
    ``stored``-th): yields its future. The slave resumes when ``reader`` asks a replica to wait
    for a readable end (a long poll: the position settling), or at the end. A reader that never
    waits reads the moment itself: stored, not readable."""
    slave = cluster.groups["g1"].slave
    master = cluster.store.live_members("g1")["master"].address
    transport: Any = reader.transport
    plain = transport.fetch

    def fetch(*args: Any, **kw: Any) -> Any:
        if kw.get("max_wait_ms"):
            slave.resume()
        return plain(*args, **kw)

    slave.pause()
    try:
        pending = producer.send(b"x")
        wait_until(lambda: transport.segment_info(master, "q", 0).end == stored, what=f"the master stores {stored}")
        transport.fetch = fetch
        yield pending
    finally:
        transport.fetch = plain
        slave.resume()


def test_latest_and_a_seq_wait_for_what_the_replica_stores_to_become_readable(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q")) as producer, \
            ReplicaReader(cluster.store) as reader:
        assert producer.send(b"first").result(10).seq == 0
        st = cluster.store.load_state("q")[0]
        with stored_not_readable(cluster, producer, reader, 2) as pending:
            assert reader.extent("q", st.consume[0]).last_seq == 0  # the moment: stored, not readable yet
            cursor = latest_cursor(cluster.store, reader, st)
        assert pending.result(10).seq == 1
        assert (cursor.offset, cursor.last_seq) == (2, 1)  # before: (1, 0), one message short
        # A seq acked a moment ago is found, not refused as "not stored yet".
        with stored_not_readable(cluster, producer, reader, 3) as pending:
            found = locate_seq(cluster.store, reader, "q", 2, state=st)
        assert pending.result(10).seq == 2
        assert (found.seg, found.offset) == (0, 2)
