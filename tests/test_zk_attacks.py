"""Issue 23: the client ZooKeeper credential (held by every producer and consumer of every queue)
changes no list, epoch, cursor, policy, queue or subscription: it asks the coordinator.

A hand-made attacker — a raw kazoo client with the client credential — tries each write the
issue reports (drills/security.py ``probe_zk_writes``, shared with the ``security-zk-write``
drill): all refused by ZooKeeper (NoAuth), and afterwards every node is byte for byte as it was
and nothing was created. What a client still may do (its elections, its alarm, the parked
ledger) it still can, and what it creates there an anonymous client cannot touch."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import attrs
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout, NoAuthError

from ordq.cluster_config import ClusterConfig
from ordq.common.errors import WaitTimeout, ZkAccessDenied
from ordq.coordinator.acl import CREATE, DELETE, READ, AclIds, acl_for, client_rights, digest_id
from ordq.coordinator.acl_client import protect, tokens_changed
from ordq.coordinator.paths import Paths
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import new_client
from ordq.coordinator.tokens import TokenRecord, create_token, revoke_token, token_credential, token_id, tokens_path
from ordq.drills.security import ROGUE_QUEUE, ROGUE_SUB, probe_zk_writes
from ordq.local_cluster import LocalCluster
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.util import raw_zk as raw
from tests.util import wait_until

ADMIN, CLIENT = "ordq-admin:a-secret", "ordq-client:c-secret"
IDS = AclIds.of(ADMIN, CLIENT)
POLICY = {"on_failure": "block", "attempts": 3, "backoff_s": [0.1]}


@pytest.fixture
def protected(zk_server, zk_root) -> Iterator[ZkStore]:
    """A protected tree: group g1, queues q and q2 (q2 with subscription s and a policy)."""
    admin = ZkStore.connect(zk_server.connection_string, zk_root, auth=ADMIN)
    try:
        protect(admin.client, zk_root, IDS)
        admin.add_group("g1")
        for q in ("q", "q2"):
            admin.create_queue(q, ["g1"])
        admin.create_subscription("q2", "s")
        admin.set_sub_policy("q2", "s", POLICY)
        yield admin
    finally:
        with contextlib.suppress(Exception):
            admin._delete_tree(zk_root)  # the fixture's cleanup has no credential
        admin.close()


def snapshot(store: ZkStore) -> dict[str, bytes]:
    """Every node's data under the root (the ACL record aside: it is the same either way)."""
    out: dict[str, bytes] = {}
    pending = [store.paths.root]
    while pending:
        node = pending.pop()
        data, _ = store.client.get(node)
        out[node] = data
        pending.extend(f"{node}/{c}" for c in store.client.get_children(node))
    return out


@pytest.mark.zk
def test_the_client_credential_rewrites_no_state_cursor_policy_queue_or_subscription(
        zk_server, zk_root, protected: ZkStore) -> None:
    before = snapshot(protected)
    results = probe_zk_writes(zk_server.connection_string, zk_root, "q2", "s", CLIENT)
    assert len(results) >= 15
    assert [what for what, refused in results if not refused] == []
    assert snapshot(protected) == before  # nothing written, created or deleted
    assert ROGUE_QUEUE not in protected.list_queues() and ROGUE_SUB not in protected.list_subscriptions("q2")
    assert protected.sub_policy("q2", "s") == POLICY
    # ordq's own store, with the client credential: the same, as one typed error
    with ZkStore.connect(zk_server.connection_string, zk_root, auth=CLIENT) as client:
        cursor, version = client.get_cursor("q2", "s")
        for write in (lambda: client.create_queue("q3", ["g1"]), lambda: client.create_subscription("q2", "s2"),
                      lambda: client.commit_cursor("q2", "s", cursor, version),
                      lambda: client.set_sub_policy("q2", "s", {**POLICY, "on_failure": "park"}),
                      lambda: client.delete_subscription("q2", "s")):
            with pytest.raises(ZkAccessDenied):
                write()
    assert snapshot(protected) == before


