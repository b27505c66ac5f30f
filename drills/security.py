"""The security drills (docs/SECURITY.md): hostile clients under steady load. Each is
refused, counted, and stores nothing; the verifier's verdict over the run shows the real
producer and consumer unaffected (a rogue batch that got stored would show up as a gap or an
unknown seq there).

Each case is its own function (other security cases join the family beside them)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable
from pathlib import Path

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from broker_group.errors import from_rpc_error
from broker_group.log import Message, encode_batch
from broker_group.service import GRPC_OPTIONS
from broker_group.wire import ordq_pb2 as pb
from broker_group.wire import ordq_pb2_grpc as pb_grpc
from drills.runner import SUBSCRIPTION, DrillContext
from ordq.errors import EpochNotIssued

ROGUE_SEQ = 1 << 40  # far past anything the real producer sends: stored, it would be a gap
ABANDONED = 100  # produce streams and fetch long-polls left open by the abandoned-streams drill
ABANDONED_RSS_MIB = 64.0  # what they may add to the master's memory (measured ~19 MiB per 100 pairs)


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.BrokerStub]:
    # A connection of its own (gRPC would share one between channels), as a separate client has.
    channel = grpc.insecure_channel(address, options=[*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
    return channel, pb_grpc.BrokerStub(channel)


def _refusal(address: str, call: Callable[[pb_grpc.BrokerStub], object]) -> Exception | None:
    channel, stub = _stub(address)
    try:
        call(stub)
        return None
    except grpc.RpcError as exc:
        return from_rpc_error(exc, address)
    finally:
        channel.close()


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
    wrote = _refusal(members["master"].address, lambda s: list(s.Produce(iter([request]), timeout=10)))
    ctx.expect(f"the rogue batch was refused with EpochNotIssued ({type(wrote).__name__})",
               isinstance(wrote, EpochNotIssued))
    fence = pb.FenceRequest(queue=ctx.queue, seg=seg, epoch=epoch)
    for role, info in members.items():
        fenced = _refusal(info.address, lambda s: s.Fence(fence, timeout=10))
        ctx.expect(f"the rogue Fence was refused by the {role} ({type(fenced).__name__})",
                   isinstance(fenced, EpochNotIssued))
    after = {role: ctx.broker_stats(gid, role).get("refused", {}).get("EpochNotIssued", 0) for role in members}
    ctx.expect(f"each refusal counted by the broker (EpochNotIssued {before} -> {after})",
               after.get("master", 0) - before.get("master", 0) == 2
               and after.get("slave", 0) - before.get("slave", 0) == 1)


def zk_write_without_acl(ctx: DrillContext) -> None:
    """Clients without a credential, and with the client one, try to change what only an admin
    may: the queue's configuration, a group, deleting the queue's subscriptions, the ACL
    record; an anonymous client also tries the queue's state."""
    from coordinator.paths import Paths

    c = ctx.cluster
    p = Paths(c.root)
    gid, _ = ctx.head()
    with c.store() as store:
        _, state_version = store.load_state(ctx.queue)
    attempts: list[tuple[str, str | None, Callable[[KazooClient], object]]] = [
        ("set the queue's state", None, lambda k: k.set(p.state(ctx.queue), b"{}")),
        ("set the queue's config", None, lambda k: k.set(p.queue(ctx.queue), b"{}")),
        ("set the queue's config", c.client_auth, lambda k: k.set(p.queue(ctx.queue), b"{}")),
        ("change a group", c.client_auth, lambda k: k.set(p.group(gid), b"{}")),
        ("delete the consumer's subscription", c.client_auth, lambda k: k.delete(p.sub(ctx.queue, SUBSCRIPTION))),
        ("rewrite the ACL record", c.client_auth, lambda k: k.set(f"{c.root}/acl", b"{}")),
    ]
    ctx.fault(f"{len(attempts)} ZooKeeper writes by clients without the admin credential")
    refused = 0
    for what, auth, write in attempts:
        client = KazooClient(hosts=c.zk_hosts, timeout=5.0, auth_data=[("digest", auth)] if auth else None)
        client.start(timeout=15)
        try:
            write(client)
            ok = False
        except NoAuthError:
            ok = True
        except Exception:  # noqa: BLE001 - any other outcome (NoNode...) is not the refusal we want
            ok = False
        finally:
            client.stop()
            client.close()
        refused += ok
        ctx.expect(f"{'an anonymous client' if auth is None else 'the client credential'} refused: {what}", ok)
    with c.store() as store:
        ctx.expect(f"{refused} of {len(attempts)} refused by ZooKeeper; the queue's state not touched by them "
                   "(its version moved only by the real producer's own writes, if at all)",
                   refused == len(attempts) and store.load_state(ctx.queue)[1] >= state_version)


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
    channels: list[grpc.Channel] = []
    blockers: list[queue.SimpleQueue[pb.ProduceRequest | None]] = []
    calls: list[object] = []  # held: a dropped call object is cancelled
    ctx.fault(f"{ABANDONED} produce streams and {ABANDONED} fetch long-polls opened on {gid} master and abandoned")
    try:
        for _ in range(ABANDONED):
            channel, stub = _stub(address)
            channels.append(channel)
            requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
            blockers.append(requests)
            calls.append(stub.Produce(iter(requests.get, None)))
            calls.append(stub.Fetch.future(pb.FetchRequest(queue=ctx.queue, seg=seg, offset=1 << 40,
                                                           max_bytes=2**31 - 1, max_wait_ms=2**31 - 1, known_end=-1)))
        ctx.wait(lambda: sum(int(w.status().get("acked", 0)) for w in ctx.producers) > acked_before + 100,
                 timeout_s=30, what="the real producer to keep being acked")
        grown = (_rss_mib(pid) if pid else 0.0) - before_rss
        ctx.expect(f"the master's memory grew {grown:.1f} MiB (bound {ABANDONED_RSS_MIB:g}) and it kept acking the "
                   "real producer", pid is not None and grown < ABANDONED_RSS_MIB)
    finally:
        for requests in blockers:
            requests.put(None)
        for channel in channels:
            with contextlib.suppress(Exception):
                channel.close()
