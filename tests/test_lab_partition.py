"""Partitions as data (ordq/lab/partition.py), without I/O: which pairs each kind cuts, and
that the nemesis's iptables commands, run on a model of iptables, leave exactly the rules of
its state and nothing at all after heal. The same kinds on real namespaces: tests/test_lab.py."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.lab.partition import (
    CHAIN,
    Command,
    NemesisState,
    Partition,
    bridge,
    cut_pair,
    flaky,
    isolate,
    one_way,
    restore_inputs,
    rule_spec,
    rules_of,
    split,
    transition,
)

HOSTS = [f"h{k}" for k in range(1, 6)]
ADDRESSES = {h: f"10.200.0.{k}" for k, h in enumerate(HOSTS, 1)}


class FakeIptables:
    """iptables' filter table as far as the nemesis uses it, per host, refusing what iptables
    refuses: a chain created twice, deleted while it has rules or a jump to it, a jump to a
    chain that does not exist, a rule deleted that is not there."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, list[tuple[str, ...]]]] = {}

    def run(self, command: Command) -> None:
        table = self.tables.setdefault(command.host, {"INPUT": []})
        op, chain, *rest = command.args
        if op == "-N":
            assert chain not in table
            table[chain] = []
        elif op == "-X":
            assert table.pop(chain) == [] and ("-j", chain) not in table["INPUT"]
        elif op == "-I":
            position, *spec = rest
            assert position == "1" and spec[-1] in table
            table[chain].insert(0, tuple(spec))
        elif op == "-A":
            table[chain].append(tuple(rest))
        elif op == "-D":
            table[chain].remove(tuple(rest))  # ValueError: not there
        else:
            raise AssertionError(f"unexpected iptables command {command}")

    def untouched(self) -> bool:
        return all(t == {"INPUT": []} for t in self.tables.values())


@st.composite
def partitions(draw: st.DrawFn) -> Partition:
    hosts = HOSTS
    kind = draw(st.sampled_from(["isolate", "split", "cut", "one-way", "bridge", "flaky"]))
    a, b, c = draw(st.permutations(hosts))[:3]
    if kind == "isolate":
        return isolate(a, hosts)
    if kind == "split":
        order = draw(st.permutations(hosts))
        at = draw(st.integers(1, len(hosts) - 1))
        return split(order[:at], order[at:])
    if kind == "cut":
        return cut_pair(a, b)
    if kind == "one-way":
        return one_way(a, b)
    if kind == "bridge":
        order = draw(st.permutations(hosts))
        shared, rest = order[0], order[1:]
        at = draw(st.integers(1, len(rest) - 1))
        return bridge(rest[:at], rest[at:], shared)
    return flaky(a, b, draw(st.floats(0.01, 1.0)))


steps = st.lists(st.one_of(st.tuples(st.just("apply"), partitions()), st.tuples(st.just("replace"), partitions()),
                           st.tuples(st.just("heal"), st.none())), max_size=8)


@settings(deadline=None)  # no timing: under load a case may take long
@given(steps)
def test_the_commands_leave_exactly_the_state_and_heal_leaves_nothing(ops: list[tuple[str, Partition | None]]) -> None:
    fake = FakeIptables()
    state = NemesisState()
    for op, partition in ops:
        new = state.heal() if partition is None else getattr(state, op)(partition)
        for command in transition(state.rules, new.rules, ADDRESSES):
            fake.run(command)
        state = new
        installed = {(h, rule) for h, t in fake.tables.items() for rule in t.get(CHAIN, [])}
        assert installed == {(r.host, rule_spec(r, ADDRESSES)) for r in state.rules}
        jumps = {h for h, t in fake.tables.items() if ("-j", CHAIN) in t["INPUT"]}
        assert jumps == {r.host for r in state.rules}  # a chain and its jump only where a rule is
    for command in transition(state.rules, state.heal().rules, ADDRESSES):
        fake.run(command)
    assert fake.untouched()


def test_each_host_gets_one_restore_transaction_in_command_order() -> None:
    commands = transition(frozenset(), rules_of(one_way("h1", "h2") | one_way("h3", "h2")), ADDRESSES)
    assert restore_inputs(commands) == {"h2": "*filter\n-N ORDQ-NEMESIS\n-I INPUT 1 -j ORDQ-NEMESIS\n"
                                              "-A ORDQ-NEMESIS -i eth0 -s 10.200.0.1/32 -j DROP\n"
                                              "-A ORDQ-NEMESIS -i eth0 -s 10.200.0.3/32 -j DROP\nCOMMIT\n"}


