"""What a consumer does when the application's handler fails on a message (``Consumer.run``).

Pure: from the policy and the number of failed attempts at one message to the next step. In a
strictly ordered subscription nothing behind a failing message may be delivered before it,
so the choices are: try again (``block``: for ever, raising an alarm after ``attempts``),
move it aside with a record (``park``: to the subscription's parking queue, an ordinary ordq
queue, so it stays replicated and ordered) and go on, or stop (``raise``).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ordq.common.errors import ConfigError

MODES = ("block", "park", "raise")


def parking_queue(queue: str, subscription: str) -> str:
    """The queue a subscription's parked messages go to."""
    return f"{queue}.parked.{subscription}"


@attrs.frozen
class FailurePolicy:
    on_failure: str = "block"  # block | park | raise
    attempts: int = 5  # tries before the alarm (block), parking (park) or the error (raise)
    backoff_s: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0)  # wait before try k+1; the last repeats

    def __attrs_post_init__(self) -> None:
        if self.on_failure not in MODES:
            raise ConfigError(f"on_failure must be one of {', '.join(MODES)}, not {self.on_failure!r}")
        if not 1 <= self.attempts <= 10**6:
            raise ConfigError(f"attempts must be 1..1000000, not {self.attempts}")
        if not self.backoff_s or any(not (math.isfinite(b) and 0 <= b <= 86400) for b in self.backoff_s):
            raise ConfigError(f"backoff_s must be a non-empty list of 0..86400 seconds, not {self.backoff_s}")


@attrs.frozen
class Step:
    action: str  # "retry" | "park" | "raise"
    delay_s: float = 0.0  # before the retry
    alarm: bool = False  # blocked past the policy's attempts: tell the operator


def after_failure(policy: FailurePolicy, failures: int) -> Step:
    """The step after the ``failures``-th failed attempt (1-based) at one message."""
    if failures < 1:
        raise ValueError("failures counts from 1")
    delay = policy.backoff_s[min(failures - 1, len(policy.backoff_s) - 1)]
    if failures < policy.attempts:
        return Step("retry", delay)
    if policy.on_failure == "park":
        return Step("park")
    if policy.on_failure == "raise":
        return Step("raise")
    return Step("retry", delay, alarm=True)


# -- the ledger of parked messages (pure) ----------------------------------------------------
#
# One record per parked seq (ZooKeeper, ``Paths.parked``): written by the consumer when it
# parks, changed by an operator (``ordq sub parked replay|drop``) and by the consumer when it
# replays. Its ``status`` moves only along LEDGER_MOVES:
#
#   parked --replay--> replay --handled--> replayed
#     |  ^                |
#     |  +--failed again--+
#     +--drop--> dropped <--drop-- replay
#
# A record written by keyed delivery (``keyed``) parks its key: while a key has an unresolved
# keyed record (parked or replay), every later message of that key follows it into the parking
# queue. The key goes on once all of its records are replayed or dropped.

UNRESOLVED = ("parked", "replay")
LEDGER_MOVES = {
    ("parked", "replay"): "replay",
    ("parked", "drop"): "dropped",
    ("replay", "drop"): "dropped",
    ("replay", "handled"): "replayed",
    ("replay", "failed"): "parked",
}


def status_of(record: dict[str, Any]) -> str:
    """A record's status (records of the first slice have none: parked)."""
    return str(record.get("status", "parked"))


def moved(record: dict[str, Any], event: str) -> str:
    """The status after ``event``; ConfigError when the record's status does not allow it."""
    now = status_of(record)
    after = LEDGER_MOVES.get((now, event))
    if after is None:
        raise ConfigError(f"seq {record['seq']} is {now}: cannot {event} it")
    return after


def parked_keys(records: list[dict[str, Any]]) -> dict[str, int]:
    """Parked keys (hex; "" for no key) -> the lowest unresolved seq holding each back."""
    out: dict[str, int] = {}
    for r in records:
        if r.get("keyed") and status_of(r) in UNRESOLVED:
            key, seq = str(r.get("key") or ""), int(r["seq"])
            out[key] = min(out.get(key, seq), seq)
    return out


def select(records: list[dict[str, Any]], action: str, *, seq: int | None = None, key: str | None = None,
           every: bool = False) -> list[int]:
    """The seqs an operator's ``replay`` or ``drop`` changes, in seq order.

    Exactly one of ``seq``, ``key`` (hex; "" for messages without a key) or ``every``. Only
    unresolved records are chosen. ``replay --seq N`` of a keyed record is refused while an
    earlier record of its key is still parked (not asked to replay): replaying N first would
    hand the key's messages to the application out of order. ConfigError otherwise names why.
    """
    if action not in ("replay", "drop"):
        raise ValueError(f"unknown action {action!r}")
    if (seq is not None) + (key is not None) + bool(every) != 1:
        raise ConfigError("name what to " + action + ": exactly one of --seq N, --key K or --all")
    ordered = sorted(records, key=lambda r: int(r["seq"]))
    if seq is not None:
        found = [r for r in ordered if r["seq"] == seq]
        if not found:
            raise ConfigError(f"seq {seq} is not in the ledger of parked messages")
        r = found[0]
        moved(r, action)  # a clear error when already resolved
        if action == "replay" and r.get("keyed"):
            before = [b for b in ordered if b.get("keyed") and b.get("key") == r.get("key")
                      and int(b["seq"]) < seq and status_of(b) == "parked"]
            if before:
                raise ConfigError(f"seq {seq} waits behind parked seq {before[0]['seq']} of the same key: replay or "
                                  f"drop that one first, or replay the whole key with --key")
        return [seq]
    chosen = [r for r in ordered if status_of(r) in UNRESOLVED and (every or str(r.get("key") or "") == key)]
    if action == "replay":
        chosen = [r for r in chosen if status_of(r) == "parked"]
    if key is not None and not chosen:
        raise ConfigError(f"no parked message of key {key!r} to {action}")
    return [int(r["seq"]) for r in chosen]


def replay_plan(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records to replay now, in seq order: those asked to replay, except that a keyed
    record waits while an earlier record of its key is still parked (so one key's messages
    reach the application in seq order, whatever was asked)."""
    out = []
    held: set[str] = set()  # keys with an earlier parked record
    for r in sorted(records, key=lambda r: int(r["seq"])):
        key = str(r.get("key") or "")
        st = status_of(r)
        if r.get("keyed") and st == "parked":
            held.add(key)
        elif st == "replay" and not (r.get("keyed") and key in held):
            out.append(r)
    return out
