"""The noisy-neighbour drill's kinds of abuse as the environment names them (pure): all by
default, a subset for a measurement, ``none`` for the idle control (nothing sent), ``hog`` for the
CPU control (nothing sent, ~0.1-0.2 core spun in the cluster's group), and clear errors for a
mistyped kind or a control mixed with others."""

from __future__ import annotations

import pytest

from ordq.drills import neighbour


def kinds(monkeypatch: pytest.MonkeyPatch, value: str | None) -> tuple[str, ...]:
    if value is None:
        monkeypatch.delenv(neighbour.ABUSE_ENV, raising=False)
    else:
        monkeypatch.setenv(neighbour.ABUSE_ENV, value)
    return neighbour.abuse_kinds()


def test_every_kind_by_default_and_a_subset_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, None) == neighbour.ABUSE_KINDS
    assert kinds(monkeypatch, "streams, huge") == ("streams", "huge")


def test_none_is_the_idle_control_sending_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, "none") == ()


def test_hog_is_the_cpu_control_sending_nothing_either(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(monkeypatch, "hog") == (neighbour.HOG_CONTROL,)
    assert not set(neighbour.ABUSE_KINDS) & {neighbour.HOG_CONTROL, neighbour.IDLE_CONTROL}


@pytest.mark.parametrize("value", ["streams,none", "stream", "hog,streams", "none,hog"])
def test_a_mistyped_kind_or_none_with_others_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    with pytest.raises(ValueError, match=neighbour.ABUSE_ENV):
        kinds(monkeypatch, value)
