"""The broker's epoch gate, without I/O: only the epoch ZooKeeper holds passes, and the hot
path (a claim equal to the cached epoch) makes no lookup."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_group.epochs import EpochGate, judge
from ordq.errors import EpochNotIssued, FencedError


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
