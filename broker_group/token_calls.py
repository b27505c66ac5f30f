"""The calls one token holds open on a broker at once (issue 39, fast39r).

Guarantee: one token never holds more than ``limit`` calls open on this broker (Read streams,
Fetch long polls, produce streams, any call that shows it), so that it cannot take every call
the server admits: past ``max_concurrent_rpcs`` (1,024) gRPC refuses *every* caller's next
call at once, the neighbours' reads, a new produce stream and the coordinator's Seal included.
An idle Read stream costs the broker next to nothing else (no thread, 64 KiB of budget room
once answered, a wake-up only when its own segment moves): 1,100 of them on one consume
token did exactly that (tests/test_protect.py).

Rules: pure counting, used on the broker's loop only (no gRPC, no clock, no locks); the caller
refuses the call past the limit, typed and counted (dataplane._metered). Calls without a token
(the group's peers, the coordinator) are not counted here.
"""

from __future__ import annotations

import attrs

from ordq.common.counts import count_down, count_up


@attrs.define
class OpenCalls:
    limit: int  # calls one token may hold open at once
    _open: dict[str, int] = attrs.field(factory=dict)  # token holder -> calls open
    admitted: int = 0  # calls counted open since start, every token (statistics)

    def enter(self, token: str) -> bool:
        """Count a call of ``token`` open; False (nothing counted) when it holds ``limit`` already."""
        if self._open.get(token, 0) >= self.limit:
            return False
        count_up(self._open, token)
        self.admitted += 1
        return True

    def leave(self, token: str) -> None:
        """A call counted by ``enter`` ended."""
        count_down(self._open, token)

    def open(self, token: str) -> int:
        return self._open.get(token, 0)

    def statistics(self) -> dict[str, int]:
        """Tokens with calls open, the most calls one of them holds, and calls admitted so far."""
        return {"tokens": len(self._open), "most": max(self._open.values(), default=0), "limit": self.limit,
                "admitted": self.admitted}
