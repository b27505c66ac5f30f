"""The coordinator service without the daemon's duties, in the test process (issue 23).

Producers and consumers ask the elected coordinator for what they no longer write themselves
(commits, subscriptions, seals, pops, the parking queue; claims and failovers). A test cluster
must answer them, but its tests say "no coordinator daemon runs unless a test starts one": the
duties (failing heads over, sealing, popping, admitting) would change what they observe. So
``Cluster`` starts this: it joins ``<root>/coordinator/leader`` as ``tests-<pid>@<address>`` (the
form clients read the leader's address from) and serves ``coordinator.service.CoordinatorService``
while it holds the election. ``Cluster.start_daemon`` stops it first, so the daemon it starts
leads and answers."""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.service import CoordinatorService
from coordinator.store import ZkStore
from ordq.security import Credentials, ensure_coordinator_pki


class InProcessCoordinator:
    def __init__(self, hosts: str, root: str, *, tls_folder: Path | None, token: str | None = None,
                 timeout_s: float = 30.0) -> None:
        from ordq.commands.coordinator import _subscriber

        if tls_folder is not None:
            pki = ensure_coordinator_pki(tls_folder)
            creds = Credentials(ca_file=pki.ca_file, cert_file=pki.cert_file, key_file=pki.key_file, token=token)
        else:
            creds = Credentials(token=token)
        self.store = ZkStore.connect(hosts, root, timeout_s=10)
        self.service = CoordinatorService(self.store, is_leader=self._leads, credentials=creds,
                                          subscriber=_subscriber(creds))
        self._lock = None
        self._stopped = False
        try:
            self.address = self.service.start("127.0.0.1:0")
            self._lock = self.store.client.Lock(self.store.paths.coordinator_leader,
                                                f"tests-{os.getpid()}@{self.address}")
            if not self._lock.acquire(timeout=timeout_s):
                raise TimeoutError("the test coordinator was not elected")
        except BaseException:
            self.stop()
            raise

    def _leads(self) -> bool:
        return not self._stopped and self._lock is not None and bool(self._lock.is_acquired)

    def stop(self) -> None:
        """Leave the election and stop serving (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._lock is not None:
            try:
                self._lock.release()
            except Exception:  # noqa: BLE001 - the session goes with close() anyway
                pass
        self.service.stop(grace_s=0.2)
        self.store.close()
