"""Issue 37: ZooKeeper holds three identities (admin, coordinator, broker) and no client; the
issue's attacks are refused, and ``ordq up`` repairs whatever someone else made.

Before: every producer and consumer held a shared client credential, and (issue 29) its token
was a ZooKeeper identity that could create election, member, alarm and parked nodes of its
queues, with an ACL of its own choosing. A consume-only token then (1) planted a node in its
subscription's ``blocked`` folder that only it could read, and ``queue list``, ``sub list`` and
``ordq down && ordq up`` failed cluster-wide; (2) forged an election node
``x__lock__-0000000001`` that sorts first and hid another subscription's acked messages; (3)
rewrote a parked record with the ACL ``world:anyone``; and (4) anonymous clients read every
node, the token records and cursors included.

The attacker here is a raw kazoo client holding what a producer or consumer was handed: the
old client credential (a cluster from before this change generated one; a new cluster has none,
and ZooKeeper lets anyone authenticate as any ``user:password``: the ACLs decide) and its
token's digest, or nothing at all. Each test names its guard."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from ordq.cluster_config import ClusterConfig
from ordq.coordinator.acl import ACL_NODE, AclIds, acl_for, digest_id
from ordq.coordinator.acl_client import AUTH_DIR, protect, read_credential
from ordq.coordinator.paths import Paths
from ordq.coordinator.store import ZkStore
from ordq.coordinator.tokens import create_token, token_id, tokens_path
from ordq.drills.security import FORGED_CONTENDER, ROGUE_QUEUE, ROGUE_SUB, probe_zk_writes
from ordq.local_cluster import LocalCluster
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.util import raw_zk as raw
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent
ADMIN, COORDINATOR, BROKER = "ordq-admin:a-secret", "ordq-coordinator:c-secret", "ordq-broker:b-secret"
OLD_CLIENT = "ordq-client:c-secret"  # the client identity of an ordq from before issue 37
IDS = AclIds.of(ADMIN, COORDINATOR, BROKER)
POLICY = {"on_failure": "block", "attempts": 3, "backoff_s": [0.1]}
ANYONE_ALL = [ACL(Permissions.ALL, Id("world", "anyone"))]


def token_digest_credential(token: str) -> str:
    """A token as the ZooKeeper identity issue 29 made it (``token-<id>:<token>``)."""
    return f"token-{token_id(token)}:{token}"


def only(credential: str) -> list[ACL]:
    user, _, password = credential.partition(":")
    return [make_digest_acl(user, password, all=True)]


@pytest.fixture
def protected(zk_server, zk_root) -> Iterator[ZkStore]:
    """A protected tree: group g1, queues q and q2 (q2 with subscription s, a policy, a parked
    record and a token record)."""
    admin = ZkStore.connect(zk_server.connection_string, zk_root, auth=ADMIN)
    try:
        protect(admin.client, zk_root, IDS)
        admin.add_group("g1")
        for q in ("q", "q2"):
            admin.create_queue(q, ["g1"])
        admin.create_subscription("q2", "s")
        admin.set_sub_policy("q2", "s", POLICY)
        admin.record_parked("q2", "s", 7, {"seq": 7, "status": "parked"})
        yield admin
    finally:
        with contextlib.suppress(Exception):
            admin._delete_tree(zk_root)  # the fixture's cleanup has no credential
        admin.close()


def snapshot(store: ZkStore) -> dict[str, tuple[bytes, list[str]]]:
    """Every node's data and ACL under the root."""
    out: dict[str, tuple[bytes, list[str]]] = {}
    pending = [store.paths.root]
    while pending:
        node = pending.pop()
        data, _ = store.client.get(node)
        out[node] = (data, sorted(map(str, store.client.get_acls(node)[0])))
        pending.extend(f"{node}/{c}" for c in store.client.get_children(node))
    return out


def off_policy(store: ZkStore, root: str, ids: AclIds) -> list[str]:
    """Every node under ``root`` whose ACL is not the policy's (as the admin sees them)."""
    off, pending = [], [root]
    while pending:
        node = pending.pop()
        if sorted(map(str, store.client.get_acls(node)[0])) != sorted(map(str, acl_for(node, root, ids) or [])):
            off.append(node)
        pending.extend(f"{node}/{c}" for c in store.client.get_children(node))
    return off


