"""The ZooKeeper store's plumbing: the kazoo client it is made with, the translation of kazoo's
errors (``zk_errors``, the one place they enter), every request bounded in time, and the reads
of a queue's settings and state that every part of the store needs.

Rules: no policy (decisions are in ``ordq.coordinator.state``); a part of the store
(``store_groups``, ``store_cursors``, ``store_subs``, ``store``) subclasses ``ZkBase`` and sends
every request through ``_wait``/``_read`` under ``_errors``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from ordq.common.errors import (
    ConfigError,
    CoordinationUnavailable,
    CorruptState,
    OrdqError,
    QueueNotFound,
    ZkAccessDenied,
)
from ordq.coordinator.acl_client import AclClient
from ordq.coordinator.paths import Paths, check_zk_hosts
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_values import DeletionLog, QueueConfig, StateVersion, json_value, parse_state
from ordq.coordinator.zk_answer import zk_answer
from ordq.coordinator.zk_tls import PollHandler, TlsHandler, cut_connection

# How long a read keeps retrying while the connection to ZooKeeper is lost. kazoo reconnects
# by itself (to another node of an ensemble, or to the same one after a stall of this process
# made it miss a heartbeat: with a 1 s session the answer to a ping must come within ~0.3 s);
# such a blip must not fail a producer's failover or a consumer's poll.
READ_RETRY_S = 10.0
# How long one request to ZooKeeper waits for its answer. kazoo queues a request made while the
# connection is down and would wait for the whole outage; 5 s rides out a reconnection (leader
# re-election ~0.4 s, reconnecting to a restarted standalone server 1-3 s: STACK-NOTES) and still
# lets a CLI command, the coordinator or a producer's failover report or retry within seconds.
OP_TIMEOUT_S = 5.0
# How long a close waits for the server's answer before it cuts the connection (``ZkBase.close``)
CLOSE_GRACE_S = 1.0
# Deletions of other queues a deletion may lose its race to (each re-reads the recent ones).
MAX_DELETE_ATTEMPTS = 50
T = TypeVar("T")


def new_client(hosts: str, *, session_timeout_s: float, auth: str | None = None) -> AclClient:
    """A kazoo client that tries to reconnect at least every quarter of its session.

    kazoo's default reconnect back-off doubles up to an hour: after a ZooKeeper outage of a
    few seconds (a lost quorum) its next attempt could come seconds after the servers are
    back, when a short session has already expired there, so every leader would lose its
    lease for an outage it had survived. Capped at a quarter session, a client reconnects in
    time to keep its session whenever the servers kept it.

    ``auth``: ``user:password`` of a ZooKeeper digest identity (coordinator/acl.py), or None."""
    from ordq.common.security import zk_tls_options

    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=max(0.05, session_timeout_s / 4))
    # TLS when the cluster at this address serves ZooKeeper over TLS (ordq/common/security.py)
    tls = zk_tls_options(hosts)
    # one SSL context per process, not one (with the system CA bundle) per attempt; poll(2)
    # instead of a new epoll selector per request and answer (zk_tls.poll_select)
    tls["handler"] = TlsHandler() if tls else PollHandler()
    return AclClient(hosts=check_zk_hosts(hosts), timeout=session_timeout_s, connection_retry=retry, auth=auth, **tls)


@contextlib.contextmanager
def zk_errors(hosts: str = "") -> Iterator[None]:
    """Translate kazoo's connection errors to ordq's (the one place they enter)."""
    try:
        yield
    except NoAuthError as exc:
        raise ZkAccessDenied(f"{type(exc).__name__} at {hosts or 'ZooKeeper'}") from exc
    except KazooTimeoutError as exc:  # no answer within the operation timeout (ZkBase._wait)
        where = f" at {hosts}" if hosts else ""
        raise CoordinationUnavailable(f"ZooKeeper unreachable{where}: no answer in time") from exc
    except (ConnectionLoss, SessionExpiredError, SessionMovedError, ConnectionClosedError, OperationTimeoutError,
            RetryFailedError) as exc:
        where = f" at {hosts}" if hosts else ""
        raise CoordinationUnavailable(f"ZooKeeper unreachable{where}: {type(exc).__name__}") from exc



# ZooKeeper requests each thread has waited for (``_wait``): what a coordinator call cost
# ZooKeeper and the kazoo thread, charged to its caller (coordinator/fair_share.py).
_WAITED = threading.local()


def requests_waited() -> int:
    """ZooKeeper requests the calling thread has waited for so far (a running count)."""
    return int(getattr(_WAITED, "n", 0))


class WrittenStates:
    """The queue states this process wrote, each with the version the write made, until a read
    of that version or a later one (``seen``) took its place (issue 43: ``queue list`` right
    after a group's failure re-read from ZooKeeper every state the daemon had just written
    itself, ~15 s of the listing's 23 s at 10^5 queues). The elected coordinator is the one
    writer of the states, so what it wrote last is what ZooKeeper holds, as of that write.
    Thread-safe; holds no more than the states written and not read back since.

    While ``leading`` (the elected daemon's term: ``CoordinatorDaemon._lead``) it also keeps
    the first state of each queue this process creates (``created``, version 0), so that a
    verdict plans the moves of a dead group's new queues without reading them (issue 43:
    7,600-12,800 such states read in 14-18 s at 10^5 queues, scale43k). Bounded: a
    non-leader keeps none (no view of it would ever read them back), and a term's end drops
    those its view did not read. A state kept of a queue deleted since (by any process) is
    never written over its successor: each carries its ``StateVersion``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, tuple[QueueState, StateVersion]] = {}
        self._leading = False
        self.changes = 0  # one more each time a state is kept, replaced or dropped (a spread pass's skip)

    def leading(self, on: bool) -> None:
        """This process's daemon leads (``on``) or no longer does: then the creations kept and
        not read back are dropped (version 0: every write makes a later version)."""
        with self._lock:
            self._leading = on
            if not on:
                self._states = {q: held for q, held in self._states.items() if held[1].znode > 0}
                self.changes += 1

    def created(self, queue: str, state: QueueState, deletions: int) -> None:
        """``queue`` was created with ``state`` (its node at version 0) after the deletion
        count ``deletions`` was read; kept only while leading. It replaces what was kept of a
        queue of that name: a new creation is a new incarnation."""
        with self._lock:
            if self._leading:
                self._states[queue] = (state, StateVersion(0, deletions))
                self.changes += 1

    def note(self, queue: str, state: QueueState, version: StateVersion) -> None:
        with self._lock:
            held = self._states.get(queue)
            if held is None or held[1].znode < version.znode or held[1].deletions < version.deletions:
                self._states[queue] = (state, version)
                self.changes += 1

    def seen(self, queue: str, version: StateVersion) -> None:
        """``queue``'s state was read at ``version``: what was written before it is no news,
        nor is what was written before a deletion the read came after (it may be of a queue
        deleted since)."""
        with self._lock:
            held = self._states.get(queue)
            if held is not None and (held[1].znode <= version.znode or held[1].deletions < version.deletions):
                del self._states[queue]
                self.changes += 1

    def get(self, queue: str) -> tuple[QueueState, StateVersion] | None:
        with self._lock:
            return self._states.get(queue)

    def snapshot(self) -> dict[str, tuple[QueueState, StateVersion]]:
        """Every state kept, at once: one lock for a reader of many queues (``known_queues`` of
        10^5 took 0.9-2.6 s under load with a lock a queue, scale43n), not ``get`` for each."""
        with self._lock:
            return dict(self._states)

    def creations(self) -> dict[str, tuple[QueueState, StateVersion]]:
        """The creations kept (``created``) and not read back or written since."""
        with self._lock:
            return {q: held for q, held in self._states.items() if held[1].znode == 0}

    def forget(self, queue: str) -> None:
        """``queue`` was deleted: what was kept of it is no state of any queue now."""
        with self._lock:
            if self._states.pop(queue, None) is not None:
                self.changes += 1


