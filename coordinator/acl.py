"""Who may do what under an ordq root in ZooKeeper: the ACL of every path, per role. Pure.

Digest identities (``user:password``, ZooKeeper's ``digest`` scheme):

- **admin** — brokers, coordinators, ``ordq`` admin commands: every right everywhere.
- **client** — producers and consumers: read everything. Until tokens are enforced it also
  writes what their protocol writes (``client_rights``), on every queue.
- **a token** (issue 29) — once tokens are enforced, each token is an identity of its own,
  ``token-<id>:<token>`` (``tokens.token_credential``; a producer or consumer adds it to its
  session beside the client credential, so ZooKeeper checks the token itself). What the client
  protocol writes under queue Q is writable only by the tokens with the path's role on Q
  (``produce`` for the producer election, ``consume`` for the rest; ``admin`` and ``*`` grants
  count, as for brokers): ``<root>/acl`` lists every token's digest id with its grants
  (``writers``), and ``acl_for`` names those that qualify in each such node's ACL.
- anyone else (no credential): read only.

The guard: a token holder of queue A (who has the client credential) cannot plant, delete or forge a
node of queue B's elections, group members, alarm or parked ledger — before it could plant a
persistent node at the head of B's consumer election and hide B's acked messages for as long as it
liked (tests/test_zk_attacks.py). Issuing or revoking a token sets the ACLs again where its rights
change, its queues' client-written nodes (``acl_client.tokens_changed``: ``ordq auth
create|revoke``), so a revoked token's ZooKeeper writes are refused too. Limits: a token recorded
before issue 29 has no digest id and is left out (its holders can no longer join elections: reissue
it; ``ordq up`` upgrades its own); a queue or subscription created by a process whose copy of
``<root>/acl`` is milliseconds old may miss a token issued meanwhile (running ``ordq up`` sets every
ACL again).

What the client protocol writes (issue 23: everything else it asks the coordinator service for,
coordinator/service.py, which acts with the admin identity):

- producer and consumer: contender nodes in their queue's elections, ``producer-leader`` and
  ``subs/<sub>/leader`` (kazoo's Lock creates one ephemeral sequential node under the parent
  and deletes it; its ``ensure_path`` of the parent only looks, as the parent exists: whoever
  creates a queue or subscription — the coordinator or an admin verb, coordinator/store.py —
  creates these parents with it, and ``protect`` adds them to a tree from before).
- consumer (sdk/parking.py): the alarm it shows while blocked (one ephemeral node per consumer
  under ``subs/<sub>/blocked``, so it goes with its session) and the ledger of parked messages
  (``subs/<sub>/parked/<seq>``, created and updated). A consume token of Q can thus forge or
  hide the alarm or ledger records of Q's subscriptions, no other queue's; it cannot move a
  cursor, a list, an epoch or a policy.
- consumer-group member (sdk/group.py): its membership, one ephemeral node under
  ``subs/<group>/members`` of the topic's partition 0 (``<topic>.p0``: a consume grant on it).
  The parent is made with the subscription, as ``leader`` is: by the coordinator service's
  Subscribe (the first member asks for the group's subscription of every partition) or an
  admin verb, never by a client. CREATE and DELETE there let a consume token of ``<topic>.p0``
  add or remove *any* member node of its groups (as any contender of an election): a forged
  or removed member only makes the members rebalance; it cannot make two of them deliver one
  partition, which the partition's election and the consumer's lease forbid (a persistent
  forged member would hold the partitions assigned to it idle, as a persistent node planted in
  an election holds it: a holder of a consume token of that queue is trusted not to).
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

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from ordq.common.errors import ConfigError

READ, WRITE, CREATE, DELETE = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE
ACL_NODE = "acl"  # <root>/acl: the identities' digests (never the passwords) and the tokens' grants

# What clients write, by path under the root ("*" stands for one name): the rights and the
# role a token needs on the queue (``parts[1]``) to have them. A parent's CREATE and DELETE
# rights let their holder create and delete *any* child of it: so no client has them on a
# queue, ``subs`` or a subscription node (it could delete or plant a ``policy``, or create a
# subscription), only on the parents made for what it may create.
_CLIENT: dict[tuple[str, ...], tuple[int, str]] = {
    ("queues", "*", "producer-leader"): (READ | CREATE | DELETE, "produce"),
    ("queues", "*", "subs", "*", "leader"): (READ | CREATE | DELETE, "consume"),
    ("queues", "*", "subs", "*", "blocked"): (READ | CREATE | DELETE, "consume"),
    ("queues", "*", "subs", "*", "blocked", "*"): (READ | WRITE, "consume"),
    ("queues", "*", "subs", "*", "parked"): (READ | CREATE, "consume"),
    ("queues", "*", "subs", "*", "parked", "*"): (READ | WRITE, "consume"),
    ("queues", "*", "subs", "*", "members"): (READ | CREATE | DELETE, "consume"),
}
CLIENT_PATTERNS = tuple(_CLIENT)  # the only nodes whose ACL names the tokens (acl_client.tokens_changed)

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
    """The digest ids (``user:hash``) of the two identities, as kept in ``<root>/acl``; and
    ``writers``, the digest id of every token (``tokens.token_credential``) with its grants,
    once tokens are enforced (None before: then the client identity writes for every queue)."""

    admin: str
    client: str
    writers: Mapping[str, Mapping[str, tuple[str, ...]]] | None = attrs.field(default=None, hash=False)

    @classmethod
    def of(cls, admin_credential: str, client_credential: str) -> AclIds:
        ids = cls(admin=digest_id(admin_credential), client=digest_id(client_credential))
        if ids.admin.split(":")[0] == ids.client.split(":")[0]:
            raise ConfigError("the admin and client ZooKeeper credentials need different user names")
        return ids

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"admin": self.admin, "client": self.client}
        if self.writers is not None:
            d["writers"] = {w: {q: list(r) for q, r in g.items()} for w, g in sorted(self.writers.items())}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AclIds:
        writers = d.get("writers")
        return cls(admin=str(d["admin"]), client=str(d["client"]),
                   writers=None if writers is None else {str(w): {str(q): tuple(r) for q, r in g.items()}
                                                         for w, g in writers.items()})


def relative(path: str, root: str) -> tuple[str, ...] | None:
    """The parts of ``path`` under ``root`` (() for the root itself); None outside it."""
    if path == root:
        return ()
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    return tuple(path[len(prefix):].split("/"))


def _client_part(parts: tuple[str, ...]) -> tuple[int, str] | None:
    """The rights clients have on the node at ``parts`` and the role they need; None: read only."""
    for pattern, part in _CLIENT.items():
        if len(pattern) == len(parts) and all(w in ("*", g) for w, g in zip(pattern, parts, strict=True)):
            return part
    return None


def client_rights(parts: tuple[str, ...]) -> int:
    """What a client may do on the node at ``parts`` under the root (the client identity
    until tokens are enforced; then a token with the path's role on its queue)."""
    part = _client_part(parts)
    return int(READ) if part is None else part[0]


def acl_for(path: str, root: str, ids: AclIds) -> list[ACL] | None:
    """The ACL a node at ``path`` gets; None outside ``root`` (left to ZooKeeper's default).
    Once tokens are enforced (``ids.writers``), what a client writes under queue Q is given to
    the tokens with the path's role on Q, and the shared client identity only reads it."""
    parts = relative(path, root)
    if parts is None:
        return None
    part = _client_part(parts)
    acl = [ACL(Permissions.ALL, Id("digest", ids.admin))]
    if part is None or ids.writers is None:
        acl.append(ACL(client_rights(parts), Id("digest", ids.client)))
    else:
        rights, role = part
        acl.append(ACL(READ, Id("digest", ids.client)))
        acl.extend(ACL(rights, Id("digest", w)) for w, grants in sorted(ids.writers.items())
                   if grants_allow(grants, parts[1], role))
    acl.append(ACL(READ, Id("world", "anyone")))
    return acl
