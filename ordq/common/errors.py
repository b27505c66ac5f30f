"""The one error tree of ordq.

Every error raised by ordq derives from :class:`OrdqError`, which always has ``retriable``
(may the same call succeed later, untouched?). Foreign exceptions (kazoo, gRPC, OS) are
translated once, where they enter, with ``raise ... from exc``.

    OrdqError
    ├── ConfigError (ValueError)          bad option, bad name, bad argument
    │   └── InvalidName
    ├── NotFound (LookupError)
    │   ├── QueueNotFound
    │   ├── GroupNotFound
    │   ├── SegmentNotFound
    │   ├── SubscriptionNotFound
    │   └── TopicNotFound
    ├── AlreadyExists
    ├── IllegalTransition                 a state-machine transition whose precondition fails
    ├── InvariantViolation                a transition produced a state breaking I1–I5 (a bug)
    ├── CorruptState                      one queue's state in ZooKeeper does not parse (that queue only)
    ├── ConflictError                     conditional write lost a race (retriable)
    ├── CoordinationUnavailable           ZooKeeper unreachable (retriable)
    │   ├── NotCoordinatorLeader          this coordinator does not lead; ask the one named (retriable)
    │   └── TokensUnavailable             a server cannot judge tokens now: its token store is unreadable (retriable)
    ├── ZkAccessDenied                    ZooKeeper's ACLs refuse this identity the operation
    ├── BrokerUnavailable                 a broker process did not answer (retriable)
    ├── NoGroupAvailable                  no eligible broker group to write to (retriable)
    ├── FencedError                       a higher producer epoch took over: stop
    ├── EpochNotIssued                    a writer claimed a producer epoch ZooKeeper never issued
    ├── NotLeader                         this consumer lost its subscription's lease: stop
    │   └── LeaseLost                     the coordinator granted the lease to another (the SDK rejoins)
    ├── GapDetected                       a seq is missing in delivery: stop and alarm
    ├── HandlerError                      keyed delivery: the application's handler raised
    ├── PartitionNotLed                   a topic's key routes to a partition this producer does not lead
    ├── TopicChanged                      a topic's partition count changed under its producer: stop
    ├── MessageTooLarge (ValueError)
    ├── CorruptLog                        bad CRC before the tail of a stored segment
    ├── DiskFull                          the log could not be written: nothing half-served
    ├── WaitTimeout (TimeoutError)        a bounded wait ran out (retriable)
    ├── ClosedError                       you closed it
    ├── PermissionDenied                  no credentials, or they lack the role the call needs
    ├── ExternalProcessError              ZooKeeper/Java missing or a child process failed
    ├── OutboxError                       the outbox database refused or disagrees with the queue
    │   ├── OutboxUnavailable             the database cannot be reached (retriable)
    │   ├── OutboxTableMissing (NotFound) the outbox table was never created
    │   ├── OutboxPositionError           the queue's tail and the outbox (or binlog) do not fit together
    │   ├── BinlogUnavailable             ordq cdc: the source database's binlog cannot be read (retriable)
    │   ├── ApplyTargetUnavailable        ordq cdc apply: the target database cannot be reached (retriable)
    │   └── ApplyTargetError              ordq cdc apply: the target refused a change (missing table, column)
    └── MirrorError                       ordq mirror: the copy and its source do not fit together
        ├── MirrorLoop                    a message's origin chain names the target cluster (A -> B -> A)
        └── MirrorDiverged                the source cannot continue the copy (a moved cursor, dropped messages)
"""

from __future__ import annotations


class OrdqError(Exception):
    """Root of every ordq error. ``retriable`` says whether retrying unchanged may succeed."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigError(OrdqError, ValueError):
    """A bad option, name or argument given by the caller."""


class InvalidName(ConfigError):
    def __init__(self, kind: str, name: str, rule: str) -> None:
        super().__init__(f"invalid {kind} name {name!r}: must match {rule}")
        self.kind = kind
        self.name = name


class NotFound(OrdqError, LookupError):
    """Something named does not exist."""


class QueueNotFound(NotFound):
    def __init__(self, queue: str) -> None:
        super().__init__(f"unknown queue {queue!r} (create it with: ordq queue create {queue})")
        self.queue = queue


class GroupNotFound(NotFound):
    def __init__(self, gid: str) -> None:
        super().__init__(f"unknown broker group {gid!r} (register it with: ordq group add {gid})")
        self.gid = gid


class SegmentNotFound(NotFound):
    def __init__(self, queue: str, seg: int) -> None:
        super().__init__(f"queue {queue!r} has no segment {seg}")
        self.queue = queue
        self.seg = seg


class SubscriptionNotFound(NotFound):
    def __init__(self, queue: str, sub: str) -> None:
        super().__init__(f"queue {queue!r} has no subscription {sub!r}")
        self.queue = queue
        self.sub = sub


class TopicNotFound(NotFound):
    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r} (create it with: ordq topic create {topic} --partitions N)")
        self.topic = topic


class AlreadyExists(OrdqError):
    """Creating something that is already there."""


class IllegalTransition(OrdqError):
    """A state-machine transition whose precondition does not hold in the current state."""

    def __init__(self, transition: str, reason: str) -> None:
        super().__init__(f"{transition}: {reason}")
        self.transition = transition
        self.reason = reason


class InvariantViolation(OrdqError):
    """A transition produced a state that breaks an invariant (I1–I5). Always a bug."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant {invariant} violated: {detail}")
        self.invariant = invariant
        self.detail = detail