@pytest.mark.zk
def test_the_client_credential_still_does_its_part(zk_server, zk_root, protected: ZkStore) -> None:
    """Elections (kazoo's Lock finds its parent made with the queue / subscription), the alarm
    and the parked ledger; an anonymous client can change none of what it made there."""
    p = Paths(zk_root)
    with ZkStore.connect(zk_server.connection_string, zk_root, auth=CLIENT) as client:
        for path in (p.producer_leader("q2"), p.sub_leader("q2", "s")):
            lock = client.client.Lock(path, "me")
            assert lock.acquire(timeout=10)
            assert lock.contenders() == ["me"]
            lock.release()
        client.set_blocked("q2", "s", {"seq": 5, "consumer": "c1"}, owner="c1")
        assert client.blocked("q2", "s") == {"seq": 5, "consumer": "c1"}
        client.record_parked("q2", "s", 5, {"seq": 5, "status": "parked"})
        client.update_parked("q2", "s", 5, lambda r: {**r, "status": "replay"})
        assert [r["status"] for r in client.parked("q2", "s")] == ["replay"]
        with raw(zk_server.connection_string) as anon:
            for write in (lambda: anon.set(f"{p.sub_blocked('q2', 's')}/c1", b"{}"),
                          lambda: anon.delete(f"{p.sub_blocked('q2', 's')}/c1"),
                          lambda: anon.set(p.parked("q2", "s", 5), b"{}")):
                with pytest.raises(NoAuthError):
                    write()
        client.set_blocked("q2", "s", None, owner="c1")
        assert client.blocked("q2", "s") is None


@pytest.mark.zk
def test_an_alarm_goes_with_the_session_that_raised_it(zk_server, zk_root, protected: ZkStore) -> None:
    with ZkStore.connect(zk_server.connection_string, zk_root, auth=CLIENT) as client:
        client.set_blocked("q2", "s", {"seq": 9}, owner="gone")
        found = protected.blocked_alarm("q2", "s")
        assert found is not None and found[0] == {"seq": 9} and found[1] > 0
    assert protected.blocked("q2", "s") is None  # its session closed: the ephemeral node went


@pytest.mark.zk
def test_the_client_credential_creates_changes_and_deletes_no_topic(zk_server, zk_root, protected: ZkStore) -> None:
    """A topic's record (``<root>/topics/<T>``) is the admin's: a client may read it (a
    TopicProducer routes by it), never write it (a changed partition count breaks key order)."""
    protected.create_topic("t", 2, ["g1"])
    before = snapshot(protected)
    p = Paths(zk_root)
    with raw(zk_server.connection_string, CLIENT) as rogue:
        assert rogue.get(p.topic("t"))[0]  # readable
        for write in (lambda: rogue.set(p.topic("t"), b'{"hash":"blake2b-64-mod","partitions":4}'),
                      lambda: rogue.delete(p.topic("t")),
                      lambda: rogue.create(p.topic("t2"), b'{"hash":"blake2b-64-mod","partitions":1}'),
                      lambda: rogue.create(f"{p.topic('t')}/x", b"")):
            with pytest.raises(NoAuthError):
                write()
    with ZkStore.connect(zk_server.connection_string, zk_root, auth=CLIENT) as client:
        assert client.read_topic("t").partitions == 2
        for action in (lambda: client.create_topic("t3", 1, ["g1"]), lambda: client.alter_topic("t", 3, rekey=True),
                       lambda: client.delete_topic("t")):
            with pytest.raises(ZkAccessDenied):
                action()
    assert snapshot(protected) == before


@pytest.mark.zk
def test_a_group_member_registers_itself_and_writes_nothing_else(zk_server, zk_root, protected: ZkStore) -> None:
    """Consumer groups (sdk/group.py): the membership parent ``T.p0/subs/G/members`` is made
    with the subscription (admin or coordinator); a client creates and deletes its ephemeral
    member node there, and with it moves no cursor, changes no topic and plants or deletes
    nothing else (not under its member node, not beside ``members``, not the parent)."""
    protected.create_topic("t", 2, ["g1"])
    for q in ("t.p0", "t.p1"):
        protected.create_subscription(q, "G")
    p = Paths(zk_root)
    members = p.sub_members("t.p0", "G")
    assert protected.client.exists(members) is not None  # made with the subscription
    with ZkStore.connect(zk_server.connection_string, zk_root, auth=CLIENT) as store:
        member = store.client  # as GroupMember registers: the policy's ACL on what it creates
        member.create(f"{members}/m1", b'{"pid": 1}', ephemeral=True)
        before = snapshot(protected)
        cursor = p.sub("t.p0", "G")
        for write in (lambda: member.set(cursor, b'{"seg": 9, "offset": 0, "last_seq": 99}'),
                      lambda: member.set(p.topic("t"), b'{"hash":"blake2b-64-mod","partitions":4}'),
                      lambda: member.set(f"{members}/m1", b"{}"),
                      lambda: member.create(f"{members}/m1/x", b""),
                      lambda: member.create(f"{cursor}/x", b""),
                      lambda: member.delete(members),
                      lambda: member.create(f"{p.subs('t.p1')}/G2", b""),
                      lambda: member.delete(p.sub_leader("t.p0", "G"))):
            with pytest.raises(NoAuthError):
                write()
        assert client_rights(("queues", "t.p0", "subs", "G", "members", "m1")) == READ
        assert snapshot(protected) == before
        with raw(zk_server.connection_string) as anon, pytest.raises(NoAuthError):
            anon.delete(f"{members}/m1")
        member.delete(f"{members}/m1")  # its own, as leaving the group does
    assert protected.client.get_children(members) == []


