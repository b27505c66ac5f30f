"""kazoo over TLS at the cost of a handshake, not of loading the system's CA bundle.

kazoo (``kazoo/handlers/utils.py`` ``create_tcp_connection``) builds a new ``SSLContext`` at
every connection attempt and loads the system CA bundle into it (``load_default_certs``):
140-500 ms of CPU per attempt on a small machine, before the handshake — too slow for a
broker whose 1 s session must be re-established within it, and useless here, as the only CA
an ordq ZooKeeper's certificate is checked against is the cluster's own. ``TlsHandler``
connects with one context per set of files per process, holding only that CA (and the
client's certificate, which the server requires), built once and reused while the files
are unchanged.

A TLS connect has its own budget, ``CONNECT_TIMEOUT_S``, not the session timeout kazoo gives
it. kazoo bounds each connection attempt (TCP connect and handshake, then the session request)
by the client's session timeout: 1 s for a broker or a coordinator, chosen for how fast a dead
process is noticed, not for the work of a handshake. Under load a handshake takes longer (the
ZooKeeper JVM spends ~10 ms of CPU on each, and gets a small share of 2 busy cores), so the
daemons' attempts were cut off at 1 s, retried within 50-250 ms and cut off again: each
abandoned handshake had cost the server its CPU, the server fell further behind, and a doc
run saw ~90 abandoned handshakes per 10 s for 50 s, during which a command's own 5 s connect
failed (issue 24's note has the measurements). A handshake that is under way now finishes.

The handshake also ends only once the server has checked the client's certificate: in TLS 1.3
the client's side is done when it has sent its certificate and Finished, and the server's
check of them (two signature verifications) would otherwise fall into kazoo's session request,
bounded by the session timeout again. The server's first record after the handshake (its
session ticket) says it is done; the ticket is kept, and the next connect of this process to
that address resumes the TLS session (no certificate signing or checking: ~20% less CPU for
the server on a reconnect).
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import threading
import time
from typing import Any

from kazoo.handlers import utils
from kazoo.handlers.threading import SequentialThreadingHandler

from ordq.coordinator.zk_answer import AnswerResult

# How long a TLS connect (TCP connect, handshake, the server's check of the client) may take,
# whatever the session timeout. Measured (ordq's client against `ordq up`'s ZooKeeper, P-256
# certificates): p99 78 ms quiet, 253 ms at load ~7, 777 ms (max 1.02 s) at load ~30; 2.3 s
# was the slowest that completed in the storm described above. 5 s: twice that, and the CLI's
# default --zk-timeout.
CONNECT_TIMEOUT_S = 5.0

_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}
# the last TLS session per (context, address): a reconnect resumes it
_SESSIONS: dict[tuple[int, Any], ssl.SSLSession] = {}
_LOCK = threading.Lock()


def client_context(ca: str, certfile: str | None, keyfile: str | None) -> ssl.SSLContext:
    """The TLS client context for a ZooKeeper with a certificate of ``ca`` (hostname not
    checked: the cluster CA signs only the cluster's own servers), cached by the files' paths
    and modification times, so a rotated certificate is picked up at the next connect."""
    files = [f for f in (ca, certfile, keyfile) if f]
    key = tuple((f, os.stat(f).st_mtime_ns) for f in files)
    with _LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(ca)
            if certfile and keyfile:
                ctx.load_cert_chain(certfile, keyfile)
            _CONTEXTS[key] = ctx
        return ctx


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITABLE = select.POLLOUT | select.POLLERR | select.POLLNVAL


def poll_select(rlist: list[Any], wlist: list[Any], xlist: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (which kazoo's handler ``select`` keeps) over one poll(2):
    the objects of each list that are ready, within ``timeout`` seconds (None: no limit).
    Ready as select(2) says it: readable on data, end of file or an error, writable on room
    or an error; a closed descriptor counts as both, so the caller's next read or write fails.

    Why (issue 29): kazoo's own (``kazoo.handlers.utils.selector_select``) builds, registers
    and closes a new epoll selector at every call, and its connection thread calls it before
    every request it sends and every answer it reads: in a profile of the elected coordinator
    failing over thousands of queues, 42 % of the time the GIL was held went to that."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    masks: dict[int, int] = {}
    for objs, mask in ((rlist, select.POLLIN), (wlist, select.POLLOUT), (xlist, select.POLLPRI)):
        for obj in objs:
            fd = obj if isinstance(obj, int) else obj.fileno()
            if fd < 0:
                raise ValueError(f"invalid file descriptor: {fd}")
            masks[fd] = masks.get(fd, 0) | mask
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else timeout * 1000))

    def of(objs: list[Any], want: int) -> list[Any]:
        return [o for o in objs if ready.get(o if isinstance(o, int) else o.fileno(), 0) & want]

    return of(rlist, _READABLE), of(wlist, _WRITABLE), of(xlist, select.POLLPRI)


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, waiting on sockets with ``poll_select``; its results raise
    copies of their exceptions (``AnswerResult``: no reference cycle holds a caller's frames)."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return poll_select(*args, **kwargs)

    def async_result(self) -> AnswerResult:
        return AnswerResult(self)


class TlsHandler(PollHandler):
    """kazoo's threading handler whose TLS connections use ``client_context`` (the client's
    ``ca``/``certfile``/``keyfile`` options, which kazoo passes to every connect). Its
    handshakes under way can be cut (``cut_connection``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handshakes_lock = threading.Lock()
        self._handshakes: set[ssl.SSLSocket] = set()

    def handshakes(self) -> list[ssl.SSLSocket]:
        """The connections whose handshake is under way now."""
        with self._handshakes_lock:
            return list(self._handshakes)

    def create_connection(self, address: Any, hostname: str | None = None, timeout: float | None = None,
                          use_ssl: bool = False, ca: str | None = None, certfile: str | None = None,
                          keyfile: str | None = None, **options: Any) -> Any:
        if not use_ssl or ca is None:
            return super().create_connection(address, hostname=hostname, timeout=timeout, use_ssl=use_ssl, ca=ca,
                                             certfile=certfile, keyfile=keyfile, **options)
        ctx = client_context(ca, certfile, keyfile)
        deadline = time.monotonic() + max(timeout or 0.0, CONNECT_TIMEOUT_S)
        family = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)[0][0]
        key = (id(ctx), tuple(address))
        with _LOCK:
            session = _SESSIONS.get(key)
        conn = ctx.wrap_socket(socket.socket(family), server_hostname=hostname, session=session)
        with self._handshakes_lock:
            self._handshakes.add(conn)
        try:
            conn.settimeout(CONNECT_TIMEOUT_S if timeout is None else max(timeout, CONNECT_TIMEOUT_S))
            conn.connect(address)
            _await_server_done(conn, deadline)
        except BaseException:
            conn.close()
            raise
        finally:
            with self._handshakes_lock:
                self._handshakes.discard(conn)
        if conn.session is not None:
            with _LOCK:
                _SESSIONS[key] = conn.session
        utils._set_default_tcpsock_options(socket, conn)
        return conn


