"""``ordq mirror run``: copy a queue of one cluster to a queue of another, in order, each
message once, whatever dies on either side.

Guarantee: the target queue holds source seqs ``s0, s0+1, ...`` once each, in source order
(``s0``: where the source subscription stood when the target was empty). One process is a
consumer of the source (subscription ``mirror.<target id>``) and the producer of the target.
Several instances elect one: the target's producer lease (the coordinator's, as for any
producer) picks the leader, standbys wait in it and take over when the leader dies or is
paused past its lease; the new leader's claim fences the old one on the target's brokers, so
no two instances write. On every takeover the leader reads the target's last message: the
source seq in its ``x-ordq-mirror`` chain (``ordq.mirror.chain``) says where to go on: the
target is the truth, the source cursor only a hint (the subscription's cursor never passes
what the target acked: a batch is polled only after the one before was acked on the target,
and ``poll`` finishes the previous batch, so only acked copies are ever committed).

When a cluster cannot be reached the mirror waits and tries again (waits doubling up to
``RetryPolicy.max_s``, one WARNING line per attempt), for ever: nothing is dropped, the
source's backlog grows (``ordq_mirror_lag_messages``). Final: ``MirrorLoop`` (a message that
came from the target), ``MirrorDiverged`` (the source cannot continue the copy),
``PermissionDenied``, ``QueueNotFound``, ``ConfigError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import attrs

from ordq.common.errors import (
    ConfigError,
    FencedError,
    GapDetected,
    MirrorError,
    NotFound,
    OrdqError,
    PermissionDenied,
    WaitTimeout,
)
from ordq.mirror.chain import SourceFilter, copy_headers, resume_from
from ordq.mirror.config import MirrorConfig
from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, StoredMessage

log = logging.getLogger("ordq.mirror")
STANDBY_ASK_S = 30.0
# How long the target's producer waits for a writable group before the mirror starts over (and says so)
NO_GROUP_TIMEOUT_S = 10.0
FINAL = (MirrorError, PermissionDenied, NotFound, ConfigError, GapDetected)


@attrs.define
class MirrorStats:
    state: str = "starting"  # starting | standby | leading | waiting (a cluster unreachable)
    copied: int = 0  # messages acked on the target by this process
    skipped: int = 0  # source messages the target held already (dropped)
    leaderships: int = 0  # times this process became the leader
    retries: int = 0  # attempts after a cluster could not be reached
    last_error: str | None = None
    last_source_seq: int | None = None  # the last source seq acked on the target (as this process knows)
    last_source_ts_us: int = 0  # that message's source timestamp
    next_source_seq: int | None = None  # where the copy goes on


class Mirror:
    """Runs the mirror until ``stop`` is set (``run``); ``statistics()`` from any thread."""

    def __init__(self, config: MirrorConfig, *, on_state: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._stats = MirrorStats()
        self._lock = threading.Lock()
        self._on_state = on_state  # told "standby", "leading", "waiting" as they happen (the CLI prints them)

    def statistics(self) -> MirrorStats:
        with self._lock:
            return attrs.evolve(self._stats)

    def _set(self, **changes: object) -> None:
        with self._lock:
            state = self._stats.state
            for name, value in changes.items():
                setattr(self._stats, name, value)
            now = self._stats.state
        if now != state and self._on_state is not None:
            self._on_state(now)

    def _producer_config(self) -> ProducerConfig:
        cfg = self.config
        extra: dict[str, Any] = {"producer_id": cfg.instance} if cfg.instance else {}
        return ProducerConfig(queue=cfg.target.queue, **cfg.target.options(), send_timeout_s=cfg.send_timeout_s,
                              lease_ttl_s=cfg.lease_ttl_s, audit_dir=cfg.audit_dir,
                              no_group_timeout_s=NO_GROUP_TIMEOUT_S, **extra)

    def _consumer_config(self) -> ConsumerConfig:
        cfg = self.config
        extra: dict[str, Any] = {"consumer_id": cfg.instance} if cfg.instance else {}
        return ConsumerConfig(queue=cfg.source.queue, subscription=cfg.sub, **cfg.source.options(), start=cfg.start,
                              lease_ttl_s=cfg.lease_ttl_s, commit=CommitConfig(every_messages=1000, every_ms=500.0),
                              **extra)

    def run(self, stop: threading.Event) -> MirrorStats:
        """Lead (or wait as a standby) and copy until ``stop`` is set. Raises the final errors
        (module docstring); rides out every other one."""
        attempt = 0
        while not stop.is_set():
            try:
                self._lead(stop)
                attempt = 0
            except FINAL:
                raise
            except FencedError as exc:
                # Another instance took over (this one was paused past its lease, or cut off):
                # it goes on from what the target holds; this one waits as its standby.
                log.warning("mirror %s -> %s: another instance leads now (%s); waiting as a standby",
                            self.config.source, self.config.target, exc)
                self._set(state="standby", last_error=str(exc))
                attempt = 0
            except OrdqError as exc:
                attempt += 1
                wait = self.config.retry.wait_s(attempt)
                with self._lock:
                    self._stats.retries += 1
                self._set(state="waiting", last_error=f"{type(exc).__name__}: {exc}")
                log.warning("mirror %s -> %s: %s: %s; trying again in %.1fs (attempt %d; nothing is dropped, "
                            "the source keeps the backlog)", self.config.source, self.config.target,
                            type(exc).__name__, exc, wait, attempt)
                stop.wait(wait)
        return self.statistics()

    def _lead(self, stop: threading.Event) -> None:
        cfg = self.config
        if self._stats.state != "waiting":
            self._set(state="standby")
        # Standbys wait here: the target's producer lease elects the one mirror that writes
        # (asked again every STANDBY_ASK_S, so that ``stop`` is seen).
        producer = Producer(attrs.evolve(self._producer_config(), leader_timeout_s=STANDBY_ASK_S))
        try:
            producer.start()
        except WaitTimeout:
            return  # another instance leads: ask again
        try:
            if stop.is_set():
                return
            resumed = self._resume(producer, stop)
            if resumed is None:
                return
            next_seq = resumed[0]
            with self._lock:
                self._stats.leaderships += 1
                self._stats.next_source_seq = next_seq
            self._set(state="leading", last_error=None)
            log.warning("mirror %s -> %s leads (%s): the target holds up to source seq %s; copying from %s",
                        cfg.source, cfg.target, cfg.instance or producer.config.producer_id,
                        "-" if next_seq is None else next_seq - 1,
                        "the subscription's cursor" if next_seq is None else f"seq {next_seq}")
            with Consumer(self._consumer_config()) as consumer:
                watch = _FencedWatch(producer, consumer, every_s=cfg.lease_ttl_s / 4)
                try:
                    self._copy(producer, consumer, SourceFilter(cfg.source.identity, next_seq), stop)
                except OrdqError:  # ClosedError (the watch closed the consumer), or what its closing broke
                    if producer.failure is not None:
                        raise producer.failure from None
                    raise
                finally:
                    watch.stop()
        finally:
            producer.close(timeout_s=cfg.send_timeout_s)

    def _resume(self, producer: Producer, stop: threading.Event) -> tuple[int | None] | None:
        """(the source seq to copy next,) from the target's last message (None inside: the
        target is empty). None: stopped while its last message could not be read."""
        attempt = 0
        while True:
            last: StoredMessage | None = producer.last_committed()
            if last is None:
                return (None,)
            if last.message is not None:
                return (resume_from(self.config.target.queue, last.message.headers, last.seq,
                                    source=self.config.source.identity),)
            attempt += 1
            log.warning("mirror %s -> %s: the target's last message (seq %d) cannot be read yet (%s); trying again",
                        self.config.source, self.config.target, last.seq, last.message_error)
            if stop.wait(self.config.retry.wait_s(attempt)):
                return None

    def _copy(self, producer: Producer, consumer: Consumer, gate: SourceFilter, stop: threading.Event) -> None:
        cfg = self.config
        src, target = cfg.source.identity, cfg.target.identity
        queue = cfg.source.queue
        while not stop.is_set():
            # poll() finishes the previous batch: it was acked on the target (flush below), so
            # a commit of the source cursor never passes what the target holds.
            batch = consumer.poll(0.2, max_messages=cfg.max_batch)
            if not batch:
                producer.flush(cfg.send_timeout_s)  # nothing pending: raises if this producer was fenced meanwhile
                continue
            sent = 0
            last = None
            for m in batch:
                if not gate.admit(m.seq):
                    continue
                producer.send(m.payload, key=m.key, headers=copy_headers(
                    m.headers, queue=queue, source=src, seq=m.seq, ts_us=m.timestamp_us, target=target))
                sent += 1
                last = m
            producer.flush()
            with self._lock:
                st = self._stats
                st.copied += sent
                st.skipped = gate.skipped
                st.next_source_seq = gate.next_seq
                if last is not None:
                    st.last_source_seq, st.last_source_ts_us = last.seq, last.timestamp_us


class _FencedWatch:
    """Closes the source consumer once the target producer stopped (fenced by a successor):
    a consumer whose lease went to that successor waits inside ``poll`` to be granted it again,
    and would hold this process there instead of letting it go back to the standbys."""

    def __init__(self, producer: Producer, consumer: Consumer, *, every_s: float) -> None:
        self._producer, self._consumer, self._every_s = producer, consumer, max(every_s, 0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ordq-mirror-fenced", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            if self._producer.failure is not None:
                log.warning("the target's producer stopped (%s): closing the source consumer", self._producer.failure)
                self._consumer.close()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
