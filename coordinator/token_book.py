"""A server's copy of the token store: what a broker's Gate and the coordinator service check
every call against (coordinator/tokens.py has the records; DESIGN §7).

Guarantees:
- **Reloaded on change.** The copy is loaded at start and again on every change of
  ``<root>/auth`` (``ordq auth create|revoke`` touch it), so a revoked token is refused on its
  next call.
- **A new token works at once (issue 24).** The watch fires some milliseconds after ``auth
  create`` returns; a call carrying a well-formed token whose id is not in the copy waits for
  a load that *started after the call arrived* (``fresh_after``) before it is judged, so a
  token used the moment ``auth create`` printed it is found, not refused.
- **Bounded by construction.** Such loads are single-flight and rate-limited: every caller
  waiting meanwhile shares the next one, and one starts at most every ``refresh_every_s``
  (0.2 s: at most 5 loads a second per server, whatever a flood of garbage tokens sends). A
  token that is not ``ordq_<8 hex>_<secret>``, or whose id is known with another hash, is
  judged without any load. Waiting callers hold a future, not a thread (the broker awaits it).
- **A generation per copy (issue 39).** ``generation`` changes whenever the copy in effect
  does (a load landed, or the copy dropped as unreadable): a verdict kept while it is the
  same (a stream's, broker_group/auth.py) is as fresh as a check made again.
- **Never a guess (issue 24).** When a load fails while serving (ZooKeeper away past its
  bound, or refusing this identity) the copy is dropped and every token check raises
  TokensUnavailable (retriable, gRPC UNAVAILABLE) — not PermissionDenied, which is final for
  the SDK — until a load succeeds (tried again every ``reload_after_s``). A revoked token
  never passes for a stale copy.

Rules: kazoo calls only here and in the timers/threads it starts; no gRPC.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kazoo.exceptions import ConnectionClosedError

from ordq.common.errors import ConfigError, OrdqError, TokensUnavailable
from ordq.coordinator.tokens import TokenRecord, auth_root, load_tokens, token_id
from ordq.coordinator.zk_retry import retry_zk

log = logging.getLogger("ordq.tokens")

LOAD_DEADLINE_S = 30.0  # how long a load rides out transient ZooKeeper errors
RELOAD_AFTER_S = 1.0  # while the copy is unreadable: the next try
REFRESH_EVERY_S = 0.2  # loads for unknown token ids: at most one per this long
REFRESH_DEADLINE_S = 5.0  # such a load's own bound on transient ZooKeeper errors


def well_formed_id(token: str | None) -> str | None:
    """The id of ``token`` when it has a token's shape, else None."""
    if not token:
        return None
    try:
        return token_id(token)
    except ConfigError:
        return None


