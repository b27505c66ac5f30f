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

import threading

import pytest

from ordq.sdk import Producer, ProducerConfig
from ordq.sdk.positions import latest_cursor
from ordq.sdk.replicas import ReplicaReader, locate_seq
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk


def test_latest_and_a_seq_wait_for_what_the_replica_stores_to_become_readable(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    slave = cluster.groups["g1"].slave
    master = cluster.store.live_members("g1")["master"].address
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q")) as producer, \
            ReplicaReader(cluster.store) as reader:
        assert producer.send(b"first").result(10).seq == 0
        st = cluster.store.load_state("q")[0]
        slave.pause()
        resumed = threading.Timer(0.3, slave.resume)
        try:
            pending = producer.send(b"second")  # stored on the master; readable once the slave has it
            wait_until(lambda: reader.transport.segment_info(master, "q", 0).end == 2, what="the master stores 2")
            assert reader.extent("q", st.consume[0]).last_seq == 0  # the moment: stored, not readable yet
            resumed.start()
            cursor = latest_cursor(cluster.store, reader, st)
        finally:
            resumed.cancel()
            slave.resume()
        assert pending.result(10).seq == 1
        assert (cursor.offset, cursor.last_seq) == (2, 1)  # before: (1, 0), one message short
        # A seq acked a moment ago is found, not refused as "not stored yet".
        slave.pause()
        resumed = threading.Timer(0.3, slave.resume)
        try:
            pending = producer.send(b"third")
            wait_until(lambda: reader.transport.segment_info(master, "q", 0).end == 3, what="the master stores 3")
            resumed.start()
            found = locate_seq(cluster.store, reader, "q", 2, state=st)
        finally:
            resumed.cancel()
            slave.resume()
        assert pending.result(10).seq == 2
        assert (found.seg, found.offset) == (0, 2)
