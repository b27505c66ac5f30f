"""How long a new segment's first write took on this broker, step by step (issue 29: what the
time from a producer's failover to its first ack on the new segment is made of).

Rules:
- One record per segment this broker creates for a write (the master: a producer's first
  request; the slave: the master's first replicated batches), stamped at a handful of points
  of that first write's way (never per message or per batch afterwards) and reported once, as
  one log line. Nothing here does I/O or reads a clock: the write path hands the times in
  (``time.monotonic()``, one clock for every process of the machine, so a bench can lay these
  stamps beside a producer's).
- Only timing: nothing here decides anything.
"""

from __future__ import annotations

import attrs


@attrs.define
class FirstWrite:
    """The first write of one new segment on this replica (monotonic seconds; ``arrived``:
    the first request for it, the producer's on the master, the master's on the slave).

    ``steps`` are the set-up steps' durations, in the order they ran: on the master ``zk``
    (one round trip: the queue's state, synced first when the producer's epoch is new here,
    and its settings) and ``files`` (the segment's folder, log and meta file created, their
    names synced); on the slave ``state`` (the queue's state read: which incarnation its
    folder belongs to) and ``files``. The stamps after them: ``ready`` (the
    set-up done, back on the loop), ``placed`` (master: the batches placed and handed to the
    replication stream), ``synced`` (this replica's first group commit of it ended),
    ``replicated`` (master: the slave's first answer for it), ``done`` (master: its first ack
    taken for the produce stream; slave: its first answer taken for the master)."""

    queue: str
    seg: int
    arrived: float
    steps: dict[str, float] = attrs.field(factory=dict)
    ready: float | None = None
    placed: float | None = None
    synced: float | None = None
    replicated: float | None = None
    done: float | None = None

    def step(self, name: str, seconds: float) -> None:
        self.steps[name] = self.steps.get(name, 0.0) + seconds

    def spans_ms(self) -> dict[str, float]:
        """Each set-up step's duration and each stamp after ``arrived``, in ms (absent stamps
        left out)."""
        out = {name: round(s * 1000, 1) for name, s in self.steps.items()}
        for name in ("ready", "placed", "synced", "replicated", "done"):
            at = getattr(self, name)
            if at is not None:
                out[f"{name}_at"] = round((at - self.arrived) * 1000, 1)
        return out

    def line(self, role: str) -> str:
        """The log line: ``first write of <queue>/<seg> (<role>): arrived=<monotonic> k=ms ...``
        (``bench/bench_queues.py`` reads it back)."""
        spans = " ".join(f"{k}={v:g}" for k, v in self.spans_ms().items())
        return f"first write of {self.queue}/{self.seg} ({role}): arrived={self.arrived:.6f} {spans}"


@attrs.frozen
class Reported:
    """One ``FirstWrite.line`` read back: ``ms`` holds its ``k=ms`` fields."""

    queue: str
    seg: int
    role: str
    arrived: float
    ms: dict[str, float]

    def at(self, name: str) -> float:
        """The monotonic time of stamp ``name`` (e.g. ``placed_at``; ``arrived`` if absent)."""
        return self.arrived + self.ms.get(name, 0.0) / 1000


def parse_line(text: str) -> Reported | None:
    """The ``FirstWrite.line`` found in ``text`` (a log line), or None."""
    marker = "first write of "
    at = text.find(marker)
    if at < 0:
        return None
    head, _, rest = text[at + len(marker):].partition(" (")
    role, _, fields = rest.partition("): ")
    queue, _, seg = head.rpartition("/")
    if not queue or not seg.isdigit() or not role:
        return None
    values: dict[str, float] = {}
    for part in fields.split():
        key, eq, value = part.partition("=")
        try:
            values[key] = float(value)
        except ValueError:
            return None
        if not eq:
            return None
    arrived = values.pop("arrived", None)
    if arrived is None:
        return None
    return Reported(queue=queue, seg=int(seg), role=role, arrived=arrived, ms=values)