@settings(deadline=None)  # no timing: under load a case may take long
@given(partitions(), partitions())
def test_apply_adds_cuts_and_replace_installs_one_partition(first: Partition, second: Partition) -> None:
    state = NemesisState().apply(first).apply(second)
    assert state.partition().cuts == (first | second).cuts
    assert NemesisState().apply(first).replace(second).partition().cuts == second.cuts
    assert rules_of(state.partition()) == state.rules


def pairs(hosts: list[str]) -> list[tuple[str, str]]:
    return list(itertools.permutations(hosts, 2))


@settings(deadline=None)  # no timing: under load a case may take long
@given(st.sampled_from(HOSTS))
def test_isolate_cuts_every_pair_of_the_host_and_no_other(host: str) -> None:
    p = isolate(host, HOSTS)
    for a, b in pairs(HOSTS):
        assert p.blocks(a, b) == (host in (a, b))


@settings(deadline=None)  # no timing: under load a case may take long
@given(st.permutations(HOSTS), st.integers(1, len(HOSTS) - 1))
def test_split_cuts_exactly_the_pairs_across(order: list[str], at: int) -> None:
    left, right = order[:at], order[at:]
    p = split(left, right)
    for a, b in pairs(HOSTS):
        assert p.blocks(a, b) == ((a in left) != (b in left))
        assert p.connects(a, b) == ((a in left) == (b in left))


@settings(deadline=None)  # no timing: under load a case may take long
@given(st.permutations(HOSTS), st.integers(1, len(HOSTS) - 2))
def test_a_bridge_keeps_the_shared_host_reachable_from_both_halves(order: list[str], at: int) -> None:
    shared, rest = order[0], order[1:]
    left, right = rest[:at], rest[at:]
    p = bridge(left, right, shared)
    for h in rest:
        assert p.connects(shared, h) and p.connects(h, shared)
    for a, b in itertools.product(left, right):
        assert p.blocks(a, b) and p.blocks(b, a)
    for side in (left, right):
        assert all(p.connects(a, b) for a, b in pairs(side))


def test_one_way_drops_one_direction_and_so_breaks_tcp_both_ways() -> None:
    p = one_way("h1", "h2")
    assert p.blocks("h1", "h2") and p.delivers("h2", "h1")
    assert not p.connects("h1", "h2") and not p.connects("h2", "h1")
    assert all(p.connects(a, b) for a, b in pairs(HOSTS) if {a, b} != {"h1", "h2"})


def test_cut_pair_and_flaky_touch_one_pair() -> None:
    c = cut_pair("h2", "h3")
    assert c.blocks("h2", "h3") and c.blocks("h3", "h2")
    assert all(c.delivers(a, b) for a, b in pairs(HOSTS) if {a, b} != {"h2", "h3"})
    f = flaky("h1", "h2", 0.3)
    assert not f.blocks("h1", "h2") and not f.delivers("h1", "h2") and not f.delivers("h2", "h1")
    (rule,) = [r for r in rules_of(f) if r.host == "h2"]
    assert rule_spec(rule, ADDRESSES) == ("-i", "eth0", "-s", "10.200.0.1/32", "-m", "statistic", "--mode",
                                          "random", "--probability", "0.300000", "-j", "DROP")


def test_a_cut_is_dropped_where_it_arrives() -> None:
    (rule,) = rules_of(one_way("h1", "h2"))
    assert (rule.host, rule.src) == ("h2", "h1")  # the receiver drops: the sender's send succeeds
    assert rule_spec(rule, ADDRESSES) == ("-i", "eth0", "-s", "10.200.0.1/32", "-j", "DROP")


@pytest.mark.parametrize("make", [
    lambda: split(["h1"], ["h1", "h2"]),
    lambda: split([], ["h1"]),
    lambda: isolate("h9", HOSTS),
    lambda: isolate("h1", ["h1"]),
    lambda: bridge(["h1"], ["h2"], "h1"),
    lambda: one_way("h1", "h1"),
    lambda: flaky("h1", "h2", 0.0),
    lambda: flaky("h1", "h2", 1.5),
])
def test_impossible_partitions_are_refused(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]