def test_no_outsider_plants_forges_rewrites_or_reads_anything(zk_server, zk_root, protected: ZkStore) -> None:
    """Guard: coordinator/acl.py ``acl_for`` (no client right, no world entry). Each attack of
    issue 37 and 23 (drills/security.py ``zk_write_attempts``: (1) a node planted in the alarm
    folder readable only by itself, (2) a forged ``x__lock__-0000000001`` in the producer's and
    the subscription's elections, (3) a parked record open to ``world:anyone``, (4) the token
    records and a cursor read), by an anonymous client, by the old client credential and by a
    token's digest: all NoAuth, and every node's data and ACL is as it was."""
    _, token = create_token(protected.client, zk_root, {"q2": ["consume"]}, "a reader of q2")
    before = snapshot(protected)
    results = []
    for outsider in (OLD_CLIENT, token_digest_credential(token)):
        results += probe_zk_writes(zk_server.connection_string, zk_root, "q2", "s", outsider)
    assert len(results) >= 60
    assert [what for what, refused in results if not refused] == []
    assert snapshot(protected) == before  # nothing written, created, deleted or opened
    assert ROGUE_QUEUE not in protected.list_queues() and ROGUE_SUB not in protected.list_subscriptions("q2")
    assert protected.sub_policy("q2", "s") == POLICY


def test_a_forged_election_node_is_refused_to_everyone_but_the_clusters_processes(
        zk_server, zk_root, protected: ZkStore) -> None:
    """Guard: ``acl_for`` gives CREATE under ``producer-leader`` and ``subs/<s>/leader`` to the
    admin, coordinator and broker identities only. Issue 37's ``x__lock__-0000000001`` (its
    negative sequence sorts first; kazoo's lock pattern accepts it) cannot be made by a client,
    whatever it holds; the cluster's own identities still can (they are the cluster)."""
    p = Paths(zk_root)
    _, token = create_token(protected.client, zk_root, {"q2": ["produce", "consume"]}, "owner of q2")
    for election in (p.producer_leader("q2"), p.sub_leader("q2", "s")):
        for outsider in (None, OLD_CLIENT, token_digest_credential(token)):
            with raw(zk_server.connection_string, outsider) as rogue, pytest.raises(NoAuthError):
                rogue.create(f"{election}/{FORGED_CONTENDER}", b"", ephemeral=True)
        assert protected.client.get_children(election) == []
    with raw(zk_server.connection_string, COORDINATOR) as coordinator:
        coordinator.create(f"{p.sub_leader('q2', 's')}/x", b"", ephemeral=True, acl=acl_for(p.sub_leader("q2", "s"),
                                                                                             zk_root, IDS))


def test_a_parked_record_cannot_be_rewritten_or_opened_to_the_world(zk_server, zk_root, protected: ZkStore) -> None:
    """Guard: ``acl_for`` (no WRITE, CREATE or ADMIN for clients on ``subs/<s>/parked``), and
    ADMIN (setACL) for the admin identity only: issue 37's consumer wrote garbage into a parked
    record and gave it ``world:anyone``. Neither a client nor even a coordinator or broker
    credential can open a record to the world."""
    p = Paths(zk_root)
    record = p.parked("q2", "s", 7)
    before = protected.client.get(record)[0]
    _, token = create_token(protected.client, zk_root, {"q2": ["consume"]}, "a reader of q2")
    for outsider in (None, OLD_CLIENT, token_digest_credential(token)):
        with raw(zk_server.connection_string, outsider) as rogue:
            for attempt in (lambda: rogue.set(record, b"garbage"), lambda: rogue.set_acls(record, ANYONE_ALL),
                            lambda: rogue.create(p.parked("q2", "s", 8), b"garbage", acl=ANYONE_ALL),
                            lambda: rogue.delete(record)):
                with pytest.raises(NoAuthError):
                    attempt()
    for process in (COORDINATOR, BROKER):
        with raw(zk_server.connection_string, process) as k, pytest.raises(NoAuthError):
            k.set_acls(record, ANYONE_ALL)
    assert protected.client.get(record)[0] == before
    assert off_policy(protected, zk_root, IDS) == []


