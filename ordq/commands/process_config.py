"""Per-process config files: ``ordq broker run --config FILE``, ``ordq coordinator run --config
FILE``, ``ordq zk start --config FILE`` (docs/OPERATIONS.md, Deploying on three machines).

A file is TOML, one process's settings; every key is optional, since a flag may give it
instead. Guarantees:
- A key the process does not know, or a value of the wrong type, is refused with a
  ConfigError naming the file and the key (a typo never passes for a default).
- Command-line flags override the file; the file overrides ``ORDQ_ZK``/``ORDQ_ROOT`` and the
  built-in defaults.
- Relative paths in the file are relative to the file's own folder, not to where the
  command runs.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ordq.common import addresses
from ordq.common.errors import ConfigError

C = TypeVar("C")

_str = attrs.validators.optional(attrs.validators.instance_of(str))
_path = attrs.validators.optional(attrs.validators.instance_of(Path))
_bool = attrs.validators.instance_of(bool)


def _number(low: float) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > low:
            raise ConfigError(f"{attribute.name} must be a number > {low:g}, not {value!r}")
    return check


def _address(_inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _str(_inst, attribute, value)
        addresses.split_host_port(value, attribute.name, port_optional=attribute.name.endswith("advertise"))


@attrs.frozen(kw_only=True)
class TlsFiles:
    """``[tls]``: the process's certificate and key, the cluster CA; or ``insecure = true``.
    ``zookeeper = true``: reach ZooKeeper over TLS too, presenting the same certificate."""

    cert: Path | None = attrs.field(default=None, validator=_path)
    key: Path | None = attrs.field(default=None, validator=_path)
    ca: Path | None = attrs.field(default=None, validator=_path)
    insecure: bool = attrs.field(default=False, validator=_bool)
    zookeeper: bool = attrs.field(default=False, validator=_bool)


@attrs.frozen(kw_only=True)
class ServerFile:
    """What every server process's file may name: where ZooKeeper is, where it listens,
    what it advertises, where its metrics are served, its TLS files."""

    zk: str | None = attrs.field(default=None, validator=_str)
    root: str | None = attrs.field(default=None, validator=_str)
    listen: str | None = attrs.field(default=None, validator=_address)
    advertise: str | None = attrs.field(default=None, validator=_address)
    metrics: str | None = attrs.field(default=None, validator=_address)
    session_timeout_s: float | None = attrs.field(default=None, validator=_number(0))
    tls: TlsFiles = attrs.field(factory=TlsFiles, validator=attrs.validators.instance_of(TlsFiles))


@attrs.frozen(kw_only=True)
class BrokerFile(ServerFile):
    """``ordq broker run --config``: also the group and role, and the data folder."""

    group: str | None = attrs.field(default=None, validator=_str)
    role: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(("master", "slave"))))
    data: Path | None = attrs.field(default=None, validator=_path)
    register_wait_s: float | None = attrs.field(default=None, validator=_number(-1e-9))
    disk_room_mib: float | None = attrs.field(default=None, validator=_number(-1e-9))
    # the lean link's (BrokerConfig.link_listen / link_advertise; docs/OPERATIONS.md, "The lean links")
    link_listen: str | None = attrs.field(default=None, validator=_address)
    link_advertise: str | None = attrs.field(default=None, validator=_address)


@attrs.frozen(kw_only=True)
class CoordinatorFile(ServerFile):
    """``ordq coordinator run --config``: also the duty round period."""

    interval_s: float | None = attrs.field(default=None, validator=_number(0))
    # an operator's Prometheus, where the status page's charts read the last hour (issue 42)
    prometheus_url: str | None = attrs.field(default=None, validator=_str)


@attrs.frozen(kw_only=True)
class ZkNodeSpec:
    """``[[servers]]`` of a ZooKeeper file: where one node listens."""

    host: str = attrs.field(validator=attrs.validators.instance_of(str))
    client_port: int = attrs.field(default=2181, validator=attrs.validators.instance_of(int))
    quorum_port: int = attrs.field(default=2888, validator=attrs.validators.instance_of(int))
    election_port: int = attrs.field(default=3888, validator=attrs.validators.instance_of(int))


@attrs.frozen(kw_only=True)
class ZkFile:
    """``ordq zk start --config``: every server of the ensemble (1 or 3), which of them this
    machine runs (``myid``, 1-based as ZooKeeper's), its folder, its tick, its TLS files."""

    servers: tuple[ZkNodeSpec, ...] = attrs.field(converter=tuple)
    myid: int | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.instance_of(int)))
    dir: Path | None = attrs.field(default=None, validator=_path)
    tick_time_ms: int = attrs.field(default=200, validator=attrs.validators.instance_of(int))
    tls: TlsFiles = attrs.field(factory=TlsFiles, validator=attrs.validators.instance_of(TlsFiles))

    def __attrs_post_init__(self) -> None:
        if len(self.servers) not in (1, 3):
            raise ConfigError(f"servers: a ZooKeeper has 1 or 3 servers, not {len(self.servers)}")
        if self.myid is None and len(self.servers) > 1:
            raise ConfigError("myid: name which of the servers this machine runs (1, 2 or 3)")
        if self.myid is not None and not 1 <= self.myid <= len(self.servers):
            raise ConfigError(f"myid must be 1..{len(self.servers)}, not {self.myid}")

    @property
    def node(self) -> int:
        """This machine's node, numbered from 0 (ordq.zk_server)."""
        return (self.myid or 1) - 1