# -- issue 29: a token of one queue plants nothing in another's elections, members or ledger ----

PLANT = "planted__lock__-0000000000"  # sorts before every real contender: kazoo's Lock waits behind it


def as_holder(hosts: str, token: str) -> contextlib.AbstractContextManager[KazooClient]:
    """A raw kazoo client with everything a token holder has: the shared client credential,
    and its token as its per-queue identity (coordinator/tokens.py, ``token_credential``)."""
    return raw(hosts, CLIENT, token_credential(token))


def elected(hosts: str, token: str, path: str, timeout_s: float) -> bool:
    """Whether the holder of ``token`` is elected at ``path`` within ``timeout_s``."""
    with as_holder(hosts, token) as client:
        lock = client.Lock(path, "the real contender")
        try:
            lock.acquire(timeout=timeout_s)
        except LockTimeout:
            return False
        lock.release()
        return True


@pytest.mark.zk
def test_a_token_of_one_queue_plants_deletes_and_forges_nothing_in_another_queues_zookeeper_nodes(
        zk_server, zk_root, protected: ZkStore) -> None:
    """The attack: a token holder of queue ``q`` (so with the client credential) plants a
    persistent node at the head of queue ``q2``'s consumer and producer elections and among its
    group's members, forges a parked record and an alarm, deletes q2's real contender. Before
    the guard each went through and q2's consumer was never elected again: its acked messages
    hidden for as long as the planted node stays. With the guard (per-queue rights for the
    tokens of that queue) every one is NoAuth, nothing changed, and q2's own token holder
    is elected; a consume-only token cannot join the producer election; a revoked one
    nothing."""
    hosts, p = zk_server.connection_string, Paths(zk_root)
    protected.create_topic("t", 2, ["g1"])
    for q in ("t.p0", "t.p1"):
        protected.create_subscription(q, "G")
    protected.create_subscription("q", "s")
    _, token_a = create_token(protected.client, zk_root, {"q": ["produce", "consume"]}, "holder of q")
    _, token_b = create_token(protected.client, zk_root, {q: ["produce", "consume"] for q in ("q2", "t.p0", "t.p1")},
                              "owner of q2 and t")
    _, reader_b = create_token(protected.client, zk_root, {"q2": ["consume"]}, "a reader of q2")
    tokens_changed(protected.client, zk_root)  # as ordq auth create does
    protected.record_parked("q2", "s", 7, {"seq": 7, "status": "parked"})
    with as_holder(hosts, token_b) as owner:
        contender = owner.Lock(p.sub_leader("q2", "s"), "q2's consumer")
        assert contender.acquire(timeout=10)
        before = snapshot(protected)
        went_through = []
        with as_holder(hosts, token_a) as rogue:
            for what, write in (
                    ("plant at the head of q2's consumer election",
                     lambda: rogue.create(f"{p.sub_leader('q2', 's')}/{PLANT}", b"")),
                    ("plant at the head of q2's producer election",
                     lambda: rogue.create(f"{p.producer_leader('q2')}/{PLANT}", b"")),
                    ("plant a member of t's group G", lambda: rogue.create(f"{p.sub_members('t.p0', 'G')}/m0", b"{}")),
                    ("forge a parked record of q2", lambda: rogue.create(p.parked("q2", "s", 9), b"{}")),
                    ("rewrite a parked record of q2", lambda: rogue.set(p.parked("q2", "s", 7), b"{}")),
                    ("forge q2's alarm", lambda: rogue.create(f"{p.sub_blocked('q2', 's')}/c9", b"{}")),
                    ("delete q2's elected consumer",
                     lambda: rogue.delete(f"{contender.path}/{contender.node}"))):
                try:
                    write()
                    went_through.append(what)
                except NoAuthError:
                    pass
            # Its own queue: its part still works.
            assert elected(hosts, token_a, p.sub_leader("q", "s"), 10)
            assert elected(hosts, token_a, p.producer_leader("q"), 10)
        after = snapshot(protected)
        contender.release()
    # q2's consumer: elected unless a node was planted ahead of it (then never, while it stays)
    q2_consumer_elected = elected(hosts, token_b, p.sub_leader("q2", "s"), 3)
    assert went_through == [] and q2_consumer_elected, (
        f"a token of q went through on q2: {went_through}; q2's consumer elected: {q2_consumer_elected}")
    assert after == before
    # q2's and t's own token: a group member of t registers itself, as sdk/group.py does.
    with as_holder(hosts, token_b) as member:
        member.create(f"{p.sub_members('t.p0', 'G')}/m1", b"{}", ephemeral=True)
        member.delete(f"{p.sub_members('t.p0', 'G')}/m1")
    # Roles: a consume-only token of q2 joins its consumer election, not its producer's.
    assert elected(hosts, reader_b, p.sub_leader("q2", "s"), 10)
    with as_holder(hosts, reader_b) as reader, pytest.raises(NoAuthError):
        reader.create(f"{p.producer_leader('q2')}/{PLANT}", b"", ephemeral=True)
    # Revoked: the token's ZooKeeper rights go with it.
    revoke_token(protected.client, zk_root, token_id(reader_b))
    tokens_changed(protected.client, zk_root)  # as ordq auth revoke does
    with as_holder(hosts, reader_b) as reader, pytest.raises(NoAuthError):
        reader.create(f"{p.sub_leader('q2', 's')}/{PLANT}", b"", ephemeral=True)
    assert elected(hosts, token_b, p.sub_leader("q2", "s"), 10)


