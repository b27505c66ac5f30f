"""The kazoo side of ZooKeeper ACLs (the policy itself is coordinator/acl.py, pure).

``AclClient`` is a KazooClient that gives every node it creates the ACL the policy names for
its path — nodes created by ordq's store, by kazoo recipes and by ``ensure_path`` alike — once
``follow(root)`` has found the root protected. ``protect`` turns protection on for a tree and
repairs it: every node that exists gets the policy's ACL, whoever made it and whatever ACL they
gave it (an unprotected tree from before, one protected by an older ordq with a client identity
and tokens' digests, a node a client planted with an ACL only it can read: issue 37). It runs
as the admin identity, ZooKeeper's super-user when ordq started ZooKeeper; on a ZooKeeper
without that super-user a node whose ACL shuts the admin out is deleted instead when it can be
(its parent is the admin's), else named in a warning, and the walk goes on.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError, NotEmptyError

from ordq.common.errors import ZkAccessDenied
from ordq.coordinator.acl import (
    ACL_NODE,
    QUEUE_PARENTS,
    SUB_PARENTS,
    AclIds,
    acl_for,
    check_credential,
    digest_id,
    relative,
)

AUTH_DIR = "zk-auth"  # <folder>/zk-auth/{admin,coordinator,broker}: "user:password", readable by the owner only
AUTH_USERS = {"admin": "ordq-admin", "coordinator": "ordq-coordinator", "broker": "ordq-broker"}
RETIRED = ("client",)  # credentials an older ordq generated: removed once the tree no longer names them
log = logging.getLogger("ordq.acl")
_WINDOW = 500  # ZooKeeper requests in flight at once on one session (pipelined, answered in order)


def read_credential(folder: Path, role: str) -> str | None:
    """The ``user:password`` ``ordq up`` generated for ``role`` (admin | coordinator | broker) in ``folder``."""
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
    identities (a wrong password, another cluster's credential, a client's from before issue
    37), or is missing while ``required``. ZooKeeper itself accepts any digest credential at
    connect and refuses only the first request. ``<root>/acl`` is readable by the identities
    only: a refused read is the answer."""
    path = f"{root}/{ACL_NODE}"
    if client.exists(path) is None:  # exists checks no ACL
        return  # not protected: any credential (or none) writes
    if credential is None:
        if required:
            raise ZkAccessDenied(f"the ZooKeeper root {root} is protected and no ZooKeeper credential was given "
                                 "(--zk-auth-file, ORDQ_ZK_AUTH, or the credentials file: docs/SECURITY.md)")
        return
    user = credential.partition(":")[0]
    try:
        data, _ = client.get(path)
        ids = AclIds.from_dict(json.loads(data))
    except NoNodeError:
        return
    except NoAuthError:
        ids = None
    except (ValueError, KeyError, TypeError):
        return  # recorded by an older ordq: ordq up rewrites it, the requests themselves say
    if ids is None or digest_id(credential) not in (ids.admin, ids.coordinator, ids.broker):
        raise ZkAccessDenied(f"the ZooKeeper credential of user {user!r} is not one of {root}'s identities "
                             "(a wrong password, another cluster's credential, or a client's: clients speak "
                             "only to the coordinator, docs/SECURITY.md)")


