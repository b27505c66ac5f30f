"""A claim whose fences fail on every group moves the head at most once per group, then
answers with why (coordinator/head.py ``take_over``).

Found by hand (stop 84): a produce token made on a plaintext cluster (`ordq up --insecure`,
then `ordq auth create`) turned tokens on there, and the brokers then refused the coordinator's
Fence and Seal (a plaintext coordinator has no identity, and no token). A producer's claim
then failed over from segment to segment for as long as it kept asking: 700 segments of an
empty queue in 40 s, 12,500 deferred seals in the coordinator's log, the producer told only
"no coordinator answered Claim in time". Now a plaintext coordinator refuses ``auth create``,
and a claim whose Fence is refused moves nothing. Real processes there: ``ordq up``, the CLI.

The other bound (replicas live in ZooKeeper that answer no Fence: a coordinator cut off from
the brokers) is the head protocol on real ZooKeeper and the coordinator's own gRPC transport,
the replicas registered live at an address where nothing listens.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ordq.common.errors import BrokerUnavailable
from ordq.coordinator import state as sm
from ordq.coordinator.head import HeadProtocol
from ordq.coordinator.store import ZkStore
from ordq.coordinator.tokens import create_token, touch
from ordq.local_cluster import LocalCluster
from ordq.wire.client import GrpcTransport
from ordq.wire.transport import ReplicaEnd
from ordq.zk_server import ZkServer, free_ports
from tests.test_local_cluster import ordq

pytestmark = pytest.mark.zk

GROUPS = 2


def segments_of(folder: Path, queue: str) -> int:
    """How many segments the queue's consume list holds (ZooKeeper, as the cluster's admin)."""
    cluster = LocalCluster.load(folder)
    with cluster.store() as store:
        st, _ = store.load_state(queue)
        return len(st.consume)


def test_a_claim_whose_fence_the_brokers_refuse_moves_nothing_and_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    res = ordq("up", "--insecure", "--dir", str(folder), "--zk-port", "0", "--groups", str(GROUPS),
               "--coordinators", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        zk = LocalCluster.load(folder).zk_hosts
        assert ordq("--zk", zk, "queue", "create", "q").returncode == 0
        # A plaintext cluster takes no token (docs/SECURITY.md): refused, saying why, nothing made.
        made = ordq("--zk", zk, "auth", "create", "--role", "produce:q", "--name", "t")
        assert made.returncode != 0 and "plaintext (--insecure), which takes no tokens" in made.stderr, made.stderr
        assert "NOT enforced" in ordq("--zk", zk, "auth", "list").stdout
        # As one made before that refusal existed (or written into ZooKeeper by its admin): the
        # brokers now refuse the coordinator's Fence, and a claim must not move the head for it.
        with LocalCluster.load(folder).store() as store:
            _rec, token = create_token(store.client, store.paths.root, {"q": ["produce"]}, "t")
            touch(store.client, store.paths.root)
        started = time.monotonic()
        sent = ordq("--zk", zk, "produce", "q", "--count", "1", env={"ORDQ_TOKEN": token}, timeout_s=120)
        took = time.monotonic() - started
        # Refused, saying why, not after the claim's whole wait; the head not moved.
        assert sent.returncode != 0, sent.stdout + sent.stderr
        assert "refuse this coordinator's Fence" in sent.stderr and "the head is not moved" in sent.stderr, sent.stderr
        assert took < 30, f"{took:.1f} s: {sent.stderr}"
        assert segments_of(folder, "q") == 1  # a refusal moves nothing
    finally:
        LocalCluster.load(folder).stop()


class CountedFences(GrpcTransport):
    """The coordinator's own transport to the brokers, its Fence calls counted."""

    def __init__(self) -> None:
        super().__init__(rpc_timeout_s=1.0)
        self.fences = 0

    def fence(self, address: str, queue: str, seg: int, epoch: int) -> ReplicaEnd:
        self.fences += 1
        return super().fence(address, queue, seg, epoch)


def test_fences_unanswered_move_the_head_once_per_group_then_say_so(zk_server: ZkServer, zk_root: str) -> None:
    groups = ["g1", "g2", "g3"]
    [nothing] = free_ports(1)
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        for g in groups:
            store.add_group(g)
            for role in ("master", "slave"):
                # live in ZooKeeper, at an address where nothing listens (the coordinator cut off)
                store.register_live(g, role, address=f"127.0.0.1:{nothing}", incarnation=f"{g}-{role}")
        store.create_queue("q", groups)
        epoch = store.apply("q", lambda s, _f: sm.bump_epoch(s, "k")).producer_epoch
        transport = CountedFences()
        head = HeadProtocol(store, transport, "q", no_group_timeout_s=5.0)
        try:
            said = r"could not be fenced \(g\d master 127\.0\.0\.1:\d+: .*unavailable.* moved 3 times"
            with pytest.raises(BrokerUnavailable, match=said):
                head.take_over(epoch)
        finally:
            transport.close()
        st, _ = store.load_state("q")
        assert len(st.consume) == 1 + len(groups)  # the first segment and one move per group
        assert transport.fences == 2 * (1 + len(groups))
