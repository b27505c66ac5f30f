"""Producer bookkeeping without I/O: seq assignment, batching, in-flight window, resend.

Rules:
- Owns the order: seqs are assigned here, gap-free and strictly increasing by 1 in ``add``
  order; batches are cut in that order and handed out (``take_ready``) in that order.
- Never touches sockets, ZooKeeper, threads or the clock: time comes in as ``now_s``.
- A batch leaves the window only when its ack arrives, in order. After a failover every
  unacked batch is handed out again (``rewind``) with the same seqs and the same bytes, so the
  new segment receives exactly the unacked suffix in order and consumers drop duplicates by seq.
- Resends are gated (issue 39): after a rewind, batches handed out before go out again only as
  far as the new stream has acked bytes (``RESEND_GROWTH`` of them; one batch at a time while it
  has acked nothing). A head that stores what it gets but never acks (its slave hung, a
  machine too loaded to sync) thus holds one resent batch, not the whole window: a storm of
  failovers no longer stores the unacked window again on every head it passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import attrs

from ordq.common.errors import ConfigError
from ordq.wire.batch import Message, encode_batch, message_size

MESSAGE_OVERHEAD = 32  # about what a message adds to a batch beyond its bytes (its record header)
BATCH_FRAMING_BYTES = 64  # what a batch adds around its messages: a batch fits one message this much smaller
# After a rewind, resent batches in flight on the new stream may reach this share of the bytes
# it has acked (at least one batch): the resend grows by 1.5x per round trip on a healthy head,
# and what a failing head holds of it unacked stays under half of what it acked.
RESEND_GROWTH = 0.5


def message_bytes(payload: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
    """A message's own bytes as stored: payload, key and encoded headers
    (``ordq.broker_group.log.message_size``, what a queue's ``max_message_bytes`` limits)."""
    if not headers:  # the common case, on the per-message path: no call, no generator
        return len(payload) + (len(key) if key else 0)
    return message_size(payload, key, headers)


@attrs.frozen(kw_only=True)
class BatchingConfig:
    """How messages are grouped on the wire and how much may be unacked at once."""

    # A batch goes at once while fewer than ``eager_batches`` sent batches await their ack (an
    # idle pipe: waiting would only add latency); beyond that, batches wait up to
    # ``linger_ms`` to fill, as the acks that will free the pipe are on their way anyway.
    linger_ms: float = 5.0
    eager_batches: int = 1
    max_batch_messages: int = 256
    # one message of a queue's default limit (1 MiB) plus its framing: `ordq produce --size 1048576`
    # to such a queue was refused by the producer's own limit (issue 42)
    max_batch_bytes: int = (1 << 20) + BATCH_FRAMING_BYTES
    max_inflight_bytes: int = 32 << 20  # send() blocks beyond this many unacked bytes

    def __attrs_post_init__(self) -> None:
        if self.linger_ms < 0:
            raise ConfigError("linger_ms must be >= 0")
        if self.eager_batches < 0:
            raise ConfigError("eager_batches must be >= 0")
        if self.max_batch_messages < 1 or self.max_batch_bytes < 1:
            raise ConfigError("max_batch_messages and max_batch_bytes must be >= 1")
        if self.max_inflight_bytes < self.max_batch_bytes:
            raise ConfigError("max_inflight_bytes must be >= max_batch_bytes")


@attrs.define(eq=False)
class PendingBatch:
    """A cut batch: its seq range, its encoded bytes, and per-message completion tokens."""

    first_seq: int
    messages: list[Message]
    tokens: list[object]  # opaque per-message handles (futures) resolved on ack
    epoch: int
    encoded: bytes = b""
    sent: bool = False  # handed out since the last rewind
    resent: bool = False  # handed out before the last rewind: handing it out again is a resend
    sent_at: float = 0.0  # when it was last handed out (take_ready's now_s)

    @property
    def count(self) -> int:
        return len(self.messages)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.messages) - 1

    @property
    def size(self) -> int:
        return len(self.encoded)