class CorruptState(OrdqError):
    """A queue's ``state`` node does not parse (not UTF-8, not JSON, fields missing or of the
    wrong type, or invariants I1–I4 broken): an error of that queue only. Nothing is written
    to it until an operator restores it; every other queue is served as usual."""

    def __init__(self, queue: str, detail: str) -> None:
        super().__init__(f"queue {queue!r}: its state in ZooKeeper is corrupt ({detail}); "
                         "restore it from a backup or delete the queue")
        self.queue = queue
        self.detail = detail


class ConflictError(OrdqError):
    """A conditional (versioned) write lost a race with another writer."""

    retriable = True


class CoordinationUnavailable(OrdqError):
    """ZooKeeper cannot be reached."""

    retriable = True


class NotCoordinatorLeader(CoordinationUnavailable):
    """The coordinator asked is not the elected one (coordinator/service.py); ``leader`` is the
    address of the one that is, as far as it knows ("" when none leads)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"this coordinator does not lead; the leader is {leader or 'not elected yet'}")
        self.leader = leader


class TokensUnavailable(CoordinationUnavailable):
    """A broker or the coordinator service cannot judge any token now: its copy of the token
    store failed to load (ZooKeeper away) and it refuses to guess. Not a refusal: the same call
    may pass once it loads again (retriable; the SDK waits within its bounds)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"cannot check tokens now (the token store is unreadable: {detail}); retry shortly")
        self.detail = detail


class ZkAccessDenied(OrdqError):
    """ZooKeeper refused an operation: the ordq root is protected by ACLs and this process's
    credentials (``--zk-auth`` / ``ORDQ_ZK_AUTH``; none given, or a client's where an admin's
    is needed) do not allow it. Nothing was changed."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"ZooKeeper refused access: {detail} (pass credentials with --zk-auth-file PATH or "
                         "ORDQ_ZK_AUTH; see docs/SECURITY.md)")


class BrokerUnavailable(OrdqError):
    """A broker process did not answer in time or refused the connection."""

    retriable = True

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"broker {address} unavailable: {detail}")
        self.address = address


class NoGroupAvailable(OrdqError):
    """No broker group is eligible to take writes (all failed or holding backlog)."""

    retriable = True

    def __init__(self, queue: str, detail: str = "") -> None:
        msg = f"queue {queue!r}: no broker group available for writes"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.queue = queue


class FencedError(OrdqError):
    """This producer's epoch was superseded: another leader took over. Stop writing."""

    def __init__(self, queue: str, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"queue {queue!r}: producer epoch {epoch} is fenced by epoch {current_epoch}"
        )
        self.queue = queue
        self.epoch = epoch
        self.current_epoch = current_epoch


class EpochNotIssued(OrdqError):
    """A broker refused a write or fence claiming a producer epoch above the one ZooKeeper
    holds for the queue: no election issued it (a hand-made or buggy client); or the current
    epoch without the key its claim was issued with (``key_mismatch``: another identity).
    Nothing was stored and the real leader is not fenced."""

    def __init__(self, queue: str, epoch: int, current_epoch: int, *, key_mismatch: bool = False) -> None:
        if key_mismatch:
            super().__init__(f"queue {queue!r}: producer epoch {epoch} was not issued to this caller (its epoch "
                             "key is missing or wrong); refused, nothing stored")
        else:
            super().__init__(f"queue {queue!r}: producer epoch {epoch} was never issued (ZooKeeper holds epoch "
                             f"{current_epoch}); refused, nothing stored")
        self.key_mismatch = key_mismatch
        self.queue = queue
        self.epoch = epoch
        self.current_epoch = current_epoch


