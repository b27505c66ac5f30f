"""The partition nemesis: installs and removes the iptables rules of ``ordq.lab.partition``
inside the lab's hosts (each namespace has its own netfilter tables).

Guarantees:
- Only the nemesis's own chain (``CHAIN``) and the one jump to it from INPUT are ever written;
  ``heal()`` deletes every rule it added, the jump and the chain, leaving each host's tables as
  they were. After a command failed half-way it cannot know what is installed, so it then heals
  by flushing and deleting its chain in every host instead.
- Rules act on packets as they arrive, established connections included: a partition cuts
  open TCP connections too, as a real one does.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from ordq.common.errors import ConfigError, ExternalProcessError
from ordq.lab.netns import in_namespace, run
from ordq.lab.partition import CHAIN, Command, NemesisState, Partition, restore_inputs, transition


class Nemesis:
    """Partitions for hosts named by ``namespaces`` (host -> network namespace) whose lab
    addresses are ``addresses`` (host -> IPv4 address)."""

    def __init__(self, namespaces: Mapping[str, str], addresses: Mapping[str, str]) -> None:
        self._namespaces = dict(namespaces)
        self._addresses = dict(addresses)
        self.state = NemesisState()
        self._unsure = False  # a command failed: what is installed is no longer known

    def apply(self, partition: Partition) -> None:
        """Add ``partition``'s cuts to those in place."""
        self._check(partition)
        self._to(self.state.apply(partition))

    def replace(self, partition: Partition) -> None:
        """Install exactly ``partition`` (heals what it does not cut)."""
        self._check(partition)
        self._to(self.state.replace(partition))

    def heal(self) -> None:
        """Remove every rule the nemesis added: all packets flow again."""
        if not self._unsure:
            self._to(self.state.heal())
            return
        for host in self._namespaces:
            for args in (("-F", CHAIN), ("-D", "INPUT", "-j", CHAIN), ("-X", CHAIN)):
                try:
                    self._iptables(Command(host, args))
                except ExternalProcessError:
                    pass  # not there: nothing to remove
        self.state, self._unsure = NemesisState(), False

    def current(self) -> Partition:
        return self.state.partition()

    def installed(self, host: str) -> list[str]:
        """The rules of ``host``'s tables that mention the nemesis (``iptables -S``), to check
        what heal left."""
        out = run(in_namespace(self._namespaces[host], ["iptables", "-w", "-S"]))
        return [line for line in out.splitlines() if CHAIN in line]

    def _check(self, partition: Partition) -> None:
        unknown = partition.hosts() - set(self._addresses)
        if unknown:
            raise ConfigError(f"partition names hosts that are not in the lab: {sorted(unknown)}")

    def _to(self, new: NemesisState) -> None:
        if shutil.which("iptables") is None:
            raise ConfigError("the nemesis needs iptables (apt-get install iptables)")
        for host, script in restore_inputs(transition(self.state.rules, new.rules, self._addresses)).items():
            try:
                run(in_namespace(self._namespaces[host], ["iptables-restore", "--noflush", "-w", "5"]), stdin=script)
            except ExternalProcessError:
                self._unsure = True  # that host's transaction did not apply; those before it did
                raise
        self.state = new

    def _iptables(self, command: Command) -> None:
        run(in_namespace(self._namespaces[command.host], ["iptables", "-w", *command.args]))
