"""A blocking TLS client socket that leaves nothing open when its handshake fails.

Why: CPython 3.11's ``SSLSocket._create`` leaves the TLS socket it made open when the peer
reset the connection before the handshake (``recv(1)``'s ECONNRESET is raised past its own
close), and the plain socket it came from is detached by then, so the caller cannot close
either. A consumer whose master was killed between its connect and its handshake left such a
socket behind (an unclosed-socket ResourceWarning that failed a later test beside busy loops,
stop 78). Every blocking TLS client of ordq wraps its sockets with ``wrap_owned``; asyncio's
TLS (the lean links' async ends) makes no ``SSLSocket``.

Rules: the standard library only (loaded by the CLI's diagnosis after a failed call, issue 42).
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any, ClassVar


class _OwnedSSLSocket(ssl.SSLSocket):
    """An SSLSocket its maker can close even when ``wrap_socket`` raised (the module's why)."""

    made: ClassVar[threading.local] = threading.local()  # this thread's last one made

    def __new__(cls, *args: Any, **kwargs: Any) -> _OwnedSSLSocket:
        made = super().__new__(cls, *args, **kwargs)
        cls.made.sock = made
        return made


def wrap_owned(ctx: ssl.SSLContext, sock: socket.socket, host: str) -> ssl.SSLSocket:
    """``ctx.wrap_socket(sock)`` (client side, for ``host``) that leaves nothing open when it
    raises."""
    ctx.sslsocket_class = _OwnedSSLSocket
    _OwnedSSLSocket.made.sock = None
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        made = _OwnedSSLSocket.made.sock
        if made is not None:
            made.close()
        raise
    finally:
        _OwnedSSLSocket.made.sock = None
