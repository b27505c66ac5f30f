"""Leases the coordinator grants (DESIGN §5 Leases): the arithmetic and the book, without I/O.

Guarantee: a lease is granted to a new holder only when nobody holds it: never granted, released
by its holder, or expired on this coordinator's clock — ``ttl`` after the last renewal it
*received*, plus a drift ``margin``. The holder (sdk/_lease_client.py) counts its lease from
before it *sent* that renewal and trusts it for ``CLIENT_TRUST`` of ``ttl`` only, so it stops
acting (delivering, committing) before the coordinator can grant a successor, whatever the pauses
and clock-rate differences (a rate difference under ``1 - CLIENT_TRUST``). A renewal with a
superseded generation or a wrong key is refused; a renewal of an expired lease that nobody took
since (same generation, same key) revives it: a holder whose heartbeats lapsed under load goes on
without losing its place.

A new coordinator term knows no renewal times: a lease it reads from ZooKeeper (``learn``) is
honoured as if renewed at that moment, so it can be granted to another only ``ttl + margin``
after the new term first saw it. (The deposed coordinator stops serving once it stops leading or
its ZooKeeper connection is suspended, coordinator/lease_service.py, so it renews nothing after
its successor's first look.)

Rules: pure — time comes in as ``now`` (monotonic seconds of this process), records go out to
the caller, who makes them durable in ZooKeeper before it answers; a grant's record is written
with a version check, so two coordinators cannot both grant (coordinator/store_leases.py).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import attrs

from ordq.common.errors import ConfigError, LeaseLost

MIN_TTL_MS = 300
MAX_TTL_MS = 60_000
DEFAULT_TTL_MS = 3_000
MARGIN_FRACTION = 0.25  # of the ttl, added on the coordinator's side before a successor
MIN_MARGIN_S = 0.2
CLIENT_TRUST = 2.0 / 3.0  # of the ttl, counted by the holder from the send time of its renewal


class Kind(enum.Enum):
    PRODUCER = "producer"  # leadership of a queue's producer
    CONSUMER = "consumer"  # leadership of a subscription's consumer
    MEMBER = "member"  # membership of a consumer group of a keyed topic


@attrs.frozen
class LeaseName:
    """Which lease: the producer lease of ``queue``; the consumer lease of ``queue``/``sub``;
    the member lease of ``member`` in group ``sub`` of topic ``queue``."""

    kind: Kind
    queue: str
    sub: str = ""
    member: str = ""

    def __str__(self) -> str:
        parts = [self.kind.value, self.queue] + [p for p in (self.sub, self.member) if p]
        return "/".join(parts)


def key_digest(key: str) -> str:
    """What a record keeps of a lease key (the key itself goes only to its holder)."""
    return hashlib.sha256(key.encode()).hexdigest()


def clamp_ttl_ms(asked_ms: int) -> int:
    """The ttl granted for ``asked_ms`` (0: the default)."""
    if asked_ms <= 0:
        return DEFAULT_TTL_MS
    return max(MIN_TTL_MS, min(int(asked_ms), MAX_TTL_MS))


def margin_s(ttl_ms: int) -> float:
    return max(MIN_MARGIN_S, ttl_ms / 1000.0 * MARGIN_FRACTION)


@attrs.frozen
class LeaseRecord:
    """What ZooKeeper keeps of a lease: who holds it, the generation (bumped by every grant),
    the digest of its key, its ttl, and whether the holder gave it back."""

    holder: str
    generation: int
    key_hash: str = attrs.field(repr=False)
    ttl_ms: int
    released: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "generation": self.generation, "key_hash": self.key_hash,
                "ttl_ms": self.ttl_ms, "released": self.released}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LeaseRecord:
        try:
            return cls(holder=str(d["holder"]), generation=int(d["generation"]), key_hash=str(d["key_hash"]),
                       ttl_ms=clamp_ttl_ms(int(d["ttl_ms"])), released=bool(d.get("released", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad lease record: {exc}") from exc

    def matches(self, generation: int, key: str) -> bool:
        return generation == self.generation and hmac.compare_digest(key_digest(key), self.key_hash)


@attrs.frozen
class Decision:
    """May a new holder be granted the lease now? If not: who holds it, and in how many
    seconds it can be granted at the soonest (if not renewed meanwhile)."""

    free: bool
    holder: str = ""
    retry_s: float = 0.0
    generation: int = 0  # of the record found (0: none): the next grant is generation + 1


@attrs.define
class _Held:
    record: LeaseRecord
    renewed_at: float  # when this term last heard from the holder (or first saw the record)


class LeaseBook:
    """The leases of one coordinator term, by name. ``learn`` what ZooKeeper holds before
    deciding about a lease this term has not seen; after that every change goes through
    ``granted``, ``renew`` and ``released`` (the caller persists the records they return)."""

    def __init__(self) -> None:
        self._held: dict[LeaseName, _Held | None] = {}

    def knows(self, name: LeaseName) -> bool:
        return name in self._held

    def learn(self, name: LeaseName, record: LeaseRecord | None, now: float) -> None:
        """What ZooKeeper holds for ``name`` (None: nothing), seen for the first time in this
        term: a lease held there counts as renewed ``now`` (we cannot know when it was)."""
        if name not in self._held:
            self._held[name] = None if record is None else _Held(record, now)

    def forget(self, name: LeaseName) -> None:
        """Read it from ZooKeeper again before the next decision (its node changed outside)."""
        self._held.pop(name, None)

    def record(self, name: LeaseName) -> LeaseRecord | None:
        held = self._held.get(name)
        return held.record if held is not None else None

    def expires_at(self, name: LeaseName) -> float | None:
        """When a successor may be granted (monotonic), None when nobody holds it."""
        held = self._held.get(name)
        if held is None or held.record.released:
            return None
        ttl = held.record.ttl_ms
        return held.renewed_at + ttl / 1000.0 + margin_s(ttl)

    def decide(self, name: LeaseName, now: float) -> Decision:
        held = self._held.get(name)
        if held is None:
            return Decision(free=True)
        until = self.expires_at(name)
        if until is None or now >= until:
            return Decision(free=True, holder=held.record.holder, generation=held.record.generation)
        return Decision(free=False, holder=held.record.holder, retry_s=until - now,
                        generation=held.record.generation)

    def granted(self, name: LeaseName, record: LeaseRecord, now: float) -> None:
        """``record`` was written to ZooKeeper: it is the lease now, renewed ``now``."""
        self._held[name] = _Held(record, now)

    def renew(self, name: LeaseName, generation: int, key: str, now: float) -> LeaseRecord:
        """The holder's heartbeat, received ``now``. LeaseLost when the lease is not (or no
        longer) the caller's: another generation was granted, or it was released. An expired
        lease nobody took since is revived."""
        held = self._held.get(name)
        if held is None:
            raise LeaseLost(name.kind.value, name.queue, name.sub, "the coordinator holds no such lease")
        if not held.record.matches(generation, key):
            raise LeaseLost(name.kind.value, name.queue, name.sub,
                            f"generation {generation} was superseded by {held.record.generation} "
                            f"({held.record.holder})" if generation != held.record.generation
                            else "the lease key does not match")
        if held.record.released:
            raise LeaseLost(name.kind.value, name.queue, name.sub, "it was released")
        held.renewed_at = max(held.renewed_at, now)
        return held.record

    def check(self, name: LeaseName, generation: int, key: str, now: float) -> LeaseRecord:
        """For a request the lease guards (a commit, a record): the caller's lease, current,
        not released and not expired on our clock. LeaseLost otherwise."""
        held = self._held.get(name)
        if held is None or not held.record.matches(generation, key) or held.record.released:
            raise LeaseLost(name.kind.value, name.queue, name.sub,
                            "the request does not come from the lease's current holder")
        until = self.expires_at(name)
        if until is not None and now >= until:
            raise LeaseLost(name.kind.value, name.queue, name.sub, "it expired (no heartbeat in time)")
        return held.record

    def released(self, name: LeaseName, generation: int, key: str) -> LeaseRecord:
        """The record to persist for a release by its holder (LeaseLost if it is not its)."""
        held = self._held.get(name)
        if held is None or not held.record.matches(generation, key):
            raise LeaseLost(name.kind.value, name.queue, name.sub, "not the holder's lease")
        return attrs.evolve(held.record, released=True)

    def names(self) -> Iterator[LeaseName]:
        return iter(list(self._held))

    def held(self, name: LeaseName, now: float) -> bool:
        """Someone holds ``name`` and it has not expired."""
        until = self.expires_at(name)
        return until is not None and now < until
