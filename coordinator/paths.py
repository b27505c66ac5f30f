"""ZooKeeper paths of one ordq cluster, under its root prefix (e.g. ``/ordq``).

    <root>/groups/<gid>                    group config (JSON)
    <root>/groups/<gid>/live/<role>        ephemeral: {"address", "incarnation", "pid"}
    <root>/queues/<q>                      queue config (JSON)
    <root>/queues/<q>/state                QueueState (JSON), written only with a version check
    <root>/queues/<q>/subs/<sub>           cursor (JSON), written only with a version check
    <root>/queues/<q>/subs/<sub>/leader    election of the subscription's consumer
    <root>/queues/<t>.p0/subs/<g>/members/<m>  ephemeral: member m of consumer group g of topic t
    <root>/queues/<q>/producer-leader      election of the queue's producer (before issue 37)
    <root>/queues/<q>/leases/producer      the producer lease (coordinator/leases.py), written
                                           only by the coordinator, like every lease below
    <root>/queues/<q>/leases/consumer/<sub>          the consumer lease of a subscription
    <root>/queues/<t>.p0/leases/member/<g>/<m>       member m of consumer group g of topic t
    <root>/coordinator/leader              election of the coordinator daemon
    <root>/topics/<t>                      topic config (JSON, coordinator/topics.py); its
                                           partitions are the queues <t>.p0 .. <t>.p<N-1>

Several clusters (and test runs) share one ZooKeeper by using different roots.
"""

from __future__ import annotations

import re

import attrs

from ordq.common.errors import ConfigError, InvalidName

NAME_RULE = r"[A-Za-z0-9._-]{1,128}"
_NAME_RE = re.compile(NAME_RULE)
ROLES = ("master", "slave")


def check_name(kind: str, name: str) -> str:
    """Return name if it is a valid queue/group/subscription name, else raise InvalidName."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidName(kind, str(name), NAME_RULE)
    return name


ZK_HOSTS_RULE = "host:port[,host:port...] (e.g. 127.0.0.1:2181)"


def check_zk_hosts(hosts: str) -> str:
    """Return ``hosts`` if kazoo can connect with it, else raise ConfigError saying what is
    wrong (kazoo itself raises a bare ValueError, later, from its connection thread)."""
    from kazoo.hosts import collect_hosts  # kazoo's own parser: accept exactly what it accepts

    problem = None
    if not isinstance(hosts, str) or not hosts.strip():
        problem = "it is empty"
    else:
        try:
            parsed, _chroot = collect_hosts(hosts)
        except ValueError as exc:
            problem = str(exc)
        else:
            bad = [f"{h}:{p}" for h, p in parsed if not h.strip() or not 0 < p < 65536]
            if bad:
                problem = f"bad host:port {', '.join(bad)}"
    if problem is not None:
        raise ConfigError(f"invalid ZooKeeper connection string {hosts!r} ({problem}): expected {ZK_HOSTS_RULE}; "
                          "set it with --zk or ORDQ_ZK")
    return hosts


@attrs.frozen
class Paths:
    root: str = "/ordq"

    def __attrs_post_init__(self) -> None:
        if not self.root.startswith("/") or (len(self.root) > 1 and self.root.endswith("/")):
            raise InvalidName("root", self.root, "/absolute/path without trailing slash")

    @property
    def groups(self) -> str:
        return f"{self.root}/groups"

    @property
    def queues(self) -> str:
        return f"{self.root}/queues"

    def group(self, gid: str) -> str:
        return f"{self.groups}/{check_name('group', gid)}"

    def live(self, gid: str, role: str | None = None) -> str:
        base = f"{self.group(gid)}/live"
        if role is None:
            return base
        if role not in ROLES:
            raise InvalidName("role", role, "master|slave")
        return f"{base}/{role}"

    @property
    def topics(self) -> str:
        return f"{self.root}/topics"

    def topic(self, topic: str) -> str:
        return f"{self.topics}/{check_name('topic', topic)}"

    def queue(self, queue: str) -> str:
        return f"{self.queues}/{check_name('queue', queue)}"

    def state(self, queue: str) -> str:
        return f"{self.queue(queue)}/state"

    def subs(self, queue: str) -> str:
        return f"{self.queue(queue)}/subs"

    def sub(self, queue: str, sub: str) -> str:
        return f"{self.subs(queue)}/{check_name('subscription', sub)}"

    def parked(self, queue: str, sub: str, seq: int | None = None) -> str:
        """The subscription's ledger of parked messages (one node per seq)."""
        base = f"{self.sub(queue, sub)}/parked"
        return base if seq is None else f"{base}/{seq:020d}"

    def parked_signal(self, queue: str, sub: str) -> str:
        """Written whenever an operator changes the ledger; the consumer watches it."""
        return f"{self.sub(queue, sub)}/parked-changed"

    def sub_policy(self, queue: str, sub: str) -> str:
        """What its consumers do with a message that keeps failing (sdk/failure.py)."""
        return f"{self.sub(queue, sub)}/policy"

    def sub_settings(self, queue: str, sub: str) -> str:
        """The subscription's settings (``ordq sub create|alter``): {"delay_ms": N} (sdk/delay.py)."""
        return f"{self.sub(queue, sub)}/settings"

    def sub_waiting(self, queue: str, sub: str) -> str:
        """What its consumer reports it waits on: the head of the line held for its time."""
        return f"{self.sub(queue, sub)}/waiting"

    def sub_blocked(self, queue: str, sub: str) -> str:
        """Ephemeral: the message its consumer is blocked on, past the policy's attempts."""
        return f"{self.sub(queue, sub)}/blocked"

    def sub_leader(self, queue: str, sub: str) -> str:
        return f"{self.sub(queue, sub)}/leader"

    def sub_members(self, queue: str, sub: str) -> str:
        """A consumer group's members (sdk/group.py): one ephemeral node each, under the
        group's subscription of its topic's partition 0."""
        return f"{self.sub(queue, sub)}/members"

    def producer_leader(self, queue: str) -> str:
        return f"{self.queue(queue)}/producer-leader"

    def leases(self, queue: str) -> str:
        return f"{self.queue(queue)}/leases"

    def lease(self, kind: str, queue: str, sub: str = "", member: str = "") -> str:
        """The node of a lease (``kind``: producer | consumer | member)."""
        base = self.leases(queue)
        if kind == "producer":
            return f"{base}/producer"
        if kind == "consumer":
            return f"{base}/consumer/{check_name('subscription', sub)}"
        if kind == "member":
            group = f"{base}/member/{check_name('group', sub)}"
            return group if not member else f"{group}/{check_name('member', member)}"
        raise InvalidName("lease kind", kind, "producer|consumer|member")

    @property
    def coordinator_leader(self) -> str:
        return f"{self.root}/coordinator/leader"
