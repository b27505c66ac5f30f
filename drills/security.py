"""Intruders at a broker (issue #14, TLS and tokens): each must be refused, typed, while the
cluster's own clients go on undisturbed. Used by the ``security-*`` drills and tests/test_security.py.

Cases: a client without a token, one with the wrong role, one with a token for another queue,
a revoked token, a plaintext client against a TLS broker, a TLS client without a certificate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from broker_group.client import GrpcTransport
from broker_group.log import Message, encode_batch
from coordinator.store import ZkStore
from coordinator.tokens import create_token, revoke_token, touch
from drills.runner import DrillContext
from ordq.errors import BrokerUnavailable, OrdqError, PermissionDenied
from ordq.security import Credentials

REVOKE_TIMEOUT_S = 10.0  # how soon every broker must refuse a revoked token (a ZooKeeper watch)


def _denied(call: Callable[[], object], role: str, queue: str) -> bool:
    """True when ``call`` raises PermissionDenied naming ``role`` and ``queue``."""
    try:
        call()
    except PermissionDenied as exc:
        return exc.role == role and exc.queue == queue
    except OrdqError:
        return False
    return False


def _unreachable(call: Callable[[], object]) -> bool:
    """True when the broker would not even talk (the TLS handshake failed)."""
    try:
        call()
    except BrokerUnavailable:
        return True
    except OrdqError:
        return False
    return False


def _fetch(creds: Credentials, address: str, queue: str, seg: int) -> Callable[[], object]:
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

    out = [
        ("a client without a token is refused (consume)",
         _denied(_fetch(with_token(None), address, queue, seg), "consume", queue)),
        ("a consume-only token cannot produce",
         _denied(_produce(with_token(consume_tok), address, queue, seg), "produce", queue)),
        ("a token for another queue cannot read this one",
         _denied(_fetch(with_token(other_tok), address, queue, seg), "consume", queue)),
        ("a plaintext client cannot talk to a TLS broker",
         _unreachable(_fetch(Credentials(token=creds.token), address, queue, seg))),
        ("a TLS client without a certificate signed by the cluster CA cannot talk to it",
         _unreachable(_fetch(Credentials(ca_file=creds.ca_file, token=creds.token), address, queue, seg))),
    ]
    # Revocation: the token works, is revoked, and is refused within REVOKE_TIMEOUT_S.
    worked = not _denied(_fetch(with_token(consume_tok), address, queue, seg), "consume", queue)
    revoke_token(store.client, root, consume_rec.tid)
    touch(store.client, root)
    deadline = time.monotonic() + REVOKE_TIMEOUT_S
    refused = False
    while not refused and time.monotonic() < deadline:
        refused = _denied(_fetch(with_token(consume_tok), address, queue, seg), "consume", queue)
        if not refused:
            time.sleep(0.05)
    out.append(("a revoked token is refused on its next call", worked and refused))
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
