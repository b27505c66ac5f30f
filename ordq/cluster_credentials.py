"""A local cluster's credentials: the ZooKeeper ACL credentials it generates and rotates (one
per identity: admin, coordinator, broker; coordinator/acl.py), the admin token of its own
clients, and where it registers them (docs/SECURITY.md).

``ClusterCredentials`` is the part of ``LocalCluster`` that owns them; it reads the cluster's
folder, configuration, processes and ZooKeeper through the few members declared below.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import attrs

from ordq.cluster_config import OWN_CREDENTIALS, ClusterConfig, coordinator_addresses
from ordq.common.errors import ConfigError
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials, register, register_coordinators, unregister
from ordq.coordinator.acl import digest_id
from ordq.coordinator.acl_client import AUTH_DIR, AUTH_USERS, RETIRED, read_credential, write_credential
from ordq.coordinator.store import ZkStore
from ordq.zk_server import ZkServer


class ClusterCredentials:
    """Credentials of the cluster in ``folder`` (a part of ``LocalCluster``)."""

    folder: Path
    config: ClusterConfig
    credentials: Credentials
    zk: ZkServer
    _saved: dict[str, Any]

    coordinators: list[ManagedProcess]

    # What the cluster provides (ordq/local_cluster.py).
    def processes(self) -> list[tuple[str, ManagedProcess]]:
        raise NotImplementedError

    def broker_processes(self) -> list[ManagedProcess]:
        raise NotImplementedError

    def store(self, timeout_s: float = 10.0) -> contextlib.AbstractContextManager[ZkStore]:
        raise NotImplementedError

    def _start_zk(self, deadline: float) -> None:
        raise NotImplementedError

    @property
    def zk_hosts(self) -> str:
        return self.zk.connection_string

    @property
    def root(self) -> str:
        return self.config.root

    @property
    def admin_auth(self) -> str | None:
        """The admin ZooKeeper credential (None: ACLs off, or not generated yet)."""
        return read_credential(self.folder, "admin") if self.config.zk_acl else None

    @property
    def coordinator_auth(self) -> str | None:
        """The ZooKeeper credential of this cluster's coordinators."""
        return read_credential(self.folder, "coordinator") if self.config.zk_acl else None

    @property
    def broker_auth(self) -> str | None:
        """The ZooKeeper credential of this cluster's brokers."""
        return read_credential(self.folder, "broker") if self.config.zk_acl else None

    def _use_credentials(self) -> None:
        """Brokers and coordinators act each with their own identity (passed in their
        environment, never argv), and find the cluster's credentials in its own file. ZooKeeper
        makes the admin identity its super-user (ordq/zk_server.py), from its next start."""
        common = {"ORDQ_CREDENTIALS": str(self.own_credentials_file)}
        admin = self.admin_auth
        self.zk.super_digest = digest_id(admin) if admin is not None else None
        for procs, auth in ((self.broker_processes(), self.broker_auth), (self.coordinators, self.coordinator_auth)):
            for proc in procs:
                env = {**(proc.env or {}), **common}
                if auth is not None:
                    env["ORDQ_ZK_AUTH"] = auth
                else:
                    env.pop("ORDQ_ZK_AUTH", None)
                proc.env = env

    def _ensure_zk_credentials(self) -> None:
        """Generate the identities' credentials (once), before ZooKeeper starts: it starts
        with the admin's digest as its super-user. Nothing with ACLs off."""
        if not self.config.zk_acl:
            return
        for role in AUTH_USERS:
            write_credential(self.folder, role)
        self._use_credentials()

    def _protect(self, *, walk: bool = False) -> None:
        """Generate the credentials (once) and protect the root: a tree from before (ACLs off,
        or an older ordq: a client identity, tokens' digests) is upgraded in place, and a node
        someone else made is repaired (coordinator/acl_client.py). The older ordq's client
        credential is removed once the tree names it no more."""
        if not self.config.zk_acl:
            return
        from ordq.coordinator.acl import ACL_NODE, AclIds
        from ordq.coordinator.acl_client import protect, protected_by

        running = [name for name, proc in self.processes() if proc.alive() and proc not in self.zk.processes]
        if running:
            with self.store() as store:
                protected = store.client.exists(f"{self.root}/{ACL_NODE}") is not None
            if not protected:
                raise ConfigError(
                    f"the ZooKeeper root {self.root} of the cluster in {self.folder} is not protected yet, and "
                    f"{', '.join(running)} run without credentials (they could not write to it once protected): "
                    f"stop them first (ordq down --dir {self.folder}), then ordq up protects it")
        self._ensure_zk_credentials()
        admin, coordinator, broker = self.admin_auth, self.coordinator_auth, self.broker_auth
        assert admin is not None and coordinator is not None and broker is not None
        self.credentials = attrs.evolve(self.credentials, zk_auth=admin)
        self._register_own()
        ids = AclIds.of(admin, coordinator, broker)
        with self.store() as store:
            # The whole tree only when its record does not name these identities (a first start,
            # a rotation, a tree an older ordq protected): every node made since is made by the
            # policy, and the walk took a restart minutes at 10^4 queues (issue 43).
            protect(store.client, self.root, ids, walk=walk or not protected_by(store.client, self.root, ids))
        for role in RETIRED:
            (self.folder / AUTH_DIR / role).unlink(missing_ok=True)

    def rotate_zk_credentials(self, *, timeout_s: float = 60.0) -> None:
        """Replace the admin, coordinator and broker ZooKeeper credentials of this stopped
        cluster: new ones are generated (``<dir>/zk-auth/*.new`` until done), every node's ACL
        is set to name them (``protect``, as the old admin, which loses every right), then they
        replace the files and the credentials registered for the cluster. ZooKeeper is started
        for it when it is not running and stopped again; when it was running it is restarted,
        so that the new admin, not the old one, is its super-user. A rotation cut short is
        finished by running it again (the client also presents the new admin credential).
        ConfigError while a broker or coordinator runs (it would lose its rights), or without
        ZooKeeper ACLs."""
        from ordq.coordinator.acl import AclIds
        from ordq.coordinator.acl_client import protect

        if not self.config.zk_acl or self.admin_auth is None:
            raise ConfigError(f"the cluster in {self.folder} has no ZooKeeper credentials to rotate (--no-zk-acl)")
        running = [name for name, proc in self.processes() if proc.alive() and proc not in self.zk.processes]
        if running:
            raise ConfigError(f"{', '.join(running)} still run with the current credential: stop the cluster first "
                              f"(ordq down --dir {self.folder})")
        auth = self.folder / AUTH_DIR
        for role in AUTH_USERS:
            write_credential(self.folder, f"{role}.new")
        new = {role: read_credential(self.folder, f"{role}.new") for role in AUTH_USERS}
        assert new["admin"] is not None and new["coordinator"] is not None and new["broker"] is not None
        deadline = time.monotonic() + timeout_s
        started_zk = not any(p.alive() for p in self.zk.processes)
        if started_zk:
            self._start_zk(deadline)
        try:
            with self.store() as store:
                store.client.add_auth("digest", new["admin"])  # a second run, after the ACLs changed
                protect(store.client, self.root, AclIds.of(new["admin"], new["coordinator"], new["broker"]))
        finally:
            if started_zk:
                self.zk.stop()
        for role in AUTH_USERS:
            os.replace(auth / f"{role}.new", auth / role)
        for role in RETIRED:
            (auth / role).unlink(missing_ok=True)
        self.credentials = attrs.evolve(self.credentials, zk_auth=new["admin"])
        self._use_credentials()  # ZooKeeper's super-user: the new admin, from its next start
        if not started_zk:  # it runs with the old admin as its super-user: not a moment longer
            self.zk.stop()
            self._start_zk(deadline)
        self._register_own()
        self._register_user()

    def unregister(self) -> bool:
        """Remove this cluster's entry from the user's credentials file; an entry another
        cluster registered at the same address stays. True when removed."""
        return unregister(self.zk_hosts, self.root, cluster=self.cluster_id)

    @property
    def cluster_id(self) -> str:
        """This cluster's identity (made at its first start, kept in the state file): what its
        credentials entry is registered under besides its address."""
        cid = self._saved.get("cluster_id")
        if not cid:
            cid = self._saved["cluster_id"] = uuid.uuid4().hex
        return str(cid)

    @property
    def own_credentials_file(self) -> Path:
        """The folder's credentials file, holding only this cluster (mode 0600): its own
        processes read it (ORDQ_CREDENTIALS), never the user's."""
        return self.folder / OWN_CREDENTIALS

    @property
    def bootstrap(self) -> str:
        """The coordinators' addresses, ``host:port,...``: what a client finds this cluster by
        (``bootstrap=``, ``ordq --bootstrap``); fixed at its first start ("" without coordinators)."""
        return ",".join(coordinator_addresses(self.config))

    def _register_own(self) -> None:
        register(self.zk_hosts, self.root, self.credentials, cluster=self.cluster_id,
                 path=self.own_credentials_file)
        register_coordinators(self.zk_hosts, self.root, coordinator_addresses(self.config),
                              path=self.own_credentials_file)

    def _register_user(self) -> None:
        """The user's credentials file: this cluster's credentials and its coordinators, so a
        client named by (ZooKeeper address, root) finds them (``ordq down`` removes the entry)."""
        register(self.zk_hosts, self.root, self.credentials, cluster=self.cluster_id)
        register_coordinators(self.zk_hosts, self.root, coordinator_addresses(self.config))

    @property
    def _token_file(self) -> Path:
        return self.folder / "admin.token"

    def _ensure_admin_token(self) -> None:
        """An admin token on every queue for this cluster's own clients (the CLI after
        ``ordq up``, the tests, the drills), made once and kept in the folder (mode 0600)."""
        from ordq.coordinator.tokens import create_token, load_tokens, token_id, touch

        token = self.credentials.token
        with self.store() as store:
            if token is None or token_id(token) not in load_tokens(store.client, self.root):
                _, token = create_token(store.client, self.root, {"*": ["admin"]}, "ordq up")
                touch(store.client, self.root)  # brokers reload
                fd = os.open(self._token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
        self.credentials = attrs.evolve(self.credentials, token=token)
        self._register_own()