def close_all(stores: Sequence[ZkBase | None]) -> None:
    """Close these sessions side by side (None: none there): a server that does not answer
    costs one grace in all, not one a session (a coordinator has three)."""
    closing = [threading.Thread(target=s.close, name="ordq-zk-close-all", daemon=True) for s in stores if s is not None]
    for t in closing:
        t.start()
    for t in closing:
        t.join(2 * CLOSE_GRACE_S + 1.0)


class ZkBase:
    """One cluster's ZooKeeper (under ``paths.root``) through one kazoo client: the requests
    every part of the store makes."""

    def __init__(self, client: KazooClient, paths: Paths, *, owns_client: bool = False,
                 read_retry_s: float = READ_RETRY_S, op_timeout_s: float = OP_TIMEOUT_S) -> None:
        """``op_timeout_s``: how long one request waits for ZooKeeper's answer (then
        CoordinationUnavailable); every operation is bounded by it (a read retried across a
        lost connection by up to ``read_retry_s`` more)."""
        if not op_timeout_s > 0:
            raise ConfigError(f"op_timeout_s must be > 0, not {op_timeout_s}")
        self.client = client
        self._op_timeout_s = op_timeout_s
        self.paths = paths
        self.written = WrittenStates()  # shared by a coordinator's stores (commands/coordinator.py)
        # statistics (a dead group's moves log them, issue 43): batched transactions of states
        # that failed and were done again part by part (``apply_batch``), and batches checked
        # again against the deletion log (``_revalidated``)
        self.batches_redone = 0
        self.revalidations = 0
        self._owns_client = owns_client
        self._hosts = str(getattr(client, "hosts", ""))
        self._retry = KazooRetry(max_tries=-1, delay=0.02, backoff=2, max_delay=0.5, deadline=read_retry_s,
                                 ignore_expire=True)
        if isinstance(client, AclClient) and client.connected:
            with self._errors():
                client.follow(paths.root)  # nodes it creates get their ACL once the root is protected

    @property
    def hosts(self) -> str:
        """The ZooKeeper connection string this store's client was made with ("h:p,h:p")."""
        hosts = getattr(self.client, "hosts", None)
        if isinstance(hosts, list):
            return ",".join(f"{h}:{p}" for h, p in hosts)
        return self._hosts

    def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and free the client. A server
        that does not answer the close within CLOSE_GRACE_S (paused, hung) has the
        connection cut (``cut_connection``): the session then ends at its expiry."""
        if not self._owns_client:
            return
        done = threading.Event()
        failed: list[Exception] = []

        def stop() -> None:
            try:
                self.client.stop()
                self.client.close()
            except Exception as exc:  # noqa: BLE001 - raised in the caller's thread below
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=stop, name="ordq-zk-close", daemon=True).start()
        if not done.wait(CLOSE_GRACE_S):
            cut_connection(self.client)
            done.wait(CLOSE_GRACE_S)
        if failed:
            raise failed[0]

    def _acl_of(self, path: str) -> Any:
        """The ACL a node created at ``path`` gets (None: the default; coordinator/acl.py) —
        for transactions, which do not go through the client's ``create_async``."""
        return self.client.acl_of(path) if isinstance(self.client, AclClient) else None

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return zk_errors(self._hosts)

    def _wait(self, request: Any) -> Any:
        """The answer to one kazoo request (the result of a ``*_async`` call), waited for at
        most ``op_timeout_s``, else KazooTimeoutError (CoordinationUnavailable under
        ``_errors``). kazoo queues a request made while disconnected and its blocking calls
        wait for the whole outage: every request of this store goes through here. A request
        that timed out may still be sent and applied after a reconnection (in order, before
        any later request of this client), like a write whose connection dropped in flight;
        but a create with ``makepath`` whose parents were missing sends its parents and its
        second try from kazoo's callbacks, after requests made later: a conditional write
        (a create, a versioned set) then finds it as a conflict.
        kazoo's async results are thread-safe: callers may be on any thread."""
        _WAITED.n = getattr(_WAITED, "n", 0) + 1
        return zk_answer(request, self._op_timeout_s)  # not request.get(): coordinator/zk_answer.py

    def _read(self, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Send a read (``get_async``, ``get_children_async``) and wait for it (``_wait``);
        send it again while the connection is lost or the session was replaced, up to
        ``read_retry_s`` (then RetryFailedError: CoordinationUnavailable under ``_errors``).
        A read that gets no answer within ``op_timeout_s`` (ZooKeeper down) is not retried.
        Other kazoo errors (NoNodeError, ...) propagate at once. Never for writes: a write lost
        in flight may have landed (see ``apply``, ``commit_cursor``)."""
        return self._retry.copy()(lambda: self._wait(request(*args, **kwargs)))

    def _delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything under it, children first, each request bounded.
        NoNodeError when ``path`` itself is missing (kazoo's recursive delete ignores that,
        and waits without limit while disconnected)."""
        for child in self._read(self.client.get_children_async, path):
            with contextlib.suppress(NoNodeError):  # deleted meanwhile
                self._delete_tree(f"{path}/{child}")
        self._wait(self.client.delete_async(path))

    def _ask_deletions(self) -> Any:
        """Send the read of the queues' deletion count (``StateVersion``); a state read sent
        after it on this client is answered after it (ZooKeeper keeps a session's order), so
        the count is one read before that state was."""
        return self.client.exists_async(self.paths.queues)

    def _deletions(self, request: Any) -> int:
        """The answer to ``_ask_deletions`` (0 while the queues folder does not exist yet)."""
        stat = self._wait(request)
        return int(stat.version) if stat is not None else 0

    def _check_deletions(self, tx: Any, deletions: int) -> None:
        """Add to a transaction that writes queue states: no queue was deleted since
        ``deletions`` was read (``StateVersion``)."""
        tx.check(self.paths.queues, deletions)

    def _delete_queue(self, queue: str) -> None:
        """Delete a queue's nodes: first its state, in one transaction with the deletion count's
        bump and the queue named in the recent deletions (``DeletionLog``: a write planned on
        this queue's state can then never land on a queue created later under its name), then
        the rest. NoNodeError when the queue's node is missing; a state already gone (a
        deletion cut short) is not counted again."""
        for _ in range(MAX_DELETE_ATTEMPTS):
            log = self._deletion_log()
            tx = self.client.transaction()
            tx.delete(self.paths.state(queue))
            tx.set_data(self.paths.queues, log.with_deletion(queue), version=log.count)
            results = self._wait(tx.commit_async())
            if isinstance(results[1], BadVersionError):
                continue  # another queue deleted meanwhile: name this one after it
            if not isinstance(results[0], NoNodeError) and any(isinstance(r, Exception) for r in results):
                raise_first(results)
            break
        else:
            raise OrdqError(f"queue {queue!r}: gave up deleting it after {MAX_DELETE_ATTEMPTS} deletions of others")
        self._delete_tree(self.paths.queue(queue))

    def _deletion_log(self) -> DeletionLog:
        """The recent deletions of queues (``DeletionLog``), as of now."""
        data, stat = self._read(self.client.get_async, self.paths.queues)
        return DeletionLog.parse(data, stat.version)

    def _in_thread(self, call: Callable[[], T], undo: Callable[[T], object] | None = None) -> T:
        """Run a kazoo recipe call (Lock), whose blocking requests take no timeout, on a helper
        thread and wait for it at most ``op_timeout_s`` (else KazooTimeoutError). The call goes
        on in the background when we stop waiting; ``undo`` is then applied to its result."""
        done = threading.Event()
        guard = threading.Lock()
        outcome: list[Any] = []  # [result] or [None, exception]
        gave_up = False

        def run() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome.extend((None, exc))
            with guard:
                late = gave_up
                done.set()
            if late and undo is not None and len(outcome) == 1:
                with contextlib.suppress(Exception):
                    undo(outcome[0])

        threading.Thread(target=run, name="ordq-zk-recipe", daemon=True).start()
        if not done.wait(self._op_timeout_s):
            with guard:
                if not done.is_set():
                    gave_up = True
                    raise KazooTimeoutError(f"no answer within {self._op_timeout_s:g}s")
        if len(outcome) == 2:
            raise outcome[1]
        result: T = outcome[0]
        return result

    def queue_config(self, queue: str) -> QueueConfig:
        with self._errors():
            try:
                data, _ = self._read(self.client.get_async, self.paths.queue(queue))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return QueueConfig(**json_value(data))

    def state_and_config(self, queue: str, *, sync: bool = False) -> tuple[QueueState, QueueConfig]:
        """The queue's state and settings in one round trip (the reads pipelined), after a
        ``sync`` when asked (then a write another client's session just made is seen, as by
        ``ZkStore.producer_epoch``): what a broker reads for a new segment's first write."""
        state_path, config_path = self.paths.state(queue), self.paths.queue(queue)

        def once() -> tuple[bytes, bytes]:
            synced = self.client.sync_async(state_path) if sync else None
            state = self.client.get_async(state_path)
            config = self.client.get_async(config_path)
            if synced is not None:
                self._wait(synced)
            return self._wait(state)[0], self._wait(config)[0]

        with self._errors():
            try:
                state_data, config_data = self._retry.copy()(once)
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return parse_state(queue, state_data), QueueConfig(**json_value(config_data))

    def load_state(self, queue: str, *, watch: Callable[[Any], None] | None = None) -> tuple[QueueState, int]:
        """The queue's state and its node's version (to show or follow it; a write reads with
        ``load_state_to_write``); ``watch`` is called once on the next change (pass the same
        callable each time: kazoo keeps a set)."""
        st, stat = self.load_state_stat(queue, watch=watch)
        return st, stat.version

    def load_state_stat(self, queue: str, *, watch: Callable[[Any], None] | None = None) -> tuple[QueueState, Any]:
        """``load_state`` with its node's whole stat (kazoo's ZnodeStat): its ``mzxid`` is the
        state's stamp (``state_stamp``)."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.state(queue), watch=watch)
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return parse_state(queue, data), stat

    def state_stamp(self, queue: str, sub: str = "", *, wait_s: float | None = None) -> int:
        """The zxid of the queue state's last change (its node's ``mzxid``); -1 when the queue,
        or the subscription ``sub`` if named, is gone. Reads the nodes' stats, not their data,
        in one round trip. Every change of the state changes the stamp, a queue deleted and
        created again too (zxids never repeat), so a client that holds a state and its stamp
        knows from the stamp alone whether it is still the latest (a consumer's heartbeat:
        ``LeaseRequest.with_state``, sdk/_queue_view.py).

        ``wait_s``: sent once, its answers awaited this long at most (CoordinationUnavailable
        then): for a caller that must not wait on ZooKeeper (a lease renewal is answered from
        memory); None: as every read (``_read``)."""
        paths = [self.paths.state(queue)] + ([self.paths.sub(queue, sub)] if sub else [])

        def stats() -> list[Any]:
            asked = [self.client.exists_async(p) for p in paths]
            if wait_s is None:
                return [self._wait(request) for request in asked]
            deadline = time.monotonic() + wait_s
            return [zk_answer(request, max(0.0, deadline - time.monotonic())) for request in asked]

        with self._errors():
            got = stats() if wait_s is not None else self._retry.copy()(stats)
        return -1 if any(stat is None for stat in got) else int(got[0].mzxid)

    def load_state_to_write(self, queue: str) -> tuple[QueueState, StateVersion]:
        """The queue's state and the version a write of it checks (``StateVersion``: the
        deletion count read first, in the same round trip)."""

        def once() -> tuple[bytes, StateVersion]:
            deletions = self._ask_deletions()
            data, stat = self._wait(self.client.get_async(self.paths.state(queue)))
            return data, StateVersion(stat.version, self._deletions(deletions))

        with self._errors():
            try:
                data, version = self._retry.copy()(once)
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return parse_state(queue, data), version

    def load_states(self, queues: Sequence[str], *, with_subs: bool = False, slice_size: int = 500,
                    watch: Callable[[Any], None] | None = None,
                    ) -> dict[str, tuple[QueueState, StateVersion, list[str] | None] | CorruptState]:
        """Many queues' states (and their subscriptions' names when ``with_subs``), the reads
        sent ``slice_size`` at a time and then awaited (kazoo pipelines them on one connection):
        what ``queue list`` reads of the queues the coordinator's copy does not hold (issue 43).
        A queue deleted meanwhile is left out; one whose state does not parse is its CorruptState.
        ``watch``: set on each state read (as ``load_state``'s). A slice whose connection was
        lost is read again, as ``_read`` does one read (up to ``read_retry_s``).

        Why again (issue 43): a broker's SealMany reads the states of the segments it never
        held with this, and a blip of its ZooKeeper connection (0.26 s, scale43n run 2) failed
        the whole call, up to 1,000 segments (the coordinator tries such a batch again after
        1 s at the soonest, ``daemon_seals``)."""
        out: dict[str, tuple[QueueState, StateVersion, list[str] | None] | CorruptState] = {}
        with self._errors():
            for i in range(0, len(queues), slice_size):
                out.update(self._retry.copy()(self._load_slice, queues[i:i + slice_size], with_subs, watch))
        return out

    def _load_slice(self, part: Sequence[str], with_subs: bool, watch: Callable[[Any], None] | None
                    ) -> dict[str, tuple[QueueState, StateVersion, list[str] | None] | CorruptState]:
        """``load_states`` of one slice: every read sent, then the answers taken."""
        out: dict[str, tuple[QueueState, StateVersion, list[str] | None] | CorruptState] = {}
        asked = self._ask_deletions()
        states = [self.client.get_async(self.paths.state(q), watch=watch) for q in part]
        subs = [self.client.get_children_async(self.paths.subs(q)) for q in part] if with_subs else None
        deletions = self._deletions(asked)
        for j, q in enumerate(part):
            try:
                data, stat = self._wait(states[j])
                names = sorted(self._wait(subs[j])) if subs is not None else None
            except NoNodeError:
                continue  # deleted meanwhile
            try:
                out[q] = (parse_state(q, data), StateVersion(stat.version, deletions), names)
            except CorruptState as bad:
                out[q] = bad
        return out


def raise_first(results: list[Any]) -> None:
    """Raise what a failed transaction's results say (ZkAccessDenied first)."""
    denied = next((r for r in results if isinstance(r, NoAuthError)), None)
    if denied is not None:  # the others only say "rolled back"
        raise ZkAccessDenied(f"a transaction was refused ({type(denied).__name__})") from denied
    for r in results:
        if isinstance(r, KazooException):
            raise OrdqError(f"ZooKeeper transaction failed: {type(r).__name__}") from r
