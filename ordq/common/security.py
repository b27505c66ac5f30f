"""Who may talk to a broker: TLS material, the credentials of a cluster, and where clients find them.

- ``Credentials``: what one process presents and trusts on its gRPC hops (the cluster CA, its
  own certificate and key, a token, the ZooKeeper digest ``user:password``). ``ca_file`` None
  means plaintext (``ordq broker run --insecure``); otherwise every hop is mutual TLS: a broker
  refuses any peer without a certificate signed by the cluster CA (gRPC's Python server can
  only require client certificates or not ask for them, so clients get one too).
- ``ensure_pki(folder)``: a local CA and two certificates (``broker``, ``client``) made with
  the ``cryptography`` package, valid for 127.0.0.1 and localhost. Created once, kept. The
  client certificate is for client authentication only (ExtendedKeyUsage ``clientAuth``), so
  no TLS peer accepts it from a server: a client cannot pose as a broker that a broker dials
  for a copy. Brokers and coordinators (``ensure_coordinator_pki``) are both. A client
  certificate made before that rule (it also says ``serverAuth``) is issued again.
- ``make_ca(folder)`` and ``issue(...)``: a CA of its own for a cluster across machines, and a
  certificate from it naming the addresses (IPs, DNS names) its process is dialled at
  (``ordq cert ca``, ``ordq cert issue``).
- The credentials file (like a kubeconfig): ``ordq up`` registers the cluster it started under
  its ZooKeeper address and root, so every CLI command and SDK client finds them from ``--zk``
  alone. ``$ORDQ_CREDENTIALS``, else ``$ORDQ_HOME/credentials.json``, else
  ``~/.config/ordq/credentials.json``. ``$ORDQ_TOKEN`` overrides the token found there.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ordq.common.addresses import is_ip

# What a client needs (the credentials file read, channels): there without attrs (issue 42),
# here too, for every module that imports them from here.
from ordq.common.client_tls import (
    COORDINATORS_FIELD,
    StubCache,
    aio_channel,
    channel,
    client_pair,
    cluster_key,
    credentials_path,
    entry,
    entry_for_bootstrap,
    load_clusters,
    read_tls_file,
    registered_bootstrap,
    token_metadata,
)
from ordq.common.errors import ConfigError

__all__ = ["COORDINATORS_FIELD", "StubCache", "aio_channel", "channel", "credentials_path", "registered_bootstrap",
           "token_metadata"]

if TYPE_CHECKING:  # grpc is imported where a channel is made: `ordq --help` and the
    import grpc  # commands that only read the credentials file do not load it (issue 42)

BROKER_CN = "ordq-broker"  # the certificate subject that may replicate (broker_group/service.py)
CLIENT_CN = "ordq-client"
# The certificate subject of coordinator processes: with BROKER_CN the only peers a broker takes
# control calls from (Seal, Fence, Reconcile), and the server name clients of the coordinator
# service (coordinator/service.py) see.
COORDINATOR_CN = "ordq-coordinator"
ZOOKEEPER_CN = "ordq-zookeeper"
# What a certificate is for (``ordq cert issue --role``): its subject, and whether it may serve.
ROLES: dict[str, tuple[str, bool]] = {"broker": (BROKER_CN, True), "coordinator": (COORDINATOR_CN, True),
                                      "zookeeper": (ZOOKEEPER_CN, True), "client": (CLIENT_CN, False)}
LOCAL_NAMES = (("localhost",), ("127.0.0.1",))  # (DNS names, IPs) of the certificates ensure_pki makes
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@attrs.frozen(kw_only=True)
class Credentials:
    ca_file: str | None = None  # the CA to trust; None: plaintext gRPC
    cert_file: str | None = None  # this process's certificate, signed by that CA
    key_file: str | None = None
    token: str | None = None
    zk_auth: str | None = None  # "user:password" of ZooKeeper's digest scheme
    # ZooKeeper is reached over TLS (its secureClientPort), with the same CA, certificate and key
    zk_tls: bool = False

    def __attrs_post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("a TLS certificate needs its key and a key its certificate")
        if self.cert_file is not None and self.ca_file is None:
            raise ConfigError("a TLS certificate needs the CA that signed the peers' (--tls-ca)")
        if self.zk_tls and (self.ca_file is None or self.cert_file is None):
            raise ConfigError("TLS to ZooKeeper needs the cluster CA and a certificate with its key")

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in attrs.asdict(self).items() if v is not None and v is not False}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Credentials:
        fields = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


def server_credentials(creds: Credentials) -> grpc.ServerCredentials:
    """A broker's side: its certificate, and every peer must show one signed by the CA."""
    import grpc

    key, cert = client_pair(creds)
    if creds.ca_file is None or key is None or cert is None:
        raise ConfigError("a TLS broker needs --tls-cert, --tls-key and --tls-ca (or --insecure)")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=read_tls_file(creds.ca_file),
                                       require_client_auth=True)