def test_an_anonymous_client_reads_no_token_record_and_writes_nothing(zk_server, zk_root, protected: ZkStore) -> None:
    """Guard: ``acl_for`` has no ``world`` entry: the token records (hashes and grants), the
    cursors, the leases, the states and the ACL record are read by the cluster's identities
    only (before: READ for anyone); and no write of any kind."""
    p = Paths(zk_root)
    rec, _ = create_token(protected.client, zk_root, {"*": ["admin"]}, "admin")
    with raw(zk_server.connection_string) as anon:
        assert anon.exists(f"{tokens_path(zk_root)}/{rec.tid}") is not None  # exists checks no ACL
        for attempt in (lambda: anon.get(f"{tokens_path(zk_root)}/{rec.tid}"),
                        lambda: anon.get_children(tokens_path(zk_root)), lambda: anon.get(p.sub("q2", "s")),
                        lambda: anon.get(p.state("q2")), lambda: anon.get(f"{zk_root}/{ACL_NODE}"),
                        lambda: anon.get_children(zk_root), lambda: anon.create(f"{zk_root}/x", b""),
                        lambda: anon.create(f"{tokens_path(zk_root)}/00000000", b"{}"),
                        lambda: anon.set(p.sub("q2", "s"), b"{}"), lambda: anon.delete(p.parked("q2", "s", 7))):
            with pytest.raises(NoAuthError):
                attempt()


# -- on ordq up's cluster: the repair path, the upgrade path, and the attacks end to end --------------


def ordq(*argv: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "ordq.cli", *argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO)


def test_ordq_up_repairs_a_node_someone_else_made_and_upgrades_an_older_tree(tmp_path: Path) -> None:
    """Guards: ZooKeeper started by ``ordq up`` makes the admin identity its super-user
    (ordq/zk_server.py ``super_digest``), and ``ordq up``'s protect walk
    (coordinator/acl_client.py ``protect``) sets every node's ACL to the policy.

    As issue 37 reported it: with q's 20 messages acked, a consume token of q plants a node in
    its subscription's ``blocked`` folder with an ACL only it can read, with a child; the old
    client credential and the token's digest find every create refused now, so the nodes are
    planted as a test step (by a process identity giving them a foreign ACL), and so is a tree
    protected by an older ordq (its ``<root>/acl`` with a client identity and token writers,
    client and token digests and ``world:anyone`` in ACLs, its ``zk-auth/client`` file). Then
    ``queue list`` and ``sub list`` work, ``ordq down && ordq up`` exits 0, every node's ACL is
    the policy's (the planted ones repaired), the old client credential is gone, and q's
    consumer delivers the 20 acked messages in order."""
    folder = tmp_path / "c"
    cluster = LocalCluster(folder, ClusterConfig(groups=1, coordinators=1))
    cluster.start()
    try:
        hosts, root = cluster.zk_hosts, cluster.root
        p = Paths(root)
        admin_auth = cluster.admin_auth
        assert admin_auth is not None and read_credential(folder, "client") is None  # no client identity
        ids = AclIds.of(admin_auth, str(cluster.coordinator_auth), str(cluster.broker_auth))
        with ZkStore.connect(hosts, root, auth=admin_auth) as admin:
            admin.create_queue("q", ["g1"])
            admin.create_subscription("q", "s")
            _, token = create_token(admin.client, root, {"q": ["consume"]}, "a consumer of q")
        with Producer(ProducerConfig(zk_hosts=hosts, root=root, queue="q", credentials=cluster.credentials)) as pr:
            for i in range(20):
                pr.send(b"m%d" % i)
            pr.flush()  # acked

        # The attacker's creates, with what a consumer of q was handed: refused.
        blocked = p.sub_blocked("q", "s")
        for outsider in (None, OLD_CLIENT, token_digest_credential(token)):
            with raw(hosts, outsider) as rogue:
                for attempt in (lambda: rogue.create(f"{blocked}/planted", b"{}", acl=only(OLD_CLIENT)),
                                lambda: rogue.create(f"{p.sub_leader('q', 's')}/{FORGED_CONTENDER}", b""),
                                lambda: rogue.create(p.parked("q", "s", 1), b"garbage", acl=ANYONE_ALL)):
                    with pytest.raises(NoAuthError):
                        attempt()

        # The repair path: such nodes made anyway (a test step), and a tree an older ordq protected.
        evil = token_digest_credential(token)
        with raw(hosts, cluster.coordinator_auth) as k:
            k.create(f"{blocked}/planted", b"{}", acl=only(evil))
        with raw(hosts, evil) as k:
            k.create(f"{blocked}/planted/deeper", b"", acl=only(evil))
        old_acl = [ACL(Permissions.ALL, Id("digest", ids.admin)),
                   ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, Id("digest", digest_id(OLD_CLIENT))),
                   ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, Id("digest", digest_id(evil))),
                   ACL(Permissions.READ, Id("world", "anyone"))]
        with raw(hosts, admin_auth) as admin:
            admin.set(f"{root}/{ACL_NODE}", json.dumps({"admin": ids.admin, "client": digest_id(OLD_CLIENT),
                                                          "writers": {digest_id(evil): {"q": ["consume"]}}}).encode())
            for node in (p.sub_leader("q", "s"), p.producer_leader("q"), p.parked("q", "s"), root, p.sub("q", "s")):
                admin.set_acls(node, old_acl)
        (folder / AUTH_DIR / "client").write_text(OLD_CLIENT + "\n")

        res = ordq("--zk", hosts, "--root", root, "queue", "list", "--json")
        assert res.returncode == 0 and '"q"' in res.stdout, res.stderr
        res = ordq("--zk", hosts, "--root", root, "sub", "list", "q", "--json")
        assert res.returncode == 0 and '"s"' in res.stdout, res.stderr
        res = ordq("down", "--dir", str(folder))
        assert res.returncode == 0, res.stderr
        res = ordq("up", "--dir", str(folder))
        assert res.returncode == 0, res.stdout + res.stderr

        with ZkStore.connect(hosts, root, auth=admin_auth) as admin:
            assert AclIds.from_dict(json.loads(admin.client.get(f"{root}/{ACL_NODE}")[0])) == ids
            assert off_policy(admin, root, ids) == []  # the planted nodes included: repaired
            assert admin.client.exists(f"{blocked}/planted/deeper") is not None
        assert not (folder / AUTH_DIR / "client").exists()
        with raw(hosts, evil) as k, pytest.raises(NoAuthError):
            k.get(f"{blocked}/planted")  # its maker lost it
        res = ordq("--zk", hosts, "--root", root, "sub", "list", "q", "--json")
        assert res.returncode == 0, res.stderr
        restarted = LocalCluster.load(folder)
        config = ConsumerConfig(zk_hosts=hosts, root=root, queue="q", subscription="s",
                                credentials=restarted.credentials, leader_timeout_s=60)
        got: list[bytes] = []
        with Consumer(config) as consumer:
            wait_until(lambda: got.extend(m.payload for m in consumer.poll(timeout_s=0.5)) or len(got) >= 20,
                       timeout_s=90, what="q's 20 acked messages delivered")
        assert got == [b"m%d" % i for i in range(20)]
    finally:
        cluster.stop()
        if LocalCluster.exists(folder):
            LocalCluster.load(folder).destroy()  # what the ordq up above started, by its pid files