class NotLeader(OrdqError):
    """This consumer can no longer be sure it holds its subscription's lease (its ZooKeeper
    session expired, e.g. after the process was frozen past it): another instance may be
    delivering. It delivered nothing since it stopped being sure, and commits nothing more.
    Stop; a new ``Consumer`` joins the election again."""

    def __init__(self, queue: str, subscription: str, reason: str) -> None:
        super().__init__(f"queue {queue!r} subscription {subscription!r}: this consumer is no longer the "
                         f"subscription's leader ({reason}); it stopped delivering")
        self.queue = queue
        self.subscription = subscription
        self.reason = reason


class LeaseLost(NotLeader):
    """The coordinator no longer counts this client as the holder of its lease (``kind``:
    producer, consumer or member; ``name``: the subscription or group, "" for a producer):
    another generation was granted after it expired, or it was released. The SDK's clients
    rejoin by themselves (a new Acquire); only a final refusal ends them."""

    def __init__(self, kind: str, queue: str, name: str, reason: str) -> None:
        OrdqError.__init__(self, f"{kind} lease of {queue!r}{'/' + repr(name) if name else ''} lost: {reason}")
        self.kind = kind
        self.queue = queue
        self.subscription = name
        self.reason = reason


class GapDetected(OrdqError):
    """A consumer saw a seq beyond the next expected one: a message is missing. Never skipped."""

    def __init__(self, queue: str, expected_seq: int, got_seq: int) -> None:
        super().__init__(
            f"queue {queue!r}: gap in delivery, expected seq {expected_seq}, got {got_seq}"
        )
        self.queue = queue
        self.expected_seq = expected_seq
        self.got_seq = got_seq


class RetentionOvertook(OrdqError):
    """Retention dropped messages a subscription had not delivered yet. Raised by its consumer
    instead of skipping them: the application decides (usually ``ordq sub reset ... --to
    earliest``, after taking note of what was lost)."""

    def __init__(self, queue: str, subscription: str, next_seq: int, oldest_kept_seq: int) -> None:
        missed = oldest_kept_seq - next_seq
        super().__init__(
            f"subscription {queue}/{subscription} fell behind the queue's retention: {missed} messages "
            f"(seqs {next_seq} to {oldest_kept_seq - 1}) were dropped before it read them. Nothing was skipped; "
            f"to go on from the oldest kept message, stop its consumers and run: "
            f"ordq sub reset {queue} {subscription} --to earliest"
        )
        self.queue = queue
        self.subscription = subscription
        self.next_seq = next_seq
        self.oldest_kept_seq = oldest_kept_seq
        self.missed = missed


class HandlerError(OrdqError):
    """The application's handler raised on message ``seq`` in keyed delivery
    (``Consumer.run_keyed``); the handler's exception is ``__cause__``. Nothing at or past
    ``seq`` was committed."""

    def __init__(self, queue: str, subscription: str, seq: int, key: bytes | None) -> None:
        super().__init__(f"queue {queue!r} subscription {subscription!r}: handler failed on seq {seq} "
                         f"(key {key!r})")
        self.queue = queue
        self.subscription = subscription
        self.seq = seq
        self.key = key


class PartitionNotLed(OrdqError):
    """A key routes to a partition this producer does not lead."""

    def __init__(self, topic: str, partition: int, led: tuple[int, ...]) -> None:
        super().__init__(
            f"topic {topic!r}: the key routes to partition {partition}, which this producer does not lead (it leads "
            f"{', '.join(map(str, led)) or 'none'}); send it from the process that leads it, or add it to partitions=")
        self.topic, self.partition, self.led = topic, partition, tuple(led)


class TopicChanged(OrdqError):
    """The topic's partition count changed while this producer ran: keys route differently."""

    def __init__(self, topic: str, old: int, new: int | None) -> None:
        now = "was deleted" if new is None else f"has {new} partitions now"
        super().__init__(f"topic {topic!r} had {old} partitions when this producer started and {now}: keys route "
                         "differently, so this producer stopped sending; start a new one")
        self.topic, self.old, self.new = topic, old, new


class MessageTooLarge(OrdqError, ValueError):
    """A message (payload, key and headers) or a batch over a limit; nothing of it was stored.
    ``limit_of`` names the limit (e.g. "queue 'orders' max_message_bytes")."""

    def __init__(self, size: int, limit: int, limit_of: str = "") -> None:
        of = f" ({limit_of})" if limit_of else ""
        super().__init__(f"message of {size} bytes exceeds the limit of {limit} bytes{of}")
        self.size = size
        self.limit = limit
        self.limit_of = limit_of