def peer_common_name(context: grpc.ServicerContext) -> str | None:
    """The subject CN of the peer's verified certificate, None on plaintext."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode() if names else None


def bearer_token(context: Any) -> str | None:
    """The token a gRPC call shows (``authorization: Bearer``, the last one if several), if any:
    what ``token_metadata`` sends."""
    token = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            token = value[len("Bearer "):]
    return token


# -- certificates -------------------------------------------------------------------------------

def ensure_pki(folder: Path, *, create: bool = True) -> tuple[Credentials, Credentials]:
    """(broker credentials, client credentials) under ``folder``, made on first use
    (``create`` False: only where they are)."""
    ca_pem, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    if create:
        folder.mkdir(parents=True, exist_ok=True)
        if not ca_pem.exists():
            _make_ca(ca_pem, ca_key)
    out = []
    for name, cn, server in (("broker", BROKER_CN, True), ("client", CLIENT_CN, False)):
        cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
        if create and (not cert.exists() or (not server and _serves(cert))):
            _make_cert(ca_pem, ca_key, cert, key, cn, server=server)
        out.append(Credentials(ca_file=str(ca_pem), cert_file=str(cert), key_file=str(key)))
    return out[0], out[1]


def _serves(cert_path: Path) -> bool:
    """Does the certificate allow server authentication? (A client certificate made before
    they were issued for client authentication only does: it could pose as a broker.)"""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no ExtendedKeyUsage: good for any purpose
    return ExtendedKeyUsageOID.SERVER_AUTH in usages


def ensure_coordinator_pki(folder: Path, *, create: bool = True) -> Credentials:
    """The coordinators' credentials under ``folder`` (the CA of ``ensure_pki``), made on first
    use (``create`` False: only where they are)."""
    ca_pem, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    cert, key = folder / "coordinator.pem", folder / "coordinator-key.pem"
    if create and not cert.exists():
        ensure_pki(folder)
        _make_cert(ca_pem, ca_key, cert, key, COORDINATOR_CN, server=True)
    return Credentials(ca_file=str(ca_pem), cert_file=str(cert), key_file=str(key))


def make_ca(folder: Path) -> Path:
    """A new cluster CA in ``folder`` (``ca.pem``, and ``ca-key.pem`` with mode 0600); returns
    the path of ``ca.pem``. AlreadyExists when the folder holds one (never replaced: every
    certificate it signed would stop being trusted)."""
    from ordq.common.errors import AlreadyExists

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_pem, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    if ca_pem.exists() or ca_key.exists():
        raise AlreadyExists(f"{folder} holds a CA already (ca.pem/ca-key.pem): it is kept, since replacing it "
                            "would untrust every certificate it signed")
    _make_ca(ca_pem, ca_key)
    return ca_pem


def issue(ca_folder: Path, out: Path, name: str, *, role: str = "broker", ips: Sequence[str] = (),
          dns: Sequence[str] = (), replace: bool = False) -> Credentials:
    """A certificate signed by the CA in ``ca_folder`` (``ca.pem``, ``ca-key.pem``) for a
    process of ``role`` (``ROLES``: its subject CN, and whether it may serve), naming ``ips``
    and ``dns`` in its subjectAltName: a client dialling the process at any of them accepts
    it, at any other name refuses it. Written to ``out/NAME.pem`` and ``out/NAME-key.pem``,
    the key created with mode 0600. Returns the credentials (with ``ca.pem`` of ``ca_folder``).

    Raises ConfigError for a bad name, IP or DNS name, a serving role without any address,
    no CA (or its key) in ``ca_folder``, or files already there unless ``replace``."""
    if not name or not set(name) <= _NAME_CHARS or name.startswith("."):
        raise ConfigError(f"certificate name {name!r}: use letters, digits, '.', '_' and '-' (it names the files)")
    if role not in ROLES:
        raise ConfigError(f"role {role!r}: one of {', '.join(ROLES)}")
    addrs = []
    for ip in ips:
        try:
            addrs.append(ipaddress.ip_address(ip.strip("[]")))
        except ValueError:
            raise ConfigError(f"--ip {ip!r} is not an IP address (a DNS name goes in --dns)") from None
    for host in dns:
        labels = host.rstrip(".").split(".")
        if not host or any(not label or not set(label) <= _NAME_CHARS - {"."} or label.startswith("-")
                           for label in labels) or is_ip(host):
            raise ConfigError(f"--dns {host!r} is not a DNS name (an address goes in --ip)")
    cn, server = ROLES[role]
    if server and not addrs and not dns:
        raise ConfigError(f"a {role} certificate must name where it is dialled: give --ip and/or --dns")
    ca_pem, ca_key = ca_folder / "ca.pem", ca_folder / "ca-key.pem"
    if not ca_pem.is_file():
        raise ConfigError(f"no CA in {ca_folder} (no ca.pem): make one with ordq cert ca --out {ca_folder}, "
                          "or give --ca-dir where it is")
    if not ca_key.is_file():
        raise ConfigError(f"{ca_folder} holds the CA certificate but not its key (ca-key.pem): issue "
                          "certificates where the CA key is kept")
    cert, key = out / f"{name}.pem", out / f"{name}-key.pem"
    if not replace and (cert.exists() or key.exists()):
        raise ConfigError(f"{cert} or {key} exists already: give --replace to issue it again")
    out.mkdir(parents=True, exist_ok=True)
    _make_cert(ca_pem, ca_key, cert, key, cn, server=server, dns=tuple(dns), ips=tuple(str(a) for a in addrs))
    return Credentials(ca_file=str(ca_pem), cert_file=str(cert), key_file=str(key))


def _write_key(path: Path, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # Created with its mode, never chmod-ed after: O_EXCL, so a leftover file of another
    # mode (O_TRUNC would keep its mode) is replaced by a new one rather than reused.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _builder(subject: Any, issuer: Any, public_key: Any) -> Any:
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=825)))


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _make_ca(cert_path: Path, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("ordq local CA")
    cert = (_builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _make_cert(ca_path: Path, ca_key_path: Path, cert_path: Path, key_path: Path, cn: str, *, server: bool,
               dns: Sequence[str] = LOCAL_NAMES[0], ips: Sequence[str] = LOCAL_NAMES[1]) -> None:
    """A certificate for ``cn`` signed by the CA: for client authentication, and also for
    server authentication when ``server`` (brokers and coordinators serve; clients never do);
    valid for the names ``dns`` and addresses ``ips``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server \
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    builder = _builder(_name(cn), ca.subject, key.public_key())
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (builder
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    # Key, then certificate, each replaced whole (a re-issued client certificate replaces both).
    tmp_key = key_path.with_name(key_path.name + ".tmp")
    _write_key(tmp_key, key)
    os.replace(tmp_key, key_path)
    tmp_cert = cert_path.with_name(cert_path.name + ".tmp")
    tmp_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp_cert, cert_path)


