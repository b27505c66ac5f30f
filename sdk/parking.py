"""A message the handler keeps failing on, the I/O half (the decisions are in sdk/failure.py):
retries with the lease checked before each, the alarm operators see, parking (a whole message
in ``run``, a whole key in ``run_keyed``) and replaying what an operator asked for.

Guarantees (docs/SDK.md, "A message that keeps failing"):
- A parked message is in the parking queue ``Q.parked.SUB`` (acked by both replicas) and in the
  subscription's ledger before it counts as finished: a crash in between redelivers it (and
  may park it twice in the parking queue; the ledger holds one record per seq).
- Keyed: once a key is parked, every later message of it that reaches the key's worker goes to
  the parking queue too, with a record (``follows``: the seq holding the key back), until every
  parked record of the key is replayed or dropped. The parked keys are read from the ledger
  when delivery starts, so a restarted consumer keeps following them.
- Replay: records an operator marked ``replay`` are handed to the handler from the parking
  queue (the same seq, seg, offset, key and payload; header ``x-ordq-replayed: 1``), one key's
  in seq order, by the thread that delivers that key (in ``run_keyed`` the key's worker), before
  it takes the next message of the key from the queue. A record that fails again goes back to
  ``parked`` (the policy's attempts again) and holds its key's later records back.

The alarm and the ledger are kept by the coordinator (``CoordinatorClient.record`` with the
consumer's lease: only the subscription's current holder may write them, coordinator/
service_leases.py); the alarm is cleared when the consumer releases its lease, and when the
coordinator grants the lease to another consumer (a dead consumer's alarm does not stay). An
operator's replay or drop is learnt by polling the "parked-changed" signal's version every
``SIGNAL_POLL_S`` while delivering.

Rules: no decision here (``after_failure``, ``replay_plan``, ``parked_keys`` decide); thread-safe
(keyed workers call in parallel, each for its own keys); nothing here commits a cursor.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ordq.common.errors import (
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    HandlerError,
    LeaseLost,
    NotFound,
    OrdqError,
)
from ordq.sdk._consumer_lease import LeaseGone
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._producer_types import ProducerConfig
from ordq.sdk.failure import FailurePolicy, after_failure, moved, parked_keys, parking_queue, replay_plan
from ordq.sdk.keyed import worker_of

if TYPE_CHECKING:
    from ordq.coordinator.client import CoordinatorClient
    from ordq.sdk._lease_client import CoordinatorLease
    from ordq.sdk.audit import AuditWriter
    from ordq.wire.batch import Message

log = logging.getLogger("ordq.consumer")

REPLAYED_HEADER = "x-ordq-replayed"
SIGNAL_POLL_S = 1.0  # how often a delivering consumer asks whether an operator changed the ledger
UPDATE_TRIES = 20  # a ledger record changed by an operator meanwhile: read and decide again


@attrs.frozen
class BlockedMessage:
    """A message whose handler failed ``attempts`` times so far and is being retried."""

    seq: int
    key: bytes | None
    attempts: int
    last_error: str
    blocked_s: float  # since its first failure


def key_hex(key: bytes | None) -> str:
    """How the ledger and the audit files name a key ("" for none)."""
    return (key or b"").hex()


def guarded(coord: CoordinatorClient, lease: CoordinatorLease, op: str, body: Any = None) -> Any:
    """``coord.record(lease.held, op, body)``; a refusal for the lease waits for the lease's
    verdict: revived (nobody took it) -> sent again; granted to another -> LeaseGone (the
    consumer rejoins); no coordinator confirms it -> CoordinationUnavailable."""
    while True:
        try:
            return coord.record(lease.held, op, body)
        except LeaseLost as exc:
            if lease.wait_valid(2 * lease.held.ttl_ms / 1000.0):
                continue
            if lease.lost_reason is not None:
                raise LeaseGone(lease.lost_reason) from exc
            raise CoordinationUnavailable(f"{op}: the consumer lease is not confirmed") from exc


def stored_policy(coord: CoordinatorClient, lease: CoordinatorLease) -> FailurePolicy | None:
    """The subscription's policy set with ``ordq sub policy`` (None: none set)."""
    stored = guarded(coord, lease, "policy")
    if stored is None:
        return None
    return FailurePolicy(on_failure=stored["on_failure"], attempts=int(stored["attempts"]),
                         backoff_s=tuple(float(b) for b in stored["backoff_s"]))