def load(path: Path, cls: type[C]) -> C:
    """The file at ``path`` as a ``cls`` (one of the classes above); ConfigError naming the
    file and the key when it cannot be read, is not TOML, has a key ``cls`` does not know or
    a value of the wrong type."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        return _build(cls, doc, "", Path(path).absolute().parent)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def _build(cls: Any, doc: Any, prefix: str, base: Path) -> Any:
    if not isinstance(doc, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the file'} must be a table, not {doc!r}")
    fields = {f.name: f for f in attrs.fields(cls)}
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key '{prefix}{unknown[0]}' (known keys: {', '.join(sorted(fields))})")
    values: dict[str, Any] = {}
    for name, value in doc.items():
        kind = fields[name].type
        if kind in ("TlsFiles", TlsFiles):
            value = _build(TlsFiles, value, f"{prefix}{name}.", base)
        elif name == "servers":
            if not isinstance(value, list):
                raise ConfigError(f"{prefix}servers must be an array of tables ([[servers]])")
            value = [_build(ZkNodeSpec, v, f"{prefix}servers[{i}].", base) for i, v in enumerate(value)]
        elif kind in ("Path | None",) and isinstance(value, str):
            value = base / Path(value).expanduser()
        values[name] = value
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix}{exc.args[0] if exc.args else exc}") from None


def pick(args: argparse.Namespace, flag: str, file_value: Any, default: Any) -> Any:
    """A setting: the flag when given (not None), else the file's, else ``default``."""
    given = getattr(args, flag, None)
    if given is not None:
        return given
    return file_value if file_value is not None else default


def apply_globals(args: argparse.Namespace, cfg: ServerFile) -> None:
    """``zk`` and ``root`` from the file unless given on the command line (``--zk``/``--root``;
    ``ordq.commands.Given`` marks them); the file wins over ``ORDQ_ZK``/``ORDQ_ROOT``."""
    given: set[str] = getattr(args, "given", set())
    if cfg.zk is not None and "zk" not in given:
        args.zk = cfg.zk
    if cfg.root is not None and "root" not in given:
        args.root = cfg.root


def tls_from(args: argparse.Namespace, cfg: ServerFile) -> None:
    """``--tls-cert/--tls-key/--tls-ca/--insecure`` from the file's ``[tls]`` unless some TLS
    flag was given (TLS settings are taken from one place, never mixed); ``--zk-tls`` from
    ``zookeeper`` unless given."""
    if getattr(args, "zk_tls", None) is None:
        args.zk_tls = cfg.tls.zookeeper
    if any(getattr(args, f, None) for f in ("tls_cert", "tls_key", "tls_ca", "insecure")):
        return
    args.tls_cert, args.tls_key, args.tls_ca = cfg.tls.cert, cfg.tls.key, cfg.tls.ca
    args.insecure = cfg.tls.insecure