@attrs.define
class ProducerCore:
    config: BatchingConfig
    epoch: int
    next_seq: int
    encode: Callable[..., bytes] = encode_batch
    _open: list[Message] = attrs.field(factory=list)
    _open_tokens: list[object] = attrs.field(factory=list)
    _open_bytes: int = 0
    _open_since: float | None = None
    _window: deque[PendingBatch] = attrs.field(factory=deque)  # cut, not yet acked, in seq order
    _inflight_bytes: int = 0
    _sent: int = 0  # batches of the window handed out since the last rewind
    _stream_acked: int = 0  # bytes acked since the last rewind (on the current stream)
    _resend_out: int = 0  # bytes of resent batches handed out since the last rewind, not yet acked

    # -- adding ------------------------------------------------------------------------------

    def starts_batch(self, size: int) -> bool:
        """Will ``add`` of a message of ``size`` bytes (``message_bytes``) put it first in a new
        batch (none open, or the open one full)?"""
        return not self._open or (
            len(self._open) >= self.config.max_batch_messages
            or self._open_bytes + size + MESSAGE_OVERHEAD > self.config.max_batch_bytes
        )

    def add(self, message: Message, token: object, now_s: float, size: int | None = None) -> int:
        """Assign the next seq to ``message`` and put it in the open batch; return the seq.
        ``size``: its ``message_bytes``, when the caller has it already."""
        if size is None:
            size = message_bytes(message.payload, message.key, message.headers)
        approx = size + MESSAGE_OVERHEAD
        if self._open and self.starts_batch(size):
            self._cut()
        seq = self.next_seq + len(self._open)
        if not self._open:
            self._open_since = now_s
        self._open.append(message)
        self._open_tokens.append(token)
        self._open_bytes += approx
        return seq

    def _cut(self) -> None:
        if not self._open:
            return
        batch = PendingBatch(
            first_seq=self.next_seq, messages=self._open, tokens=self._open_tokens, epoch=self.epoch
        )
        batch.encoded = self.encode(batch.messages, epoch=self.epoch, first_seq=batch.first_seq)
        self.next_seq += batch.count
        self._window.append(batch)
        self._inflight_bytes += batch.size
        self._open, self._open_tokens, self._open_bytes, self._open_since = [], [], 0, None

    def flush(self) -> None:
        """Cut the open batch now (close, flush())."""
        self._cut()

    # -- handing out and acking --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When the open batch must be cut: now when the pipe is idle (fewer than
        ``eager_batches`` sent and unacked), else at the end of its linger; None when nothing
        is open."""
        if self._open_since is None:
            return None
        if self._sent < self.config.eager_batches:
            return self._open_since
        return self._open_since + self.config.linger_ms / 1000.0

    def take_ready(self, now_s: float, budget_bytes: int | None = None) -> list[PendingBatch]:
        """Batches to send now, in seq order: every cut batch not sent since the last rewind,
        after cutting the open batch if it is due (``next_deadline``). ``budget_bytes``: hand
        out batches only while fewer than that many (encoded) bytes were handed out in this
        call, the one that crosses it included; 0 or less: none. A resent batch waits while
        resent batches in flight would pass ``RESEND_GROWTH`` of the bytes acked since the last
        rewind (one at a time while none were acked), and every batch after it with it."""
        deadline = self.next_deadline()
        if deadline is not None and now_s >= deadline:
            self._cut()
        out = []
        for b in self._window:
            if b.sent:
                continue
            if b.resent and self._resend_out > 0 and \
                    self._resend_out + b.size > self._stream_acked * RESEND_GROWTH:
                break
            if budget_bytes is not None:
                if budget_bytes <= 0:
                    break
                budget_bytes -= len(b.encoded)
            out.append(b)
            b.sent = True
            b.sent_at = now_s
            if b.resent:
                self._resend_out += b.size
        self._sent += len(out)
        return out

    def oldest_sent_at(self) -> float | None:
        """When the oldest unacked batch was handed out (for the ack deadline)."""
        for b in self._window:
            return b.sent_at if b.sent else None
        return None

    def on_ack(self, first_seq: int, last_seq: int) -> list[PendingBatch]:
        """An ack for the seq range ``first_seq..last_seq``: pop and return the acked batches.

        Acks arrive in order; an ack that does not match the window head is a protocol error
        (raised as ValueError: the caller treats it as a broken stream and fails over)."""
        if not self._window or self._window[0].first_seq != first_seq:
            head = self._window[0].first_seq if self._window else None
            raise ValueError(f"ack for seq {first_seq} but the oldest unacked batch starts at {head}")
        done: list[PendingBatch] = []
        while self._window and self._window[0].last_seq <= last_seq:
            b = self._window.popleft()
            self._inflight_bytes -= b.size
            self._sent -= b.sent
            self._stream_acked += b.size
            if b.resent and b.sent:
                self._resend_out -= b.size
            done.append(b)
        if not done or done[-1].last_seq != last_seq:
            raise ValueError(f"ack for seqs {first_seq}..{last_seq} does not end on a batch boundary")
        return done

    def rewind(self) -> None:
        """After a failover: every unacked batch is to be sent again (same seqs, same bytes);
        those handed out before are resends, gated by what the new stream acks."""
        for b in self._window:
            b.resent = b.resent or b.sent
            b.sent = False
        self._sent = self._stream_acked = self._resend_out = 0

    def reset(self, epoch: int, next_seq: int) -> None:
        """A new epoch (takeover) with nothing pending: re-encode nothing, start at next_seq."""
        if self._window or self._open:
            raise ValueError("reset with messages pending")
        self.epoch, self.next_seq = epoch, next_seq

    # -- introspection -----------------------------------------------------------------------

    @property
    def inflight_bytes(self) -> int:
        return self._inflight_bytes

    @property
    def inflight_batches(self) -> int:
        """Batches handed out since the last rewind and not yet acked."""
        return self._sent

    def window_full(self) -> bool:
        return self._inflight_bytes >= self.config.max_inflight_bytes

    @property
    def unacked(self) -> list[PendingBatch]:
        return list(self._window)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def drop_all(self) -> list[object]:
        """Give up (fenced or closed): return every token still pending, in seq order."""
        tokens = [t for b in self._window for t in b.tokens] + list(self._open_tokens)
        self._window.clear()
        self._open, self._open_tokens, self._open_bytes, self._open_since = [], [], 0, None
        self._inflight_bytes = self._sent = self._stream_acked = self._resend_out = 0
        return tokens
