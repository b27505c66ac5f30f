"""The lean links as deployed (issue 39; broker_group/config.py ``link_bind``/``link_advertised``,
ordq/wire/lean_produce.py, broker_group/replication.py): where a broker's lean link listens and
what it registers (pure), a fixed link port taken and published by real brokers, and a link
the clients cannot reach (a firewalled or NAT'd port, modelled by a published address nobody
listens at): the producer and the master then use the gRPC call on the SAME broker, counted,
with no failover and the messages in order."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from ordq.broker_group import lean_link
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.process import BrokerGroupProcesses
from ordq.broker_group.replica import Role
from ordq.common.errors import ConfigError
from ordq.common.metrics import value
from ordq.drills.cdc_mirror import published_ports
from ordq.sdk import BatchingConfig, CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, SendResult
from ordq.sdk._producer_types import ProducerStats
from ordq.wire import lean_produce
from ordq.wire.aio_client import AioProduceStream
from ordq.wire.lean_produce import LeanProduceStream
from ordq.wire.transport import AsyncProduceStream
from ordq.zk_server import free_ports
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import read_metrics, wait_until

N = 300

# -- where a link listens and what it registers (pure) ------------------------------------------


def _config(listen: str, advertise: str | None = None, **link: str) -> BrokerConfig:
    return BrokerConfig(gid="g1", role=Role.MASTER, data_dir=Path("d"), zk_hosts="zk:1", listen=listen,
                        advertise=advertise, **link)  # type: ignore[arg-type]


def test_a_fixed_grpc_port_gives_the_link_a_fixed_port_a_thousand_above_it() -> None:
    deployed = _config("0.0.0.0:7000", "host2")  # docs/OPERATIONS.md's deployment
    assert deployed.link_bind() == "0.0.0.0:8000"
    assert deployed.link_advertised("host2:7000", 8000) == "host2:8000"
    natted = _config("0.0.0.0:7000", "gateway:17000")  # the NAT maps 17000 -> 7000: and 18000 -> 8000
    assert natted.link_advertised("gateway:17000", 8000) == "gateway:18000"
    any_port = _config("127.0.0.1:0")  # tests, ordq up: any free port, as the gRPC one
    assert any_port.link_bind() == "127.0.0.1:0"
    assert any_port.link_advertised("127.0.0.1:41000", 41234) == "127.0.0.1:41234"
    assert _config("127.0.0.1:65000").link_bind() is None  # no such port: no link (clients use gRPC)


def test_link_listen_and_link_advertise_name_the_links_addresses() -> None:
    explicit = _config("0.0.0.0:7000", "gateway:17000", link_listen="0.0.0.0:7443")
    assert explicit.link_bind() == "0.0.0.0:7443"
    assert explicit.link_advertised("gateway:17000", 7443) == "gateway:7443"  # no offset guessed for it
    assert _config("0.0.0.0:7000", "h", link_advertise="edge").link_advertised("h:7000", 8000) == "edge:8000"
    assert _config("0.0.0.0:7000", "h", link_advertise="edge:443").link_advertised("h:7000", 8000) == "edge:443"
    for bad in ({"link_listen": "nowhere"}, {"link_advertise": "0.0.0.0:9"}, {"link_advertise": "edge:0"}):
        with pytest.raises(ConfigError):
            _config("127.0.0.1:0", **bad)


# -- real brokers -------------------------------------------------------------------------------


def _start_group(cluster: Cluster, master_args: list[str], slave_args: list[str]) -> BrokerGroupProcesses:
    """Group g1 with these ``ordq broker run`` options for each process, and queue q on it."""
    cluster.add_groups("g1", extra_args={"master": master_args, "slave": slave_args})
    cluster.create_queue("q", ["g1"])
    return cluster.groups["g1"]


def _node(cluster: Cluster, gid: str, role: str) -> dict[str, str]:
    return dict(json.loads(cluster.store.client.get(cluster.paths.live(gid, role))[0]))


@attrs.frozen
class Fallbacks:
    """The lean links each client could not open: as counted in its statistics, and as its
    metrics showed them."""

    producer: int
    producer_metric: float | None
    consumer: int
    consumer_metric: float | None


def _produce_and_consume(cluster: Cluster
                         ) -> tuple[ProducerStats, AsyncProduceStream | None, list[SendResult], Fallbacks]:
    """N messages sent in batches, each batch awaited, then read back in order by a consumer:
    the producer's statistics and its stream (which link carried it), every ack, and both
    clients' link fallbacks."""
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q",
                         batching=BatchingConfig(linger_ms=2, max_batch_messages=50), metrics_listen="127.0.0.1:0")
    acks: list[SendResult] = []
    with Producer(cfg) as p:
        for start in range(0, N, 50):
            futures = [p.send(f"m{i}".encode()) for i in range(start, start + 50)]
            acks.extend(f.result(timeout=30) for f in futures)
        stats, stream = p.statistics(), p._stream  # noqa: SLF001 - which link carried it
        assert p.metrics_url is not None
        producer_metric = value(read_metrics(p.metrics_url), "ordq_producer_link_fallbacks_total")
    consumer_cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                                  commit=CommitConfig(every_messages=10**9, every_ms=10**9),
                                  metrics_listen="127.0.0.1:0")
    seen: list[tuple[int, bytes]] = []
    with Consumer(consumer_cfg) as c:
        def read() -> bool:
            seen.extend((m.seq, m.payload) for m in c.poll(max_messages=N))
            return len(seen) >= N

        wait_until(read, timeout_s=30, what=f"{N} messages read back")
        assert c.metrics_url is not None
        fallbacks = Fallbacks(stats.link_fallbacks, producer_metric, c.statistics().read_link_fallbacks,
                              value(read_metrics(c.metrics_url), "ordq_consumer_read_link_fallbacks_total"))
    assert seen == [(i, f"m{i}".encode()) for i in range(N)]
    return stats, stream, acks, fallbacks


