"""Keyed-topic producer: routes each message by its key to one partition of a topic, and sends
it with that partition's ordinary leader-elected ``Producer``.

Guarantee: every message with the same key goes to the same partition
(``coordinator.topics.partition_of``: BLAKE2b-64 of the key modulo the partition count, stable
across processes and versions), and within a partition ``Producer``'s guarantee holds (futures
resolve in send order; after a failover every unacked message is resent with its seq), so the
messages of one key are stored in the order this process sent them. Several processes may
produce to one topic: each leads the partitions it names (``partitions=``), one elected
producer per partition as for any queue; a process that names a partition another leads waits
as its standby. A send whose key routes to a partition this process does not lead raises
``PartitionNotLed`` at once (it never waits: a key's messages must come from one process to
have one order). When the topic's partition count changes (``ordq topic alter --rekey``),
every later send raises ``TopicChanged``: keys route differently now; make a new producer.
The topic is read from the coordinator (Describe) every ``TOPIC_POLL_S``, so a change is seen
within that (plus one call); nothing here holds a ZooKeeper session (issue 37).

Threads: ``send`` is the hot path: one hash and a list lookup on top of ``Producer.send``.
The partitions' producers are started in parallel (one waiting for its lease must not hold
up the others) and each keeps its own lease, event loop and streams; one more thread reads
the topic.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from ordq.common.errors import ClosedError, ConfigError, OrdqError, PartitionNotLed, TopicChanged, TopicNotFound
from ordq.common.security import Credentials
from ordq.coordinator.client import CoordinatorClient
from ordq.coordinator.paths import check_name
from ordq.coordinator.topics import partition_of, partition_queue
from ordq.sdk._cluster import open_coordinator
from ordq.sdk._futures import SendFuture
from ordq.sdk._producer_core import BatchingConfig
from ordq.sdk._producer_types import ProducerConfig, ProducerStats
from ordq.sdk.audit import new_writer_id
from ordq.sdk.producer import Producer
from ordq.wire.transport import BrokerTransport

log = logging.getLogger("ordq.producer")
TOPIC_POLL_S = 1.0  # how often the topic's partition count is read again


def _default(option: str) -> Any:
    """ProducerConfig's default of ``option``: one source for the options a partition's producer shares."""
    return getattr(attrs.fields(ProducerConfig), option).default



@attrs.frozen(kw_only=True)
class TopicProducerConfig:
    """Options of a ``TopicProducer``: the topic, the partitions this process leads (None: all),
    and the options each partition's ``Producer`` gets (``ProducerConfig``'s, same meaning)."""

    topic: str
    bootstrap: str | None = None  # the coordinators (ProducerConfig's, same meaning)
    zk_hosts: str | None = None
    root: str = "/ordq"
    partitions: tuple[int, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(tuple))
    batching: BatchingConfig = BatchingConfig()
    send_timeout_s: float = _default("send_timeout_s")
    leader_timeout_s: float | None = _default("leader_timeout_s")
    no_group_timeout_s: float = _default("no_group_timeout_s")
    lease_ttl_s: float = _default("lease_ttl_s")
    connect_timeout_s: float = _default("connect_timeout_s")
    audit_dir: Path | None = None
    producer_id: str = attrs.field(factory=new_writer_id)  # partition i's producer is "<id>.p<i>"
    credentials: Credentials | None = None

    def __attrs_post_init__(self) -> None:
        check_name("topic", self.topic)
        if self.partitions is not None and (not self.partitions or len(set(self.partitions)) != len(self.partitions)
                                            or not all(isinstance(i, int) and i >= 0 for i in self.partitions)):
            raise ConfigError(f"partitions must be distinct partition numbers >= 0, not {self.partitions!r}")
        self.partition_config(0)  # ProducerConfig validates the shared options now

    def partition_config(self, partition: int) -> ProducerConfig:
        """The config of the producer of partition ``partition``."""
        return ProducerConfig(
            bootstrap=self.bootstrap, zk_hosts=self.zk_hosts, queue=partition_queue(self.topic, partition),
            root=self.root,
            batching=self.batching, send_timeout_s=self.send_timeout_s, leader_timeout_s=self.leader_timeout_s,
            no_group_timeout_s=self.no_group_timeout_s, lease_ttl_s=self.lease_ttl_s,
            connect_timeout_s=self.connect_timeout_s, audit_dir=self.audit_dir,
            producer_id=f"{self.producer_id}.p{partition}", credentials=self.credentials)


class TopicProducer:
    """Use as a context manager, or ``start()`` / ``close()``.

        with TopicProducer(TopicProducerConfig(zk_hosts="127.0.0.1:2181", topic="orders")) as p:
            p.send(b"paid", key="customer-42").result()   # (seq, seg, offset) in its partition
    """

    def __init__(self, config: TopicProducerConfig, *, transport: BrokerTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._coordinator: CoordinatorClient | None = None  # reads the topic (Describe)
        self._poll_stop = threading.Event()
        self._partitions = 0  # the topic's partition count, read at start
        self._producers: list[Producer | None] = []  # by partition: ours, or None
        self._led: tuple[int, ...] = ()
        self._stale: OrdqError | None = None  # set by the topic's poll: sends refused
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> TopicProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def partitions(self) -> int:
        """The topic's partition count (read at start)."""
        return self._partitions

    @property
    def led(self) -> tuple[int, ...]:
        """The partitions this producer leads (after start)."""
        return self._led

    def start(self) -> None:
        """Read the topic, then start (in parallel) the producer of every partition it is to
        lead; returns once each leads (a standby waits for its lease, bounded by
        ``leader_timeout_s``). TopicNotFound; ConfigError for a partition the topic lacks. On
        any error nothing is left running."""
        cfg = self.config
        try:
            self._coordinator, _ = coord, _ = open_coordinator(cfg.bootstrap, cfg.zk_hosts, cfg.root,
                                                               cfg.credentials)
            topic = coord.describe_topic(cfg.topic, timeout_s=cfg.connect_timeout_s)
            self._partitions = n = topic.partitions
            led = tuple(sorted(cfg.partitions)) if cfg.partitions is not None else tuple(range(n))
            missing = [i for i in led if i >= n]
            if missing:
                raise ConfigError(f"topic {cfg.topic!r} has partitions 0..{n - 1}, not {missing}")
            threading.Thread(target=self._poll_topic, name="ordq-topic-poll", daemon=True).start()
            producers = {i: Producer(cfg.partition_config(i), transport=self._transport) for i in led}
            self._producers = [None] * n
            for i, p in producers.items():
                self._producers[i] = p  # close() closes every one built, started or not
            with ThreadPoolExecutor(max_workers=len(producers), thread_name_prefix="ordq-topic-start") as pool:
                for future in [pool.submit(p.start) for p in producers.values()]:
                    future.result()
            self._led = led
        except BaseException:
            self.close()
            raise

    def _poll_topic(self) -> None:
        """Thread: read the topic every ``TOPIC_POLL_S``; a changed count (or a deleted topic)
        stops every later send. A coordinator that does not answer now is asked again."""
        coord = self._coordinator
        assert coord is not None
        while not self._poll_stop.wait(TOPIC_POLL_S):
            try:
                new: int | None = coord.describe_topic(self.config.topic, timeout_s=max(TOPIC_POLL_S, 2.0)).partitions
            except TopicNotFound:
                new = None
            except OrdqError as exc:  # no answer now (or a refusal): sends go on, asked again
                log.debug("topic %s: not read now: %s", self.config.topic, exc)
                continue
            if self._partitions and new != self._partitions:
                self._stale = TopicChanged(self.config.topic, self._partitions, new)
                return

    def partition_for(self, key: bytes | str) -> int:
        """The partition ``key`` routes to."""
        return partition_of(key.encode() if isinstance(key, str) else key, self._partitions)

    def send(self, payload: bytes, *, key: bytes | str, headers: Sequence[tuple[str, bytes]] = (),
             timeout_s: float | None = None, deliver_at: float | datetime.datetime | None = None) -> SendFuture:
        """Send ``payload`` to the partition of ``key`` (required, non-empty: bytes, or str
        sent as UTF-8); returns that partition's producer's future (``Producer.send``). Raises
        PartitionNotLed (the key's partition is led elsewhere), TopicChanged, ConfigError
        (no key), and what ``Producer.send`` raises."""
        if isinstance(key, str):
            key = key.encode()
        if not key or not isinstance(key, bytes):  # an empty key reads as none in the audit files
            raise ConfigError(f"a topic's message needs a key (non-empty bytes or str), not {key!r}")
        if self._stale is not None:
            raise self._stale
        try:
            partition = partition_of(key, self._partitions)
            producer = self._producers[partition]
        except (IndexError, ZeroDivisionError):
            raise ClosedError("topic producer not started, or closed") from None
        if producer is None:
            raise PartitionNotLed(self.config.topic, partition, self._led)
        return producer.send(payload, key=key, headers=headers, timeout_s=timeout_s, deliver_at=deliver_at)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued on every partition and wait until it is acked."""
        for p in self._started():
            p.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush and close every partition's producer (releasing their leases)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        first: BaseException | None = None
        try:
            for p in self._started():  # every one closed, even when one fails to flush
                try:
                    p.close(timeout_s)
                except Exception as exc:  # noqa: BLE001 - raised after the others are closed
                    first = first or exc
        finally:
            self._producers = []
            self._poll_stop.set()
            if self._coordinator is not None:
                self._coordinator.close()
        if first is not None:
            raise first

    def statistics(self) -> dict[str, ProducerStats]:
        """Each led partition's producer statistics, by partition queue."""
        return {p.config.queue: p.statistics() for p in self._started()}

    def _started(self) -> list[Producer]:
        return [p for p in self._producers if p is not None]