class FailureHandling:
    """One consumer's failure policy at work (made by ``Consumer.run``/``run_keyed``)."""

    def __init__(self, config: ConsumerConfig, coordinator: CoordinatorClient, lease: CoordinatorLease,
                 policy: FailurePolicy, *, audit: AuditWriter | None, keyed: bool) -> None:
        self.config = config
        self._coord = coordinator  # the parking queue, the alarm, the ledger: asked of the coordinator
        self._lease = lease
        self.policy = policy
        self.keyed = keyed
        self._audit = audit
        self._lock = threading.Lock()
        self._blocked: dict[int, BlockedMessage] = {}  # per delivering thread
        self._alarmed: set[int] = set()  # threads whose message is shown as the alarm
        self._producer: Any = None  # of the parking queue, made on first use
        self._reader: Any = None  # reads the parking queue for replays
        self.parked = 0
        self.replayed = 0
        self.alarms = 0  # messages that blocked past the policy's attempts (the alarm was raised)
        self.redeliveries = 0  # handler attempts repeated after a failure
        self.target = parking_queue(config.queue, config.subscription)
        # Set when the ledger changed under us (an operator): replay or unpark at the next look.
        # Set from the start: a replay asked while no consumer ran is done first.
        self.changed = threading.Event()
        self.changed.set()
        self._closed = False
        self._signal_version: int | None = None  # of the operators' "parked-changed" signal, as last seen
        self._signal_at = float("-inf")  # monotonic time of the last look at it
        self._keys: dict[str, int] = {}
        self._recorded: set[int] = set()  # seqs in the ledger: parked already, never twice
        if keyed:
            ledger = self._ledger()
            self._keys = parked_keys(ledger)
            self._recorded = {int(r["seq"]) for r in ledger}

    def look_for_changes(self, *, now: float | None = None) -> None:
        """Every ``SIGNAL_POLL_S`` (called between messages): ask whether an operator changed
        the ledger since the last look (``changed`` is set then). Unanswered: the next look."""
        now = time.monotonic() if now is None else now
        if now - self._signal_at < SIGNAL_POLL_S:
            return
        self._signal_at = now
        try:
            version = int(guarded(self._coord, self._lease, "parked_signal"))
        except (CoordinationUnavailable, NotFound) as exc:
            log.debug("queue %s/%s: the parked signal not read: %s", self.config.queue, self.config.subscription, exc)
            return
        if self._signal_version is not None and version != self._signal_version:
            self.changed.set()
        self._signal_version = version

    # -- status ------------------------------------------------------------------------------

    def blocked(self) -> BlockedMessage | None:
        """The lowest seq being retried, if any."""
        with self._lock:
            return min(self._blocked.values(), key=lambda b: b.seq, default=None)

    def alarmed(self) -> bool:
        """Whether a message is blocked past the policy's attempts (shown as the alarm)."""
        with self._lock:
            return bool(self._alarmed)

    def parked_keys(self) -> dict[str, int]:
        with self._lock:
            return dict(self._keys)

    # -- one message -------------------------------------------------------------------------

    def attempt(self, m: Delivered, handler: Callable[[Delivered], object], *, may_start: Callable[[], None],
                wait: Callable[[float], bool], on_park: Callable[[Delivered, int, Exception], None]) -> bool:
        """Call ``handler(m)`` under the policy: True once it returned, or once ``m`` was
        parked (``on_park``) after the policy's attempts; False when ``wait`` said stop while
        retrying (``m`` is not finished). ``may_start`` runs before every attempt (the lease
        check: NotLeader and CoordinationUnavailable propagate). HandlerError for ``raise``."""
        me = threading.get_ident()
        failures = 0
        since = time.monotonic()
        outcome = "not done (stopped)"  # unless the handler returned or it was parked
        try:
            while True:
                may_start()
                try:
                    handler(m)
                    outcome = "done"
                    return True
                except Exception as exc:  # noqa: BLE001 - the policy decides, HandlerError carries it
                    failures += 1
                    step = after_failure(self.policy, failures)
                    with self._lock:
                        self._blocked[me] = BlockedMessage(m.seq, m.key, failures, repr(exc),
                                                           time.monotonic() - since)
                    if step.action == "raise":
                        outcome = "raised to the application"
                        raise HandlerError(self.config.queue, self.config.subscription, m.seq, m.key) from exc
                    if step.action == "park":
                        on_park(m, failures, exc)
                        outcome = "parked"
                        return True
                    with self._lock:
                        self.redeliveries += 1  # the same message is tried again
                    if step.alarm:
                        self._alarm(me, m, failures, exc)
                    if wait(step.delay_s):
                        return False
        finally:
            self._unblocked(me, m, failures, outcome)

    def _unblocked(self, me: int, m: Delivered, failures: int, outcome: str) -> None:
        with self._lock:
            self._blocked.pop(me, None)
            was_alarmed = me in self._alarmed
            self._alarmed.discard(me)
            others = self._alarmed_record()
        if not was_alarmed:
            return
        try:
            self._coord.record(self._lease.held, "set_blocked", others)
        except OrdqError:
            pass  # the coordinator clears it when our lease is released or granted to another
        # "done" only when the handler returned: a consumer stopped while blocked leaves the
        # message unfinished (issue 24 found it logged "done" then).
        log.warning("queue %s/%s: seq %d %s after %d failed attempts; unblocked", self.config.queue,
                    self.config.subscription, m.seq, outcome, failures)

    def _alarmed_record(self) -> dict[str, Any] | None:
        """The alarm to show: the lowest alarmed seq (under the lock)."""
        shown = [self._blocked[t] for t in self._alarmed if t in self._blocked]
        if not shown:
            return None
        b = min(shown, key=lambda b: b.seq)
        return {"seq": b.seq, "key": b.key.hex() if b.key is not None else None, "attempts": b.attempts,
                "error": b.last_error[:500], "consumer": self.config.consumer_id}

    def _alarm(self, me: int, m: Delivered, failures: int, exc: BaseException) -> None:
        """Blocked past the policy's attempts: say so where operators look (the log, and
        ``ordq sub list`` through an ephemeral node), updated as attempts go on."""
        with self._lock:
            first = me not in self._alarmed
            self._alarmed.add(me)
            if first:
                self.alarms += 1
            record = self._alarmed_record()
        if first:
            log.error("queue %s/%s: seq %d (key %r) failed %d times and blocks %s (policy block): %r",
                      self.config.queue, self.config.subscription, m.seq, m.key, failures,
                      "its key" if self.keyed else "the subscription", exc)
        try:
            self._coord.record(self._lease.held, "set_blocked", record)
        except OrdqError:
            pass  # shown at the next attempt (NotFound: not until ordq up upgrades the tree); the log has it

    # -- parking -----------------------------------------------------------------------------

    def park(self, m: Delivered, failures: int, exc: Exception) -> None:
        """Park ``m`` after ``failures`` failed attempts (in keyed delivery its key with it)."""
        self._park(m, attempts=failures, error=repr(exc)[:500], follows=None)

    def follows_parked_key(self, m: Delivered) -> bool:
        """Keyed: when ``m``'s key is parked, park ``m`` behind it (no handler call) and say so."""
        with self._lock:
            first = self._keys.get(key_hex(m.key))
            if m.seq in self._recorded:
                return True  # parked before a restart (its redelivery): in the parking queue already
        if first is None or first > m.seq:
            return False
        self._park(m, attempts=0, error=f"follows parked seq {first} of its key", follows=first)
        return True

    def _park(self, m: Delivered, *, attempts: int, error: str, follows: int | None) -> None:
        """Send ``m`` to the parking queue (acked before anything else), then record it."""
        from ordq.sdk.producer import Producer

        cfg = self.config
        with self._lock:
            if self._producer is None:
                self._ensure_parking_queue()
                self._producer = Producer(ProducerConfig(bootstrap=cfg.bootstrap, zk_hosts=cfg.zk_hosts, root=cfg.root,
                                                         credentials=cfg.credentials, queue=self.target,
                                                         lease_ttl_s=cfg.lease_ttl_s,
                                                         connect_timeout_s=cfg.connect_timeout_s))
                self._producer.start()
            producer = self._producer
        headers = [*m.headers, ("x-ordq-parked-from", f"{cfg.queue}/{cfg.subscription}/{m.seq}".encode()),
                   ("x-ordq-parked-attempts", str(attempts).encode()), ("x-ordq-parked-error", error.encode())]
        ack = producer.send(m.payload, key=m.key, headers=headers).result(60)
        now_us = time.time_ns() // 1000
        guarded(self._coord, self._lease, "record_parked", {
            "seq": m.seq, "seg": m.seg, "offset": m.offset, "key": m.key.hex() if m.key is not None else None,
            "attempts": attempts, "error": error, "parked_at_us": now_us, "parking_queue": self.target,
            "parked_seq": ack.seq, "status": "parked", "keyed": self.keyed, "follows": follows})
        self._audit_skip(m.seq, m.key, "parked", ack.seq, now_us)
        with self._lock:
            if self.keyed:
                k = key_hex(m.key)
                self._keys[k] = min(self._keys.get(k, m.seq), m.seq)
            self._recorded.add(m.seq)
            self.parked += 1
        # The first of a key at WARNING; those that follow it (maybe many) at INFO.
        log.log(logging.INFO if follows is not None else logging.WARNING, "queue %s/%s: seq %d parked to %s as "
                "seq %d (%s)", cfg.queue, cfg.subscription, m.seq, self.target, ack.seq,
                f"after {attempts} failed attempts: {error}" if attempts else error)

    def _ensure_parking_queue(self) -> None:
        made = self._coord.ensure_parking_queue(self.config.queue, self.config.subscription)  # idempotent
        if made != self.target:  # one naming rule (sdk/failure.py parking_queue) on both sides
            raise ConfigError(f"the coordinator made parking queue {made!r}, not {self.target!r}")

    def _audit_skip(self, seq: int, key: bytes | None, action: str, parked_seq: int, at_us: int) -> None:
        if self._audit is not None:
            cfg = self.config
            self._audit.write_rows([(cfg.queue, cfg.subscription, cfg.consumer_id, seq, key_hex(key), action,
                                     self.target, parked_seq, at_us)])

    # -- replay ------------------------------------------------------------------------------

    def _ledger(self) -> list[dict[str, Any]]:
        return list(guarded(self._coord, self._lease, "parked"))

    def _replica_reader(self) -> Any:
        from ordq.sdk.replicas import DescribedQueues, ReplicaReader
        from ordq.wire.client import GrpcTransport

        if self._reader is None:
            self._reader = ReplicaReader(DescribedQueues(self._coord),  # type: ignore[arg-type]
                                         GrpcTransport(rpc_timeout_s=1.0, credentials=self._coord.credentials))
        return self._reader

    def _record_of(self, seq: int) -> dict[str, Any] | None:
        """The ledger record of ``seq`` (None: none), read alone: the whole ledger is a
        ZooKeeper read per record, and a replay of N records must not read it N times."""
        got = guarded(self._coord, self._lease, "parked", {"seq": seq})
        # a list (a coordinator that ignores the seq answers the whole ledger: pick it out)
        return next((dict(r) for r in got if int(r["seq"]) == seq), None)

    def _update_parked(self, seq: int, change: Callable[[dict[str, Any]], dict[str, Any]],
                       known: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace the ledger record of ``seq`` by ``change(record)`` (which raises to refuse),
        only if nobody changed its status meanwhile (else read and decide again). ``known``:
        the record as last read (the first try decides on it; the write's status check tells
        whether it still holds). NotFound when there is none."""
        for _ in range(UPDATE_TRIES):
            now, known = known if known is not None else self._record_of(seq), None
            if now is None:
                raise NotFound(f"{self.config.queue}/{self.config.subscription}: seq {seq} is not in the ledger "
                               "of parked messages")
            new = change(dict(now))
            try:
                return dict(guarded(self._coord, self._lease, "update_parked",
                                    {"seq": seq, "expect_status": now.get("status"), "set": new}))
            except ConflictError:
                continue  # an operator changed it meanwhile: decide again on what is there now
        raise ConflictError(f"{self.config.queue}/{self.config.subscription}: the ledger record of seq {seq} "
                            "kept changing; try again")

    def resolve(self, handler: Callable[[Delivered], object], *, mine: Callable[[str], bool],
                may_start: Callable[[], None], wait: Callable[[float], bool]) -> bool:
        """Replay the records asked for whose keys are ``mine`` (in ``replay_plan`` order), then
        look again which of those keys are still parked. False: stopped while retrying one."""
        failed: set[str] = set()  # keys whose replay failed again in this round: the rest waits
        again: list[int] = []  # the record in hand was parked again

        def parked_again(m: Delivered, failures: int, exc: Exception, r: dict[str, Any]) -> None:
            again.append(failures)
            self._failed_again(m, failures, exc, r)

        plan = [r for r in replay_plan(self._ledger()) if mine(str(r.get("key") or ""))]
        fetched = self._prefetch(plan)
        for r in plan:
            k = str(r.get("key") or "")
            if k in failed:
                continue
            m = self._from_parking_queue(r, fetched)
            if m is None:
                failed.add(k)
                continue
            again.clear()
            on_park = functools.partial(parked_again, r=r)
            if not self.attempt(m, handler, may_start=may_start, wait=wait, on_park=on_park):
                return False
            if again:
                failed.add(k)
                continue
            self._settle(m.seq, "handled", r)
            self._audit_skip(m.seq, m.key, "replayed", int(r["parked_seq"]), time.time_ns() // 1000)
            with self._lock:
                self.replayed += 1
        if self.keyed:
            fresh = parked_keys(self._ledger())
            with self._lock:
                self._keys = {k: s for k, s in self._keys.items() if not mine(k)}
                self._keys.update({k: s for k, s in fresh.items() if mine(k)})
        return True

    def _prefetch(self, plan: list[dict[str, Any]]) -> dict[tuple[str, int], Message]:
        """The parked messages of ``plan`` read in a few large fetches (one per ~1 MiB), not
        one lookup each; what cannot be read now is looked up one by one later."""
        from ordq.sdk.replicas import read_messages

        reader = self._replica_reader()
        out: dict[tuple[str, int], Message] = {}
        for target in sorted({str(r["parking_queue"]) for r in plan}):
            try:
                got = read_messages(reader.store, reader, target,
                                    [int(r["parked_seq"]) for r in plan if r["parking_queue"] == target])
            except OrdqError as exc:
                log.warning("queue %s/%s: reading parked messages from %s: %s", self.config.queue,
                            self.config.subscription, target, exc)
                continue
            out.update({(target, seq): m for seq, m in got.items()})
        return out

    def _from_parking_queue(self, r: dict[str, Any], fetched: dict[tuple[str, int], Message]) -> Delivered | None:
        from ordq.sdk.replicas import read_message

        pm = fetched.get((str(r["parking_queue"]), int(r["parked_seq"])))
        if pm is None:
            reader = self._replica_reader()
            try:
                pm = read_message(reader.store, reader, str(r["parking_queue"]), int(r["parked_seq"])).message
            except (NotFound, CoordinationUnavailable) as exc:
                log.error("queue %s/%s: cannot read parked seq %d (%s seq %s) to replay it: %s", self.config.queue,
                          self.config.subscription, r["seq"], r["parking_queue"], r["parked_seq"], exc)
                return None
        return Delivered(int(r["seq"]), int(r.get("seg", -1)), int(r.get("offset", -1)), pm.payload, pm.key,
                         (*pm.headers, (REPLAYED_HEADER, b"1")), pm.timestamp_us)

    def _failed_again(self, m: Delivered, failures: int, exc: Exception, known: dict[str, Any]) -> None:
        def change(r: dict[str, Any]) -> dict[str, Any]:
            return {**r, "status": moved(r, "failed"), "attempts": int(r.get("attempts", 0)) + failures,
                    "error": repr(exc)[:500]}

        self._update_parked(m.seq, change, known)
        log.warning("queue %s/%s: replayed seq %d failed %d more times; parked again", self.config.queue,
                    self.config.subscription, m.seq, failures)

    def _settle(self, seq: int, event: str, known: dict[str, Any]) -> None:
        def change(r: dict[str, Any]) -> dict[str, Any]:
            return {**r, "status": moved(r, event), "resolved_at_us": time.time_ns() // 1000}

        try:
            self._update_parked(seq, change, known)
        except ConfigError as exc:  # dropped by an operator while its replay ran: it ran anyway
            log.warning("queue %s/%s: replayed seq %d, but the ledger says: %s", self.config.queue,
                        self.config.subscription, seq, exc)

    def close(self) -> None:
        self._closed = True
        if self._alarmed:
            try:  # the coordinator clears it on release too; this is the quick way
                self._coord.record(self._lease.held, "set_blocked", None, timeout_s=2.0)
            except OrdqError:
                pass
        if self._producer is not None:
            self._producer.close()
        if self._reader is not None:
            self._reader.close()


def worker_key_filter(worker: int, workers: int) -> Callable[[str], bool]:
    """Keys (hex) whose messages go to ``worker``."""
    return lambda k: worker_of(bytes.fromhex(k), workers) == worker
