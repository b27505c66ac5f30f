"""The security drills (docs/SECURITY.md): hostile clients at the brokers and ZooKeeper under
steady load. Each is refused, typed and counted, and stores nothing, while the cluster's own
clients go on undisturbed; the verifier's verdict over the run shows the real producer and
consumer unaffected (a rogue batch that got stored would show up as a gap or an unknown seq).

- ``intruders`` (TLS and tokens): a client without a token, one with the wrong role, one with a
  token for another queue, a revoked token, a plaintext client against a TLS broker, a TLS
  client without a certificate. ``probe_intruders`` is shared with tests/test_security.py.
- ``rogue_epoch``: an insider (valid certificate and produce token) claims a producer epoch
  ZooKeeper never issued.
- ``control_calls``: a token holder of the queue (consume only) calls what only brokers and
  coordinators may: Seal and Fence on the head's open segment, Reconcile to end 0 and from an
  address of its own, Replicate into the slave.
- ``zk_write_without_acl``: ZooKeeper requests by whoever is none of the cluster's identities
  (``probe_zk_writes``, shared with tests/test_zk_attacks.py): no node planted, no election
  forged, no record rewritten or read (issues 23 and 37).
- ``abandoned_streams``: produce streams and long-polls opened and never read or closed.
- ``noisy_neighbour``: in drills/neighbour.py.
"""

from __future__ import annotations

import contextlib
import json
import queue
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions

from ordq.broker_group.auth import ALL_QUEUES
from ordq.common.errors import BrokerUnavailable, EpochNotIssued, OrdqError, PermissionDenied
from ordq.common.security import Credentials, channel, token_metadata
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_base import new_client
from ordq.coordinator.tokens import create_token, revoke_token, touch
from ordq.drills.runner import SUBSCRIPTION, DrillContext
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS

REVOKE_TIMEOUT_S = 10.0  # how soon every broker must refuse a revoked token (a ZooKeeper watch)


def denied(call: Callable[[], object], role: str, queue: str) -> bool:
    """True when ``call`` raises PermissionDenied naming ``role`` and ``queue`` (or ``*``: a
    caller without a known token is refused on its headers, before the request naming the
    queue is read)."""
    try:
        call()
    except PermissionDenied as exc:
        return exc.role == role and exc.queue in (queue, ALL_QUEUES)
    except OrdqError:
        return False
    return False


def within(check: Callable[[], bool], timeout_s: float = REVOKE_TIMEOUT_S) -> bool:
    """Call ``check`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _unreachable(call: Callable[[], object]) -> bool:
    """True when the broker would not even talk (the TLS handshake failed)."""
    try:
        call()
    except BrokerUnavailable:
        return True
    except OrdqError:
        return False
    return False


def fetch_call(creds: Credentials, address: str, queue: str, seg: int) -> Callable[[], object]:
    def call() -> object:
        transport = GrpcTransport(rpc_timeout_s=2.0, credentials=creds)
        try:
            return transport.fetch(address, queue, seg, 0, max_bytes=1, max_wait_ms=0)
        finally:
            transport.close()
    return call


def _produce(creds: Credentials, address: str, queue: str, seg: int) -> Callable[[], object]:
    def call() -> object:
        transport = GrpcTransport(rpc_timeout_s=2.0, credentials=creds)
        stream = transport.open_produce(address, queue, seg, 1)
        try:
            # Epoch 0 and a far seq: were it let through, it would be fenced, never stored.
            stream.send([encode_batch([Message(payload=b"intruder")], epoch=0, first_seq=10**12)])
            return next(stream.acks())
        finally:
            stream.close()
            transport.close()
    return call


def probe_intruders(store: ZkStore, creds: Credentials, address: str, queue: str, seg: int
                    ) -> list[tuple[str, bool]]:
    """Call the broker at ``address`` (serving ``queue`` segment ``seg``) as each intruder;
    ``creds`` are a legitimate client's (TLS files and an admin token). [(what, refused)]."""
    root = store.paths.root
    consume_rec, consume_tok = create_token(store.client, root, {queue: ["consume"]}, "drill: consume only")
    other_rec, other_tok = create_token(store.client, root, {queue + "-other": ["produce", "consume"]},
                                        "drill: another queue")
    touch(store.client, root)

    def with_token(tok: str | None) -> Credentials:
        return attrs.evolve(creds, token=tok)

    # The brokers learn of new tokens through the same ZooKeeper watch as of revoked ones: wait
    # (bounded) until the consume token works, so what follows tests refusals, not that watch.
    worked = within(lambda: not denied(fetch_call(with_token(consume_tok), address, queue, seg), "consume", queue))
    out = [
        ("a client without a token is refused (consume)",
         denied(fetch_call(with_token(None), address, queue, seg), "consume", queue)),
        ("a consume-only token cannot produce",
         denied(_produce(with_token(consume_tok), address, queue, seg), "produce", queue)),
        ("a token for another queue cannot read this one",
         denied(fetch_call(with_token(other_tok), address, queue, seg), "consume", queue)),
        ("a plaintext client cannot talk to a TLS broker",
         _unreachable(fetch_call(Credentials(token=creds.token), address, queue, seg))),
        ("a TLS client without a certificate signed by the cluster CA cannot talk to it",
         _unreachable(fetch_call(Credentials(ca_file=creds.ca_file, token=creds.token), address, queue, seg))),
    ]
    # Revocation: the token works (above), is revoked, and is refused within REVOKE_TIMEOUT_S.
    revoke_token(store.client, root, consume_rec.tid)
    touch(store.client, root)
    revoked_at = time.monotonic()
    refused = within(lambda: denied(fetch_call(with_token(consume_tok), address, queue, seg), "consume", queue))
    # Brokers learn of it through a ZooKeeper watch: milliseconds, not literally the next call.
    took_ms = (time.monotonic() - revoked_at) * 1000
    out.append((f"a revoked token is refused once the brokers' watch fires ({took_ms:.0f} ms, "
                f"limit {REVOKE_TIMEOUT_S:g} s)", worked and refused))
    revoke_token(store.client, root, other_rec.tid)
    touch(store.client, root)
    return out


