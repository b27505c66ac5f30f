"""``ordq sub parked replay|drop``: an operator resolves parked messages (sdk/failure.py has the
rules, sdk/parking.py the consumer's half).

Replay marks the chosen records ``replay`` and signals the subscription's consumer, which hands
them to its handler from the parking queue (one key's in seq order, before the key goes on).
Drop marks them ``dropped`` with the reason, the time and who; a dropped message is never
delivered, and its record stays in the ledger. Both are conditional writes per record: a
consumer changing the same record meanwhile makes the decision run again on what is there.
"""

from __future__ import annotations

import getpass
import time
from typing import Any

from ordq.common.errors import ConfigError
from ordq.coordinator.store import ZkStore
from ordq.sdk.failure import moved, select


def resolve_parked(store: ZkStore, queue: str, sub: str, action: str, *, seq: int | None = None,
                   key: bytes | None = None, every: bool = False, reason: str | None = None,
                   who: str | None = None) -> list[int]:
    """Replay or drop the parked messages named by exactly one of ``seq``, ``key`` or
    ``every``; returns their seqs (in order). ``who``: the operator recorded (default: this
    process's user). ConfigError names why nothing can be done
    (unknown seq, already resolved, replay out of its key's order, drop without a reason)."""
    if action == "drop" and not (reason and reason.strip()):
        raise ConfigError("drop needs --reason TEXT: it is recorded in the ledger")
    records = store.parked(queue, sub)
    chosen = select(records, action, seq=seq, key=key.hex() if key is not None else None, every=every)
    now_us = time.time_ns() // 1000
    who = who or _operator()

    def change(r: dict[str, Any]) -> dict[str, Any]:
        out = {**r, "status": moved(r, action)}
        if action == "drop":
            out.update(reason=reason, resolved_at_us=now_us, dropped_by=who)
        else:
            out.update(replay_asked_at_us=now_us, replay_asked_by=who)
        return out

    for s in chosen:
        store.update_parked(queue, sub, s, change)
    if chosen:
        store.signal_parked(queue, sub)
    return chosen


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
