"""ZooKeeper ACLs on the ordq root: the policy (pure) and a real ZooKeeper refusing writes.

The real-ZooKeeper test starts from a tree made without ACLs (as an older ordq left it),
protects it (the upgrade ``ordq up`` does), then checks who may do what with raw kazoo
clients and with ordq's own store, and that brokers (admin) and the SDK (client) still work."""

from __future__ import annotations

import contextlib
import json
import sys

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.common.errors import ConfigError, ZkAccessDenied
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials
from ordq.coordinator import state as sm
from ordq.coordinator.acl import (
    CREATE,
    DELETE,
    QUEUE_PARENTS,
    READ,
    SUB_PARENTS,
    WRITE,
    AclIds,
    acl_for,
    check_credential,
    client_rights,
    relative,
)
from ordq.coordinator.acl_client import missing_parents, protect
from ordq.coordinator.paths import Paths
from ordq.coordinator.store import ZkStore
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import REPO
from tests.util import raw_zk as raw
from tests.util import wait_until

ADMIN, CLIENT = "ordq-admin:a-secret", "ordq-client:c-secret"
IDS = AclIds.of(ADMIN, CLIENT)
name = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)


# -- the policy, pure ---------------------------------------------------------------------------


def test_client_rights_follow_what_the_protocol_writes() -> None:
    p = Paths("/r")
    rel = lambda path: relative(path, "/r")  # noqa: E731
    assert client_rights(rel(p.producer_leader("q"))) == READ | CREATE | DELETE  # election contenders
    assert client_rights(rel(p.sub_leader("q", "s"))) == READ | CREATE | DELETE
    assert client_rights(rel(p.sub_blocked("q", "s"))) == READ | CREATE | DELETE  # one alarm per consumer
    assert client_rights(rel(p.sub_blocked("q", "s") + "/c1")) == READ | WRITE
    assert client_rights(rel(p.parked("q", "s"))) == READ | CREATE  # the ledger (parking: a later stop)
    assert client_rights(rel(p.parked("q", "s", 7))) == READ | WRITE
    # Issue 23: the coordinator writes these; a client asks it (coordinator/service.py).
    for admin_only in (p.queues, p.queue("q"), p.state("q"), p.subs("q"), p.sub("q", "s"),
                       p.queue("q") + "/x", p.group("g1"), p.live("g1", "master"), p.coordinator_leader,
                       p.sub_policy("q", "s"), p.parked_signal("q", "s"), "/r/acl", "/r/groups", "/r"):
        assert client_rights(rel(admin_only)) == READ, admin_only


def test_every_parent_a_client_creates_under_is_made_with_its_queue_or_subscription() -> None:
    p = Paths("/r")
    rel = lambda path: relative(path, "/r")  # noqa: E731
    assert missing_parents(rel(p.queue("q"))) == QUEUE_PARENTS
    assert missing_parents(rel(p.sub("q", "s"))) == SUB_PARENTS
    for other in (p.state("q"), p.subs("q"), p.sub_leader("q", "s"), p.queues, p.group("g")):
        assert missing_parents(rel(other)) == ()
    made = {f"{p.queue('q')}/{n}" for n in QUEUE_PARENTS} | {f"{p.sub('q', 's')}/{n}" for n in SUB_PARENTS}
    creatable = {path for path in made if client_rights(rel(path)) & CREATE}
    assert creatable == made  # each parent made is one a client may create in, and no other


@given(parts=st.lists(name | st.sampled_from(["queues", "subs", "state", "leader", "parked", "blocked", "members",
                                              "producer-leader", "policy", "groups"]), max_size=7))
