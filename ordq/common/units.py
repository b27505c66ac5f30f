"""Durations and sizes as people write them: ``7d``, ``90s``, ``500ms``; ``10GiB``, ``256MiB``.

One parser for every place that takes them (CLI options, relative times, SDK configs)."""

from __future__ import annotations

import math
import re

from ordq.common.errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)?", re.IGNORECASE)
_BYTES = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(text: str) -> float:
    """Seconds from ``500ms``, ``90s``, ``15m``, ``2h``, ``7d``, ``1w`` or a bare number of
    seconds; ConfigError otherwise."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"bad duration {text!r}: use a number with ms, s, m, h, d or w (such as 90s, 7d)")
    value = float(m.group(1)) * _SECONDS[m.group(2) or "s"]
    if not math.isfinite(value):
        raise ConfigError(f"bad duration {text!r}: too large")
    return value


def parse_size(text: str) -> int:
    """Bytes from ``512``, ``64KiB``, ``256MiB``, ``10GiB`` (binary; also K/M/G/T) or ``10GB``
    (decimal); ConfigError otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"bad size {text!r}: use a number of bytes with B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)")
    value = float(m.group(1)) * _BYTES[(m.group(2) or "b").lower()]
    if not math.isfinite(value):
        raise ConfigError(f"bad size {text!r}: too large")
    return int(value)


def format_duration(seconds: float) -> str:
    """The shortest exact way ``parse_duration`` reads back (``7d``, ``90s``, ``1.5s``)."""
    for unit in ("d", "h", "m", "s"):
        n = seconds / _SECONDS[unit]
        if n >= 1 and n == int(n):
            return f"{int(n)}{unit}"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """Binary units where exact (``256MiB``), else bytes."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return f"{size}B"