def _await_server_done(conn: ssl.SSLSocket, deadline: float) -> None:
    """Return once the server has finished its side of the handshake (TLS 1.3: its first
    record after the handshake, a session ticket, arrived; TLS 1.2 and a resumed session end
    with the server's Finished). TimeoutError past ``deadline``; OSError when the server
    refused the client's certificate. No application data can arrive before the client sends
    its session request, so nothing is read that kazoo would miss."""
    if conn.version() != "TLSv1.3" or conn.session_reused:
        return
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([conn], [], [], left)[0]:
            raise TimeoutError("TLS handshake: the server did not finish it in time")
        conn.setblocking(False)
        try:
            data = conn.recv(1)
        except ssl.SSLWantReadError:
            return  # the ticket was read, no data: the server is done
        finally:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
        if not data:
            raise ConnectionResetError("TLS handshake: the server closed the connection (client certificate refused?)")
        raise ssl.SSLError("TLS handshake: unexpected data from the server before the session request")


def cut_connection(client: Any) -> None:
    """Shut ``client``'s socket down, and any handshake its handler has under way: its
    connection thread then sees a dropped connection at once, and a stop in progress ends.
    For a stop the server does not answer (paused, or its machine hung): kazoo waits for the
    answer to its close, or for a handshake, up to a session or CONNECT_TIMEOUT_S, and a
    broker's stop under ``ordq down`` with ZooKeeper paused ran out its 10 s grace and was
    killed (stops 96-97). kazoo keeps the socket in ``_connection._socket`` (pinned version)."""
    handler = getattr(client, "handler", None)
    waiting = handler.handshakes() if isinstance(handler, TlsHandler) else []
    sock = getattr(getattr(client, "_connection", None), "_socket", None)
    for conn in [*waiting, *([sock] if sock is not None else [])]:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # done or closed meanwhile