def test_a_forged_election_node_hides_no_acked_message_once_clients_hold_leases(tmp_path: Path) -> None:
    """Guard: leases granted by the coordinator (DESIGN §5 "Leases"), not ZooKeeper elections.
    Even a node ``x__lock__-0000000001`` that the cluster's own identity made (no client can
    since this change: tests above) in ``subs/<s>/leader`` and ``producer-leader`` decides
    nothing: the producer is acked and the subscription's consumer delivers every acked
    message, in order. On a branch whose clients still join ZooKeeper elections the forged
    node sorts first and the consumer is never elected (issue 37): this test passes only
    once the clients are on leases."""
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=1, coordinators=1))
    cluster.start()
    try:
        hosts, root = cluster.zk_hosts, cluster.root
        p = Paths(root)
        with ZkStore.connect(hosts, root, auth=cluster.admin_auth) as admin:
            admin.create_queue("q", ["g1"])
            admin.create_subscription("q", "s")
            for election in (p.producer_leader("q"), p.sub_leader("q", "s")):
                admin.client.create(f"{election}/{FORGED_CONTENDER}", b"")
        with Producer(ProducerConfig(zk_hosts=hosts, root=root, queue="q", credentials=cluster.credentials,
                                     leader_timeout_s=30)) as producer:
            for i in range(30):
                producer.send(b"m%d" % i)
            producer.flush()
        config = ConsumerConfig(zk_hosts=hosts, root=root, queue="q", subscription="s",
                                credentials=cluster.credentials, leader_timeout_s=30)
        got: list[bytes] = []
        with Consumer(config) as consumer:
            wait_until(lambda: got.extend(m.payload for m in consumer.poll(timeout_s=0.5)) or len(got) >= 30,
                       timeout_s=90, what="q's 30 acked messages delivered")
        assert got == [b"m%d" % i for i in range(30)]
    finally:
        cluster.stop()
        cluster.destroy()
