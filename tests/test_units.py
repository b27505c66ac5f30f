"""Durations and sizes as people write them (ordq.common.units): the one parser behind every option
that takes them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.common.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("90s", 90), ("90", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("1w", 604800),
    ("1.5s", 1.5), (" 3 h ", 10800),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [
    ("512", 512), ("512B", 512), ("64KiB", 65536), ("256MiB", 256 << 20), ("10GiB", 10 << 30), ("1TiB", 1 << 40),
    ("10GB", 10**10), ("1kb", 1000), ("4K", 4096), ("1.5MiB", 3 << 19),
])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "s", "-5s", "5x", "1e999", "inf", "nan", "7 days"])
def test_bad_durations_are_clear_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="bad duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", "MiB", "-1", "5 XB", "1e3", "inf"])
def test_bad_sizes_are_clear_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="bad size"):
        parse_size(text)


@given(st.integers(1, 10**9))
def test_durations_read_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(0, 1 << 50))
def test_sizes_read_back(size: int) -> None:
    assert parse_size(format_size(size)) == size