def test_a_client_creates_or_deletes_only_under_the_parents_made_for_it(parts: list[str]) -> None:
    """CREATE/DELETE on a node lets its holder create/delete any child: the client has them
    only on election, alarm, ledger and consumer-group membership parents, never where a state,
    cursor, policy, queue or subscription lives; WRITE only on alarm and ledger records."""
    rights = client_rights(tuple(parts))
    if rights & (CREATE | DELETE):
        assert len(parts) in (3, 5) and parts[0] == "queues"
        assert parts[-1] in ("producer-leader", "leader", "blocked", "parked", "members")
        assert parts[-1] == "producer-leader" if len(parts) == 3 else parts[2] == "subs"
    if rights & WRITE:
        assert len(parts) == 6 and parts[2] == "subs" and parts[4] in ("blocked", "parked")


@given(parts=st.lists(name | st.sampled_from(["queues", "subs", "state", "leader", "parked", "groups"]),
                      max_size=7))
def test_every_node_under_the_root_gives_admin_all_and_nobody_else_more_than_the_client(parts: list[str]) -> None:
    path = "/r" + "".join(f"/{x}" for x in parts)
    acl = acl_for(path, "/r", IDS)
    assert acl is not None
    by_id = {(a.id.scheme, a.id.id): a.perms for a in acl}
    assert by_id[("digest", IDS.admin)] == Permissions.ALL
    client = by_id[("digest", IDS.client)]
    assert client & READ and not client & Permissions.ADMIN
    assert by_id[("world", "anyone")] == READ  # reads are open; no write without a credential
    if not parts or parts[0] != "queues":
        assert client == READ  # groups, liveness, the coordinator, the acl record: admin only


def test_once_tokens_are_enforced_a_queues_client_nodes_are_written_only_by_its_tokens_with_the_role() -> None:
    """Issue 29: with ``writers`` (every token's digest id and grants), the nodes clients write
    under queue Q name the tokens with the path's role on Q (admin and ``*`` grants count);
    the shared client identity only reads them; every other node is as before."""
    p = Paths("/r")
    writers = {"token-1:a": {"q": ("produce",)}, "token-2:b": {"q": ("consume",)}, "token-3:c": {"*": ("admin",)},
               "token-4:d": {"q2": ("produce", "consume")}, "token-5:e": {"*": ("consume",)}}
    ids = attrs.evolve(IDS, writers=writers)
    assert AclIds.from_dict(json.loads(json.dumps(ids.to_dict()))) == ids  # as kept in <root>/acl

    def rights(path: str) -> dict[str, int]:
        acl = acl_for(path, "/r", ids)
        assert acl is not None
        return {a.id.id: a.perms for a in acl if a.id.scheme == "digest"}

    assert rights(p.producer_leader("q")) == {IDS.admin: Permissions.ALL, IDS.client: READ,
                                              "token-1:a": READ | CREATE | DELETE, "token-3:c": READ | CREATE | DELETE}
    parent, record = READ | CREATE | DELETE, READ | WRITE
    for path, perms in ((p.sub_leader("q", "s"), parent), (p.sub_members("q", "G"), parent),
                        (p.sub_blocked("q", "s"), parent), (p.parked("q", "s"), READ | CREATE),
                        (p.parked("q", "s", 7), record), (p.sub_blocked("q", "s") + "/c1", record)):
        assert rights(path) == {IDS.admin: Permissions.ALL, IDS.client: READ, "token-2:b": perms,
                                "token-3:c": perms, "token-5:e": perms}, path
    contender = f"{p.sub_leader('q', 's')}/x__lock__0000000001"
    for other in (p.state("q"), p.sub("q", "s"), p.sub_policy("q", "s"), contender, p.group("g1"), "/r/acl"):
        assert rights(other) == {IDS.admin: Permissions.ALL, IDS.client: READ}, other
    # Before tokens are enforced (no writers) the client identity writes them, as before.
    assert {a.id.id: a.perms for a in acl_for(p.producer_leader("q"), "/r", IDS) or []}[IDS.client] == (
        READ | CREATE | DELETE)


def test_paths_outside_the_root_and_bad_credentials() -> None:
    assert acl_for("/other/x", "/r", IDS) is None and acl_for("/rx", "/r", IDS) is None
    for bad in ("nopassword", ":pw", "user:", ""):
        with pytest.raises(ConfigError):
            check_credential(bad)
    with pytest.raises(ConfigError):
        AclIds.of("same:a", "same:b")


