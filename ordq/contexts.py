"""Contexts: named clusters and the current one, as kubeconfig contexts, ``rpk`` profiles and
``nats context`` keep them (issue 42: after ``ordq up --zk-port 0`` the other commands still
tried ZooKeeper at 2181).

A context names a cluster the way every command does: its ZooKeeper connection string and root
(the name under which ``ordq up`` or ``ordq cert register`` registered its coordinators and
credentials), and optionally the coordinators' addresses (``--bootstrap``). The file is
``contexts.json`` beside the credentials file (``ORDQ_CONTEXTS`` names another)::

    {"current": "local", "contexts": {"local": {"zk": "127.0.0.1:2181", "root": "/ordq"}}}

A context ``ordq up`` adds keeps the local cluster's folder too (``dir``): ``ordq down`` given
no ``--dir``, in a folder that holds no cluster, stops the current context's one.

Precedence for a command: its flags (``--zk``, ``--root``, ``--bootstrap``), then the
environment (``ORDQ_ZK``, ``ORDQ_ROOT``, ``ORDQ_BOOTSTRAP``), then ``--context NAME`` or
``ORDQ_CONTEXT``, then the current context, then the defaults.

Rules: no connection to anything; the file is read and written under a lock and replaced
atomically, so two ``ordq up`` at once keep both contexts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ordq.common.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"invalid context name {name!r}: letters, digits, '.', '_', '-', at most 64")
    return name


class Context:
    """One named cluster: what ``--zk``, ``--root`` and ``--bootstrap`` would say. Immutable.
    (Plain classes here, not attrs: every client command reads the contexts, and ``ordq queue
    list`` loads no attrs, issue 42.)"""

    __slots__ = ("name", "zk", "root", "bootstrap", "dir")
    name: str
    zk: str
    root: str
    bootstrap: str | None
    dir: str | None  # the folder of the local cluster ``ordq up`` made it for (``ordq down`` finds it)

    def __init__(self, *, name: str, zk: str, root: str = "/ordq", bootstrap: str | None = None,
                 dir: str | None = None) -> None:
        for field, value in (("name", _check_name(name)), ("zk", zk), ("root", root), ("bootstrap", bootstrap),
                             ("dir", dir)):
            object.__setattr__(self, field, value)
        if not self.zk.strip() and not self.bootstrap:
            raise ConfigError(f"context {self.name!r}: give --zk (and --root) or --bootstrap")
        if not self.root.startswith("/"):
            raise ConfigError(f"context {self.name!r}: the root is an absolute path, not {self.root!r}")

    def __setattr__(self, field: str, value: object) -> None:
        raise AttributeError(f"a Context is immutable ({field})")

    def _key(self) -> tuple[str, str, str, str | None, str | None]:
        return (self.name, self.zk, self.root, self.bootstrap, self.dir)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Context(name={self.name!r}, zk={self.zk!r}, root={self.root!r}, bootstrap={self.bootstrap!r}, "
                f"dir={self.dir!r})")

    def to_dict(self) -> dict[str, Any]:
        return {"zk": self.zk, "root": self.root, **({"bootstrap": self.bootstrap} if self.bootstrap else {}),
                **({"dir": self.dir} if self.dir else {})}

    @classmethod
    def from_dict(cls, name: str, data: Any) -> Context:
        if not isinstance(data, dict) or not isinstance(data.get("zk", ""), str):
            raise ConfigError(f"context {name!r} in {contexts_path()} is not an object with a 'zk' string")
        folder = data.get("dir")
        return cls(name=name, zk=data.get("zk", ""), root=data.get("root", "/ordq"),
                   bootstrap=data.get("bootstrap") or None, dir=folder if isinstance(folder, str) and folder else None)


class Contexts:
    """The file's content: every context by name, and the current one's name (None: none)."""

    __slots__ = ("current", "contexts")

    def __init__(self, current: str | None, contexts: dict[str, Context]) -> None:
        self.current = current
        self.contexts = contexts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Contexts) and (self.current, self.contexts) == (other.current, other.contexts)

    __hash__ = None  # type: ignore[assignment]  # holds a dict

    def __repr__(self) -> str:
        return f"Contexts(current={self.current!r}, contexts={self.contexts!r})"

    def get(self, name: str) -> Context:
        try:
            return self.contexts[name]
        except KeyError:
            known = ", ".join(sorted(n for n in self.contexts if _NAME.fullmatch(n))) or (
                "none (ordq context add NAME --zk ... adds one)")
            raise ConfigError(f"unknown context {name!r} (contexts: {known})") from None


def contexts_path() -> Path:
    """``$ORDQ_CONTEXTS``, else ``contexts.json`` beside the credentials file (whose place
    ``ORDQ_CREDENTIALS`` and ``ORDQ_HOME`` set; default ~/.config/ordq)."""
    if os.environ.get("ORDQ_CONTEXTS"):
        return Path(os.environ["ORDQ_CONTEXTS"])
    from ordq.common.client_tls import credentials_path

    return credentials_path().with_name("contexts.json")


def load(path: Path | None = None) -> Contexts:
    path = path or contexts_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return Contexts(None, {})
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the contexts file {path}: {exc}") from exc
    raw = data.get("contexts") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise ConfigError(f"the contexts file {path} has no 'contexts' object")
    contexts = {name: Context.from_dict(name, value) for name, value in raw.items()}
    current = data.get("current")
    return Contexts(current if isinstance(current, str) and current in contexts else None, contexts)


@contextlib.contextmanager
def _editing(path: Path | None = None) -> Iterator[dict[str, Any]]:
    """The file as a dict (``current``, ``contexts``) under an exclusive lock; written back
    atomically on exit."""
    path = path or contexts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = load(path)
        data: dict[str, Any] = {"current": now.current,
                                "contexts": {n: c.to_dict() for n, c in now.contexts.items()}}
        yield data
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)


def add(context: Context, *, select: bool = False, path: Path | None = None) -> None:
    """Add ``context`` (replacing one of the same name); ``select``: make it the current one."""
    with _editing(path) as data:
        data["contexts"][context.name] = context.to_dict()
        if select:
            data["current"] = context.name


def use(name: str, *, path: Path | None = None) -> Context:
    """Make ``name`` the current context (ConfigError if unknown)."""
    with _editing(path) as data:
        found = _known(name, data)
        data["current"] = name
    return found


def remove(name: str, *, path: Path | None = None) -> bool:
    """Remove ``name`` (ConfigError if unknown); True when it was the current one (then none is)."""
    with _editing(path) as data:
        _known(name, data)
        del data["contexts"][name]
        was_current = data["current"] == name
        if was_current:
            data["current"] = None
    return was_current


def _known(name: str, data: dict[str, Any]) -> Context:
    contexts = {n: Context.from_dict(n, c) for n, c in data["contexts"].items()}
    return Contexts(data["current"], contexts).get(name)


def remove_matching(zk: str, root: str, *, path: Path | None = None) -> list[str]:
    """Remove every context naming the cluster (``zk``, ``root``) (``ordq down --wipe``)."""
    with _editing(path) as data:
        gone = [n for n, c in data["contexts"].items() if c.get("zk") == zk and c.get("root", "/ordq") == root]
        for name in gone:
            del data["contexts"][name]
        if data["current"] in gone:
            data["current"] = None
    return gone


def selected(name: str | None = None) -> Context | None:
    """The context ``name`` (ConfigError if unknown), else the current one, else None."""
    contexts = load()
    if name:
        return contexts.get(name)
    return contexts.contexts.get(contexts.current) if contexts.current else None


def apply(args: Any) -> None:
    """--zk, --root and --bootstrap (of the parsed command line ``args``) from the context
    (--context, ORDQ_CONTEXT, else the current one) where neither the command line nor the
    environment gives them: how every client command and ``ordq status`` find their cluster."""
    given: set[str] = set(getattr(args, "given", ()))
    name = args.context or os.environ.get("ORDQ_CONTEXT") or None
    if "zk" in given or os.environ.get("ORDQ_ZK") or (args.bootstrap and not name):
        return  # the command line or the environment names the cluster
    context = selected(name)
    if context is None:
        return
    args.zk = context.zk or args.zk
    if "root" not in given and not os.environ.get("ORDQ_ROOT"):
        args.root = context.root
    if not args.bootstrap and context.bootstrap:
        args.bootstrap = context.bootstrap