# -- the credentials file -----------------------------------------------------------------------

_key = cluster_key
_load = load_clusters


@contextlib.contextmanager
def _locked_file(path: Path | None = None) -> Iterator[dict[str, Any]]:
    """The file's clusters, under an exclusive lock; written back (atomically) on exit."""
    path = path or credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        clusters = _load(path)
        yield clusters
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # tokens inside
        with os.fdopen(fd, "w") as f:
            json.dump({"clusters": clusters}, f, indent=2, sort_keys=True)
        os.replace(tmp, path)


CLUSTER_FIELD = "cluster"  # the entry's cluster identity (not a Credentials field)


def register(zk_hosts: str, root: str, creds: Credentials, *, cluster: str | None = None,
             path: Path | None = None) -> None:
    """Register ``creds`` for the cluster at (``zk_hosts``, ``root``). ``cluster``: that
    cluster's identity (``LocalCluster.cluster_id``), so that only the same cluster removes or
    replaces it by name (``unregister``). ``path``: another file than the user's (a local
    cluster's own file, which its coordinators read before the cluster serves)."""
    entry = creds.to_dict()
    if cluster is not None:
        entry[CLUSTER_FIELD] = cluster
    with _locked_file(path) as clusters:
        # the coordinators' addresses stay (register_coordinators): clients find the cluster by them
        known = (clusters.get(_key(zk_hosts, root)) or {}).get(COORDINATORS_FIELD)
        if known and COORDINATORS_FIELD not in entry:
            entry[COORDINATORS_FIELD] = known
        clusters[_key(zk_hosts, root)] = entry


