"""``pad_heap`` (ordq/common/heap.py): glibc takes the top pad; without a C library to ask it
does nothing and says so."""

from __future__ import annotations

import ctypes.util

import pytest

from ordq.common import heap


def test_glibc_takes_the_top_pad() -> None:
    assert heap.pad_heap(heap.HEAP_PAD_BYTES) is True


def test_without_a_c_library_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda _name: None)
    assert heap.pad_heap() is False