class CorruptLog(OrdqError):
    """A stored batch failed its CRC before the tail: the replica stops serving that segment."""

    def __init__(self, path: str, position: int, detail: str) -> None:
        super().__init__(f"corrupt log {path} at byte {position}: {detail}")
        self.path = path
        self.position = position


class DiskFull(OrdqError):
    """The log could not be written for lack of space; nothing partial is served."""

    retriable = True


class WaitTimeout(OrdqError, TimeoutError):
    """A bounded wait ran out."""

    retriable = True


class PermissionDenied(OrdqError):
    """The broker refused the caller: no or unknown credentials, or they lack ``role`` on ``queue``."""

    def __init__(self, queue: str, role: str, why: str) -> None:
        # No queue: refused before the request's body was read (an unknown token, none at all)
        super().__init__(f"permission denied: {role!r} on queue {queue!r}: {why}" if queue
                         else f"permission denied: {why}")
        self.queue, self.role, self.why = queue, role, why


class ClosedError(OrdqError):
    """The object was closed by its owner; calls after close() raise this."""


class ExternalProcessError(OrdqError):
    """A required program (Java, ZooKeeper) is missing, or a child process failed to start."""


class OutboxError(OrdqError):
    """The outbox database refused a statement, or its rows and the queue disagree."""


class OutboxUnavailable(OutboxError):
    """The outbox database cannot be reached (bad address, server down, bad credentials)."""

    retriable = True

    def __init__(self, database: str, reason: str) -> None:
        super().__init__(f"cannot open the outbox database {database}: {reason}")
        self.database = database
        self.reason = reason


class OutboxTableMissing(OutboxError, NotFound):
    def __init__(self, table: str, database: str | None = None) -> None:
        where = database or "the database"
        how = f"ordq outbox init {database or 'DATABASE'}" + ("" if table == "ordq_outbox" else f" --table {table}")
        super().__init__(f"no outbox table {table!r} in {where} (create it with: {how})")
        self.table = table
        self.database = database


class OutboxPositionError(OutboxError):
    """Where the queue says the relay stopped cannot be matched to the outbox: another
    producer wrote the queue's last message, or the queue is behind what the outbox recorded
    as shipped (the queue was deleted and made again). Nothing is shipped."""

    def __init__(self, queue: str, detail: str, *, process: str = "outbox relay") -> None:
        super().__init__(f"{process} for queue {queue!r}: {detail}")
        self.queue = queue
        self.process = process  # which producer could not resume: "outbox relay", "binlog shipper"


class BinlogUnavailable(OutboxError):
    """``ordq cdc``: the source database cannot be reached, or refuses to stream its binlog."""

    retriable = True

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"cannot read the binlog of {source}: {reason}")
        self.source = source
        self.reason = reason


class ApplyTargetUnavailable(OutboxError):
    """``ordq cdc apply``: the target database cannot be reached (bad address, server down)."""

    retriable = True

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"cannot reach the target database {target}: {reason}")
        self.target = target
        self.reason = reason


class ApplyTargetError(OutboxError):
    """``ordq cdc apply``: the target refused a change (no such table or column, a bad value).
    Nothing of that change, nor anything after it of its key, is applied."""

    def __init__(self, table: str, seq: int | None, reason: str) -> None:
        what = f"apply seq {seq} to table {table}" if seq is not None else f"write table {table}"
        super().__init__(f"cannot {what}: {reason}")
        self.table = table
        self.seq = seq
        self.reason = reason


class MirrorError(OrdqError):
    """``ordq mirror``: the copy and its source cannot be carried on together (a loop, a
    copy that is not this source's, a source position the copy cannot continue from)."""


class MirrorLoop(MirrorError):
    """A message's origin chain already names the target cluster: mirroring it would loop
    (A -> B -> A). Nothing of it is written."""

    def __init__(self, queue: str, seq: int, target: str, chain: list[str]) -> None:
        super().__init__(f"mirror loop refused: {queue} seq {seq} came from {' -> '.join(chain)}, and the target "
                         f"cluster {target} is in that chain (a mirror must not write a copy back where it came from)")
        self.queue, self.seq, self.target, self.chain = queue, seq, target, chain


class MirrorDiverged(MirrorError):
    """The copy and the source do not continue each other: the source delivered seq ``got``
    where the copy needs ``expected`` next (its subscription was moved past what the copy
    holds, or the messages were dropped by retention), or the copy's last message is not
    this source's."""

    def __init__(self, source: str, detail: str, *, expected: int | None = None, got: int | None = None) -> None:
        super().__init__(f"mirror of {source}: {detail}")
        self.source, self.expected, self.got = source, expected, got