class AclClient(KazooClient):  # type: ignore[misc]  # kazoo is untyped
    def __init__(self, *args: Any, auth: str | None = None, **kwargs: Any) -> None:
        """``auth``: the identity's ``user:password`` (coordinator/acl.py)."""
        if auth is not None:
            kwargs["auth_data"] = [("digest", check_credential(auth))]
        super().__init__(*args, **kwargs)
        self.auth = auth
        self._root: str | None = None
        self._ids: AclIds | None = None
        self._watched: set[str] = set()

    def follow(self, root: str) -> None:
        """Watch ``<root>/acl``: while it names the three identities, nodes created under
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

        try:
            self.DataWatch(f"{root}/{ACL_NODE}", changed)
        except NoAuthError:  # none of the root's identities: it creates nothing there (check_identity says so)
            self._watched.discard(root)

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


def protect(client: KazooClient, root: str, ids: AclIds, *, walk: bool = True) -> int:
    """Protect and repair the tree under ``root`` (the client holds the admin credential):
    record the identities in ``<root>/acl`` and set every existing node's ACL by the policy,
    one level of the tree at a time (its calls pipelined: 40,000 nodes at 10⁴ queues).
    Idempotent; returns the number of nodes set. A node the admin may not administer (a
    ZooKeeper without ordq's super-user, and a node whose ACL shuts the admin out) is deleted
    when it can be, else left and named in a warning (module doc). ZkAccessDenied only when
    the root itself or its ACL record cannot be set (this client is not the admin, and
    ZooKeeper has no super-user for it).

    ``walk=False``: only the root and its ACL record (issue 43: the walk is two requests a node,
    40,000 nodes at 10^4 queues, and took ``ordq up`` minutes; ``protected_by`` says when the
    tree is protected for ``ids`` already and nothing needs it)."""
    try:
        if isinstance(client, AclClient):
            client.use(root, ids)  # what it creates from now on (this call's nodes too) is protected
        client.ensure_path(root, acl=acl_for(root, root, ids))
        client.set_acls(root, acl_for(root, root, ids))
        # While a walk is under way the record says so: one cut short is done again next time.
        data = json.dumps({**ids.to_dict(), **({WALKING: True} if walk else {})}).encode()
        path = f"{root}/{ACL_NODE}"
        try:
            client.create(path, data, acl=acl_for(path, root, ids))
        except NodeExistsError:
            client.set_acls(path, acl_for(path, root, ids))
            client.set(path, data)
    except NoAuthError as exc:
        raise ZkAccessDenied(f"cannot protect {root}: this client has no admin credential of it, and the "
                             "ZooKeeper has no super-user for it (ordq up starts ZooKeeper with one)") from exc
    count = 0
    level = [root] if walk else []
    while level:
        set_now, refused = _set_acls(client, level, lambda node: acl_for(node, root, ids))
        count += set_now
        gone = _remove_foreign(client, refused)
        level = [node for node in level if node not in gone]
        children: dict[str, list[str]] = {}
        _list_children(client, level, children)
        for node in level:
            children[node] += _add_parents(client, node, root, ids, children[node])
        level = [f"{node}/{c}" for node in level for c in children[node]]
    if walk:
        client.set(f"{root}/{ACL_NODE}", json.dumps(ids.to_dict()).encode())  # walked whole
    return count


WALKING = "walking"  # in the ACL record while protect's walk is under way


def protected_by(client: KazooClient, root: str, ids: AclIds) -> bool:
    """Whether ``root``'s ACL record names exactly ``ids`` and no walk was cut short (a tree
    a full ``protect`` with them has set; nodes made since are made by the policy: ``AclClient``)."""
    try:
        data, _ = client.get(f"{root}/{ACL_NODE}")
        return bool(json.loads(data) == ids.to_dict())
    except (NoNodeError, NoAuthError, ValueError):
        return False


def _remove_foreign(client: KazooClient, nodes: list[str]) -> set[str]:
    """Delete each node whose ACL the admin could not set (a ZooKeeper without ordq's super-
    user): a node made outside the policy, with an ACL shutting the admin out. Deleting needs
    only DELETE on its parent, which the policy gives the admin; a node with children it may
    not list stays, named in a warning. Returns the nodes deleted or gone."""
    gone: set[str] = set()
    for node in nodes:
        try:
            client.delete(node)
            log.warning("protect: deleted %s, a node whose ACL shut the admin identity out", node)
            gone.add(node)
        except NoNodeError:
            gone.add(node)
        except (NoAuthError, NotEmptyError):
            log.warning("protect: cannot repair or delete %s (its ACL shuts the admin identity out; start "
                        "ZooKeeper with the admin's super digest, as ordq up does)", node)
    return gone


def _list_children(client: KazooClient, paths: list[str], into: dict[str, list[str]]) -> None:
    """``into[p]``: the children of each of ``paths`` ([] for a missing node), _WINDOW calls in flight."""
    for start in range(0, len(paths), _WINDOW):
        chunk = paths[start:start + _WINDOW]
        for path, pending in [(p, client.get_children_async(p)) for p in chunk]:
            try:
                into[path] = pending.get()
            except (NoNodeError, NoAuthError):  # gone; or foreign and not deleted (protect warned)
                into[path] = []


def _set_acls(client: KazooClient, nodes: list[str], acl: Callable[[str], Any]) -> tuple[int, list[str]]:
    """Set each node's ACL, _WINDOW calls in flight; a node gone meanwhile is skipped.
    Returns the nodes set and those refused (NoAuth: the admin may not administer them)."""
    count, refused = 0, []
    for start in range(0, len(nodes), _WINDOW):
        chunk = nodes[start:start + _WINDOW]
        for node, pending in [(n, client.set_acls_async(n, acl(n))) for n in chunk]:
            try:
                pending.get()
                count += 1
            except NoNodeError:
                pass
            except NoAuthError:
                refused.append(node)
    return count, refused


def missing_parents(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The children a node at ``parts`` (under the root) is created with, so that what is later
    created under them finds its parent: a queue's election, a subscription's election, alarm,
    ledger and group members (coordinator/acl.py). () for any other node."""
    if len(parts) == 2 and parts[0] == "queues":
        return QUEUE_PARENTS
    if len(parts) == 4 and parts[0] == "queues" and parts[2] == "subs":
        return SUB_PARENTS
    return ()


def _add_parents(client: KazooClient, node: str, root: str, ids: AclIds, children: list[str]) -> list[str]:
    """Create the parents a queue or subscription made before issue 23 lacks (a client made
    them on first use); returns their names. An existing one is left as it is (an old
    consumer's ephemeral ``blocked`` node goes with its session)."""
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