def _client_closed(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) says the kazoo client itself was closed."""
    while exc is not None:
        if isinstance(exc, ConnectionClosedError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class TokenBook:
    """The token records one server checks calls against (see the module's guarantees)."""

    def __init__(self, *, refresh_every_s: float = REFRESH_EVERY_S, reload_after_s: float = RELOAD_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = refresh_every_s
        self._reload_after_s = reload_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._enforced = False
        self._records: dict[str, TokenRecord] = {}
        self._unreadable: str | None = None  # why no token can be judged now
        self._loaded_from = float("-inf")  # when the load now in effect started
        # callers waiting for the next refresh, not started yet: a future each, so that one
        # that gives up (its call cancelled) cancels only its own
        self._waiting: list[Future[None]] | None = None
        self._last_start = float("-inf")
        self._client: Any = None
        self._root = ""
        self._closed = False  # the server stopped: no more reloads (a test's ZooKeeper is gone)
        self.refreshes = 0  # loads made for unknown token ids (statistics, tests)
        self.generation = 0  # changes with every copy put in effect (or dropped): see the module's guarantees

    # -- loading ------------------------------------------------------------------------------

    def watch(self, client: Any, root: str, *, deadline_s: float = LOAD_DEADLINE_S) -> None:
        """Load now and again on every change of ``<root>/auth``. At start,
        CoordinationUnavailable when ZooKeeper did not answer for ``deadline_s``."""
        self._client, self._root = client, root
        # The first load here, not in the watch's first call: kazoo logs a traceback for an
        # exception raised there, and a server must stop with one clear line.
        self._load(deadline_s)

        def changed(data: bytes | None, _stat: Any, *_event: Any) -> None:
            try:
                self._load(deadline_s)
            except OrdqError as exc:  # ZooKeeper away past the bound, or refusing this identity
                self._unreadable_now(exc)

        retry_zk(lambda: client.DataWatch(auth_root(root))(changed),  # the watch's own first read
                 f"cannot watch {auth_root(root)}", bound_s=deadline_s)

    def _load(self, deadline_s: float, *, sync: bool = False) -> None:
        client, root = self._client, self._root
        started = self._clock()

        def read() -> tuple[bool, dict[str, TokenRecord]]:
            if sync:  # this session's server has seen every write made before the load began
                client.sync(auth_root(root))
            enforced = client.exists(auth_root(root)) is not None
            return enforced, (load_tokens(client, root) if enforced else {})

        enforced, records = retry_zk(read, f"cannot load the tokens under {auth_root(root)}", bound_s=deadline_s)
        with self._lock:
            if started < self._loaded_from:
                return  # a load that started later has already landed: keep the newer copy
            self._enforced, self._records, self._loaded_from = enforced, records, started
            self.generation += 1
            was, self._unreadable = self._unreadable, None
        if was is not None:
            log.info("tokens loaded again: %d", len(records))
        else:
            log.info("tokens %s: %d loaded", "enforced" if enforced else "not enforced", len(records))

    def close(self) -> None:
        """The server stopped: end the retries of an unreadable copy (else they go on, every
        ``reload_after_s`` plus the load's bound, for as long as the process lives)."""
        with self._lock:
            self._closed = True

    def _unreadable_now(self, exc: Exception) -> None:
        """A load failed while serving: judge no token until one succeeds (or the owner closed
        its ZooKeeper client: then the server is stopping, and reloads end)."""
        with self._lock:
            if _client_closed(exc):
                self._closed = True
            if self._closed:
                return
            self._unreadable, self._records = str(exc), {}
            self.generation += 1
        log.error("tokens: %s; answering every client token 'cannot check tokens now' until they load", exc)

        def again() -> None:
            if self._closed:
                return
            try:
                self._load(LOAD_DEADLINE_S)
            except OrdqError as err:
                self._unreadable_now(err)

        timer = threading.Timer(self._reload_after_s, again)
        timer.daemon = True
        timer.start()

    # -- refreshing for an unknown token ------------------------------------------------------

    def fresh_after(self, arrived: float) -> Future[None]:
        """Done once a load that started at or after ``arrived`` (this clock) has landed;
        its exception is TokensUnavailable when that load failed. Single-flight: every
        caller before the next load starts shares it; rate-limited: one starts at most every
        ``refresh_every_s``. The future is the caller's own: cancelling it (its call went
        away) leaves the others' waits as they were."""
        mine: Future[None] = Future()
        with self._lock:
            if self._loaded_from >= arrived:
                mine.set_result(None)
                return mine
            if self._waiting is None:
                self._waiting = []
                timer = threading.Timer(max(self._last_start + self._every_s - self._clock(), 0.0), self._refresh)
                timer.daemon = True
                timer.start()
            self._waiting.append(mine)
            return mine

    def _refresh(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting or [], None
            self._last_start = self._clock()
            self.refreshes += 1
        failure: str | None = None
        try:
            self._load(REFRESH_DEADLINE_S, sync=True)
        except OrdqError as exc:
            failure = str(exc)
        except Exception as exc:  # noqa: BLE001 - never leave a caller waiting for ever
            log.exception("tokens: refresh failed")
            failure = repr(exc)
        for fut in waiting:
            if not fut.set_running_or_notify_cancel():
                continue  # its caller gave up
            if failure is None:
                fut.set_result(None)
            else:
                fut.set_exception(TokensUnavailable(failure))

    # -- judging ------------------------------------------------------------------------------

    def current(self) -> tuple[bool, dict[str, TokenRecord]]:
        """(enforced, records) now; TokensUnavailable while the copy is unreadable."""
        with self._lock:
            if self._unreadable is not None:
                raise TokensUnavailable(self._unreadable)
            return self._enforced, self._records

    def unknown(self, token: str | None) -> bool:
        """Whether ``token`` is well formed with an id the copy does not hold (enforced):
        created a moment ago, or revoked; a ``fresh_after`` load tells which."""
        enforced, records = self.current()
        tid = well_formed_id(token)
        return enforced and tid is not None and tid not in records

    def fresh_for(self, token: str | None, arrived: float, timeout_s: float = REFRESH_DEADLINE_S + 1.0) -> None:
        """Blocking (a thread-per-call server): when ``token`` is unknown, wait for a load
        that started after ``arrived``; TokensUnavailable when it failed or did not come."""
        if not self.unknown(token):
            return
        try:
            self.fresh_after(arrived).result(timeout=timeout_s)
        except TimeoutError:
            raise TokensUnavailable(f"no token load within {timeout_s:g}s") from None

    def now(self) -> float:
        return self._clock()
