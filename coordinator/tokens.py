"""Access tokens: who may produce, consume or administer which queue.

A token is ``ordq_<id>_<secret>``: ``id`` (8 hex digits) names its record, ``secret`` is 32
random bytes. ZooKeeper keeps only the SHA-256 of the whole token under
``<root>/auth/tokens/<id>``, with its grants: a token that leaks from a ZooKeeper dump cannot
be replayed. A plain hash (not a slow password hash) is enough because the secret is 256 random
bits: there is no dictionary to try, and the broker checks it on every call.

Grants: ``{queue or "*": [roles]}``, roles ``produce``, ``consume``, ``admin`` (admin implies
the other two). A token is no ZooKeeper identity (issue 37: clients hold no ZooKeeper session;
a record from issue 29 to 37 also kept a ``zk`` digest id, now ignored and dropped when the
record is rewritten): the records are readable by the cluster's identities only
(coordinator/acl.py).
Tokens are enforced once ``<root>/auth`` exists (``ordq up`` and the first
``ordq auth create`` make it): until then a cluster accepts any caller, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import attrs

from ordq.common.errors import ConfigError, PermissionDenied
from ordq.coordinator.acl import grants_allow

ROLES = ("produce", "consume", "admin")
ANY = "any"  # a call any role on the queue may make (seal, segment info, health)
_TOKEN_RE = re.compile(r"ordq_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")


def auth_root(root: str) -> str:
    return f"{root}/auth"


def tokens_path(root: str) -> str:
    return f"{root}/auth/tokens"


def revoked_path(root: str) -> str:
    """Revoked tokens' records (never their hash), for ``ordq auth list --all``: brokers read
    only ``tokens_path``, so a record here grants nothing."""
    return f"{root}/auth/revoked"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(id, token) of a fresh random token."""
    tid = secrets.token_hex(4)
    return tid, f"ordq_{tid}_{secrets.token_urlsafe(32)}"


def token_id(token: str) -> str:
    m = _TOKEN_RE.fullmatch(token)
    if m is None:
        raise ConfigError("not an ordq token (ordq_<id>_<secret>, as printed by: ordq auth create)")
    return m.group(1)


def parse_grants(specs: list[str]) -> dict[str, list[str]]:
    """``ROLE[:QUEUE]`` specs (no queue: every queue, ``*``) into grants."""
    grants: dict[str, list[str]] = {}
    for spec in specs:
        role, _, queue = spec.partition(":")
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r} in {spec!r}: one of {', '.join(ROLES)} (ROLE[:QUEUE])")
        queue = queue or "*"
        if queue != "*":
            from ordq.coordinator.paths import check_name

            check_name("queue", queue)
        roles = grants.setdefault(queue, [])
        if role not in roles:
            roles.append(role)
    if not grants:
        raise ConfigError("a token needs at least one --role ROLE[:QUEUE]")
    return grants


@attrs.frozen
class TokenRecord:
    tid: str
    hash: str
    grants: Mapping[str, tuple[str, ...]]
    name: str = ""
    created_ms: int = 0

    def allows(self, queue: str, role: str) -> bool:
        return grants_allow(self.grants, queue, role)

    def to_json(self) -> bytes:
        return json.dumps({"hash": self.hash, "grants": {q: list(r) for q, r in self.grants.items()},
                           "name": self.name, "created_ms": self.created_ms}).encode()

    @classmethod
    def from_json(cls, tid: str, raw: bytes) -> TokenRecord:
        d = json.loads(raw)
        return cls(tid=tid, hash=d["hash"], grants={q: tuple(r) for q, r in d["grants"].items()},
                   name=d.get("name", ""), created_ms=int(d.get("created_ms", 0)))

    def describe(self) -> dict[str, Any]:
        return {"id": self.tid, "name": self.name, "grants": {q: list(r) for q, r in self.grants.items()},
                "created_ms": self.created_ms}


def make_record(tid: str, token: str, grants: dict[str, list[str]], name: str) -> TokenRecord:
    return TokenRecord(tid=tid, hash=hash_token(token), grants={q: tuple(r) for q, r in grants.items()},
                       name=name, created_ms=int(time.time() * 1000))


