"""The broker's epoch gate, without I/O: only the epoch ZooKeeper holds passes, and the hot
path (a claim equal to the cached epoch) makes no lookup."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.broker_group.epochs import EpochGate, judge
from ordq.common.errors import EpochNotIssued, FencedError


@given(claimed=st.integers(0, 50), current=st.integers(0, 50))
def test_judge_passes_only_the_current_epoch(claimed: int, current: int) -> None:
    if claimed == current:
        judge("q", claimed, current)
    else:
        with pytest.raises(FencedError if claimed < current else EpochNotIssued):
            judge("q", claimed, current)


@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40))
def test_the_gate_agrees_with_zookeeper_and_reads_it_only_on_a_new_claim(steps: list[tuple[bool, int]]) -> None:
    zk = {"q": 0}
    gate = EpochGate(lambda q: zk[q])
    for bump, claimed in steps:
        if bump:  # a new leader (or a re-created queue: back to 0)
            zk["q"] = 0 if claimed == 0 else zk["q"] + 1
            continue
        cached_before = gate.lookups
        try:
            gate.check("q", claimed)
            ok = True
        except (FencedError, EpochNotIssued):
            ok = False
        # The cache may be stale, but a claim it passes without a lookup is what the last lookup
        # returned; every other claim is judged against ZooKeeper as it is now.
        if gate.lookups > cached_before:
            assert ok == (claimed == zk["q"])
    gate.check("q", zk["q"])
    n = gate.lookups
    for _ in range(100):
        gate.check("q", zk["q"])
    assert gate.lookups == n


def _hash(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def test_a_write_needs_the_key_issued_with_the_epoch_and_the_hot_path_neither_reads_nor_hashes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    zk = {"q": (3, _hash("secret"))}
    gate = EpochGate(lambda q: zk[q])
    for wrong in ("", "guess", "secret "):
        with pytest.raises(EpochNotIssued):
            gate.check("q", 3, wrong)
    assert gate.key_refusals == 3
    gate.check("q", 3, "secret")
    gate.check("q", 3)  # a control call (Fence): no key to check, the certificate gate decides
    n = gate.lookups
    import ordq.broker_group.epochs as epochs

    def no_hashing(*_a: object) -> bool:
        raise AssertionError("hashed on the hot path")

    monkeypatch.setattr(epochs, "key_matches", no_hashing)
    for _ in range(100):
        assert gate.knows("q", 3, "secret")
        gate.check("q", 3, "secret")
    assert gate.lookups == n
    monkeypatch.undo()
    # a new claim binds a new key: once a write of it was seen (the cache is a shortcut; the
    # new leader's Fence is what stops the old one), the old epoch and key are refused
    zk["q"] = (4, _hash("next"))
    with pytest.raises(EpochNotIssued):
        gate.check("q", 4, "secret")
    gate.check("q", 4, "next")
    with pytest.raises(FencedError):
        gate.check("q", 3, "secret")


def test_state_from_before_keys_lets_any_key_pass() -> None:
    gate = EpochGate(lambda q: (2, None))
    gate.check("q", 2, "")
    gate.check("q", 2, "anything")
    with pytest.raises(EpochNotIssued):
        gate.check("q", 3, "")


def test_a_read_handed_in_replaces_the_lookup_and_is_judged_the_same() -> None:
    """A new segment's first write reads the epoch with the queue's state in one round trip
    (``WritePath._prepare_segment``): that read is judged as the gate's own lookup is, and
    the next claim equal to it takes the hot path."""

    def no_lookup(_q: str) -> tuple[int, str | None]:
        raise AssertionError("looked up although a read was handed in")

    gate = EpochGate(no_lookup)
    reads = []

    def read() -> tuple[int, str | None]:
        reads.append(1)
        return 5, _hash("k")

    with pytest.raises(FencedError):
        gate.check("q", 4, "k", read=read)
    with pytest.raises(EpochNotIssued):
        gate.check("q", 5, "other", read=read)
    gate.check("q", 5, "k", read=read)
    n = len(reads)
    gate.check("q", 5, "k", read=read)  # cached: the read is not called
    assert len(reads) == n and gate.knows("q", 5, "k")
