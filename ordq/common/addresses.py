"""Where a server listens and the address it advertises (in ZooKeeper, where clients find it).

A process binds ``listen`` (``HOST:PORT``; port 0: any free one) and registers the address
others must dial: ``advertise`` when given (``HOST`` or ``HOST:PORT``; without a port, the one
bound), else the listen host with the bound port. A wildcard listen host (``0.0.0.0``, ``::``)
is no address anyone can dial, so it needs ``advertise``: refused when built, before anything
is bound or registered.
"""

from __future__ import annotations

import ipaddress

from ordq.common.errors import ConfigError

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def split_host_port(text: str, what: str = "address", *, port_optional: bool = False) -> tuple[str, int | None]:
    """``HOST:PORT`` (or ``[v6]:PORT``) -> (host, port); with ``port_optional`` a bare
    ``HOST`` gives (host, None). ConfigError when malformed."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if text.startswith("[") and "]" in text:  # [v6] or [v6]:port
        close = text.index("]")
        host, rest = text[:close + 1], text[close + 1:]
        sep, port = (":", rest[1:]) if rest.startswith(":") else ("", "")
    elif sep and ":" in host:  # a bare IPv6 address: no port
        host, sep, port = text, "", ""
    if not sep:
        if port_optional and text:
            return text, None
        raise ConfigError(f"{what} must be HOST:PORT, not {text!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT with a port 0..65535, not {text!r}")
    return host, int(port)


def check(listen: str, advertise: str | None) -> None:
    """ConfigError unless ``listen`` is HOST:PORT and what would be advertised is dialable."""
    host, _ = split_host_port(listen, "listen address")
    if advertise is None:
        if host in WILDCARD_HOSTS:
            raise ConfigError(f"listening on {listen!r} (every address) needs an advertised address: "
                              "give --advertise HOST[:PORT] (advertise in a config file), the address "
                              "other machines reach this one at")
        return
    adv_host, adv_port = split_host_port(advertise, "advertised address", port_optional=True)
    if adv_host in WILDCARD_HOSTS or adv_port == 0:
        raise ConfigError(f"advertised address {advertise!r} is no address a client can dial")


def advertised(listen: str, advertise: str | None, bound_port: int) -> str:
    """The ``HOST:PORT`` to register for a server bound at ``bound_port`` (see the module doc)."""
    check(listen, advertise)
    if advertise is None:
        host, _ = split_host_port(listen)
        return f"{host}:{bound_port}"
    host, port = split_host_port(advertise, port_optional=True)
    return f"{host}:{port if port is not None else bound_port}"


def is_ip(host: str) -> bool:
    """Is ``host`` an IP address (not a DNS name)?"""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
