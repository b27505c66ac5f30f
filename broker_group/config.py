"""A broker's configuration (``ordq broker run`` flags) and the gRPC server options it implies."""

from __future__ import annotations

from pathlib import Path

import attrs

from ordq.broker_group.budget import BudgetConfig
from ordq.broker_group.replica import Role
from ordq.broker_group.request_time import RequestTimeConfig, broker_request_time
from ordq.common import addresses
from ordq.common.errors import ConfigError
from ordq.common.security import Credentials
from ordq.wire.framing import GRPC_OPTIONS, REQUEST_BYTES

# A lean link's default port: the broker's gRPC port + this (7000 -> 8000). Not + 1: brokers
# of several groups on one machine take neighbouring ports (ordq/lab/cluster.py, 7000 + i).
LINK_PORT_OFFSET = 1000


@attrs.frozen(kw_only=True)
class BrokerConfig:
    gid: str
    role: Role
    data_dir: Path
    zk_hosts: str
    root: str = "/ordq"
    listen: str = "127.0.0.1:0"  # HOST:PORT bound (port 0: any free one)
    # HOST[:PORT] registered in ZooKeeper, where clients and the peer dial this broker; None: the
    # listen host with the bound port (ordq/common/addresses.py).
    advertise: str | None = None
    # The lean link this broker serves (issue 39; a master's produce link, a slave's replication
    # link): HOST:PORT it binds, None for the listen host and the gRPC port + LINK_PORT_OFFSET
    # (port 0 stays 0: any free one); and HOST[:PORT] registered for it, None for the advertised
    # host and the link's port (``link_advertised``). A client that cannot reach it uses the gRPC
    # call on the same broker (docs/OPERATIONS.md, "The lean links").
    link_listen: str | None = None
    link_advertise: str | None = None
    zk_session_timeout_s: float = 2.0
    max_batch_bytes: int = 16 << 20  # one encoded batch on the wire
    lac_push_ms: float = 20.0  # how soon the slave learns an advanced LAC when no batch carries it
    reconcile_interval_s: float = 1.0
    rpc_timeout_s: float = 5.0  # calls this broker makes to its peer while reconciling
    # Limits (docs/SECURITY.md, Limits): what one client can make this process hold.
    max_fetch_bytes: int = 32 << 20  # one Fetch answer, whatever max_bytes the reader asks
    max_fetch_wait_ms: int = 30_000  # one Fetch long-poll, whatever max_wait_ms the reader asks
    # Master: bytes accepted but not yet synced here and on the slave; past it, produce streams
    # stop being read (gRPC flow control then holds the senders back) until syncs catch up.
    max_inflight_bytes: int = 256 << 20
    max_streams_per_connection: int = 100  # HTTP/2 concurrent streams of one client connection
    max_connections: int = 4096  # accepted at once (gRPC refuses the next)
    handshake_timeout_ms: int = 10_000  # TLS + HTTP/2 handshake of a new connection
    idle_connection_ms: int = 300_000  # a connection without calls this long is closed
    max_metadata_bytes: int = 16 << 10  # request headers (a token is ~50 bytes)
    # Worker threads for the blocking parts of calls (ZooKeeper reads, Fence/Seal/Reconcile), made
    # as needed. Streams and long-polls hold none: they wait on the loop (bench/bench_abandoned.py).
    rpc_workers: int = 512
    # Calls beyond this are refused at once (RESOURCE_EXHAUSTED), not queued without bound.
    max_concurrent_rpcs: int = 1024
    # Calls one token may hold open at once (Read streams, long polls, produce streams); the
    # next is refused at once, typed (broker_group/token_calls.py): one token's idle streams
    # must not take every call of max_concurrent_rpcs, past which gRPC refuses everyone's.
    max_calls_per_token: int = 256
    # CRC-check every batch read from a sealed segment before it is sent (docs/BENCHMARKS.md).
    verify_sealed_reads: bool = True
    # A SealMany made durable with syncfs(2) of the data folder's file system, not a sync per
    # file: only where that file system is this broker's alone (durable.py says why).
    seal_syncfs: bool = False
    # What the broker holds for clients at once, in all and per connection/token (budget.py).
    budget: BudgetConfig = attrs.field(factory=BudgetConfig)
    # Each token's share of the broker's loop (request_time.py): one token's calls, refused
    # ones included, cannot take the time its neighbours' produce and acks need.
    request_time: RequestTimeConfig = attrs.field(factory=broker_request_time)
    # After a write failed for want of space, the group takes no writes until the data folder's
    # file system has this much free again (broker_group/disk_room.py), so it is not made head
    # again only to fill up at once: seconds of the busiest queue's writes, at least.
    disk_room_bytes: int = 64 << 20
    # A process restarted right after a kill finds its predecessor's liveness node still there
    # until that ZooKeeper session expires: wait this long for it before giving up.
    register_wait_s: float = 30.0
    # What it serves with and shows its peer (ordq/common/security.py); no CA: plaintext (--insecure).
    credentials: Credentials = attrs.field(factory=Credentials)

    def __attrs_post_init__(self) -> None:
        addresses.check(self.listen, self.advertise)
        if self.link_listen is not None:
            addresses.split_host_port(self.link_listen, "link_listen")
        if self.link_advertise is not None:
            host, port = addresses.split_host_port(self.link_advertise, "link_advertise", port_optional=True)
            if host in addresses.WILDCARD_HOSTS or port == 0:
                raise ConfigError(f"link_advertise {self.link_advertise!r} is no address a client can dial")
        if self.max_batch_bytes < 1024:
            raise ConfigError("max_batch_bytes must be >= 1024")
        if self.lac_push_ms <= 0 or self.reconcile_interval_s <= 0:
            raise ConfigError("lac_push_ms and reconcile_interval_s must be > 0")
        if min(self.max_fetch_bytes, self.max_fetch_wait_ms, self.max_inflight_bytes, self.max_streams_per_connection,
               self.rpc_workers, self.max_concurrent_rpcs, self.max_calls_per_token, self.max_connections,
               self.handshake_timeout_ms,
               self.idle_connection_ms, self.max_metadata_bytes) < 1:
            raise ConfigError("broker limits must be >= 1")
        if self.disk_room_bytes < 0:
            raise ConfigError("disk_room_bytes (ordq broker run --disk-room MiB) must be >= 0")

    def link_bind(self) -> str | None:
        """HOST:PORT the lean link binds: ``link_listen``, else the listen host and the gRPC
        port + LINK_PORT_OFFSET (port 0: any free one); None when that port does not exist."""
        if self.link_listen is not None:
            return self.link_listen
        host, port = addresses.split_host_port(self.listen)
        assert port is not None
        port = port + LINK_PORT_OFFSET if port else 0
        return f"{host}:{port}" if port <= 65535 else None

    def link_advertised(self, grpc_address: str, bound_port: int) -> str:
        """HOST:PORT registered for the lean link bound at ``bound_port``: ``link_advertise``
        (its port, else the bound one); else the host of ``grpc_address`` (what this broker
        advertises) with, when ``advertise`` names a port (a NAT's) and the link's port is the
        default, that port + LINK_PORT_OFFSET, else the bound port."""
        if self.link_advertise is not None:
            host, port = addresses.split_host_port(self.link_advertise, port_optional=True)
            return f"{host}:{port if port is not None else bound_port}"
        host, _ = addresses.split_host_port(grpc_address)
        advertised_port = (addresses.split_host_port(self.advertise, port_optional=True)[1]
                           if self.advertise is not None and self.link_listen is None else None)
        if advertised_port is not None and advertised_port + LINK_PORT_OFFSET <= 65535:
            return f"{host}:{advertised_port + LINK_PORT_OFFSET}"
        return f"{host}:{bound_port}"


