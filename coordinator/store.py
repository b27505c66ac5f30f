"""ZooKeeper store: loads queue state, applies pure transitions, writes them conditionally.

Guarantee: every change of a queue's send and consume lists is one versioned write of its one
``state`` znode (DESIGN §2), so concurrent writers never lose an update and a deposed writer
cannot corrupt it: ``apply`` re-reads and re-applies on a version conflict. A transition that
reads subscription cursors (``pop``) also checks their versions in the same transaction.

Rules: this module is the only place that talks kazoo for ordq state; kazoo exceptions are
translated to ``ordq.common.errors`` here, once. No policy lives here: decisions are in
``ordq.coordinator.state``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from ordq.common.errors import (
    AlreadyExists,
    ConfigError,
    ConflictError,
    CoordinationUnavailable,
    CorruptState,
    GroupNotFound,
    InvariantViolation,
    NotLeader,
    OrdqError,
    QueueNotFound,
    SubscriptionNotFound,
    WaitTimeout,
    ZkAccessDenied,
)
from ordq.coordinator import state as sm
from ordq.coordinator.acl import QUEUE_PARENTS, SUB_PARENTS
from ordq.coordinator.acl_client import AclClient
from ordq.coordinator.paths import ROLES, Paths, check_name, check_zk_hosts
from ordq.coordinator.state import Cursor, Facts, QueueState
from ordq.coordinator.store_subs import SubscriptionRecords
from ordq.coordinator.zk_tls import CONNECT_TIMEOUT_S, TlsHandler

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_SEGMENT_AGE_S = 3600.0
MIN_SEGMENT_BYTES = 4 << 10
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
T = TypeVar("T")
# A contender node of a kazoo Lock (the consumer election of a subscription).
_LOCK_NODE = re.compile(r"__lock__(-?\d{10})$")


@attrs.frozen
class LiveInfo:
    """Content of a process's ephemeral liveness node."""

    address: str
    incarnation: str
    pid: int


ROLL_TO = ("same", "next")


@attrs.frozen
class QueueConfig:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    retention_segments: int | None = None  # keep at most this many sealed segments (None: all)
    # The open segment is rolled (sealed, the next one opened on the same head) once it holds
    # this many bytes or its first message is this old: segments stay small enough to free.
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_age_s: float = DEFAULT_SEGMENT_AGE_S
    # Sealed segments are dropped, read or not, once older than this (since sealed) or while
    # the sealed ones take more than this many bytes (None: kept until every subscription read them).
    retention_time_s: float | None = None
    retention_bytes: int | None = None
    # Where a roll opens the next segment: "same" (the head keeps taking writes) or "next"
    # (writes move to the next group of the send list; the old head rejoins once drained).
    roll_to: str = "same"

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.max_message_bytes <= 64 << 20:
            raise ConfigError(f"max_message_bytes must be 1..{64 << 20}, not {self.max_message_bytes}")
        if self.retention_segments is not None and self.retention_segments < 1:
            raise ConfigError("retention_segments must be >= 1")
        if not MIN_SEGMENT_BYTES <= self.segment_bytes <= 1 << 40:
            raise ConfigError(f"segment_bytes must be {MIN_SEGMENT_BYTES}..{1 << 40}, not {self.segment_bytes}")
        if not 1.0 <= self.segment_age_s <= 10**8:
            raise ConfigError(f"segment_age_s must be 1..{10**8} seconds, not {self.segment_age_s}")
        if self.retention_time_s is not None and not 1.0 <= self.retention_time_s <= 10**9:
            raise ConfigError(f"retention_time_s must be 1..{10**9} seconds, not {self.retention_time_s}")
        if self.roll_to not in ROLL_TO:
            raise ConfigError(f"roll_to must be one of {', '.join(ROLL_TO)}, not {self.roll_to!r}")
        if self.retention_bytes is not None and self.retention_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"retention_bytes must be >= {MIN_SEGMENT_BYTES}, not {self.retention_bytes}")


Transition = Callable[[QueueState, Facts], QueueState]


