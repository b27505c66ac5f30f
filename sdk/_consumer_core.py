"""Consumer bookkeeping without I/O: exactly-once-in-order filter and cursor commit policy.

Rules:
- ``DeliveryFilter`` is the last gate before the application: a seq <= the last delivered is
  a duplicate (a resend after failover, or a replay) and is dropped; seq == last + 1 is
  delivered; anything larger is a gap: raise ``GapDetected`` and never skip.
- ``CommitPolicy`` decides *when* to write the cursor (every N messages or T ms, and on
  close), never *what*: the cursor is always the position after the last delivered message.
- No clocks, threads or I/O: time comes in as ``now_s``.
"""

from __future__ import annotations

import attrs

from ordq.errors import ConfigError, GapDetected


@attrs.define
class DeliveryFilter:
    queue: str
    last_seq: int  # highest seq delivered (or committed as delivered); -1 before the first
    duplicates_dropped: int = 0

    def admit(self, seq: int) -> bool:
        """True: deliver it (and it becomes the last). False: duplicate, drop it.
        Raises GapDetected when ``seq`` skips ahead."""
        if seq <= self.last_seq:
            self.duplicates_dropped += 1
            return False
        if seq != self.last_seq + 1:
            raise GapDetected(self.queue, expected_seq=self.last_seq + 1, got_seq=seq)
        self.last_seq = seq
        return True

    def admit_run(self, first_seq: int, count: int) -> bool:
        """Admit ``first_seq .. first_seq+count-1`` at once if it continues the last delivered
        seq exactly (the common case: a whole new batch); else admit nothing and return False
        (the caller then goes message by message through ``admit``)."""
        if count < 1 or first_seq != self.last_seq + 1:
            return False
        self.last_seq = first_seq + count - 1
        return True


@attrs.frozen(kw_only=True)
class CommitConfig:
    every_messages: int = 1000
    every_ms: float = 200.0

    def __attrs_post_init__(self) -> None:
        if self.every_messages < 1 or self.every_ms <= 0:
            raise ConfigError("commit every_messages must be >= 1 and every_ms > 0")


@attrs.define
class CommitPolicy:
    config: CommitConfig
    _since_commit: int = 0
    _last_commit_s: float = 0.0

    def delivered(self, n: int = 1) -> None:
        self._since_commit += n

    def due(self, now_s: float) -> bool:
        if self._since_commit == 0:
            return False
        return (
            self._since_commit >= self.config.every_messages
            or (now_s - self._last_commit_s) * 1000.0 >= self.config.every_ms
        )

    def committed(self, now_s: float) -> None:
        self._since_commit = 0
        self._last_commit_s = now_s
