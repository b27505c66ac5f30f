"""Partitions as data: which packets between the lab's hosts are dropped, and the iptables
commands that make it so.

Rules:
- A ``Partition`` is a set of directed ``Cut``s: packets from ``src`` to ``dst`` are dropped;
  with ``probability`` below 1 each packet is dropped at random (a flaky link). A two-way kind
  is two cuts. The kinds (Jepsen's): ``isolate``, ``split``, ``cut_pair``, ``one_way``,
  ``bridge``, ``flaky``; partitions combine with ``|``.
- A cut is enforced where the packet arrives: a DROP rule in the receiving host's own chain
  (``CHAIN``, jumped to from INPUT) matching the sender's address on the lab link. Dropping in
  the sender's OUTPUT would fail its send with EPERM, which a real network never does: the
  sender must not learn that its packets vanish.
- ``NemesisState`` is what the nemesis installed; ``transition`` is the list of iptables
  commands from one set of rules to another, creating a host's chain with its first rule and
  removing chain and jump with its last, so healing leaves no trace of the nemesis.
- Each host's commands are one ``iptables-restore --noflush`` transaction (``restore_inputs``).
- This module never runs a command, reads a clock or draws a random number (a flaky link draws
  in the kernel: ``-m statistic --mode random``). ``ordq/lab/nemesis.py`` runs the commands.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ordq.common.errors import ConfigError

CHAIN = "ORDQ-NEMESIS"  # the nemesis's own chain in each host; nothing else writes to it
LINK = "eth0"  # the host's interface on the lab's bridge (ordq/lab/lab.py)


def _probability(_instance: object, _attribute: object, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"a drop probability must be in (0, 1], not {value}")


@attrs.frozen(order=True)
class Cut:
    """Packets from ``src`` to ``dst`` are dropped (each with ``probability``; 1: all)."""

    src: str
    dst: str
    # Rounded to the 6 decimals a rule spells (rule_spec), so two cuts that look alike are equal.
    probability: float = attrs.field(default=1.0, converter=lambda p: round(float(p), 6), validator=_probability)

    def __attrs_post_init__(self) -> None:
        if self.src == self.dst:
            raise ConfigError(f"a host is never cut from itself ({self.src})")


@attrs.frozen
class Partition:
    """A named set of cuts. ``kind`` says how it was made (for reports); ``|`` combines two."""

    kind: str
    cuts: frozenset[Cut] = frozenset()

    def __or__(self, other: Partition) -> Partition:
        kind = self.kind if self.kind == other.kind else f"{self.kind}+{other.kind}"
        return Partition(kind, self.cuts | other.cuts)

    def delivers(self, src: str, dst: str) -> bool:
        """Whether every packet from ``src`` reaches ``dst`` (no cut, not even a flaky one)."""
        return not any(c.src == src and c.dst == dst for c in self.cuts)

    def blocks(self, src: str, dst: str) -> bool:
        """Whether every packet from ``src`` to ``dst`` is dropped."""
        return any(c.src == src and c.dst == dst and c.probability == 1.0 for c in self.cuts)

    def connects(self, a: str, b: str) -> bool:
        """Whether a TCP connection between ``a`` and ``b`` works whoever opens it: a
        handshake needs packets both ways, so a one-way cut breaks it in both directions."""
        return self.delivers(a, b) and self.delivers(b, a)

    def hosts(self) -> frozenset[str]:
        return frozenset(h for c in self.cuts for h in (c.src, c.dst))


HEALED = Partition("heal")


def _both_ways(pairs: Iterable[tuple[str, str]], probability: float = 1.0) -> frozenset[Cut]:
    return frozenset(Cut(s, d, probability) for a, b in pairs for s, d in ((a, b), (b, a)))


def _distinct(*groups: Sequence[str]) -> None:
    flat = [h for g in groups for h in g]
    if len(set(flat)) != len(flat):
        raise ConfigError(f"the sides of a partition share a host: {sorted(flat)}")
    if any(not g for g in groups):
        raise ConfigError("every side of a partition needs at least one host")


def split(side_a: Sequence[str], side_b: Sequence[str]) -> Partition:
    """Two sides that cannot reach each other (both ways); each side reaches itself."""
    _distinct(side_a, side_b)
    return Partition("split", _both_ways(itertools.product(side_a, side_b)))


def isolate(host: str, hosts: Sequence[str]) -> Partition:
    """``host`` cut from every other host, both ways."""
    others = [h for h in hosts if h != host]
    if host not in hosts or not others:
        raise ConfigError(f"isolate {host}: needs it among at least two hosts, not {list(hosts)}")
    return Partition("isolate", split([host], others).cuts)


def cut_pair(a: str, b: str) -> Partition:
    """Only ``a`` and ``b`` cannot reach each other (both ways); all else flows."""
    _distinct([a], [b])
    return Partition("cut", _both_ways([(a, b)]))


def one_way(src: str, dst: str) -> Partition:
    """Packets from ``src`` to ``dst`` are dropped; from ``dst`` to ``src`` they flow."""
    _distinct([src], [dst])
    return Partition("one-way", frozenset([Cut(src, dst)]))


def bridge(left: Sequence[str], right: Sequence[str], shared: str) -> Partition:
    """Two halves cut from each other, both ways, that share one host: ``shared`` reaches (and
    is reached by) every host of both (Jepsen's bridge)."""
    _distinct(left, right, [shared])
    return Partition("bridge", split(left, right).cuts)


def flaky(a: str, b: str, probability: float) -> Partition:
    """Each packet between ``a`` and ``b`` (both ways) is dropped with ``probability``."""
    _distinct([a], [b])
    return Partition("flaky", _both_ways([(a, b)], probability))


# -- what the nemesis installs ------------------------------------------------------------------


@attrs.frozen(order=True)
class Rule:
    """One DROP rule, in ``host``'s chain, for packets from ``src``."""

    host: str
    src: str
    probability: float = 1.0


def rules_of(partition: Partition) -> frozenset[Rule]:
    return frozenset(Rule(c.dst, c.src, c.probability) for c in partition.cuts)


def partition_of(rules: Iterable[Rule], kind: str = "installed") -> Partition:
    return Partition(kind, frozenset(Cut(r.src, r.host, r.probability) for r in rules))


@attrs.frozen
class Command:
    """``iptables -w *args`` run in ``host``."""

    host: str
    args: tuple[str, ...]


def rule_spec(rule: Rule, addresses: Mapping[str, str]) -> tuple[str, ...]:
    """The rule's match and target, as ``iptables -A/-D CHAIN`` takes them."""
    spec: tuple[str, ...] = ("-i", LINK, "-s", f"{addresses[rule.src]}/32")
    if rule.probability < 1.0:
        # iptables keeps ~10 decimals; -D matches the value it parsed, so any form works.
        spec += ("-m", "statistic", "--mode", "random", "--probability", f"{rule.probability:.6f}")
    return (*spec, "-j", "DROP")


def transition(old: frozenset[Rule], new: frozenset[Rule], addresses: Mapping[str, str]) -> list[Command]:
    """The iptables commands that turn the rules ``old`` into ``new``: removals first (a host
    losing its last rule loses its chain and the jump to it), then additions (a host's first
    rule creates them). Each rule is added and deleted by its exact spec, so the nemesis
    removes only what it added."""
    commands: list[Command] = []
    before = {r.host for r in old}
    after = {r.host for r in new}
    for rule in sorted(old - new):
        commands.append(Command(rule.host, ("-D", CHAIN, *rule_spec(rule, addresses))))
    for host in sorted(before - after):
        commands.append(Command(host, ("-D", "INPUT", "-j", CHAIN)))
        commands.append(Command(host, ("-X", CHAIN)))
    for host in sorted(after - before):
        commands.append(Command(host, ("-N", CHAIN)))
        commands.append(Command(host, ("-I", "INPUT", "1", "-j", CHAIN)))
    for rule in sorted(new - old):
        commands.append(Command(rule.host, ("-A", CHAIN, *rule_spec(rule, addresses))))
    return commands


def restore_inputs(commands: Sequence[Command]) -> dict[str, str]:
    """The commands as one ``iptables-restore --noflush`` input per host, in their order: each
    host's changes then apply as one transaction (all or none), in one process."""
    lines: dict[str, list[str]] = {}
    for command in commands:
        lines.setdefault(command.host, []).append(" ".join(command.args))
    return {host: "*filter\n" + "\n".join(body) + "\nCOMMIT\n" for host, body in lines.items()}


@attrs.frozen
class NemesisState:
    """The rules the nemesis has installed. ``apply`` adds a partition's cuts to them (kinds
    combine); ``replace`` installs exactly one partition; ``heal`` removes every rule."""

    rules: frozenset[Rule] = frozenset()

    def apply(self, partition: Partition) -> NemesisState:
        return NemesisState(self.rules | rules_of(partition))

    def replace(self, partition: Partition) -> NemesisState:
        return NemesisState(rules_of(partition))

    def heal(self) -> NemesisState:
        return NemesisState()

    def partition(self) -> Partition:
        return partition_of(self.rules)
