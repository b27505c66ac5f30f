"""A local cluster's credentials: the ZooKeeper ACL credentials it generates and rotates,
the admin token of its own clients, and where it registers them (docs/SECURITY.md).

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
from ordq.coordinator.acl_client import AUTH_DIR, AUTH_USERS, read_credential, write_credential
from ordq.coordinator.store import ZkStore
from ordq.zk_server import ZkServer


class ClusterCredentials:
    """Credentials of the cluster in ``folder`` (a part of ``LocalCluster``)."""

    folder: Path
    config: ClusterConfig
    credentials: Credentials
    zk: ZkServer
    _saved: dict[str, Any]

    # What the cluster provides (ordq/local_cluster.py).
    def processes(self) -> list[tuple[str, ManagedProcess]]:
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
    def client_auth(self) -> str | None:
        """The credential producers and consumers of this cluster use."""
        return read_credential(self.folder, "client") if self.config.zk_acl else None

    def _use_credentials(self) -> None:
        """Brokers and coordinators act as admin (passed in their environment, never argv),
        and find the cluster's credentials in its own file."""
        env = {"ORDQ_CREDENTIALS": str(self.own_credentials_file)}
        admin = self.admin_auth
        if admin is not None:
            env["ORDQ_ZK_AUTH"] = admin
        for _, proc in self.processes():
            if proc not in self.zk.processes:
                proc.env = {**(proc.env or {}), **env}

    def _protect(self) -> None:
        """Generate the credentials (once) and protect the root: a tree from before (ACLs off,
        or an older ordq) is upgraded in place (coordinator/acl_client.py)."""
        if not self.config.zk_acl:
            return
        from ordq.coordinator.acl import ACL_NODE, AclIds
        from ordq.coordinator.acl_client import protect

        running = [name for name, proc in self.processes() if proc.alive() and proc not in self.zk.processes]
        if running:
            with self.store() as store:
                protected = store.client.exists(f"{self.root}/{ACL_NODE}") is not None
            if not protected:
                raise ConfigError(
                    f"the ZooKeeper root {self.root} of the cluster in {self.folder} is not protected yet, and "
                    f"{', '.join(running)} run without credentials (they could not write to it once protected): "
                    f"stop them first (ordq down --dir {self.folder}), then ordq up protects it")
        for role in AUTH_USERS:
            write_credential(self.folder, role)
        self._use_credentials()
        admin, client = self.admin_auth, self.client_auth
        assert admin is not None and client is not None
        self.credentials = attrs.evolve(self.credentials, zk_auth=admin)
        self._register_own()
        with self.store() as store:
            protect(store.client, self.root, AclIds.of(admin, client))

    def rotate_zk_credentials(self, *, timeout_s: float = 60.0) -> None:
        """Replace the admin and client ZooKeeper credentials of this stopped cluster: new ones
        are generated (``<dir>/zk-auth/*.new`` until done), every node's ACL is set to name them
        (``protect``, as the old admin, which loses every right), then they replace the files
        and the credentials registered for the cluster. ZooKeeper is started for it when it
        is not running and stopped again. A rotation cut short is finished by running it again
        (the client also presents the new admin credential). ConfigError while a broker or
        coordinator runs (it would lose its rights), or without ZooKeeper ACLs."""
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
        assert new["admin"] is not None and new["client"] is not None
        started_zk = not any(p.alive() for p in self.zk.processes)
        if started_zk:
            self._start_zk(time.monotonic() + timeout_s)
        try:
            with self.store() as store:
                store.client.add_auth("digest", new["admin"])  # a second run, after the ACLs changed
                protect(store.client, self.root, AclIds.of(new["admin"], new["client"]))
        finally:
            if started_zk:
                self.zk.stop()
        for role in AUTH_USERS:
            os.replace(auth / f"{role}.new", auth / role)
        self.credentials = attrs.evolve(self.credentials, zk_auth=new["admin"])
        self._use_credentials()
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
        from ordq.coordinator.acl_client import tokens_changed
        from ordq.coordinator.tokens import add_zk_identity, create_token, load_tokens, token_id

        token = self.credentials.token
        with self.store() as store:
            if token is None or token_id(token) not in load_tokens(store.client, self.root):
                _, token = create_token(store.client, self.root, {"*": ["admin"]}, "ordq up")
                tokens_changed(store.client, self.root)
                fd = os.open(self._token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
            elif add_zk_identity(store.client, self.root, token):  # a token from before issue 29
                tokens_changed(store.client, self.root)
        self.credentials = attrs.evolve(self.credentials, token=token)
        self._register_own()
