"""Which refused calls reach the coordinator's log (issue 38): a flood of refusals must not cost
the coordinator a log line each.

Each refusal the service answers was logged, one INFO line (``Subscribe a refused: subscription
'f10' of queue 'a' already exists``): a 64-thread flood wrote a line for each of its refused
calls, ~100-300 a second on this machine, for as long as it lasted. The refusals are counted in
``ordq_coordinator_requests_total{rpc, outcome}`` all the same; the log needs only a sample.

Guarantee: for each kind (the call's rpc and the refusal's type) at most ``lines`` are written
in each window of ``every_s`` (windows start at the first refusal of the kind after the last one
ended), whatever the refusals' rate; the first refusal of a kind after a quiet window is always
written; a refusal not written is counted and told with the next line of its kind written.

Rules: pure (no clock of its own, no threads, no logging): the service calls it under its lock,
with its clock.
"""

from __future__ import annotations

import attrs

from ordq.common.errors import ConfigError


@attrs.define
class RefusalLog:
    """See the module doc. ``admit(kind, now)``: None when this refusal is not to be written,
    else how many of its kind were held back since the last written one."""

    lines: int = 5
    every_s: float = 1.0
    # kind -> (its window's start, lines written in it, refusals held back since the last written)
    _kinds: dict[tuple[str, str], tuple[float, int, int]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.lines < 1 or not self.every_s > 0:
            raise ConfigError("refusal log: lines must be >= 1 and every_s > 0")

    def admit(self, kind: tuple[str, str], now: float) -> int | None:
        start, written, held = self._kinds.get(kind, (now, 0, 0))
        if now - start >= self.every_s:  # a new window
            start, written = now, 0
        if written >= self.lines:
            self._kinds[kind] = (start, written, held + 1)
            return None
        self._kinds[kind] = (start, written + 1, 0)
        return held
