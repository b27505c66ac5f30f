"""Who may do what under an ordq root in ZooKeeper: the ACL of every path. Pure.

Rules: this module names identities and rights; it never talks to ZooKeeper
(coordinator/acl_client.py does) and knows no client.

ZooKeeper holds three digest identities (``user:password``, ZooKeeper's ``digest`` scheme;
issue 37), and no client:

- **admin** — ``ordq up`` and the operator's repairs: every right (``ALL``) on every node. A
  ZooKeeper started by ordq also makes it the super-user (ordq/zk_server.py ``super_digest``),
  so it reads, repairs and deletes a node whatever ACL its creator gave it.
- **coordinator** — the coordinator daemons: read, write, create, delete on every node.
- **broker** — the broker processes: the same.
- anyone else (no credential, a token holder, a stranger's credential): nothing. Not even
  read: the tokens' records, the cursors and the leases are nobody's business but the
  cluster's (``exists`` stays open: ZooKeeper checks no ACL for it).

Why coordinator and broker get the same rights, and all but ADMIN: a broker drives the same
store as the coordinator (it seals its own group's segments with a compare-and-set of the
queue's state, reconciles, registers its liveness, reads tokens and cursors), and ZooKeeper's
ACLs are per node, not per field: a finer table would keep a broker off the tokens, leases and
cursors only, at the price of one more rule to break silently whenever a store path is added.
What is kept from them is ADMIN (``setACL``): only the admin identity changes an ACL, so a
stolen broker or coordinator credential cannot lock the others out of a node or open one to
the world, and ``ordq up`` (admin, super-user) repairs whatever they made. Three credentials
instead of one still pay: brokers and coordinators never hold the admin (super-user) password,
and each is rotated on its own (``LocalCluster.rotate_zk_credentials``).

Producers, consumers, consumer-group members and the CLI hold no ZooKeeper credential at all:
they ask the coordinator over gRPC for leases, commits and records (coordinator/service*.py),
which writes them with its own identity. So no client can plant a node in ZooKeeper, forge a
place in an election, or choose the ACL of a record (the attacks of issue 37,
tests/test_zk_attacks.py). Tokens are not ZooKeeper identities: ``ordq auth create|revoke``
only writes their records.

ZooKeeper ACLs are per node and not inherited: every node gets its ACL when it is created
(``ordq.coordinator.store``'s client asks ``acl_for`` for each path), and ``ordq up`` sets them on
a tree that existed before (``acl_client.protect``), a tree protected by an older ordq (a shared
client identity, tokens' digests in ACLs) included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from ordq.common.errors import ConfigError

READ, WRITE, CREATE, DELETE = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE
ADMIN = Permissions.ADMIN
ALL = Permissions.ALL
PROCESS_RIGHTS = READ | WRITE | CREATE | DELETE  # the coordinator's and the brokers': all but setACL
ACL_NODE = "acl"  # <root>/acl: the identities' digest ids (never the passwords)
IDENTITIES = ("admin", "coordinator", "broker")

# The nodes a queue and a subscription are created with, so that what the coordinator later
# creates under them (the alarm, the parked ledger, group members; the elections of clients
# not yet on leases) finds its parent (relative to the queue node and to the subscription node).
QUEUE_PARENTS = ("producer-leader",)
SUB_PARENTS = ("leader", "blocked", "parked", "members")


def check_credential(credential: str) -> str:
    """``user:password``, both non-empty, else ConfigError (never echoing the password)."""
    user, sep, password = credential.partition(":") if isinstance(credential, str) else ("", "", "")
    if not sep or not user or not password:
        raise ConfigError("a ZooKeeper credential must be USER:PASSWORD (both non-empty)")
    return credential


def digest_id(credential: str) -> str:
    """ZooKeeper's digest id of ``user:password``: ``user:base64(sha1(user:password))``."""
    user, _, password = check_credential(credential).partition(":")
    return str(make_digest_acl_credential(user, password))


def grants_allow(grants: Mapping[str, Sequence[str]], queue: str, role: str) -> bool:
    """Whether a token's grants (``{queue or "*": [roles]}``, coordinator/tokens.py) give
    ``role`` on ``queue``: ``admin`` implies every role, ``any`` is any role."""
    for scope in (queue, "*"):
        have = grants.get(scope, ())
        if "admin" in have or role in have or (role == "any" and have):
            return True
    return False


@attrs.frozen
class AclIds:
    """The digest ids (``user:hash``) of the three identities, as kept in ``<root>/acl``."""

    admin: str
    coordinator: str
    broker: str

    @classmethod
    def of(cls, admin_credential: str, coordinator_credential: str, broker_credential: str) -> AclIds:
        """From the three ``user:password`` credentials; ConfigError when two share a user
        name (ZooKeeper would then tell them apart only by their password)."""
        ids = cls(admin=digest_id(admin_credential), coordinator=digest_id(coordinator_credential),
                  broker=digest_id(broker_credential))
        users = [i.split(":")[0] for i in (ids.admin, ids.coordinator, ids.broker)]
        if len(set(users)) != len(users):
            raise ConfigError("the admin, coordinator and broker ZooKeeper credentials need different user names")
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {"admin": self.admin, "coordinator": self.coordinator, "broker": self.broker}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AclIds:
        """KeyError for a record an older ordq wrote (``admin``, ``client``, ``writers``):
        ``ordq up`` rewrites it (``acl_client.protect``)."""
        return cls(admin=str(d["admin"]), coordinator=str(d["coordinator"]), broker=str(d["broker"]))


def relative(path: str, root: str) -> tuple[str, ...] | None:
    """The parts of ``path`` under ``root`` (() for the root itself); None outside it."""
    if path == root:
        return ()
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    return tuple(path[len(prefix):].split("/"))


def rights(identity: str) -> int:
    """What ``identity`` (admin | coordinator | broker | anything else) may do on any node
    under the root: admin everything, the processes all but setACL, anyone else nothing."""
    if identity == "admin":
        return int(ALL)
    if identity in IDENTITIES:
        return int(PROCESS_RIGHTS)
    return 0


def acl_for(path: str, root: str, ids: AclIds) -> list[ACL] | None:
    """The ACL a node at ``path`` gets; None outside ``root`` (left to ZooKeeper's default).
    The same for every node under the root (the root and ``<root>/acl`` included): the three
    identities, no one else."""
    if relative(path, root) is None:
        return None
    return [ACL(rights(name), Id("digest", getattr(ids, name))) for name in IDENTITIES]
