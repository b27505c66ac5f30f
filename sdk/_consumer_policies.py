"""The consumer's handler-driven delivery: ``Consumer.run`` (one message at a time, with the
failure policy) and ``Consumer.run_keyed`` (keyed worker threads, sdk/keyed.py), over the
consumer's parts.

Guarantee: every handler attempt first makes sure the lease still holds (``wait_sure`` in
``run``, ``worker_may_start`` on a keyed worker); keyed delivery hands a read's messages to the
workers only after the consumer's check before handing out, and commits only the contiguous
prefix the workers finished. When the lease is lost (``LeaseGone``) delivery stops (keyed: the
workers finish only the calls in progress), the consumer rejoins (``rejoin``) and goes on from
the committed cursor: the message in hand is tried again. What the handler's failure leads to
(block, park, raise) is the failure policy's (sdk/failure.py decides, sdk/parking.py does).

Rules: reads, hands out and commits only through the consumer's parts (``Handout``,
``Committer``, ``LeaseChecks``, ``SegmentReader``) and the ``poll``/``read_more`` it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ordq.common.errors import HandlerError
from ordq.coordinator.client import CoordinatorClient
from ordq.sdk._consumer_commit import Committer, Handout
from ordq.sdk._consumer_lease import LeaseChecks, LeaseGone
from ordq.sdk._consumer_read import SegmentReader
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._lease_client import CoordinatorLease
from ordq.sdk.audit import AuditWriter
from ordq.sdk.failure import FailurePolicy
from ordq.sdk.keyed import KeyedWorkers
from ordq.sdk.parking import BlockedMessage, FailureHandling, stored_policy, worker_key_filter


class FailurePolicies:
    """``run`` and ``run_keyed`` of one consumer, and the failure handling they leave behind
    (what ``Consumer.blocked``, ``alarmed`` and ``statistics`` show)."""

    def __init__(self, config: ConsumerConfig, coordinator: CoordinatorClient, lease: CoordinatorLease, *,
                 handout: Handout, checks: LeaseChecks, committer: Committer, reader: SegmentReader,
                 poll: Callable[..., list[Delivered]], read_more: Callable[[float | None], None],
                 rejoin: Callable[[str], None], wait_for_time: Callable[[float | None], None]) -> None:
        self.config = config
        self._coord = coordinator
        self._lease = lease
        self._rejoin = rejoin
        self._handout = handout
        self._checks = checks
        self._committer = committer
        self._reader = reader
        self._poll = poll
        self._read_more = read_more
        self._wait_for_time = wait_for_time  # the head of the line held for its time (delayed delivery)
        self.failing: FailureHandling | None = None  # run()/run_keyed(): the failure policy at work
        self._skips: AuditWriter | None = None  # parked and replayed messages, made on first use

    def blocked(self) -> BlockedMessage | None:
        return self.failing.blocked() if self.failing is not None else None

    def alarmed(self) -> bool:
        return self.failing.alarmed() if self.failing is not None else False

    def close_audit(self) -> None:
        if self._skips is not None:
            self._skips.close()

    def close(self) -> None:
        if self.failing is not None:
            self.failing.close()

    def run(self, handler: Callable[[Delivered], object], *, stop: threading.Event | None) -> None:
        """``Consumer.run``."""
        failing = self._start_failure_handling(FailurePolicy(), keyed=False)
        may_start = self._checks.wait_sure

        def wait(delay_s: float) -> bool:
            if stop is not None:
                return stop.wait(delay_s)
            time.sleep(delay_s)
            return False

        while stop is None or not stop.is_set():
            try:
                failing.look_for_changes()
                if failing.changed.is_set():
                    failing.changed.clear()
                    if not failing.resolve(handler, mine=lambda key: True, may_start=may_start, wait=wait):
                        return  # stopped while a replayed message was retried: it stays asked for
                batch = self._poll(max_messages=1)
                if not batch:
                    continue
                if not failing.attempt(batch[0], handler, may_start=may_start, wait=wait, on_park=failing.park):
                    return  # stopped while blocked: the message stays unfinished
            except LeaseGone as gone:
                self._rejoin(gone.reason)  # the message in hand is delivered again from the cursor
                failing.changed.set()  # and the ledger read again
                continue
            self._handout.finish_handed()

    def _start_failure_handling(self, default: FailurePolicy, *, keyed: bool) -> FailureHandling:
        cfg = self.config
        policy = cfg.on_failure or stored_policy(self._coord, self._lease) or default
        if self.failing is not None:
            self.failing.close()
        self.failing = FailureHandling(cfg, self._coord, self._lease, policy, audit=self._skips_audit(),
                                       keyed=keyed)
        return self.failing

    def _skips_audit(self) -> AuditWriter | None:
        if self.config.audit_dir is None:
            return None
        if self._skips is None:
            self._skips = AuditWriter(self.config.audit_dir, "skips", writer_id=self.config.consumer_id)
        return self._skips

    def run_keyed(self, handler: Callable[[Delivered], object], *, workers: int, stop: threading.Event | None,
                  max_pending: int, drain: bool) -> None:
        """``Consumer.run_keyed`` (arguments checked, consumer open): keyed delivery, again
        from the committed cursor after each rejoin."""
        while True:
            try:
                self._run_keyed(handler, workers=workers, stop=stop, max_pending=max_pending, drain=drain)
                return
            except LeaseGone as gone:
                self._rejoin(gone.reason)

    def _run_keyed(self, handler: Callable[[Delivered], object], *, workers: int, stop: threading.Event | None,
                   max_pending: int, drain: bool) -> None:
        handout = self._handout
        handout.finish_handed()  # messages handed out before this call count as done
        start = handout.finished_pos()
        failing = self._start_failure_handling(FailurePolicy(on_failure="raise", attempts=1), keyed=True)
        may_start = self._checks.worker_may_start

        # A retry gives up when the workers stop; with ``drain``, only a blocked message does
        # (block retries for ever): one that park or raise decides within its attempts goes on.
        gives_up = stop if (not drain or failing.policy.on_failure == "block") else None

        def handle(m: Delivered) -> bool:  # on the key's worker
            if failing.follows_parked_key(m):
                return True
            return failing.attempt(m, handler, may_start=may_start,
                                   wait=lambda s: pool.wait(s, gives_up), on_park=failing.park)

        def replay(worker: int) -> None:  # on the worker, between its messages: ordered with its keys
            failing.resolve(handler, mine=worker_key_filter(worker, workers), may_start=may_start,
                            wait=lambda s: pool.wait(s, gives_up))

        pool = KeyedWorkers(handle, workers=workers, max_pending=max_pending, start=start,
                            may_start=may_start, on_control=replay,
                            name=f"ordq-keyed-{self.config.subscription}")
        handout.keyed_start(pool, start)
        clean = False
        try:
            while (stop is None or not stop.is_set()) and pool.failure is None and pool.fatal is None:
                failing.look_for_changes()
                if failing.changed.is_set():  # an operator replayed or dropped: each worker looks
                    failing.changed.clear()
                    pool.control(stop=stop, waiting=self._commit_if_due)
                for m in self._take_batch_keyed():
                    if not pool.submit(m, stop=stop, waiting=self._commit_if_due):
                        break
            clean = True
        finally:
            pool.stop(drain=drain and clean and pool.failure is None and pool.fatal is None)
            # Read on from the first message not finished (the queued ones were dropped).
            self._reader.rewind(handout.keyed_end())
        if pool.fatal is not None:
            raise pool.fatal
        if pool.failure is not None:
            m, exc = pool.failure
            if isinstance(exc, LeaseGone):  # lost while parking or recording: rejoin
                raise exc
            if isinstance(exc, HandlerError):  # the policy's (raise): from the handler's exception
                raise exc
            raise HandlerError(self.config.queue, self.config.subscription, m.seq, m.key) from exc

    def _take_batch_keyed(self) -> list[Delivered]:
        """Keyed delivery: everything one read returned, once the lease is sure (the workers
        check it again before each message)."""
        handout = self._handout
        handout.sync_keyed()
        if not handout.buffer:
            self._read_more(None)
            if not handout.buffer:
                return []
        due = handout.due_count()
        if not due:  # delayed delivery: the head of the line waits for its time (order across keys too)
            self._wait_for_time(None)
            due = handout.due_count()
            if not due:
                return []
        if not self._checks.before_hand_out(time.monotonic(), self._committer.start_if_due):
            return []
        return handout.take_keyed(due)

    def _commit_if_due(self) -> None:
        """While keyed delivery waits for queue room: commit what finished if it is time."""
        self._handout.sync_keyed()
        self._committer.start_if_due(time.monotonic())  # written on the commit thread