def register_tls(zk_hosts: str, root: str, creds: Credentials) -> None:
    """Present the TLS files of ``creds`` (CA, certificate, key) to the cluster at
    (``zk_hosts``, ``root``) from now on, and to its ZooKeeper too when ``creds.zk_tls``
    (``ordq cert register``); what the entry holds besides (token, ZooKeeper credential, the
    cluster's identity, and TLS to ZooKeeper, which ``ordq up`` turns on) is kept."""
    with _locked_file() as clusters:
        entry = clusters.setdefault(_key(zk_hosts, root), {})
        for field in ("ca_file", "cert_file", "key_file"):
            entry[field] = getattr(creds, field)
        if creds.zk_tls:
            entry["zk_tls"] = True


def unregister(zk_hosts: str, root: str, *, cluster: str | None = None, path: Path | None = None) -> bool:
    """Remove the entry for (``zk_hosts``, ``root``); with ``cluster``, only when it is that
    cluster's (an entry without an identity, from an older ordq, counts as anyone's): stopping
    a cluster that never served at that address never removes the one that does. True when
    removed."""
    with _locked_file(path) as clusters:
        entry = clusters.get(_key(zk_hosts, root))
        if entry is None:
            return False
        if cluster is not None and entry.get(CLUSTER_FIELD, cluster) != cluster:
            return False
        del clusters[_key(zk_hosts, root)]
        return True


def register_coordinators(zk_hosts: str, root: str, addresses: Sequence[str], *, path: Path | None = None) -> None:
    """Record where the coordinators of the cluster at (``zk_hosts``, ``root``) answer: what a
    client named by that cluster finds them by (``registered_bootstrap``); clients hold no
    ZooKeeper session (issue 37). The rest of the entry is kept. An address answers for one
    cluster: another entry naming it (a cluster killed without ``ordq down``, whose port this one
    now has) no longer does, or ``--bootstrap`` could find that cluster's CA for this one."""
    key = _key(zk_hosts, root)
    taken = set(addresses)
    with _locked_file(path) as clusters:
        for other, found in clusters.items():
            if other != key and isinstance(found, dict) and found.get(COORDINATORS_FIELD):
                found[COORDINATORS_FIELD] = [a for a in found[COORDINATORS_FIELD] if a not in taken]
        clusters.setdefault(key, {})[COORDINATORS_FIELD] = list(addresses)


def lookup_bootstrap(bootstrap: str) -> Credentials:
    """The credentials registered for the cluster whose coordinators ``bootstrap`` names (any
    one address in common), with the environment's overrides as ``lookup``; plaintext with no
    token when no entry names them."""
    return _with_overrides(Credentials.from_dict(entry_for_bootstrap(bootstrap)))


