"""The consumer's values that cross its parts and the SDK's other modules: its config, a
delivered message and its statistics (``ordq.sdk.consumer`` wires the parts that use them).

Rules: values only (no I/O); nothing here imports the consumer or its parts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import attrs
from prometheus_client import CollectorRegistry

from ordq.common.errors import ConfigError
from ordq.common.security import Credentials
from ordq.coordinator.client import Held
from ordq.coordinator.paths import check_name
from ordq.sdk._cluster import DEFAULT_LEASE_TTL_S, check_cluster
from ordq.sdk._consumer_core import CommitConfig
from ordq.sdk.audit import new_writer_id
from ordq.sdk.failure import FailurePolicy


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    queue: str
    subscription: str
    # The coordinators' addresses, host:port[,host:port...] (no ZooKeeper: sdk/_cluster.py);
    # None: those registered for the cluster that zk_hosts and root name (`ordq up` registers).
    bootstrap: str | None = None
    zk_hosts: str | None = None
    root: str = "/ordq"
    # Where a new subscription starts: earliest | latest | "seq N" (an application that keeps
    # its position in its own database resumes exactly there) | "time T" (as for sub reset).
    start: str = "earliest"
    commit: CommitConfig = CommitConfig()
    fetch_max_bytes: int = 4 << 20
    fetch_wait_ms: int = 200  # long-poll when nothing is readable
    leader_timeout_s: float | None = None
    # The subscription's lease from the coordinator (coordinator/leases.py): renewed every
    # quarter of it; a dead holder's successor starts about this long after its last renewal.
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    # how long start() tries to reach a coordinator before CoordinationUnavailable
    connect_timeout_s: float = 10.0
    # poll() rides out a coordinator outage (a re-election, a partition) this long, reading
    # from the replicas it knows, before it raises CoordinationUnavailable
    coordinator_outage_s: float = 30.0
    audit_dir: Path | None = None
    # What ``run(handler)`` does when the handler raises (sdk/failure.py): block, park or
    # raise, after how many attempts, with which waits between them. None: the subscription's
    # policy (``ordq sub policy``), else block with the default ladder.
    on_failure: FailurePolicy | None = None
    consumer_id: str = attrs.field(factory=new_writer_id)
    # TLS files and token (ordq/common/security.py); None: as registered for the cluster.
    credentials: Credentials | None = None
    # Prometheus series (sdk/metrics.py), opt-in: served at HOST:PORT (port 0: any; the URL is
    # ``Consumer.metrics_url``) and/or kept in the application's registry.
    metrics_listen: str | None = None
    metrics_registry: CollectorRegistry | None = None
    # A consumer group's partition consumer (sdk/group.py): its member's lease, shown with each
    # Acquire of the partition's consumer lease (the coordinator grants it only to the owner).
    member_lease: Callable[[], Held] | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_cluster(self.bootstrap, self.zk_hosts, self.root)
        check_name("queue", self.queue)
        check_name("subscription", self.subscription)
        from ordq.sdk.positions import parse_reset_target

        parse_reset_target(self.start.split())  # ConfigError for a bad start
        if self.fetch_max_bytes < 1024 or self.fetch_wait_ms < 0:
            raise ConfigError("fetch_max_bytes must be >= 1024 and fetch_wait_ms >= 0")
        if self.coordinator_outage_s < 0:
            raise ConfigError("coordinator_outage_s must be >= 0")
        if self.lease_ttl_s <= 0:
            raise ConfigError("lease_ttl_s must be > 0")
        if self.connect_timeout_s <= 0:
            raise ConfigError("connect_timeout_s must be > 0")
        if self.leader_timeout_s is not None and self.leader_timeout_s < 0:
            raise ConfigError("leader_timeout_s must be >= 0 or None (wait forever)")


class Delivered(NamedTuple):
    """One delivered message. A NamedTuple, like ``ordq.broker_group.log.Message``, not an attrs
    class: one is built per message on the hot path (~0.3 µs instead of ~1.5 µs)."""

    seq: int
    seg: int
    offset: int
    payload: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_us: int


new_delivered = tuple.__new__  # Delivered(...) without its Python-level __new__ (fields positional)


@attrs.define
class ConsumerStats:
    delivered: int = 0
    duplicates_dropped: int = 0
    commits: int = 0
    segments_done: int = 0
    seals_run: int = 0
    seg: int = 0
    offset: int = 0
    last_seq: int = -1
    parked: int = 0  # messages run()/run_keyed() moved to the parking queue
    replayed: int = 0  # parked messages handed to the handler again (ordq sub parked replay)
    alarms: int = 0  # messages that blocked past the policy's attempts (export it as a metric)
    redeliveries: int = 0  # run()/run_keyed(): handler attempts repeated after a failure
    gaps: int = 0  # GapDetected raised
    rejoins: int = 0  # the lease was lost (granted to another) and granted back: read on from the cursor
    lease_lapses: int = 0  # the lease ran out unrenewed and the coordinator revived it (nobody took it)
    time_waits: int = 0  # delayed delivery: times the head of the line was held for its due time
    # A master's lean link that could not be opened (a firewalled or NAT'd port): read over
    # gRPC instead for ordq.wire.lean_read.LINK_RETRY_S, then tried again
    read_link_fallbacks: int = 0