@pytest.mark.slow
def test_a_token_of_one_queue_cannot_hide_another_queues_acked_messages(tmp_path) -> None:
    """The same attack end to end, on ``ordq up``'s cluster (ZooKeeper ACLs, tokens, TLS), after
    ``ordq up`` upgraded a tree from before the guard: q2's messages are acked; the holder of a
    token of q plants a node at the head of q2's consumer election. Without the guard that went
    through and q2's consumer was never elected (its acked messages hidden); with it the plant
    is NoAuth and q2's consumer, with q2's token, delivers every message."""
    cluster = LocalCluster(tmp_path / "c", ClusterConfig(groups=1, coordinators=1))
    cluster.start()
    try:
        hosts, client_auth = cluster.zk_hosts, cluster.client_auth
        p = Paths(cluster.root)
        with ZkStore.connect(hosts, cluster.root, auth=cluster.admin_auth) as admin:
            for q in ("q", "q2"):
                admin.create_queue(q, ["g1"])
            admin.create_subscription("q2", "s")
            # ordq up upgrades a tree from before the guard: its own token recorded without a
            # digest id, <root>/acl without writers, the client identity writing every election.
            older = attrs.evolve(AclIds.from_dict(json.loads(admin.client.get(f"{cluster.root}/acl")[0])),
                                 writers=None)
            admin.client.set(f"{cluster.root}/acl", json.dumps(older.to_dict()).encode())
            own = cluster.credentials.token
            assert own is not None
            path = f"{tokens_path(cluster.root)}/{token_id(own)}"
            admin.client.set(path, attrs.evolve(TokenRecord.from_json(token_id(own), admin.client.get(path)[0]),
                                                zk="").to_json())
            admin.client.set_acls(p.producer_leader("q2"), acl_for(p.producer_leader("q2"), cluster.root, older))
            cluster._protect()  # what ordq up runs on a cluster folder (local_cluster.py)
            cluster._ensure_admin_token()
            acl = {a.id.id: a.perms for a in admin.client.get_acls(p.producer_leader("q2"))[0]}
            assert acl[older.client] == READ and acl[digest_id(token_credential(own))] == READ | CREATE | DELETE
            _, token_a = create_token(admin.client, cluster.root, {"q": ["produce", "consume"]}, "holder of q")
            _, token_b = create_token(admin.client, cluster.root, {"q2": ["produce", "consume"]}, "owner of q2")
            tokens_changed(admin.client, cluster.root)  # as ordq auth create does
        owner = attrs.evolve(cluster.credentials, zk_auth=client_auth, token=token_b)
        with Producer(ProducerConfig(zk_hosts=hosts, root=cluster.root, queue="q2", credentials=owner)) as producer:
            for i in range(20):
                producer.send(b"m%d" % i)
            producer.flush()  # acked
        assert client_auth is not None
        rogue = new_client(hosts, session_timeout_s=5.0, auth=client_auth, token=token_a)  # all a holder of q has
        rogue.start(timeout=30)
        try:
            rogue.create(f"{p.sub_leader('q2', 's')}/{PLANT}", b"")
            planted = True
        except NoAuthError:
            planted = False
        finally:
            rogue.stop()
            rogue.close()
        config = ConsumerConfig(zk_hosts=hosts, root=cluster.root, queue="q2", subscription="s", credentials=owner,
                                leader_timeout_s=10)
        got: list[bytes] = []
        with contextlib.suppress(WaitTimeout), Consumer(config) as consumer:  # never elected
            wait_until(lambda: got.extend(m.payload for m in consumer.poll(timeout_s=0.5)) or len(got) >= 20,
                       timeout_s=60, what="q2's 20 acked messages delivered")
        assert not planted and got == [b"m%d" % i for i in range(20)], (
            f"planted at the head of q2's election: {planted}; q2 delivered {len(got)} of its 20 acked messages")
    finally:
        cluster.stop()
        cluster.destroy()