def intruders(ctx: DrillContext) -> None:
    """The ``security-intruders`` drill: every intruder calls the head master under load."""
    gid, seg = ctx.head()
    with ctx.cluster.store() as store:
        address = store.live_members(gid)["master"].address
        ctx.fault(f"intruders call the head master {gid} on segment {seg}")
        for what, ok in probe_intruders(store, ctx.cluster.credentials, address, ctx.queue, seg):
            ctx.expect(what, ok)


ROGUE_SEQ = 1 << 40  # far past anything the real producer sends: stored, it would be a gap
ABANDONED = 100  # produce streams and fetch long-polls left open by the abandoned-streams drill
ABANDONED_RSS_MIB = 64.0  # what they may add to the master's memory (measured ~19 MiB per 100 pairs)


class Stub:
    """A hand-made client of the generated stubs with the cluster's own client credentials (a
    certificate and a token): an insider, past TLS and tokens, on a connection of its own
    (gRPC would share one between channels), as a separate client has."""

    def __init__(self, address: str, creds: Credentials) -> None:
        self.channel = channel(address, creds, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
        self.stub = pb_grpc.BrokerStub(self.channel)
        self.metadata = token_metadata(creds)


def _refusal(address: str, creds: Credentials, call: Callable[[Stub], object]) -> Exception | None:
    """What the broker answers ``call`` on a new connection (None: it went through). Not made
    again when unanswered: at load 22-30 such calls failed on gRPC's 100 ms connect timeout,
    a product defect (ordq/wire/framing.py) a retry here would have hidden."""
    s = Stub(address, creds)
    try:
        call(s)
        return None
    except grpc.RpcError as exc:
        return from_rpc_error(exc, address)
    finally:
        s.channel.close()


def _named(err: Exception | None, wanted: type[Exception] = PermissionDenied) -> str:
    """An answer as a check line shows it: the type, and the whole error when unexpected."""
    if err is None:
        return "it went through"
    return type(err).__name__ if isinstance(err, wanted) else repr(err)


def rogue_epoch(ctx: DrillContext) -> None:
    """A client built from the generated stubs claims an epoch ZooKeeper never issued: it
    writes a batch to the head master and fences both replicas with it."""
    gid, seg = ctx.head()
    with ctx.cluster.store() as store:
        epoch = store.load_state(ctx.queue)[0].producer_epoch + 5
        members = store.live_members(gid)
    before = {role: ctx.broker_stats(gid, role).get("refused", {}).get("EpochNotIssued", 0) for role in members}
    batch = encode_batch([Message(payload=b"rogue")], epoch=epoch, first_seq=ROGUE_SEQ)
    request = pb.ProduceRequest(queue=ctx.queue, seg=seg, epoch=epoch, batches=[batch])
    ctx.fault(f"a hand-made client claims producer epoch {epoch} (never issued): a batch to {gid} master and a "
              f"Fence of segment {seg} on both replicas")
    creds = ctx.cluster.credentials
    wrote = _refusal(members["master"].address, creds,
                     lambda s: list(s.stub.Produce(iter([request]), timeout=10, metadata=s.metadata)))
    ctx.expect(f"the rogue batch was refused with EpochNotIssued ({_named(wrote, EpochNotIssued)})",
               isinstance(wrote, EpochNotIssued))
    fence = pb.FenceRequest(queue=ctx.queue, seg=seg, epoch=epoch)
    for role, info in members.items():
        # A client certificate may not fence at all (only brokers and coordinators may).
        fenced = _refusal(info.address, creds, lambda s: s.stub.Fence(fence, timeout=10, metadata=s.metadata))
        ctx.expect(f"the rogue Fence was refused by the {role} ({_named(fenced)})",
                   isinstance(fenced, PermissionDenied))
    after = {role: ctx.broker_stats(gid, role).get("refused", {}).get("EpochNotIssued", 0) for role in members}
    ctx.expect(f"the rogue batch's refusal counted by the master (EpochNotIssued {before} -> {after})",
               after.get("master", 0) - before.get("master", 0) == 1)


ROGUE_QUEUE = "zz-rogue-queue"  # what an attacker with no identity of the cluster tries to create
ROGUE_SUB = "zz-rogue-sub"


def _rogue_state(data: bytes) -> bytes:
    """A valid-looking state with the consume list emptied and the epoch moved: what an
    attacker would write to make brokers drop segments and new subscriptions start past them."""
    d = json.loads(data.decode()) if data else {}
    d["consume"] = []
    d["producer_epoch"] = int(d.get("producer_epoch", 0)) + 7
    return json.dumps(d).encode()


def _rogue_cursor(data: bytes) -> bytes:
    """The cursor moved forward, consistently (13 messages skipped)."""
    d = json.loads(data.decode()) if data else {}
    d["offset"] = int(d.get("offset", 0)) + 13
    d["last_seq"] = int(d.get("last_seq", -1)) + 13
    return json.dumps(d).encode()


OLD_CLIENT_USER = "ordq-client"  # the shared client identity of ordq before issue 37
FORGED_CONTENDER = "x__lock__-0000000001"  # issue 37: a negative sequence sorts first; kazoo's lock pattern takes it


def zk_write_attempts(root: str, queue: str, sub: str, outsider_auth: str
                      ) -> list[tuple[str, str | None, Callable[[KazooClient], object]]]:
    """[(what, credential, attempt)]: what only the cluster's identities (admin, coordinator,
    broker: coordinator/acl.py) may do in ZooKeeper, each tried by an anonymous client and by
    one holding ``outsider_auth``, a credential that is none of them (a producer's or
    consumer's from before issue 37, a token's digest, a guess: ZooKeeper lets anyone
    authenticate as any ``user:password``, the ACLs decide). Each ``attempt`` takes a connected
    kazoo client and must raise NoAuthError: the issue's attacks (a node planted in a
    subscription's ``blocked`` folder with an ACL only its creator can read, a forged election
    node, a parked record open to ``world:anyone``, the token records read), and every write
    of issue 23. ``queue`` is a queue of the cluster; ``sub`` one of its subscriptions, with a
    failure policy set."""
    from ordq.coordinator.acl import digest_id
    from ordq.coordinator.paths import Paths
    from ordq.coordinator.tokens import tokens_path

    p = Paths(root)
    anyone_all = [ACL(Permissions.ALL, Id("world", "anyone"))]

    def only_me(k: KazooClient) -> list[ACL]:  # an ACL naming only the attacker: locks everyone else out
        mine = [auth for scheme, auth in (k.auth_data or ()) if scheme == "digest"]
        return [ACL(Permissions.ALL, Id("digest", digest_id(mine[0])))] if mine else anyone_all

    def set_from(path: str, change: Callable[[bytes], bytes]) -> Callable[[KazooClient], object]:
        def write(k: KazooClient) -> object:
            try:
                data, stat = k.get(path)
                version = stat.version
            except NoAuthError:  # not even readable: written blind
                data, version = b"", -1
            return k.set(path, change(data), version=version)
        return write

    def read_tokens(k: KazooClient) -> object:
        return [k.get(f"{tokens_path(root)}/{t}") for t in k.get_children(tokens_path(root))]

    attempts: list[tuple[str, Callable[[KazooClient], object]]] = [
        # issue 37
        ("plant a node in the subscription's alarm folder readable only by itself",
         lambda k: k.create(p.sub_blocked(queue, sub) + "/planted", b"{}", acl=only_me(k))),
        (f"forge a contender {FORGED_CONTENDER} in the producer election",
         lambda k: k.create(f"{p.producer_leader(queue)}/{FORGED_CONTENDER}", b"", ephemeral=True)),
        (f"forge a contender {FORGED_CONTENDER} in the subscription's election",
         lambda k: k.create(f"{p.sub_leader(queue, sub)}/{FORGED_CONTENDER}", b"", ephemeral=True)),
        ("create a contender in the producer election",
         lambda k: k.create(p.producer_leader(queue) + "/x-", b"", ephemeral=True, sequence=True)),
        ("forge a parked record open to world:anyone",
         lambda k: k.create(p.parked(queue, sub, 999_999), b"garbage", acl=anyone_all)),
        ("register a member of the subscription's group", lambda k: k.create(p.sub_members(queue, sub) + "/m0", b"{}")),
        ("read the token records", read_tokens),
        ("read the subscription's cursor", lambda k: k.get(p.sub(queue, sub))),
        # issue 23
        ("set the queue's config", lambda k: k.set(p.queue(queue), b"{}")),
        ("register a group of its own", lambda k: k.create(p.group("zz-rogue-group"), b"{}")),
        ("delete the consumer's subscription", lambda k: k.delete(p.sub(queue, sub))),
        ("rewrite the ACL record", lambda k: k.set(f"{root}/acl", b"{}")),
        ("rewrite the queue's state (consume list emptied, epoch moved)", set_from(p.state(queue), _rogue_state)),
        ("write garbage into the queue's state", lambda k: k.set(p.state(queue), b"\xff\xfe{not json")),
        ("move the subscription's cursor 13 messages forward", set_from(p.sub(queue, sub), _rogue_cursor)),
        ("delete the subscription's failure policy", lambda k: k.delete(p.sub_policy(queue, sub))),
        ("replace the failure policy",
         lambda k: k.set(p.sub_policy(queue, sub), b'{"on_failure":"park","attempts":1,"backoff_s":[]}')),
        ("plant a node beside the policy (world:anyone ALL)",
         lambda k: k.create(p.sub(queue, sub) + "/planted", b"", acl=anyone_all)),
        ("create a queue with an ACL naming only itself",
         lambda k: k.create(p.queue(ROGUE_QUEUE), b"{}", acl=only_me(k))),
        ("create a queue open to anyone", lambda k: k.create(p.queue(ROGUE_QUEUE), b"{}", acl=anyone_all)),
        ("create a subscription with an ACL naming only itself",
         lambda k: k.create(p.sub(queue, ROGUE_SUB), b'{"seg":0,"offset":0,"last_seq":-1}', acl=only_me(k))),
        ("delete the producer election", lambda k: k.delete(p.producer_leader(queue), recursive=False)),
        ("open the subscription's election to anyone", lambda k: k.set_acls(p.sub_leader(queue, sub), anyone_all)),
    ]
    return [(what, auth, attempt) for auth in (None, outsider_auth) for what, attempt in attempts]


def probe_zk_writes(hosts: str, root: str, queue: str, sub: str, outsider_auth: str
                    ) -> list[tuple[str, bool]]:
    """Try every ``zk_write_attempts`` attempt, each on a connection of its own; [(what, refused)]
    (refused: NoAuthError; any other outcome, NoNode included, is not the refusal wanted)."""
    out = []
    for what, auth, attempt in zk_write_attempts(root, queue, sub, outsider_auth):
        client = new_client(hosts, session_timeout_s=5.0, auth=auth)  # TLS when the cluster's ZooKeeper is
        client.start(timeout=15)
        try:
            attempt(client)
            ok = False
        except NoAuthError:
            ok = True
        except Exception:  # noqa: BLE001 - any other outcome (NoNode...) is not the refusal we want
            ok = False
        finally:
            client.stop()
            client.close()
        who = "an anonymous client" if auth is None else f"credential {auth.partition(':')[0]!r}"
        out.append((f"{who} refused: {what}", ok))
    return out


def zk_write_without_acl(ctx: DrillContext) -> None:
    """Clients without a credential, and with one that is none of the cluster's identities (as
    a producer's or consumer's from before issue 37), try what only the cluster's processes and
    its admin may: plant a node readable only by itself in the alarm folder, forge election
    contenders, a parked record open to anyone, a group member; read the token records and a
    cursor; rewrite the queue's state (valid and garbage), move the cursor, delete or replace
    the failure policy, create a queue, subscription or group, the ACL record. Each is refused;
    nothing was created; the policy is as set."""
    c = ctx.cluster
    from ordq.coordinator.paths import Paths

    p = Paths(c.root)
    policy = {"on_failure": "block", "attempts": 3, "backoff_s": [0.1]}
    with c.store() as store:
        _, state_version = store.load_state(ctx.queue)
        if store.sub_policy(ctx.queue, SUBSCRIPTION) is None:
            store.set_sub_policy(ctx.queue, SUBSCRIPTION, policy)
        policy = store.sub_policy(ctx.queue, SUBSCRIPTION) or policy
    outsider = f"{OLD_CLIENT_USER}:{secrets.token_urlsafe(12)}"  # a credential none of the cluster's identities
    results = probe_zk_writes(c.zk_hosts, c.root, ctx.queue, SUBSCRIPTION, outsider)
    ctx.fault(f"{len(results)} ZooKeeper requests by clients that are none of the cluster's identities")
    for what, ok in results:
        ctx.expect(what, ok)
    with c.store() as store:
        st, version = store.load_state(ctx.queue)  # parses: no garbage got in
        ctx.expect(f"{sum(ok for _, ok in results)} of {len(results)} refused by ZooKeeper; the queue's state "
                   "still parses and was moved only by the real producer's own requests, if at all",
                   all(ok for _, ok in results) and version >= state_version and st.queue == ctx.queue)
        ctx.expect("no queue or subscription was created; nothing was planted; the policy is as set",
                   ROGUE_QUEUE not in store.list_queues()
                   and ROGUE_SUB not in store.list_subscriptions(ctx.queue)
                   and store.client.exists(p.sub(ctx.queue, SUBSCRIPTION) + "/planted") is None
                   and store.sub_policy(ctx.queue, SUBSCRIPTION) == policy)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def abandoned_streams(ctx: DrillContext) -> None:
    """ABANDONED produce streams opened on the head master and never written to, read or
    closed, and as many fetch long-polls asking for 2^31 bytes and ms, never collected: the
    master's memory stays bounded and the real producer keeps being acked."""
    gid, seg = ctx.head()
    master = ctx.cluster.broker(gid, "master")
    pid = master.proc.pid
    with ctx.cluster.store() as store:
        address = store.live_members(gid)["master"].address
    before_rss = _rss_mib(pid) if pid else 0.0
    acked_before = sum(int(w.status().get("acked", 0)) for w in ctx.producers)
    stubs: list[Stub] = []
    blockers: list[queue.SimpleQueue[pb.ProduceRequest | None]] = []
    calls: list[object] = []  # held: a dropped call object is cancelled
    ctx.fault(f"{ABANDONED} produce streams and {ABANDONED} fetch long-polls opened on {gid} master and abandoned")
    try:
        for _ in range(ABANDONED):
            s = Stub(address, ctx.cluster.credentials)
            stubs.append(s)
            requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
            blockers.append(requests)
            calls.append(s.stub.Produce(iter(requests.get, None), metadata=s.metadata))
            calls.append(s.stub.Fetch.future(pb.FetchRequest(queue=ctx.queue, seg=seg, offset=1 << 40,
                                                             max_bytes=2**31 - 1, max_wait_ms=2**31 - 1,
                                                             known_end=-1), metadata=s.metadata))
        ctx.wait(lambda: sum(int(w.status().get("acked", 0)) for w in ctx.producers) > acked_before + 100,
                 timeout_s=30, what="the real producer to keep being acked")
        grown = (_rss_mib(pid) if pid else 0.0) - before_rss
        ctx.expect(f"the master's memory grew {grown:.1f} MiB (bound {ABANDONED_RSS_MIB:g}) and it kept acking the "
                   "real producer", pid is not None and grown < ABANDONED_RSS_MIB)
    finally:
        for requests in blockers:
            requests.put(None)
        for s in stubs:
            with contextlib.suppress(Exception):
                s.channel.close()


def control_calls(ctx: DrillContext) -> None:
    """The ``security-control-calls`` drill: a client with the cluster's client certificate and a
    consume-only token calls, on both replicas of the head group, Seal and Fence on the open
    segment, Reconcile to end 0 and Reconcile from an address it names, and Replicate into the
    slave. Before issue 23 each of them worked (the head was dropped, copies truncated or
    overwritten): now each is refused (PermissionDenied), counted, and the load goes on."""
    gid, seg = ctx.head()
    c = ctx.cluster
    with c.store() as store:
        members = store.live_members(gid)
        rec, token = create_token(store.client, store.paths.root, {ctx.queue: ["consume"]}, "drill: control calls")
        touch(store.client, store.paths.root)
        state_before = store.load_state(ctx.queue)[0]
    creds = attrs.evolve(c.credentials, token=token)
    master = members["master"].address
    ctx.expect("the consume-only token works for reading (the brokers loaded it)",
               within(lambda: not denied(fetch_call(creds, master, ctx.queue, seg), "consume", ctx.queue)))
    before = {role: ctx.broker_stats(gid, role).get("refused", {}).get("PermissionDenied", 0) for role in members}
    calls: list[tuple[str, Callable[[Stub], object]]] = [
        ("Seal of the open segment",
         lambda s: s.stub.Seal(pb.SegmentRef(queue=ctx.queue, seg=seg), timeout=10, metadata=s.metadata)),
        ("Fence of the open segment at the current epoch",
         lambda s: s.stub.Fence(pb.FenceRequest(queue=ctx.queue, seg=seg, epoch=state_before.producer_epoch),
                                timeout=10, metadata=s.metadata)),
        ("Reconcile to end 0",
         lambda s: s.stub.Reconcile(pb.ReconcileRequest(queue=ctx.queue, seg=seg, end=0), timeout=10,
                                    metadata=s.metadata)),
        ("Reconcile from an address it names",
         lambda s: s.stub.Reconcile(pb.ReconcileRequest(queue=ctx.queue, seg=seg, end=1 << 20, peer="127.0.0.1:9"),
                                    timeout=10, metadata=s.metadata)),
    ]
    ctx.fault(f"a consume-only token holder calls Seal, Fence, Reconcile (end 0, and from its own address) on both "
              f"replicas of {gid} segment {seg}, and Replicate into the slave")
    for role, info in members.items():
        for what, call in calls:
            err = _refusal(info.address, creds, call)
            ctx.expect(f"{what} refused by the {role} ({_named(err)})", isinstance(err, PermissionDenied))
    if "slave" in members:
        forged = pb.ReplicateRequest(queue=ctx.queue, seg=seg, batches=[encode_batch(
            [Message(payload=b"forged")], epoch=state_before.producer_epoch, first_seq=ROGUE_SEQ)], lac=1 << 40)
        err = _refusal(members["slave"].address, creds, lambda s: list(s.stub.Replicate(
            iter([pb.ReplicateRequest(hello=True), forged]), timeout=10, metadata=s.metadata)))
        ctx.expect(f"Replicate into the slave refused ({_named(err)})", isinstance(err, PermissionDenied))
    after = {role: ctx.broker_stats(gid, role).get("refused", {}).get("PermissionDenied", 0) for role in members}
    want = {role: len(calls) + (role == "slave") for role in members}
    ctx.expect(f"each refusal counted by its broker (PermissionDenied {before} -> {after}, {want} more wanted)",
               all(after.get(role, 0) - before.get(role, 0) >= n for role, n in want.items()))
    with c.store() as store:
        st = store.load_state(ctx.queue)[0]
        revoke_token(store.client, store.paths.root, rec.tid)
        touch(store.client, store.paths.root)
    still = st.segment(seg)
    ctx.expect(f"{gid} is still the send head and segment {seg} still open (nothing sealed, dropped or fenced)",
               st.head == gid and still is not None and still.status.value == "open"
               and st.producer_epoch == state_before.producer_epoch)
