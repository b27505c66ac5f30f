"""What a mirrored message carries, and where a mirror goes on: pure logic, no I/O.

Guarantee: a mirror copies source seq N to the target only right after source seq N-1, each
once. Every copy carries the header ``x-ordq-mirror``: the chain of hops it came through,
oldest first, each ``[cluster id, seq in that cluster's queue, that message's timestamp (µs)]``;
the last hop is the immediate source. So the target's last message says which source seq the
target holds last (``resume_from``): the target is the truth, the source subscription's cursor
only a hint. A chain that already names the target cluster is a loop (A -> B -> A) and is
refused (``MirrorLoop``), before anything of it is written.

Rules: no I/O, clocks or threads; the caller gives it delivered messages' seqs and headers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from ordq.common.errors import ConfigError, MirrorDiverged, MirrorLoop

MIRROR_HEADER = "x-ordq-mirror"
Headers = Sequence[tuple[str, bytes]]


@attrs.frozen
class Hop:
    """One hop of a copy's way: the message was seq ``seq`` of cluster ``cluster``'s queue,
    stamped ``ts_us`` there."""

    cluster: str
    seq: int
    ts_us: int


def parse_chain(headers: Headers) -> list[Hop]:
    """The chain a message carries ([] for a message no mirror wrote). ConfigError for a
    malformed header (a producer other than a mirror wrote one)."""
    for name, value in headers:
        if name == MIRROR_HEADER:
            try:
                hops = json.loads(value)
                return [Hop(str(c), int(s), int(t)) for c, s, t in hops]
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"malformed {MIRROR_HEADER} header {value[:80]!r}: {exc}") from None
    return []


def encode_chain(chain: Sequence[Hop]) -> bytes:
    return json.dumps([[h.cluster, h.seq, h.ts_us] for h in chain], separators=(",", ":")).encode()


def copy_headers(headers: Headers, *, queue: str, source: str, seq: int, ts_us: int, target: str) -> tuple[
        tuple[str, bytes], ...]:
    """The headers of the copy of source message ``seq`` (its own ``headers``, stamped
    ``ts_us``): the application's headers as they are, and the chain with one more hop.
    Raises MirrorLoop when the target already is in the chain (or is the source)."""
    chain = parse_chain(headers)
    chain.append(Hop(source, seq, ts_us))
    if any(h.cluster == target for h in chain):
        raise MirrorLoop(queue, seq, target, [h.cluster for h in chain])
    out = tuple((n, v) for n, v in headers if n != MIRROR_HEADER)
    return (*out, (MIRROR_HEADER, encode_chain(chain)))


def resume_from(target_queue: str, last_headers: Headers | None, last_seq: int | None, *,
                source: str) -> int | None:
    """The source seq a mirror copies next, from the target's last message (its headers and
    seq; None: the target queue is empty, so the subscription's cursor says where). Raises
    MirrorDiverged when that message is not a copy of ``source`` (another producer wrote
    the target, or another mirror does)."""
    if last_headers is None:
        return None
    chain = parse_chain(last_headers)
    if not chain:
        raise MirrorDiverged(source, f"the target queue {target_queue!r}'s last message (seq {last_seq}) is no "
                                     f"mirror copy (no {MIRROR_HEADER} header): a mirror must be its only producer")
    if chain[-1].cluster != source:
        raise MirrorDiverged(source, f"the target queue {target_queue!r}'s last message (seq {last_seq}) is a copy "
                                     f"of {chain[-1].cluster}, not of this source")
    return chain[-1].seq + 1


@attrs.define
class SourceFilter:
    """The gate between the source subscription and the target: a seq below ``next_seq`` is
    held by the target already (dropped); ``next_seq`` is copied; a higher one is a
    divergence (the source cannot give the messages between). ``next_seq`` None: the first
    delivered seq starts the copy (the target was empty)."""

    source: str
    next_seq: int | None
    skipped: int = 0

    def admit(self, seq: int) -> bool:
        if self.next_seq is None or seq == self.next_seq:
            self.next_seq = seq + 1
            return True
        if seq < self.next_seq:
            self.skipped += 1
            return False
        raise MirrorDiverged(
            self.source, f"the source subscription delivered seq {seq} where the copy needs seq {self.next_seq} next "
            f"(the subscription's cursor was moved past what the copy holds, or retention dropped those messages); "
            f"reset it: ordq sub reset QUEUE SUB --to seq {self.next_seq}", expected=self.next_seq, got=seq)
