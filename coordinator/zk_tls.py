"""kazoo over TLS at the cost of a handshake, not of loading the system's CA bundle.

kazoo (``kazoo/handlers/utils.py`` ``create_tcp_connection``) builds a new ``SSLContext`` at
every connection attempt and loads the system CA bundle into it (``load_default_certs``):
140-500 ms of CPU per attempt on a small machine, before the handshake — too slow for a
broker whose 1 s session must be re-established within it, and useless here, as the only CA
an ordq ZooKeeper's certificate is checked against is the cluster's own. ``TlsHandler``
connects with one context per set of files per process, holding only that CA (and the
client's certificate, which the server requires), built once and reused while the files
are unchanged.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from typing import Any

from kazoo.handlers import utils
from kazoo.handlers.threading import SequentialThreadingHandler

_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}
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


class TlsHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler whose TLS connections use ``client_context`` (the client's
    ``ca``/``certfile``/``keyfile`` options, which kazoo passes to every connect)."""

    def create_connection(self, address: Any, hostname: str | None = None, timeout: float | None = None,
                          use_ssl: bool = False, ca: str | None = None, certfile: str | None = None,
                          keyfile: str | None = None, **options: Any) -> Any:
        if not use_ssl or ca is None:
            return super().create_connection(address, hostname=hostname, timeout=timeout, use_ssl=use_ssl, ca=ca,
                                             certfile=certfile, keyfile=keyfile, **options)
        ctx = client_context(ca, certfile, keyfile)
        family = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)[0][0]
        conn = ctx.wrap_socket(socket.socket(family), server_hostname=hostname)
        try:
            conn.settimeout(timeout)
            conn.connect(address)
        except BaseException:
            conn.close()
            raise
        utils._set_default_tcpsock_options(socket, conn)
        return conn