def roll_transition(cfg: QueueConfig, gid: str, seg: int) -> Transition:
    """The roll of ``gid``'s open segment ``seg`` as the queue's ``roll_to`` policy says (one
    definition for the coordinator, the producer and ``ordq queue roll``)."""
    to_next = cfg.roll_to == "next"
    return lambda s, f: sm.roll(s, gid, seg, f, to_next=to_next)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    return json.loads(data.decode()) if data else {}


def parse_state(queue: str, data: bytes) -> QueueState:
    """The queue's state from its node's bytes; CorruptState when they are not a valid state
    (garbage, not UTF-8, not JSON, a missing or mistyped field, broken invariants). Why: one
    queue's bad node must fail only that queue, never the reader's thread (issue 23: garbage
    killed both coordinators' election threads)."""
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        for key, kind in (("groups", list), ("send", list), ("consume", list)):
            if not isinstance(doc.get(key), kind):
                raise TypeError(f"field {key!r} is not a list")
        if not all(isinstance(c, dict) for c in doc["consume"]):
            raise TypeError("a consume-list entry is not an object")
        st = QueueState.from_dict(doc)
        sm.check_invariants(st)
    except UnicodeDecodeError as exc:
        raise CorruptState(queue, f"not UTF-8 at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise CorruptState(queue, f"not JSON: {exc.msg} at {exc.pos}") from exc
    except KeyError as exc:
        raise CorruptState(queue, f"field {exc.args[0]!r} missing") from exc
    except InvariantViolation as exc:
        raise CorruptState(queue, str(exc)) from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptState(queue, f"{type(exc).__name__}: {exc}") from exc
    if st.queue != queue:
        raise CorruptState(queue, f"it names queue {st.queue!r}")
    return st


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
    if tls:  # one SSL context per process, not one (with the system CA bundle) per attempt
        tls["handler"] = TlsHandler()
    return AclClient(hosts=check_zk_hosts(hosts), timeout=session_timeout_s, connection_retry=retry, auth=auth,
                     **tls)


@contextlib.contextmanager
def zk_errors(hosts: str = "") -> Iterator[None]:
    """Translate kazoo's connection errors to ordq's (the one place they enter)."""
    try:
        yield
    except NoAuthError as exc:
        raise ZkAccessDenied(f"{type(exc).__name__} at {hosts or 'ZooKeeper'}") from exc
    except KazooTimeoutError as exc:  # no answer within the operation timeout (ZkStore._wait)
        where = f" at {hosts}" if hosts else ""
        raise CoordinationUnavailable(f"ZooKeeper unreachable{where}: no answer in time") from exc
    except (ConnectionLoss, SessionExpiredError, SessionMovedError, ConnectionClosedError, OperationTimeoutError,
            RetryFailedError) as exc:
        where = f" at {hosts}" if hosts else ""
        raise CoordinationUnavailable(f"ZooKeeper unreachable{where}: {type(exc).__name__}") from exc


class ZkStore(SubscriptionRecords):
    """ordq's view of one cluster in ZooKeeper (under ``paths.root``)."""

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

    @classmethod
    def connect(
        cls, hosts: str, root: str = "/ordq", *, timeout_s: float = 5.0, op_timeout_s: float = OP_TIMEOUT_S,
        auth: str | None = None, daemon: bool = False,
    ) -> ZkStore:
        """Connect a new client (closed by ``close()``); CoordinationUnavailable on failure.
        ``timeout_s`` is the session timeout and bounds the connection, ``op_timeout_s`` each
        later request; ``auth`` (``user:password``) is the ZooKeeper digest identity it acts as
        (docs/SECURITY.md). ``daemon``: the session timeout is a failure detector (a broker's or
        coordinator's 1 s), not a caller's patience, so over TLS the connection may take a
        handshake's budget (coordinator/zk_tls.py): waiting less would give up on a handshake
        under way, and the daemon's retry would start another from scratch."""
        client = new_client(hosts, session_timeout_s=timeout_s, auth=auth)
        wait_s = max(timeout_s, CONNECT_TIMEOUT_S) if daemon and client.use_ssl else timeout_s
        try:
            client.start(timeout=wait_s)
        except KazooTimeoutError as exc:
            client.stop()
            client.close()
            raise CoordinationUnavailable(
                f"cannot reach ZooKeeper at {hosts} within {wait_s:g}s "
                "(is it running? start one with: ordq zk start)"
            ) from exc
        try:
            return cls(client, Paths(root), owns_client=True, op_timeout_s=op_timeout_s)
        except BaseException:  # a bad root, or ZooKeeper gone again: no client left running
            client.stop()
            client.close()
            raise

    def close(self) -> None:
        if self._owns_client:
            self.client.stop()
            self.client.close()

    def __enter__(self) -> ZkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        any later request of this client), like a write whose connection dropped in flight.
        kazoo's async results are thread-safe: callers may be on any thread."""
        return request.get(timeout=self._op_timeout_s)

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

    # -- groups ------------------------------------------------------------------------------

    def add_group(self, gid: str, config: Mapping[str, Any] | None = None) -> None:
        path = self.paths.group(gid)
        with self._errors():
            try:
                self._wait(self.client.create_async(path, _dumps(dict(config or {})), makepath=True))
            except NodeExistsError as exc:
                raise AlreadyExists(f"broker group {gid!r} already exists") from exc
            self._wait(self.client.ensure_path_async(self.paths.live(gid)))

    def list_groups(self) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.groups))
            except NoNodeError:
                return []

    def get_group(self, gid: str) -> dict[str, Any]:
        with self._errors():
            try:
                data, _ = self._read(self.client.get_async, self.paths.group(gid))
            except NoNodeError as exc:
                raise GroupNotFound(gid) from exc
        return dict(_loads(data))

    def remove_group(self, gid: str) -> None:
        """Unregister a group; refused while a queue uses it or a process of it is live."""
        self.get_group(gid)  # GroupNotFound: kazoo's recursive delete ignores a missing node
        for queue in self.list_queues():
            st, _ = self.load_state(queue)
            if gid in st.groups:
                raise OrdqError(f"group {gid!r} still serves queue {queue!r}: remove it there first")
        if self.live_members(gid):
            raise OrdqError(f"group {gid!r} has live processes: stop them first")
        with self._errors():
            try:
                self._delete_tree(self.paths.group(gid))
            except NoNodeError as exc:
                raise GroupNotFound(gid) from exc

    def register_live(self, gid: str, role: str, address: str, incarnation: str) -> None:
        """Create this process's ephemeral liveness node (gone when its session ends).
        Safe to repeat (coordinator/zk_retry.py): a node already there with this
        ``incarnation`` is our own create, landed before its connection dropped."""
        self.get_group(gid)  # GroupNotFound for an unregistered group
        data = _dumps({"address": address, "incarnation": incarnation, "pid": os.getpid()})
        with self._errors():
            try:
                self._wait(self.client.create_async(self.paths.live(gid, role), data, ephemeral=True, makepath=True))
            except NodeExistsError as exc:
                if self.live_members(gid).get(role, LiveInfo("", "", 0)).incarnation == incarnation:
                    return
                raise AlreadyExists(
                    f"a {role} of group {gid!r} is already live (another process holds the role)"
                ) from exc

    def live_members(self, gid: str) -> dict[str, LiveInfo]:
        out: dict[str, LiveInfo] = {}
        with self._errors():
            for role in ROLES:
                try:
                    data, _ = self._read(self.client.get_async, self.paths.live(gid, role))
                except NoNodeError:
                    continue
                d = _loads(data)
                out[role] = LiveInfo(address=d["address"], incarnation=d["incarnation"], pid=d["pid"])
        return out

    def live_groups(self, gids: tuple[str, ...] | list[str]) -> frozenset[str]:
        """The groups among ``gids`` whose master and slave are both live."""
        return frozenset(g for g in gids if len(self.live_members(g)) == len(ROLES))

    def set_group_drained(self, gid: str, drained: bool) -> bool:
        """Mark (or unmark) ``gid`` as drained for maintenance in its config znode and return
        the previous mark. A drained group is never admitted to a send list (``Facts.drained``);
        taking it out of the send lists it is in is the caller's transition (``remove_from_send``)."""
        path = self.paths.group(gid)
        for _ in range(50):
            with self._errors():
                try:
                    data, stat = self._read(self.client.get_async, path)
                    config = dict(_loads(data))
                    before = bool(config.get("drained", False))
                    if before == drained:
                        return before
                    if drained:
                        config["drained"] = True
                    else:
                        config.pop("drained", None)
                    self._wait(self.client.set_async(path, _dumps(config), version=stat.version))
                    return before
                except NoNodeError as exc:
                    raise GroupNotFound(gid) from exc
                except BadVersionError:
                    continue  # the config changed meanwhile: read it again
        raise ConflictError(f"group {gid!r}: gave up marking it drained after 50 conflicting writes")

    def _drained_with_versions(self, gids: tuple[str, ...] | list[str]) -> tuple[frozenset[str], dict[str, int]]:
        drained: set[str] = set()
        versions: dict[str, int] = {}
        with self._errors():
            for gid in gids:
                try:
                    data, stat = self._read(self.client.get_async, self.paths.group(gid))
                except NoNodeError:
                    continue
                versions[gid] = stat.version
                if _loads(data).get("drained"):
                    drained.add(gid)
        return frozenset(drained), versions

    def drained_groups(self, gids: tuple[str, ...] | list[str]) -> frozenset[str]:
        """The groups among ``gids`` an operator drained (``set_group_drained``)."""
        return self._drained_with_versions(gids)[0]

    # -- queues ------------------------------------------------------------------------------

    def create_queue(
        self, queue: str, groups: list[str] | None = None, config: QueueConfig | None = None
    ) -> QueueState:
        """Create a queue served by ``groups`` (default: every registered group) and admit
        every eligible one, so it is writable at once when its groups are live."""
        check_name("queue", queue)
        gids = list(groups) if groups is not None else self.list_groups()
        for gid in gids:
            self.get_group(gid)
        if not gids:
            raise ConfigError("a queue needs at least one broker group (add one: ordq group add G)")
        cfg = config or QueueConfig()
        initial = sm.create(queue, gids, incarnation=uuid.uuid4().hex[:12])
        with self._errors():
            self._wait(self.client.ensure_path_async(self.paths.queues))
            tx = self.client.transaction()
            tx.create(self.paths.queue(queue), _dumps(attrs.asdict(cfg)), acl=self._acl_of(self.paths.queue(queue)))
            tx.create(self.paths.state(queue), _dumps(initial.to_dict()), acl=self._acl_of(self.paths.state(queue)))
            tx.create(self.paths.subs(queue), b"", acl=self._acl_of(self.paths.subs(queue)))
            for name in QUEUE_PARENTS:  # the producer election's parent: clients may not create it
                path = f"{self.paths.queue(queue)}/{name}"
                tx.create(path, b"", acl=self._acl_of(path))
            results = self._wait(tx.commit_async())
        if any(isinstance(r, NodeExistsError) for r in results):
            raise AlreadyExists(f"queue {queue!r} already exists")
        _raise_first(results)
        return self.apply(queue, lambda st, facts: sm.admit_all(st, facts))

    def list_queues(self) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.queues))
            except NoNodeError:
                return []

    def watch_queue_list(self, on_change: Callable[[list[str]], None]) -> None:
        """Call ``on_change(queues)`` now and whenever a queue is created or deleted, for as
        long as the client lives (kazoo's ChildrenWatch re-arms itself; it waits for the
        queues folder to exist)."""
        self.client.ensure_path(self.paths.queues)
        self.client.ChildrenWatch(self.paths.queues, lambda children: on_change(sorted(children)))

    def queue_config(self, queue: str) -> QueueConfig:
        with self._errors():
            try:
                data, _ = self._read(self.client.get_async, self.paths.queue(queue))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return QueueConfig(**_loads(data))

    def update_queue_config(self, queue: str, **changes: Any) -> QueueConfig:
        """Change some of a queue's settings (conditionally on the version read)."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.queue(queue))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
            cfg = attrs.evolve(QueueConfig(**_loads(data)), **changes)
            try:
                self._wait(self.client.set_async(self.paths.queue(queue), _dumps(attrs.asdict(cfg)), stat.version))
            except BadVersionError as exc:
                raise ConflictError(f"queue {queue!r} settings changed meanwhile; try again") from exc
        return cfg

    def delete_queue(self, queue: str) -> None:
        self.queue_config(queue)  # QueueNotFound: kazoo's recursive delete ignores a missing node
        with self._errors():
            try:
                self._delete_tree(self.paths.queue(queue))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc

    def load_state(self, queue: str, *, watch: Callable[[Any], None] | None = None) -> tuple[QueueState, int]:
        """The queue's state and the znode version to write it back against; ``watch`` is
        called once on the next change (pass the same callable each time: kazoo keeps a set)."""
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.state(queue), watch=watch)
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc
        return parse_state(queue, data), stat.version

    def producer_epoch(self, queue: str) -> int:
        """The queue's producer epoch as ZooKeeper holds it now: ``sync`` first, so an epoch
        another client's session just wrote is seen even through a lagging server."""
        with self._errors():
            self._wait(self.client.sync_async(self.paths.state(queue)))
        return self.load_state(queue)[0].producer_epoch

    def facts(self, st: QueueState, *, with_cursors: bool = True) -> tuple[Facts, dict[str, int]]:
        """Liveness and drain marks of the queue's groups and (optionally) cursors with their
        versions."""
        facts, versions, _ = self._facts_and_versions(st, with_cursors=with_cursors)
        return facts, versions

    def _facts_and_versions(
        self, st: QueueState, *, with_cursors: bool = True
    ) -> tuple[Facts, dict[str, int], dict[str, int]]:
        """Facts, cursor versions and group config versions (the drain marks were read there)."""
        cursors: dict[str, Cursor] = {}
        versions: dict[str, int] = {}
        if with_cursors:
            for sub in self.list_subscriptions(st.queue):
                try:
                    cursors[sub], versions[sub] = self.get_cursor(st.queue, sub)
                except SubscriptionNotFound:
                    continue  # deleted meanwhile
        drained, group_versions = self._drained_with_versions(st.groups)
        facts = Facts(live_groups=self.live_groups(st.groups), cursors=cursors, drained=drained)
        return facts, versions, group_versions

    def apply(
        self, queue: str, transition: Transition, *, max_attempts: int = 50
    ) -> QueueState:
        """Apply ``transition`` to the current state with a conditional write; on a version
        conflict re-read and re-apply. ``IllegalTransition`` propagates (the caller decides:
        e.g. a producer whose fail_over lost the race follows the new head)."""
        for _ in range(max_attempts):
            current, version = self.load_state(queue)
            facts, cursor_versions, group_versions = self._facts_and_versions(current)
            new = transition(current, facts)
            if new == current:
                return current
            try:
                with self._errors():
                    tx = self.client.transaction()
                    for sub, v in cursor_versions.items():
                        tx.check(self.paths.sub(queue, sub), v)
                    # A drain mark set after we read it must not be overtaken by an admit.
                    for gid, v in group_versions.items():
                        tx.check(self.paths.group(gid), v)
                    tx.set_data(self.paths.state(queue), _dumps(new.to_dict()), version=version)
                    results = self._wait(tx.commit_async())
            except CoordinationUnavailable:
                # The connection dropped with the write in flight: it may or may not have
                # landed. Never guess from the content (another writer may have written the
                # same state, e.g. the same epoch bump): read again and re-apply; the version
                # check keeps that safe, and a transition that already happened now raises
                # IllegalTransition (or bumps once more), as when another writer won the race.
                continue
            if not any(isinstance(r, Exception) for r in results):
                return new
            if not any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
                _raise_first(results)
            # lost a race (state or a cursor moved, or a subscription went): read again
        raise ConflictError(f"queue {queue!r}: gave up after {max_attempts} conflicting writes")

    # -- subscriptions -----------------------------------------------------------------------

    def create_subscription(self, queue: str, sub: str, *, at: str | Cursor = "earliest") -> Cursor:
        """Create ``sub`` at ``earliest`` (the oldest kept message) or at an explicit cursor.
        (``latest`` needs the open segment's current end: the SDK resolves it to a Cursor.)"""
        check_name("subscription", sub)
        st, _ = self.load_state(queue)
        if isinstance(at, Cursor):
            cursor = at
        elif at == "earliest":
            cursor = st.earliest_cursor()
        else:
            raise ConfigError(f"subscription start must be 'earliest' or a cursor, not {at!r}")
        sm.check_invariants(st, {sub: cursor})
        path = self.paths.sub(queue, sub)
        with self._errors():
            # With the parents of what its consumers may create (election, alarm, ledger):
            # clients may not create them (coordinator/acl.py).
            tx = self.client.transaction()
            tx.create(path, _dumps(cursor.to_dict()), acl=self._acl_of(path))
            for name in SUB_PARENTS:
                tx.create(f"{path}/{name}", b"", acl=self._acl_of(f"{path}/{name}"))
            results = self._wait(tx.commit_async())
        if isinstance(results[0], NodeExistsError):
            raise AlreadyExists(f"subscription {sub!r} of queue {queue!r} already exists")
        if isinstance(results[0], NoNodeError):
            raise QueueNotFound(queue)
        _raise_first(results)
        return cursor

    def list_subscriptions(self, queue: str) -> list[str]:
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.subs(queue)))
            except NoNodeError as exc:
                raise QueueNotFound(queue) from exc

    def get_cursor(self, queue: str, sub: str) -> tuple[Cursor, int]:
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.sub(queue, sub))
            except NoNodeError as exc:
                self.queue_config(queue)  # QueueNotFound first
                raise SubscriptionNotFound(queue, sub) from exc
        return Cursor.from_dict(_loads(data)), stat.version

    def commit_cursor(self, queue: str, sub: str, cursor: Cursor, version: int, *, holder: str | None = None) -> int:
        """Write the cursor if nobody else did since ``version``; return the new version.
        ConflictError when it moved (another consumer or an admin reset took over).

        ``holder``: the committer's lock node (an ephemeral node of its session). The write
        then applies only while that node exists, in the same transaction, so a consumer whose
        session expired cannot move the cursor, not even after kazoo opened a new session for
        it: NotLeader instead."""
        path, data = self.paths.sub(queue, sub), _dumps(cursor.to_dict())
        for _ in range(50):
            try:
                with self._errors():
                    return self._write_cursor(queue, sub, path, data, version, holder)
            except CoordinationUnavailable:
                # The write was in flight when the connection dropped: look whether it landed.
                with self._errors():
                    try:
                        now, stat = self._read(self.client.get_async, path)
                    except NoNodeError as exc:
                        raise SubscriptionNotFound(queue, sub) from exc
                if stat.version == version + 1 and now == data:
                    return int(stat.version)  # it did (or another wrote the very same cursor)
                if stat.version != version:
                    raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}") from None
                # it did not: write it again
        raise CoordinationUnavailable(f"cursor of {queue}/{sub}: 50 writes lost on the way to ZooKeeper")

    def _write_cursor(self, queue: str, sub: str, path: str, data: bytes, version: int, holder: str | None) -> int:
        if holder is None:
            try:
                return int(self._wait(self.client.set_async(path, data, version=version)).version)
            except BadVersionError as exc:
                raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}") from exc
            except NoNodeError as exc:
                raise SubscriptionNotFound(queue, sub) from exc
        tx = self.client.transaction()
        tx.check(holder, -1)  # -1: any version; fails only when the node is gone
        tx.set_data(path, data, version=version)
        results = self._wait(tx.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            return int(results[1].version)
        if isinstance(results[0], NoNodeError):
            raise NotLeader(queue, sub, "its lock node is gone: the session expired")
        if isinstance(results[1], BadVersionError):
            raise ConflictError(f"cursor of {queue}/{sub} moved since version {version}")
        if isinstance(results[1], NoNodeError):
            raise SubscriptionNotFound(queue, sub)
        raise CoordinationUnavailable(f"cursor of {queue}/{sub}: unexpected transaction results {results!r}")

    def reset_cursor(self, queue: str, sub: str, cursor: Cursor, *, cursor_version: int, state_version: int) -> int:
        """An operator's reset: write ``cursor`` only if neither the cursor nor the queue state
        changed since they were read at these versions (so the target, checked against that
        state, is still inside the consume list: I5). Returns the new cursor version;
        ConflictError when either moved (read both again and retry)."""
        with self._errors():
            tx = self.client.transaction()
            tx.check(self.paths.state(queue), state_version)
            tx.set_data(self.paths.sub(queue, sub), _dumps(cursor.to_dict()), version=cursor_version)
            results = self._wait(tx.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            return int(results[1].version)
        if any(isinstance(r, NoNodeError) for r in results):
            self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound
        if any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
            raise ConflictError(f"cursor of {queue}/{sub} or the queue state moved during the reset")
        _raise_first(results)
        raise ConflictError(f"cursor reset of {queue}/{sub} failed: {results}")  # pragma: no cover

    def subscription_holders(self, queue: str, sub: str) -> list[str]:
        """Identifiers of the consumers in the subscription's election (kazoo Lock contenders),
        the one holding it first; [] when no consumer holds it."""
        path = self.paths.sub_leader(queue, sub)
        with self._errors():
            try:
                children = self._read(self.client.get_children_async, path)
            except NoNodeError:
                self.get_cursor(queue, sub)  # QueueNotFound / SubscriptionNotFound
                return []
            nodes = sorted((m.group(1), c) for c in children if (m := _LOCK_NODE.search(c)) is not None)
            holders = []
            for _, child in nodes:
                try:
                    data, _ = self._read(self.client.get_async, f"{path}/{child}")
                except NoNodeError:
                    continue  # released meanwhile
                holders.append(data.decode("utf-8", "replace") if data else "")
        return holders

    @contextlib.contextmanager
    def subscription_lease(self, queue: str, sub: str, identifier: str) -> Iterator[bool]:
        """Try, without waiting, to hold the subscription's consumer election for the block;
        yields whether it got it. While held, no consumer can start on the subscription (a
        starting one waits, then reads the cursor as this block left it)."""
        self.get_cursor(queue, sub)  # never create the election under a missing subscription
        lock = self.client.Lock(self.paths.sub_leader(queue, sub), identifier)
        with self._errors():
            # if we stop waiting and it gets the lock later, it lets it go at once
            got = self._in_thread(lambda: bool(lock.acquire(blocking=False)), undo=lambda won: won and lock.release())
        try:
            yield got
        finally:
            if got:
                with self._errors():
                    self._in_thread(lock.release)  # on a timeout it goes on in the background

    def delete_subscription(self, queue: str, sub: str) -> None:
        with self._errors():
            try:
                self._delete_tree(self.paths.sub(queue, sub))
            except NoNodeError as exc:  # kazoo's recursive delete ignored a missing node
                self.queue_config(queue)  # QueueNotFound first
                raise SubscriptionNotFound(queue, sub) from exc
            except NotEmptyError as exc:  # a node was created under it meanwhile
                raise OrdqError(str(exc)) from exc

    # -- waiting -----------------------------------------------------------------------------

    def wait_state(
        self, queue: str, predicate: Callable[[QueueState], bool], *, timeout_s: float
    ) -> QueueState:
        """Block until the queue's state satisfies ``predicate`` (watch-driven)."""
        changed = threading.Event()
        deadline = time.monotonic() + timeout_s
        while True:
            changed.clear()
            with self._errors():
                try:
                    data, _ = self._read(self.client.get_async, self.paths.state(queue), watch=lambda _e: changed.set())
                except NoNodeError as exc:
                    raise QueueNotFound(queue) from exc
            st = parse_state(queue, data)
            if predicate(st):
                return st
            left = deadline - time.monotonic()
            if left <= 0 or not changed.wait(left):
                raise WaitTimeout(
                    f"queue {queue!r}: state did not reach the wanted condition in {timeout_s:g}s"
                )


    def wait_not_live(self, gid: str, role: str, *, timeout_s: float) -> bool:
        """Block until no process is registered live as ``role`` of ``gid`` (watch-driven);
        False if one still is after ``timeout_s``."""
        gone = threading.Event()
        deadline = time.monotonic() + timeout_s
        while True:
            gone.clear()
            with self._errors():
                stat = self._read(self.client.exists_async, self.paths.live(gid, role), watch=lambda _e: gone.set())
            if stat is None:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not gone.wait(left):
                return False


def _raise_first(results: list[Any]) -> None:
    denied = next((r for r in results if isinstance(r, NoAuthError)), None)
    if denied is not None:  # the others only say "rolled back"
        raise ZkAccessDenied(f"a transaction was refused ({type(denied).__name__})") from denied
    for r in results:
        if isinstance(r, KazooException):
            raise OrdqError(f"ZooKeeper transaction failed: {type(r).__name__}") from r
