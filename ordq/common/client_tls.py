"""What a client needs to reach a cluster, without attrs: the credentials file read (entries
as plain dicts), the gRPC channels (mutual TLS or plaintext) and a cache of them.

Split from ``ordq.common.security`` (which re-exports every name here) so that an admin
command (``ordq queue list``: issue 42, 0.25 s of CPU on a quiet box) loads neither attrs nor
the certificate code: ``ClientCredentials`` is what such a command presents, and anything with
``ca_file``, ``cert_file``, ``key_file`` and ``token`` (``security.Credentials`` too) serves the
channel functions.

Rules: the standard library only at import time (grpc inside the functions that make channels);
the credentials file is only read here (``security`` writes it, under its lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ordq.common.errors import ClosedError, ConfigError

if TYPE_CHECKING:  # grpc is imported where a channel is made (issue 42)
    import grpc


class TlsFiles(Protocol):
    """What a channel is made from: the CA to trust (None: plaintext), this process's
    certificate and key, and the token sent with each call."""

    @property
    def ca_file(self) -> str | None: ...
    @property
    def cert_file(self) -> str | None: ...
    @property
    def key_file(self) -> str | None: ...
    @property
    def token(self) -> str | None: ...


class ClientCredentials:
    """A client's TLS files and token, as ``security.Credentials`` has them (``tls``: a CA is
    trusted), read from a credentials file entry with the environment's overrides
    (``from_entry``). Immutable."""

    __slots__ = ("ca_file", "cert_file", "key_file", "token")
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    token: str | None

    def __init__(self, *, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 token: str | None = None) -> None:
        if (cert_file is None) != (key_file is None):
            raise ConfigError("a TLS certificate needs its key and a key its certificate")
        if cert_file is not None and ca_file is None:
            raise ConfigError("a TLS certificate needs the CA that signed the peers' (--tls-ca)")
        for name, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file),
                            ("token", token)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ClientCredentials is immutable ({name})")

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> ClientCredentials:
        """From a credentials file entry, with ``$ORDQ_TOKEN`` over its token."""
        return cls(ca_file=entry.get("ca_file"), cert_file=entry.get("cert_file"), key_file=entry.get("key_file"),
                   token=os.environ.get("ORDQ_TOKEN") or entry.get("token"))

    def __repr__(self) -> str:  # never the token
        return f"ClientCredentials(ca_file={self.ca_file!r}, cert_file={self.cert_file!r}, key_file={self.key_file!r})"


# -- the credentials file (read only) -----------------------------------------------------------

COORDINATORS_FIELD = "coordinators"  # the cluster's coordinator addresses: a client's bootstrap list


def credentials_path() -> Path:
    if os.environ.get("ORDQ_CREDENTIALS"):
        return Path(os.environ["ORDQ_CREDENTIALS"])
    if os.environ.get("ORDQ_HOME"):
        return Path(os.environ["ORDQ_HOME"]) / "credentials.json"
    return Path.home() / ".config" / "ordq" / "credentials.json"


def cluster_key(zk_hosts: str, root: str) -> str:
    return f"{zk_hosts}{root}"


def load_clusters(path: Path) -> dict[str, Any]:
    """The ``clusters`` object of the credentials file at ``path`` ({} when there is none)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the credentials file {path}: {exc}") from exc
    clusters = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(clusters, dict):
        raise ConfigError(f"the credentials file {path} has no 'clusters' object")
    return clusters


def entry(zk_hosts: str, root: str) -> dict[str, Any]:
    """The credentials file's entry for the cluster (``zk_hosts``, ``root``) ({} when none)."""
    found = load_clusters(credentials_path()).get(cluster_key(zk_hosts, root))
    return found if isinstance(found, dict) else {}


def entry_for_bootstrap(bootstrap: str) -> dict[str, Any]:
    """The entry of the cluster whose coordinators ``bootstrap`` names (any one address in
    common) ({} when no entry names them)."""
    wanted = {a.strip() for a in bootstrap.split(",") if a.strip()}
    for found in load_clusters(credentials_path()).values():
        if isinstance(found, dict) and wanted & {str(a) for a in found.get(COORDINATORS_FIELD) or ()}:
            return found
    return {}


def registered_bootstrap(zk_hosts: str, root: str) -> str | None:
    """The coordinators' addresses registered for (``zk_hosts``, ``root``) as "h:p,h:p", if any."""
    addresses = entry(zk_hosts, root).get(COORDINATORS_FIELD)
    return ",".join(str(a) for a in addresses) if addresses else None


# -- gRPC channels -------------------------------------------------------------------------------

def read_tls_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS file {path}: {exc.strerror}") from exc


def client_pair(creds: TlsFiles) -> tuple[bytes | None, bytes | None]:
    """(key, certificate chain) of ``creds`` as bytes, (None, None) without a certificate."""
    if creds.cert_file is None or creds.key_file is None:
        return None, None
    return read_tls_file(creds.key_file), read_tls_file(creds.cert_file)


def channel(address: str, creds: TlsFiles, options: Any) -> grpc.Channel:
    """A channel to a broker: mutual TLS when ``creds`` trust a CA, else plaintext."""
    import grpc

    tls = channel_credentials(creds)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls, options=options)


def aio_channel(address: str, creds: TlsFiles, options: Any) -> grpc.aio.Channel:
    """As ``channel``, for grpc.aio (make it on the event loop that will use it)."""
    import grpc

    tls = channel_credentials(creds)
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls, options=options)


def channel_credentials(creds: TlsFiles) -> grpc.ChannelCredentials | None:
    import grpc

    if creds.ca_file is None:
        return None
    key, cert = client_pair(creds)
    return grpc.ssl_channel_credentials(root_certificates=read_tls_file(creds.ca_file), private_key=key,
                                        certificate_chain=cert)


def token_metadata(creds: TlsFiles) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {creds.token}"),) if creds.token else ()


C = TypeVar("C")
S = TypeVar("S")


class StubCache(Generic[C, S]):
    """One channel and one stub per address: a stub builds a callable per method (~100 µs),
    so one per channel, not one per call. Thread-safe; ``close()`` hands back the channels
    for the caller to close (sync or grpc.aio) and later ``get`` raises ClosedError."""

    def __init__(self, open_channel: Callable[[str], C], make_stub: Callable[[C], S], what: str) -> None:
        self._open_channel = open_channel
        self._make_stub = make_stub
        self._what = what
        self._channels: dict[str, C] = {}
        self._stubs: dict[str, S] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, address: str) -> S:
        stub = self._stubs.get(address)  # no lock on the hot path: a dict read is atomic
        if stub is not None and not self._closed:
            return stub
        with self._lock:
            if self._closed:
                raise self._closed_error()
            stub = self._stubs.get(address)
            if stub is None:
                ch = self._channels[address] = self._open_channel(address)
                stub = self._stubs[address] = self._make_stub(ch)
            return stub

    def has(self, address: str) -> bool:
        return address in self._stubs

    @contextlib.contextmanager
    def closed_calls(self) -> Iterator[None]:
        """Around a call through one of these stubs: gRPC's ValueError for a channel closed
        under it ("Cannot invoke RPC on closed channel!": ``close()`` from another thread between
        the stub's lookup and the call) is ClosedError, as ``get`` after ``close()``; any other
        ValueError stays as it is."""
        try:
            yield
        except ValueError as exc:
            if self._closed:
                raise self._closed_error() from exc
            raise

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"{self._what} is closed")

    def close(self) -> list[C]:
        with self._lock:
            self._closed = True
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        return channels
