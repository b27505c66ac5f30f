"""Who may do what under an ordq root in ZooKeeper: the ACL of every path, per role. Pure.

Two digest identities (``user:password``, ZooKeeper's ``digest`` scheme):

- **admin** — brokers, coordinators, ``ordq`` admin commands: every right everywhere.
- **client** — producers and consumers: read everything, and write only what their protocol
  writes (``client_rights``). Anyone else (no credentials): read only.

What the client protocol writes (issue 23: everything else it asks the coordinator service for,
coordinator/service.py, which acts with the admin identity):

- producer and consumer: contender nodes in their queue's elections, ``producer-leader`` and
  ``subs/<sub>/leader`` (kazoo's Lock creates one ephemeral sequential node under the parent
  and deletes it; its ``ensure_path`` of the parent only looks, as the parent exists: whoever
  creates a queue or subscription — the coordinator or an admin verb, coordinator/store.py —
  creates these parents with it, and ``protect`` adds them to a tree from before).
- consumer (sdk/parking.py), left for a later stop: the alarm it shows while blocked (one
  ephemeral node per consumer under ``subs/<sub>/blocked``, so it goes with its session) and the
  ledger of parked messages (``subs/<sub>/parked/<seq>``, created and updated). A client can
  thus forge or hide another subscription's alarm or ledger records of its queue's tree; it
  cannot move a cursor, a list, an epoch or a policy.
- consumer-group member (sdk/group.py): its membership, one ephemeral node under
  ``subs/<group>/members`` of the topic's partition 0 (``<topic>.p0``). The parent is made with
  the subscription, as ``leader`` is: by the coordinator service's Subscribe (the first member
  asks for the group's subscription of every partition) or an admin verb, never by a client.
  The client's CREATE and DELETE there let it add or remove *any* member node of a group (as any
  contender of an election): a forged or removed member only makes the members rebalance; it
  cannot make two of them deliver one partition, which the partition's election and the
  consumer's lease forbid (a persistent forged member would hold the partitions assigned to it
  idle, as a persistent node planted in an election holds it: the same trust as today's).
  It cannot move a cursor, write a topic record or a queue list.
- never a client: a queue's ``state``, cursors (``subs/<sub>``), the ``subs`` and ``queues``
  lists (no queue or subscription is created or deleted by a client), queue configuration,
  a subscription's failure ``policy`` and the operators' ``parked-changed`` signal, groups and
  liveness, the coordinator's election, topics (``topics/<t>``), and this module's own record
  ``acl``.

ZooKeeper ACLs are per node and not inherited: every node gets its ACL when it is created
(``ordq.coordinator.store``'s client asks ``acl_for`` for each path), and ``ordq up`` sets them on
a tree that existed before (``ZkStore.protect``).
"""

from __future__ import annotations

import attrs
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from ordq.common.errors import ConfigError
from ordq.coordinator.tokens import token_id

READ, WRITE, CREATE, DELETE = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE
ACL_NODE = "acl"  # <root>/acl: the two identities' digests (never the passwords)

# Rights of the client identity, by path under the root ("*" stands for one name). A parent's
# CREATE and DELETE rights let a client create and delete *any* child of it: so no client has
# them on a queue, ``subs`` or a subscription node (it could delete or plant a ``policy``, or
# create a subscription), only on the parents made for what it may create.
_CLIENT: dict[tuple[str, ...], int] = {
    ("queues", "*", "producer-leader"): READ | CREATE | DELETE,
    ("queues", "*", "subs", "*", "leader"): READ | CREATE | DELETE,
    ("queues", "*", "subs", "*", "blocked"): READ | CREATE | DELETE,
    ("queues", "*", "subs", "*", "blocked", "*"): READ | WRITE,
    ("queues", "*", "subs", "*", "parked"): READ | CREATE,
    ("queues", "*", "subs", "*", "parked", "*"): READ | WRITE,
    ("queues", "*", "subs", "*", "members"): READ | CREATE | DELETE,
}

# The nodes a queue and a subscription are created with, so that clients find the parents of
# what they may create (relative to the queue node and to the subscription node).
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


def token_credential(token: str) -> str:
    """The ZooKeeper digest credential of an ordq token: ``token-<id>:<token>``. A token
    holder adds it to its session beside the client credential; ZooKeeper then checks the
    token itself (the policy names its digest on the queues it grants)."""
    return f"token-{token_id(token)}:{token}"


@attrs.frozen
class AclIds:
    """The digest ids (``user:hash``) of the two identities, as kept in ``<root>/acl``."""

    admin: str
    client: str

    @classmethod
    def of(cls, admin_credential: str, client_credential: str) -> AclIds:
        ids = cls(admin=digest_id(admin_credential), client=digest_id(client_credential))
        if ids.admin.split(":")[0] == ids.client.split(":")[0]:
            raise ConfigError("the admin and client ZooKeeper credentials need different user names")
        return ids

    def to_dict(self) -> dict[str, str]:
        return {"admin": self.admin, "client": self.client}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> AclIds:
        return cls(admin=str(d["admin"]), client=str(d["client"]))


def relative(path: str, root: str) -> tuple[str, ...] | None:
    """The parts of ``path`` under ``root`` (() for the root itself); None outside it."""
    if path == root:
        return ()
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    return tuple(path[len(prefix):].split("/"))


def client_rights(parts: tuple[str, ...]) -> int:
    """What the client identity may do on the node at ``parts`` under the root."""
    for pattern, rights in _CLIENT.items():
        if len(pattern) == len(parts) and all(w in ("*", g) for w, g in zip(pattern, parts, strict=True)):
            return rights
    return int(READ)


def acl_for(path: str, root: str, ids: AclIds) -> list[ACL] | None:
    """The ACL a node at ``path`` gets; None outside ``root`` (left to ZooKeeper's default)."""
    parts = relative(path, root)
    if parts is None:
        return None
    return [
        ACL(Permissions.ALL, Id("digest", ids.admin)),
        ACL(client_rights(parts), Id("digest", ids.client)),
        ACL(READ, Id("world", "anyone")),
    ]