def server_options(cfg: BrokerConfig) -> list[tuple[str, int]]:
    """The broker's server side: a request holds at most one split's worth of batches (a
    split ends at the first batch past REQUEST_BYTES, and a batch is at most max_batch_bytes),
    not the 256 MiB a channel accepts; a connection carries a bounded number of streams.
    Connections are bounded too (docs/SECURITY.md, Limits): one that has not finished its TLS
    and HTTP/2 handshake within ``handshake_timeout_ms`` is closed (a socket that never sends
    a ClientHello holds a descriptor otherwise); one without calls for ``idle_connection_ms``
    is closed (clients reconnect by themselves); keepalive pings find dead peers of open
    streams; at most ``max_connections`` are accepted. No maximum connection age: it would cut
    a producer's long-lived stream and make it fail over."""
    limit = REQUEST_BYTES + cfg.max_batch_bytes + (1 << 20)
    return [(k, v) for k, v in GRPC_OPTIONS if k != "grpc.max_receive_message_length"] + [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
        ("grpc.max_metadata_size", cfg.max_metadata_bytes),
        ("grpc.server_handshake_timeout_ms", cfg.handshake_timeout_ms),
        ("grpc.max_connection_idle_ms", cfg.idle_connection_ms),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.max_allowed_incoming_connections", cfg.max_connections),
    ]