def acls_off_policy(store: ZkStore, root: str) -> list[str]:
    """Every node under ``root`` whose ACL is not what the policy names for it now (the
    recorded identities and token writers; an election contender aside: its creator set it)."""
    ids = AclIds.from_dict(json.loads(store.client.get(f"{root}/acl")[0]))
    off, pending = [], [root]
    while pending:
        node = pending.pop()
        acl, _ = store.client.get_acls(node)
        if store.client.exists(node).ephemeralOwner == 0 and sorted(map(str, acl)) != sorted(
                map(str, acl_for(node, root, ids) or [])):
            off.append(node)
        pending.extend(f"{node}/{c}" for c in store.client.get_children(node))
    return off


@pytest.mark.zk
def test_issuing_or_revoking_a_token_sets_only_the_client_nodes_of_its_queues(zk_server, zk_root,
                                                                              protected: ZkStore) -> None:
    """``auth create`` and ``revoke`` re-set ACLs where the token's rights change: its queues'
    election, member, alarm and parked nodes (every queue's for a ``*`` grant), not the whole
    tree (O(nodes) per token: minutes at 10⁴ queues). Every node still ends as the policy says."""
    for i in range(3):
        protected.create_queue(f"idle-{i}", ["g1"])
    protected.record_parked("q2", "s", 7, {"seq": 7, "status": "parked"})
    _, first = create_token(protected.client, zk_root, {"q": ["produce"]}, "first")
    tokens_changed(protected.client, zk_root)  # tokens become enforced: the whole tree
    assert acls_off_policy(protected, zk_root) == []
    _, token = create_token(protected.client, zk_root, {"q2": ["consume"]}, "reader of q2")
    # q2's producer election; its subscription s: leader, blocked, parked, parked/7, members
    assert tokens_changed(protected.client, zk_root) == 6
    assert acls_off_policy(protected, zk_root) == []
    revoke_token(protected.client, zk_root, token_id(token))
    assert tokens_changed(protected.client, zk_root) == 6
    assert acls_off_policy(protected, zk_root) == []
    _, everywhere = create_token(protected.client, zk_root, {"*": ["admin"]}, "admin")
    assert tokens_changed(protected.client, zk_root) == 2 + 3 + 5  # every queue's election, q2's sub
    assert acls_off_policy(protected, zk_root) == []
    assert tokens_changed(protected.client, zk_root) == 0  # nothing changed: nothing set
    revoke_token(protected.client, zk_root, token_id(first))
    assert tokens_changed(protected.client, zk_root) == 1
    assert acls_off_policy(protected, zk_root) == []
