"""When a broker commits a request on its event loop instead of a sync thread (issue 39).

A lone small request (a synchronous send's: nothing else unsynced on the broker) is appended and
fdatasynced on the loop: no thread hand-off between it and its ack. The loop serves every
other call meanwhile, so that is only worth it while a sync is quick: one that stalls on a
congested disk (ext4 commits its journal, and may wait for other files' dirty data, on
fdatasync: tens of ms to seconds) would hold every Read answer and every other producer's
request for as long. So a slow group commit, wherever it ran, sends the next ones to the
thread for ``backoff_s``, renewed by every slow one after it; the loop takes them again
once the disk has been quick for that long.

Rules: pure (the caller gives the times and sizes); one instance per broker, used under its lock.
"""

from __future__ import annotations

import attrs

# A request of at least this many bytes is committed on a thread: its copy and write are long
# enough to hold the loop, and the loop reads (decrypts) the next requests meanwhile.
LOOP_SYNC_BYTES = 256 << 10
# A group commit (write + fdatasync) this slow sends the next ones to the thread: on the
# development disk an fdatasync takes ~0.2 ms at p50, 0.25-1.5 ms at p99, with rare spikes to
# ~90 ms; a congested one holds them for tens of ms to seconds.
SLOW_SYNC_S = 0.02
BACKOFF_S = 1.0


@attrs.define
class LoopSyncRule:
    """Whether a lone request may be committed on the loop now (``on_loop``), from its size
    and how quick the group commits have been (``synced``)."""

    max_bytes: int = LOOP_SYNC_BYTES
    slow_s: float = SLOW_SYNC_S
    backoff_s: float = BACKOFF_S
    _thread_until: float = 0.0  # monotonic: until then, every commit goes to the thread

    def on_loop(self, nbytes: int, now: float) -> bool:
        """May a lone request of ``nbytes`` be committed on the loop at ``now``?"""
        return nbytes < self.max_bytes and now >= self._thread_until

    def synced(self, seconds: float, now: float) -> bool:
        """A group commit (on the loop or a thread) took ``seconds``, ending at ``now``; True
        when it was slow (the next ones go to the thread)."""
        if seconds < self.slow_s:
            return False
        self._thread_until = max(self._thread_until, now + self.backoff_s)
        return True
