"""What a consumer does when the application's handler fails on a message (``Consumer.run``).

Pure: from the policy and the number of failed attempts at one message to the next step. In a
strictly ordered subscription nothing behind a failing message may be delivered before it,
so the choices are: try again (``block``: for ever, raising an alarm after ``attempts``),
move it aside with a record (``park``: to the subscription's parking queue, an ordinary ordq
queue, so it stays replicated and ordered) and go on, or stop (``raise``).
"""

from __future__ import annotations

import math

import attrs

from ordq.errors import ConfigError

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