# -- a real ZooKeeper ---------------------------------------------------------------------------


@pytest.mark.zk
def test_a_protected_root_refuses_writes_without_the_right_credential(zk_server, zk_root, tmp_path) -> None:
    hosts = zk_server.connection_string
    p = Paths(zk_root)
    with ZkStore.connect(hosts, zk_root) as before:  # a tree from before ACLs
        before.add_group("g1")
        before.create_queue("q", ["g1"])
        before.create_subscription("q", "s")
    admin = ZkStore.connect(hosts, zk_root, auth=ADMIN)
    procs = BrokerGroupProcesses("g1", zk_hosts=hosts, root=zk_root, base_dir=tmp_path)
    coordinator: ManagedProcess | None = None
    try:
        assert protect(admin.client, zk_root, IDS) >= 7  # upgraded in place
        assert protect(admin.client, zk_root, IDS) >= 7  # and again: idempotent
        other = ZkStore.connect(hosts, zk_root, auth="other-admin:pw")  # protected for someone else: refused
        with other, pytest.raises(ZkAccessDenied, match="another admin identity"):
            protect(other.client, zk_root, AclIds.of("other-admin:pw", CLIENT))
        with raw(hosts) as anon:
            anon.get(p.state("q"))  # reads are open
            for write in (lambda: anon.set(p.state("q"), b"{}"), lambda: anon.set(p.queue("q"), b"{}"),
                          lambda: anon.delete(p.sub("q", "s")), lambda: anon.create(p.group("g9")),
                          lambda: anon.set(p.sub("q", "s"), b"{}")):
                with pytest.raises(NoAuthError):
                    write()
        with raw(hosts, CLIENT) as client:
            for write in (lambda: client.set(p.queue("q"), b"{}"), lambda: client.delete(p.sub("q", "s")),
                          lambda: client.create(p.group("g9")), lambda: client.set(f"{zk_root}/acl", b"{}"),
                          lambda: client.set_acls(p.state("q"), OPEN_ACL_UNSAFE)):
                with pytest.raises(NoAuthError):
                    write()
        with ZkStore.connect(hosts, zk_root) as anon_store:  # ordq's store: one typed error
            with pytest.raises(ZkAccessDenied):
                anon_store.apply("q", lambda s, _f: sm.bump_epoch(s))
            with pytest.raises(ZkAccessDenied):
                anon_store.update_queue_config("q", max_message_bytes=1000)
        with ZkStore.connect(hosts, zk_root, auth=CLIENT) as client_store:
            with pytest.raises(ZkAccessDenied):
                client_store.delete_queue("q")
            with pytest.raises(ZkAccessDenied):
                client_store.add_group("g9")
            with pytest.raises(ZkAccessDenied):  # issue 23: it asks the coordinator
                client_store.create_subscription("q", "s2")
            with pytest.raises(ZkAccessDenied):
                client_store.apply("q", lambda s, _f: sm.bump_epoch(s))
        # The upgrade made the parents clients create in (a tree from before lacked them),
        # with the policy's ACL.
        for parent in (p.producer_leader("q"), p.sub_leader("q", "s"), p.sub_blocked("q", "s"), p.parked("q", "s")):
            acl, _ = admin.client.get_acls(parent)
            assert {a.id.id: a.perms for a in acl}[IDS.client] & CREATE, parent
        assert admin.load_state("q")[0].producer_epoch == 0  # nothing above changed the state

        # The processes with their credentials work: brokers and the coordinator as admin, the
        # SDK as client (asking the coordinator for what it may not write).
        for member in procs.members:
            member.proc.env = {"ORDQ_ZK_AUTH": ADMIN}
        procs.start()
        coordinator = ManagedProcess("coordinator", [sys.executable, "-m", "ordq.cli", "--zk", hosts, "--root", zk_root,
                                                     "coordinator", "run", "--insecure", "--session-timeout", "2"],
                                     run_dir=tmp_path / "run", env={"ORDQ_ZK_AUTH": ADMIN, "PYTHONPATH": str(REPO)},
                                     cwd=REPO)
        coordinator.start()
        serving = coordinator.wait_for_line("SERVING ", timeout_s=60).split()[-1]  # the producer's bootstrap
        coordinator.wait_for_line("READY", timeout_s=60)
        wait_until(lambda: admin.live_groups(["g1"]), what="g1 live")
        with Producer(ProducerConfig(bootstrap=serving, queue="q",
                                     credentials=Credentials(zk_auth=CLIENT))) as producer:
            for i in range(20):
                producer.send(b"m%d" % i)
            producer.flush()
        with Consumer(ConsumerConfig(zk_hosts=hosts, root=zk_root, queue="q", subscription="s",
                                     credentials=Credentials(zk_auth=CLIENT))) as consumer:
            got: list[bytes] = []
            wait_until(lambda: got.extend(m.payload for m in consumer.poll(timeout_s=0.5)) or len(got) >= 20,
                       timeout_s=60, what="20 messages consumed")
            consumer.commit()
        assert got == [b"m%d" % i for i in range(20)]
        assert admin.get_cursor("q", "s")[0].last_seq == 19  # committed through the coordinator
        with Consumer(ConsumerConfig(zk_hosts=hosts, root=zk_root, queue="q", subscription="s3", start="latest",
                                     credentials=Credentials(zk_auth=CLIENT))):
            assert admin.get_cursor("q", "s3")[0].last_seq == 19  # created by the coordinator
        assert admin.load_state("q")[0].producer_epoch == 1
        acl, _ = admin.client.get_acls(p.producer_leader("q"))  # made by the upgrade (producers hold leases now)
        assert {a.id.id: a.perms for a in acl}[IDS.client] == READ | CREATE | DELETE
    finally:
        procs.kill()
        if coordinator is not None:
            coordinator.kill()
        with contextlib.suppress(Exception):
            admin._delete_tree(zk_root)  # the fixture's cleanup has no credential
        admin.close()


