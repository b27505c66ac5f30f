"""Whether Python's cyclic collector was on when a function ran (issue 43: work the coordinator
does with the collector held)."""

from __future__ import annotations

import gc
from typing import Any

import pytest


def note_collector(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[bool]:
    """Wrap ``owner.name`` so that each call notes ``gc.isenabled()`` and then runs it; returns
    the notes, one a call."""
    seen: list[bool] = []
    real = getattr(owner, name)

    def noting(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, noting)
    return seen