def registered_cluster(zk_hosts: str, root: str) -> str | None:
    """The identity of the cluster registered at (``zk_hosts``, ``root``), if any."""
    entry = _load(credentials_path()).get(_key(zk_hosts, root)) or {}
    value = entry.get(CLUSTER_FIELD)
    return str(value) if value is not None else None


def provision(folder: Path, zk_hosts: str, root: str, *, tls: bool = True) -> tuple[Credentials, Credentials]:
    """A local cluster's (broker, client) credentials: certificates under ``folder`` (plaintext
    when not ``tls``), the client's registered for its ZooKeeper address and root."""
    broker, client = ensure_pki(folder) if tls else (Credentials(), Credentials())
    register(zk_hosts, root, client)
    return broker, client


def of_store(store: Any) -> Credentials:
    """The credentials registered for the cluster a ZkStore talks to."""
    return lookup(store.hosts, store.paths.root)


def lookup(zk_hosts: str, root: str = "/ordq") -> Credentials:
    """The credentials registered for this cluster (plaintext, no token when none are),
    with ``$ORDQ_TOKEN`` overriding the token and ``$ORDQ_ZK_AUTH`` the ZooKeeper credential
    (``--token`` and ``--zk-auth`` set them for a command)."""
    return _with_overrides(Credentials.from_dict(entry(zk_hosts, root)))


def _with_overrides(creds: Credentials) -> Credentials:
    overrides: dict[str, Any] = {field: os.environ[env]
                                 for field, env in (("token", "ORDQ_TOKEN"), ("zk_auth", "ORDQ_ZK_AUTH"))
                                 if os.environ.get(env)}
    return attrs.evolve(creds, **overrides) if overrides else creds


# -- TLS to ZooKeeper ---------------------------------------------------------------------------

# Connection strings this process knows to be TLS, with the credentials to present: a local
# cluster sets it before it registers anything in a credentials file (it connects while it
# starts), so ``zk_tls_options`` finds it without a file.
_ZK_TLS: dict[str, Credentials] = {}


def remember_zk_tls(zk_hosts: str, creds: Credentials) -> None:
    """Reach ``zk_hosts`` over TLS with ``creds`` from this process (see ``zk_tls_options``)."""
    if not creds.zk_tls:
        raise ConfigError("remember_zk_tls: the credentials do not say zk_tls")
    _ZK_TLS[zk_hosts] = creds


def zk_tls_options(zk_hosts: str) -> dict[str, Any]:
    """kazoo's TLS options for a ZooKeeper connection string: those of a cluster registered at
    that address (any root) with ``zk_tls``, or remembered by this process; {} for plaintext.
    Every ZooKeeper client ordq makes asks here (coordinator/store_base.py ``new_client``), so a
    cluster's ZooKeeper TLS needs no option on any command or config."""
    creds = _ZK_TLS.get(zk_hosts)
    if creds is None:
        prefix = f"{zk_hosts}/"
        for key, entry in sorted(_load(credentials_path()).items()):
            if key.startswith(prefix) and entry.get("zk_tls"):
                creds = Credentials.from_dict(entry)
                break
    if creds is None:
        return {}
    return {"use_ssl": True, "verify_certs": True, "ca": creds.ca_file, "certfile": creds.cert_file,
            "keyfile": creds.key_file}


def registration_problem(zk_hosts: str, root: str) -> str | None:
    """Why nothing is registered for the cluster (``zk_hosts``, ``root``) in the credentials
    file, in words an error can end with, when there is more to say than that (issue 42: a
    missing file read "cannot reach ZooKeeper ... start one with: ordq zk start" while
    ZooKeeper ran): the file does not exist, or it registers other roots of the same ZooKeeper
    (a mistyped ``--root``). None otherwise (an entry is there, or none of that ZooKeeper)."""
    path = credentials_path()
    if not path.exists():
        return f"the credentials file {path} does not exist (ordq up writes it)"
    clusters = _load(path)
    if _key(zk_hosts, root) in clusters:
        return None
    roots = sorted(key.removeprefix(zk_hosts) for key in clusters if key.startswith(f"{zk_hosts}/"))
    return f"{path} registers {zk_hosts} with --root {', '.join(roots)} only" if roots else None