@pytest.mark.zk
def test_a_fixed_link_port_is_bound_published_and_used(cluster: Cluster) -> None:
    master_link, slave_link = (f"127.0.0.1:{p}" for p in free_ports(2))
    group = _start_group(cluster, ["--link-listen", master_link], ["--link-listen", slave_link])
    assert _node(cluster, "g1", "master")["produce"] == master_link
    assert _node(cluster, "g1", "slave")["replication"] == slave_link
    _, stream, _, fallbacks = _produce_and_consume(cluster)
    assert isinstance(stream, LeanProduceStream) and stream.link == master_link and stream.fell_back is None
    assert fallbacks == Fallbacks(0, 0.0, 0, 0.0)
    assert f"replicating to slave at {slave_link} (lean link)" in group.master.log_tail(400)


@pytest.mark.zk
def test_links_nobody_can_reach_fall_back_to_grpc_on_the_same_brokers_without_a_failover(cluster: Cluster) -> None:
    """Each broker listens on its link but publishes an address where nobody listens (what a
    firewall or a wrong NAT mapping makes of it): every ack still comes from g1's first segment,
    in order, with no failover, each fallback counted."""
    closed_a, closed_b = (f"127.0.0.1:{p}" for p in free_ports(2))
    group = _start_group(cluster, ["--link-advertise", closed_a], ["--link-advertise", closed_b])
    assert _node(cluster, "g1", "master")["produce"] == closed_a
    first = cluster.state().open_segment
    assert first is not None
    stats, stream, acks, fallbacks = _produce_and_consume(cluster)
    # one segment, offsets in seq order: no failover, nothing resent
    assert [(a.seq, a.seg, a.offset) for a in acks] == [(i, first.seg, i) for i in range(N)]
    assert stats.failovers == 0
    # each client counted its fallback once (the consumer reads the master within LINK_RETRY_S)
    assert fallbacks == Fallbacks(1, 1.0, 1, 1.0)
    assert isinstance(stream, LeanProduceStream) and isinstance(stream.fell_back, AioProduceStream)
    state = cluster.state()
    assert state.send[0] == "g1" and state.open_segment is not None and state.open_segment.seg == first.seg
    assert len(state.consume) == 1
    master = group.master
    assert f"replicating to slave at {group.slave.address} (grpc link)" in master.log_tail(400)
    assert master.metrics_url is not None
    assert value(read_metrics(master.metrics_url), "ordq_broker_replication_link_fallbacks_total") == 1


@pytest.mark.zk
def test_a_port_cut_covers_every_address_a_client_may_dial_lean_links_too(cluster: Cluster,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The cdc-mirror drill's and bench_mirror's link cut drops the ports ``published_ports``
    reads: with the lean links on (the default), each broker's link port as well as its gRPC
    port, ZooKeeper's and the coordinators'. Before, a mirror producing over the master's link
    went on through the cut (the heavy tier's test_cdc_mirror, stop 55)."""
    for env in (lean_produce.ENV, lean_link.ENV):  # the default; named, whatever the caller's environment says
        monkeypatch.setenv(env, "lean")
    cluster.add_groups("g1")
    ports = set(published_ports(cluster.store))
    dialled = {"master": ("address", "produce"), "slave": ("address", "replication")}
    for role, keys in dialled.items():
        node = _node(cluster, "g1", role)
        for key in keys:
            assert int(node[key].rsplit(":", 1)[1]) in ports, (role, key, node, sorted(ports))
    assert {int(a.rsplit(":", 1)[1]) for a in cluster.hosts.split(",")} <= ports
    assert {int(a.rsplit(":", 1)[1]) for a in cluster.bootstrap.split(",")} <= ports
