"""The producer's values that cross its parts and the SDK's other modules: its config, its
statistics and the stored tail it reports (``ordq.sdk.producer`` is the producer).

Rules: values only (no I/O); nothing here imports the producer or its loop side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ordq.common.errors import ConfigError
from ordq.common.security import Credentials
from ordq.coordinator.paths import check_name
from ordq.sdk._cluster import DEFAULT_LEASE_TTL_S, check_cluster
from ordq.sdk._producer_core import BatchingConfig
from ordq.sdk.audit import new_writer_id
from ordq.wire.batch import Message

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


@attrs.frozen(kw_only=True)
class ProducerConfig:
    """Producer options; every field is keyword-only and validated."""

    queue: str
    # The coordinators' addresses, host:port[,host:port...] (no ZooKeeper: sdk/_cluster.py);
    # None: those registered for the cluster that zk_hosts and root name (`ordq up` registers).
    bootstrap: str | None = None
    zk_hosts: str | None = None
    root: str = "/ordq"
    batching: BatchingConfig = BatchingConfig()
    send_timeout_s: float = 2.0  # no ack for this long while batches await one means the head is gone
    leader_timeout_s: float | None = None  # None: a standby waits until it leads
    no_group_timeout_s: float = 30.0  # how long to wait for a writable group after a failure
    # The producer lease from the coordinator (coordinator/leases.py), renewed every quarter of it.
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    # how long start() tries to reach a coordinator before CoordinationUnavailable
    connect_timeout_s: float = 10.0
    audit_dir: Path | None = None
    producer_id: str = attrs.field(factory=new_writer_id)
    # Prometheus series (sdk/metrics.py), opt-in: served at HOST:PORT (port 0: any; the URL is
    # ``Producer.metrics_url``) and/or kept in the application's registry.
    metrics_listen: str | None = None
    metrics_registry: CollectorRegistry | None = None
    # TLS files and token (ordq/common/security.py); None: as registered for the cluster in the
    # credentials file (``ordq up`` registers the clusters it starts).
    credentials: Credentials | None = None

    def __attrs_post_init__(self) -> None:
        check_cluster(self.bootstrap, self.zk_hosts, self.root)
        check_name("queue", self.queue)
        check_name("producer_id", self.producer_id)  # the lease's holder name (coordinator/service_leases.py)
        if self.lease_ttl_s <= 0:
            raise ConfigError("lease_ttl_s must be > 0")
        if self.connect_timeout_s <= 0:
            raise ConfigError("connect_timeout_s must be > 0")
        if self.send_timeout_s <= 0 or self.no_group_timeout_s <= 0:
            raise ConfigError("send_timeout_s and no_group_timeout_s must be > 0")


@attrs.frozen
class StoredMessage:
    """The last message stored for the queue (what ``last_committed()`` returns). ``seq`` is
    always exact; ``message`` is None when it could not be read back, and ``message_error``
    then says why (its segment was already dropped, or no replica of its group answers)."""

    seq: int
    seg: int | None  # None when its segment was already dropped (only the seq is known)
    offset: int | None
    message: Message | None
    message_error: str | None = None


@attrs.frozen
class FailoverTimes:
    """The steps of a producer's last failover (or roll) to a new segment, each when it
    happened, in ``time.monotonic()`` seconds (one clock for every process of the machine,
    so they lie beside a broker's ``first write`` log line). None: not reached (yet)."""

    from_gid: str | None
    from_seg: int | None
    failed_at: float  # the stream's failure seen (broken, refused, no ack within the deadline)
    asked_at: float | None = None  # the coordinator's FailOver (or the follow of a roll) asked
    answered_at: float | None = None  # its last answer: the new head and segment
    head_at: float | None = None  # the new head's master address known (the coordinator's Describe)
    gid: str | None = None
    seg: int | None = None
    new_channel: bool = False  # no channel to that master's address before: one was opened
    opened_at: float | None = None  # the new produce stream made
    sent_at: float | None = None  # its first request handed to gRPC (connected, written)
    acked_at: float | None = None  # its first ack read

    def spans_ms(self) -> dict[str, float]:
        """Each step's duration after the one before it, in ms, for the steps reached."""
        out: dict[str, float] = {}
        prev = self.failed_at
        for name in ("asked_at", "answered_at", "head_at", "opened_at", "sent_at", "acked_at"):
            at = getattr(self, name)
            if at is None:
                continue
            out[name.removesuffix("_at")] = round((at - prev) * 1000, 1)
            prev = at
        return out


@attrs.define
class ProducerStats:
    sent: int = 0
    acked: int = 0
    batches_acked: int = 0
    failovers: int = 0  # the head moved to another group (a failure, or a roll to the next group)
    rolls: int = 0  # the segment ended and writes went on on a new segment of the same group
    tokens_unavailable: int = 0  # times the head could not check tokens and was asked again
    link_fallbacks: int = 0  # streams on gRPC because the master's lean link could not be opened (no failover)
    epoch: int = 0
    seg: int | None = None
    head: str | None = None
    last_failover: FailoverTimes | None = None  # set at the first ack on the new segment
    # The producer lease (sdk/producer.py's docstring: what a lapse and a loss mean).
    lease_lapses: int = 0  # ran out unrenewed, then revived by the coordinator: nothing else happened
    lease_lost: int = 0  # granted to another holder meanwhile: fenced once that one claims
    lease_rejoins: int = 0  # granted again after a loss (no successor had claimed)
