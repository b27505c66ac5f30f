"""The kazoo side of ZooKeeper ACLs (the policy itself is coordinator/acl.py, pure).

``AclClient`` is a KazooClient that gives every node it creates the ACL the policy names for
its path — nodes created by ordq's store, by kazoo recipes (the Lock elections) and by
``ensure_path`` alike — once ``follow(root)`` has found the root protected. ``protect`` turns
protection on for a tree, setting the ACL of every node that exists (an unprotected tree from
before, or one protected by an older policy, is upgraded in place: that includes creating the
election and parking parents a client may no longer create itself).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError

from ordq.common.errors import ConfigError, ZkAccessDenied
from ordq.coordinator.acl import (
    ACL_NODE,
    CLIENT_PATTERNS,
    QUEUE_PARENTS,
    SUB_PARENTS,
    AclIds,
    acl_for,
    check_credential,
    digest_id,
    relative,
)
from ordq.coordinator.tokens import enforced, load_tokens, token_credential, touch

AUTH_DIR = "zk-auth"  # <folder>/zk-auth/{admin,client}: "user:password", readable by the owner only
AUTH_USERS = {"admin": "ordq-admin", "client": "ordq-client"}
log = logging.getLogger("ordq.acl")
_WINDOW = 500  # ZooKeeper requests in flight at once on one session (pipelined, answered in order)


def read_credential(folder: Path, role: str) -> str | None:
    """The ``user:password`` ``ordq up`` generated for ``role`` (admin | client) in ``folder``."""
    try:
        return (Path(folder) / AUTH_DIR / role).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_credential(folder: Path, role: str) -> None:
    """Generate ``role``'s credential in ``folder`` unless there is one (owner-only file);
    ``<role>.new``: the next one, while a rotation runs (``LocalCluster.rotate_zk_credentials``)."""
    path = Path(folder) / AUTH_DIR / role
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{AUTH_USERS[role.removesuffix('.new')]}:{secrets.token_urlsafe(24)}\n")


def check_identity(client: KazooClient, root: str, credential: str | None, *, required: bool) -> None:
    """ZkAccessDenied at once when ``root`` is protected and ``credential`` is not one of its
    two identities (a wrong password, another cluster's credential), or is missing while
    ``required`` (producers and consumers write election nodes). ZooKeeper itself accepts any
    digest credential at connect and refuses only the first write, after a client may already
    have asked the coordinator for a subscription (issue 24). Reads ``<root>/acl``, which
    every identity may read."""
    try:
        data, _ = client.get(f"{root}/{ACL_NODE}")
    except NoNodeError:
        return  # not protected: any credential (or none) writes
    if credential is None:
        if required:
            raise ZkAccessDenied(f"the ZooKeeper root {root} is protected and no ZooKeeper credential was given "
                                 "(--zk-auth-file, ORDQ_ZK_AUTH, or the credentials file: docs/SECURITY.md)")
        return
    ids = AclIds.from_dict(json.loads(data))
    if digest_id(credential) not in (ids.admin, ids.client):
        user = credential.partition(":")[0]
        raise ZkAccessDenied(f"the ZooKeeper credential of user {user!r} is not one of {root}'s identities "
                             "(a wrong password, or another cluster's credential)")


class AclClient(KazooClient):  # type: ignore[misc]  # kazoo is untyped
    def __init__(self, *args: Any, auth: str | None = None, token: str | None = None, **kwargs: Any) -> None:
        """``auth``: the identity's ``user:password``; ``token``: an ordq token, added as a
        second digest identity (``tokens.token_credential``): ZooKeeper lets it write the
        client-written nodes of the queues it grants (coordinator/acl.py)."""
        auth_data = [("digest", check_credential(auth))] if auth is not None else []
        if token:
            with contextlib.suppress(ConfigError):  # not an ordq token: no identity (brokers refuse it)
                auth_data.append(("digest", token_credential(token)))
        if auth_data:
            kwargs["auth_data"] = auth_data
        super().__init__(*args, **kwargs)
        self.auth = auth
        self._root: str | None = None
        self._ids: AclIds | None = None
        self._watched: set[str] = set()

    def follow(self, root: str) -> None:
        """Watch ``<root>/acl``: while it names the two identities, nodes created under
        ``root`` get the policy's ACL. (Read when the store opens, then watched: kazoo calls
        back on its own thread, where no blocking request may be made.)"""
        self._root = root
        if root in self._watched:
            return
        self._watched.add(root)

        def changed(data: bytes | None, _stat: Any) -> None:
            try:
                self._ids = AclIds.from_dict(json.loads(data)) if data else None
            except (ValueError, KeyError, TypeError):
                self._ids = None

        self.DataWatch(f"{root}/{ACL_NODE}", changed)

    def use(self, root: str, ids: AclIds) -> None:
        """Apply the policy from now on (the caller just protected ``root``: no waiting for
        the watch to report it)."""
        self.follow(root)
        self._ids = ids

    def acl_of(self, path: str) -> Any:
        if self._root is None or self._ids is None:
            return None
        return acl_for(path, self._root, self._ids)

    def create_async(self, path: str, value: bytes = b"", acl: Any = None, *args: Any, **kwargs: Any) -> Any:
        return super().create_async(path, value, acl if acl is not None else self.acl_of(path), *args, **kwargs)


def protect(client: KazooClient, root: str, ids: AclIds) -> int:
    """Protect the tree under ``root`` (the client holds the admin credential): record the
    identities in ``<root>/acl`` and set every existing node's ACL by the policy, one level of
    the tree at a time (its calls pipelined: 40,000 nodes at 10⁴ queues). Idempotent.
    Returns the number of nodes set. ZkAccessDenied when the tree is protected for another
    admin identity."""
    try:
        ids = attrs.evolve(ids, writers=token_writers(client, root))
        if isinstance(client, AclClient):
            client.use(root, ids)  # what it creates from now on (this call's nodes too) is protected
        client.ensure_path(root, acl=acl_for(root, root, ids))
        data = json.dumps(ids.to_dict()).encode()
        path = f"{root}/{ACL_NODE}"
        try:
            client.create(path, data, acl=acl_for(path, root, ids))
        except NodeExistsError:
            client.set(path, data)
        count = 0
        level = [root]
        while level:
            count += _set_acls(client, level, lambda node: acl_for(node, root, ids))
            children: dict[str, list[str]] = {}
            _list_children(client, level, children)
            for node in level:
                children[node] += _add_parents(client, node, root, ids, children[node])
            level = [f"{node}/{c}" for node in level for c in children[node]]
        return count
    except NoAuthError as exc:
        raise ZkAccessDenied(f"cannot protect {root}: it is protected for another admin identity, or this "
                             "client has no admin credential") from exc


def token_writers(client: KazooClient, root: str) -> dict[str, dict[str, tuple[str, ...]]] | None:
    """The ``writers`` of the ACL policy: every token's ZooKeeper digest id with its grants;
    None while tokens are not enforced (coordinator/tokens.py). A token recorded before issue
    29 has no digest id: it is left out (its holders may no longer write in ZooKeeper; reissue
    it), and said so."""
    if not enforced(client, root):
        return None
    records = load_tokens(client, root)
    for rec in records.values():
        if not rec.zk:
            log.warning("token %s (%s) predates per-queue ZooKeeper rights: its producers and consumers cannot "
                        "join elections; issue a new one (ordq auth create) and revoke it", rec.tid,
                        rec.name or "unnamed")
    return {rec.zk: dict(rec.grants) for rec in records.values() if rec.zk}


def tokens_changed(client: KazooClient, root: str) -> int:
    """After a token was issued or revoked: tell the brokers (``touch``) and, on a protected
    root, set the ACLs again so ZooKeeper grants exactly the tokens now recorded (a revoked
    token's writes are refused). Only the client-written nodes of the queues whose writers
    changed are set (every queue's for a ``*`` grant); the whole tree only when tokens just
    became enforced (then the shared client identity loses its writes everywhere). Returns
    the nodes set (0: the root is not protected)."""
    touch(client, root)
    try:
        data, _ = client.get(f"{root}/{ACL_NODE}")
    except NoNodeError:
        return 0
    old = AclIds.from_dict(json.loads(data))
    writers = token_writers(client, root)
    if old.writers is None or writers is None:
        return protect(client, root, old)  # it reads the writers itself
    scopes = changed_scopes(old.writers, writers)
    if not scopes:
        return 0
    ids = attrs.evolve(old, writers=writers)
    if isinstance(client, AclClient):
        client.use(root, ids)  # what it creates from now on names the new writers
    client.set(f"{root}/{ACL_NODE}", json.dumps(ids.to_dict()).encode())
    nodes = client_written_nodes(client, root, None if "*" in scopes else scopes)
    return _set_acls(client, nodes, lambda node: acl_for(node, root, ids))


def changed_scopes(old: Mapping[str, Mapping[str, Sequence[str]]],
                   new: Mapping[str, Mapping[str, Sequence[str]]]) -> set[str]:
    """The queues (or ``*``) named by the grants of every writer added, removed or changed."""
    scopes: set[str] = set()
    for writer in old.keys() | new.keys():
        before, after = old.get(writer, {}), new.get(writer, {})
        if {q: tuple(r) for q, r in before.items()} != {q: tuple(r) for q, r in after.items()}:
            scopes.update(before, after)
    return scopes


def client_written_nodes(client: KazooClient, root: str, queues: Collection[str] | None) -> list[str]:
    """The existing nodes whose ACL names token writers (``acl.CLIENT_PATTERNS``) under
    ``queues`` (None: every queue): each pattern's ``*`` resolved by listing children, many
    listings in flight at once (10⁴ queues: one round trip per level, not per node)."""
    children: dict[str, list[str]] = {}
    found: set[str] = set()
    for pattern in CLIENT_PATTERNS:
        paths = [root]
        for depth, part in enumerate(pattern):
            if part != "*":
                paths = [f"{p}/{part}" for p in paths]
            elif depth == 1 and queues is not None:
                paths = [f"{p}/{q}" for p in paths for q in sorted(queues)]
            else:
                _list_children(client, [p for p in paths if p not in children], children)
                paths = [f"{p}/{c}" for p in paths for c in children[p]]
        found.update(paths)
    return sorted(found)


def _list_children(client: KazooClient, paths: list[str], into: dict[str, list[str]]) -> None:
    """``into[p]``: the children of each of ``paths`` ([] for a missing node), _WINDOW calls in flight."""
    for start in range(0, len(paths), _WINDOW):
        chunk = paths[start:start + _WINDOW]
        for path, pending in [(p, client.get_children_async(p)) for p in chunk]:
            try:
                into[path] = pending.get()
            except NoNodeError:
                into[path] = []


def _set_acls(client: KazooClient, nodes: list[str], acl: Callable[[str], Any]) -> int:
    """Set each node's ACL, _WINDOW calls in flight; a node gone meanwhile is skipped.
    Returns the nodes set."""
    count = 0
    for start in range(0, len(nodes), _WINDOW):
        chunk = nodes[start:start + _WINDOW]
        for pending in [client.set_acls_async(n, acl(n)) for n in chunk]:
            try:
                pending.get()
                count += 1
            except NoNodeError:
                pass
    return count


def missing_parents(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The children a node at ``parts`` (under the root) is created with so that clients find
    the parents of what they may create: a queue's election, a subscription's election, alarm
    and ledger (coordinator/acl.py). () for any other node."""
    if len(parts) == 2 and parts[0] == "queues":
        return QUEUE_PARENTS
    if len(parts) == 4 and parts[0] == "queues" and parts[2] == "subs":
        return SUB_PARENTS
    return ()


def _add_parents(client: KazooClient, node: str, root: str, ids: AclIds, children: list[str]) -> list[str]:
    """Create the parents a queue or subscription made before issue 23 lacks (a client made
    them on first use; it no longer may); returns their names. An existing one is left as it
    is (an old consumer's ephemeral ``blocked`` node goes with its session)."""
    made = []
    for name in missing_parents(relative(node, root) or ()):
        if name in children:
            continue
        try:
            client.create(f"{node}/{name}", b"", acl=acl_for(f"{node}/{name}", root, ids))
        except NodeExistsError:
            pass  # made meanwhile: walked all the same
        except NoNodeError:
            continue  # the node itself went meanwhile (a queue deleted)
        made.append(name)
    return made