@pytest.mark.zk
def test_ordq_up_upgrades_an_open_cluster_only_once_its_processes_are_stopped(tmp_path) -> None:
    from ordq.cluster_config import STATE_FILE, ClusterConfig
    from ordq.local_cluster import LocalCluster

    folder = tmp_path / "c"
    open_cluster = LocalCluster(folder, ClusterConfig(groups=1, coordinators=0, zk_acl=False))
    made = [open_cluster]  # each object stops the processes it started (their Popen handles)
    try:
        open_cluster.start()
        assert open_cluster.admin_auth is None
        with open_cluster.store() as store:
            store.create_queue("q", ["g1"])
        # As an older ordq left it: no zk_acl in the saved config, so ACLs now default on.
        state = json.loads((folder / STATE_FILE).read_text())
        del state["config"]["zk_acl"]
        (folder / STATE_FILE).write_text(json.dumps(state))
        open_cluster.broker("g1", "slave").kill()
        made.append(LocalCluster(folder))
        with pytest.raises(ConfigError, match="not protected yet.*stop them first"):
            made[-1].start()  # g1/master still runs without a credential
        open_cluster.stop()
        upgraded = LocalCluster(folder)
        made.append(upgraded)
        upgraded.start()
        assert upgraded.admin_auth and upgraded.client_auth
        with raw(upgraded.zk_hosts) as anon, pytest.raises(NoAuthError):
            anon.set(Paths(upgraded.root).queue("q"), b"{}")
        with upgraded.store() as store:  # the brokers, restarted with the admin credential, serve
            store.update_queue_config("q", max_message_bytes=1000)
            assert store.live_groups(["g1"]) == {"g1"}
    finally:
        for cluster in reversed(made):
            cluster.stop()
        made[-1].destroy()
