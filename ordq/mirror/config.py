"""How a mirror names its two clusters and what it is told to do (values only, no I/O).

A cluster is named as the CLI names clusters: ``ZK_HOSTS/ROOT``, the key under which ``ordq up``
(or ``ordq cert register``) registered its coordinators and credentials in the credentials
file; a mirror end is ``ZK_HOSTS/ROOT/QUEUE`` (``127.0.0.1:2181/ordq/orders``), or
``ZK_HOSTS/ROOT/topic:TOPIC`` for every partition of a keyed topic. The cluster's
identity (what the chain of a copy names) is the one that registration recorded
(``ordq up``'s cluster id), else the name itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from ordq.common.errors import ConfigError
from ordq.coordinator.paths import check_name


@attrs.frozen
class MirrorEnd:
    """One end of a mirror: a cluster (its name, its identity, the SDK options naming it) and a queue."""

    name: str  # ZK_HOSTS/ROOT
    zk_hosts: str
    root: str
    queue: str  # a queue, or a keyed topic's name when ``topic``
    identity: str
    topic: bool = False  # ZK_HOSTS/ROOT/topic:T: every partition of topic T (ordq.mirror.topic)

    def options(self) -> dict[str, Any]:
        return {"zk_hosts": self.zk_hosts, "root": self.root}

    def __str__(self) -> str:
        return f"{self.name}/{TOPIC_PREFIX if self.topic else ''}{self.queue}"


TOPIC_PREFIX = "topic:"


def split_end(text: str) -> tuple[str, str, str]:
    """``ZK_HOSTS/ROOT/QUEUE`` -> (zk_hosts, root, queue); the last part may be ``topic:T`` (a
    keyed topic, kept so). ConfigError in one line."""
    usage = (f"bad mirror end {text!r}: expected ZK_HOSTS/ROOT/QUEUE or ZK_HOSTS/ROOT/topic:TOPIC, as "
             "127.0.0.1:2181/ordq/orders")
    cluster, _, queue = text.rpartition("/")
    zk_hosts, slash, root = cluster.partition("/")
    if not cluster or not slash or not zk_hosts or not root or not queue or queue == TOPIC_PREFIX:
        raise ConfigError(usage)
    if queue.startswith(TOPIC_PREFIX):
        check_name("topic", queue[len(TOPIC_PREFIX):])
    else:
        check_name("queue", queue)
    return zk_hosts, "/" + root, queue


def parse_end(text: str) -> MirrorEnd:
    """The mirror end ``text`` names, with the identity registered for its cluster."""
    from ordq.common.security import registered_bootstrap, registered_cluster

    zk_hosts, root, queue = split_end(text)
    name = f"{zk_hosts}{root}"
    if registered_bootstrap(zk_hosts, root) is None:
        raise ConfigError(f"no coordinators are registered for the cluster {name} (mirror end {text!r}): start "
                          "it with ordq up, or register it (ordq cert register)")
    topic = queue.startswith(TOPIC_PREFIX)
    return MirrorEnd(name=name, zk_hosts=zk_hosts, root=root, queue=queue.removeprefix(TOPIC_PREFIX),
                     identity=registered_cluster(zk_hosts, root) or name, topic=topic)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Waits between attempts while a cluster cannot be reached: ``first_s``, doubling up to
    ``max_s``; the mirror never gives up (it waits, the source's backlog grows)."""

    first_s: float = 0.2
    max_s: float = 5.0

    def __attrs_post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ConfigError("retry waits need 0 < first_s <= max_s")

    def wait_s(self, attempt: int) -> float:
        return float(min(self.first_s * 2 ** max(attempt - 1, 0), self.max_s))


@attrs.frozen(kw_only=True)
class MirrorConfig:
    source: MirrorEnd
    target: MirrorEnd
    # The source subscription; None: ``mirror.<target cluster identity>`` (made a queue-name-safe word)
    subscription: str | None = None
    start: str = "earliest"  # where a new subscription starts when the target is empty
    lease_ttl_s: float = 5.0
    send_timeout_s: float = 2.0
    max_batch: int = 2000  # messages copied per round (one flush on the target each)
    retry: RetryPolicy = RetryPolicy()
    instance: str | None = None  # this process's name in leases and logs (default: the SDK's)
    audit_dir: Path | None = None  # the target producer's ack audit (ordq verify --copy-of)
    metrics_listen: str | None = None
    metrics_registry: CollectorRegistry | None = None

    def __attrs_post_init__(self) -> None:
        if self.source.topic != self.target.topic:
            raise ConfigError(f"a mirror copies a queue to a queue or a topic to a topic, not {self.source} to "
                              f"{self.target}")
        if self.source.identity == self.target.identity:
            raise ConfigError(f"a mirror from {self.source.name} to itself would loop: give another target cluster")
        if self.max_batch < 1 or self.lease_ttl_s <= 0 or self.send_timeout_s <= 0:
            raise ConfigError("max_batch, lease_ttl_s and send_timeout_s must be > 0")
        check_name("subscription", self.sub)

    @property
    def sub(self) -> str:
        if self.subscription is not None:
            return self.subscription
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.target.identity)
        return f"mirror.{safe}"[:128]