def authorize(records: Mapping[str, TokenRecord], token: str | None, queue: str, role: str) -> TokenRecord:
    """The record of ``token`` if it grants ``role`` on ``queue``, else PermissionDenied."""
    rec = identify(records, token, queue, role)
    if not rec.allows(queue, role):
        raise PermissionDenied(queue, role, f"token {rec.tid} ({rec.name or 'unnamed'}) lacks the role")
    return rec


def identify(records: Mapping[str, TokenRecord], token: str | None, queue: str, role: str) -> TokenRecord:
    """The record of ``token``, whatever it grants; PermissionDenied (naming ``queue`` and
    ``role``, what the call wanted) for no token or an unknown or revoked one."""
    if not token:
        raise PermissionDenied(queue, role, "no token (give --token, ORDQ_TOKEN, or credentials from ordq up)")
    m = _TOKEN_RE.fullmatch(token)
    rec = records.get(m.group(1)) if m else None
    # compare_digest: how much of a guessed hash matched must not show in the timing.
    if rec is None or not hmac.compare_digest(rec.hash, hash_token(token)):
        raise PermissionDenied(queue, role, "unknown or revoked token")
    return rec


# -- ZooKeeper records (a kazoo client) ---------------------------------------------------------

def create_token(client: Any, root: str, grants: dict[str, list[str]], name: str = "") -> tuple[TokenRecord, str]:
    """Store a new token's record (turning enforcement on); returns (record, the token itself:
    shown once, never stored)."""
    tid, token = new_token()
    rec = make_record(tid, token, grants, name)
    client.ensure_path(tokens_path(root))
    client.create(f"{tokens_path(root)}/{tid}", rec.to_json())
    return rec, token


def load_tokens(client: Any, root: str) -> dict[str, TokenRecord]:
    from kazoo.exceptions import NoNodeError

    out = {}
    try:
        children = client.get_children(tokens_path(root))
    except NoNodeError:
        return {}
    for tid in children:
        try:
            raw, _ = client.get(f"{tokens_path(root)}/{tid}")
        except NoNodeError:
            continue  # revoked meanwhile
        out[tid] = TokenRecord.from_json(tid, raw)
    return out


def enforced(client: Any, root: str) -> bool:
    return client.exists(auth_root(root)) is not None


def revoke_token(client: Any, root: str, tid: str) -> None:
    """Delete the token's record and keep what it was (without its hash) under
    ``revoked_path``, in one transaction. NotFound when no token has this id."""
    from kazoo.exceptions import NoNodeError

    from ordq.common.errors import NotFound

    if not re.fullmatch(r"[0-9a-f]{8}", tid):
        raise ConfigError(f"not a token id: {tid!r} (8 hex digits, as ordq auth list shows)")
    path = f"{tokens_path(root)}/{tid}"
    try:
        raw, stat = client.get(path)
    except NoNodeError:
        raise NotFound(f"no token {tid} (see: ordq auth list)") from None
    rec = TokenRecord.from_json(tid, raw)
    kept = {**rec.describe(), "revoked_ms": int(time.time() * 1000)}
    client.ensure_path(revoked_path(root))
    tx = client.transaction()
    tx.delete(path, version=stat.version)
    tx.create(f"{revoked_path(root)}/{tid}", json.dumps(kept).encode())
    results = tx.commit()  # a failed transaction does not raise: its results say (STACK-NOTES)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        if isinstance(failed[0], NoNodeError) or client.exists(path) is None:
            raise NotFound(f"no token {tid} (see: ordq auth list)")
        raise failed[0]


def load_revoked(client: Any, root: str) -> list[dict[str, Any]]:
    """The revoked tokens' records (``describe()`` and ``revoked_ms``), by id."""
    from kazoo.exceptions import NoNodeError

    out = []
    try:
        children = client.get_children(revoked_path(root))
    except NoNodeError:
        return []
    for tid in sorted(children):
        try:
            raw, _ = client.get(f"{revoked_path(root)}/{tid}")
        except NoNodeError:
            continue
        out.append(json.loads(raw))
    return out


def touch(client: Any, root: str) -> None:
    """Tell every broker the tokens changed (they watch ``<root>/auth``, broker_group/auth.py)."""
    client.ensure_path(auth_root(root))
    client.set(auth_root(root), str(time.time_ns()).encode())
