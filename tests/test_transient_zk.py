"""Transient ZooKeeper errors where a process starts or serves (issue 26): retried with a bound;
only a definite refusal or an exhausted bound stops it, with one clear error.

The faults are injected into a real kazoo client on the real test ZooKeeper: a proxy that
raises ``ConnectionLoss`` on chosen calls and passes everything else through.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    OperationTimeoutError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError

from ordq.broker_group.auth import Gate
from ordq.broker_group.config import BrokerConfig
from ordq.broker_group.replica import Role
from ordq.broker_group.service import Broker
from ordq.common.errors import (
    AlreadyExists,
    CoordinationUnavailable,
    GroupNotFound,
    NotCoordinatorLeader,
    OrdqError,
    PermissionDenied,
    ZkAccessDenied,
)
from ordq.common.proc import ManagedProcess
from ordq.coordinator.store import ZkStore
from ordq.coordinator.tokens import create_token
from ordq.coordinator.zk_retry import retry_zk
from ordq.zk_server import ZkServer
from tests.cluster import REPO
from tests.util import TokenContext, wait_until

pytestmark = pytest.mark.zk


class Flaky:
    """A kazoo client whose calls named in ``faults`` raise ``faults[name]`` (an exception
    instance, or a list of them, one per call, then pass through)."""

    def __init__(self, client: KazooClient, **faults: Any) -> None:
        self._client = client
        self._faults = {k: list(v) if isinstance(v, list) else v for k, v in faults.items()}
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name not in self._faults:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            fault = self._faults[name]
            if isinstance(fault, list):
                fault = fault.pop(0) if fault else None
            if fault is not None:
                self.raised += 1
                raise fault
            return real(*args, **kwargs)
        return call




def test_one_connection_loss_while_loading_tokens_does_not_stop_a_broker_start(zk_client: KazooClient,
                                                                               zk_root: str) -> None:
    _, token = create_token(zk_client, zk_root, {"q": ["produce"]})
    flaky = Flaky(zk_client, get_children=[ConnectionLoss()], exists=[ConnectionLoss()])
    gate = Gate(tls=False)
    gate.watch(flaky, zk_root)  # raised ConnectionLoss out of broker start before
    assert flaky.raised == 2
    gate.check(TokenContext(token), "Produce", "q")  # the token loaded: allowed
    with pytest.raises(PermissionDenied):
        gate.check(TokenContext(None), "Produce", "q")  # enforced


def test_zookeeper_silent_past_the_bound_stops_the_start_with_one_clear_error(zk_client: KazooClient,
                                                                              zk_root: str) -> None:
    create_token(zk_client, zk_root, {"q": ["produce"]})

    class Always(Flaky):
        def __getattr__(self, name: str) -> Any:
            if name in ("get_children", "exists"):
                def lost(*_a: Any, **_k: Any) -> Any:
                    raise ConnectionLoss()
                return lost
            return getattr(self._client, name)

    with pytest.raises(CoordinationUnavailable, match="ZooKeeper did not answer for 0.5s"):
        Gate(tls=False).watch(Always(zk_client), zk_root, deadline_s=0.5)


def test_a_definite_refusal_is_not_retried(zk_client: KazooClient, zk_root: str) -> None:
    create_token(zk_client, zk_root, {"q": ["produce"]})
    flaky = Flaky(zk_client, get_children=NoAuthError())
    with pytest.raises(ZkAccessDenied):  # one clear line, not a kazoo traceback
        Gate(tls=False).watch(flaky, zk_root, deadline_s=30)
    assert flaky.raised == 1


# -- the one helper (coordinator/zk_retry.py), on a fake clock ---------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_a_connection_lost_while_states_are_read_in_slices_reads_the_slice_again(zk_server: ZkServer,
                                                                                   zk_root: str) -> None:
    """Issue 43: a broker's SealMany reads the states of the segments it never held with
    ``load_states``; one lost connection there (0.26 s, scale43n run 2) failed the whole call.
    The slice it hit is read again; the answers are as without the loss."""
    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        store.add_group("g1")
        names = [f"q-{i}" for i in range(12)]
        store.create_queues(names, groups=["g1"])
        calm = store.load_states(names, slice_size=5)
        real = store.client.get_async
        sent = 0  # reads of states

        def get_async(path: str, *args: Any, **kwargs: Any) -> Any:
            nonlocal sent
            if path.endswith("/state"):
                sent += 1
                if sent == 9:  # the second slice's 4th read loses its connection
                    lost = store.client.handler.async_result()
                    lost.set_exception(ConnectionLoss())
                    return lost
            return real(path, *args, **kwargs)

        store.client.get_async = get_async  # type: ignore[method-assign]
        try:
            got = store.load_states(names, slice_size=5)
        finally:
            del store.client.get_async
        assert got == calm and len(got) == len(names)
        assert sent == len(names) + 5  # the slice of 5 with the lost read, read again


def test_retry_zk_rides_out_transient_errors_with_back_off() -> None:
    clock = _Clock()
    faults = [ConnectionLoss(), SessionMovedError(), OperationTimeoutError(), KazooTimeoutError()]

    def call() -> str:
        if faults:
            raise faults.pop(0)
        return "ok"

    assert retry_zk(call, "step", bound_s=5, sleep=clock.sleep, clock=lambda: clock.now) == "ok"
    assert clock.slept == [0.05, 0.1, 0.2, 0.4]


def test_retry_zk_stops_with_one_line_when_the_bound_runs_out() -> None:
    clock = _Clock()

    def call() -> None:
        raise ConnectionLoss()

    with pytest.raises(CoordinationUnavailable) as info:
        retry_zk(call, "broker g1/master: register liveness", bound_s=3, sleep=clock.sleep, clock=lambda: clock.now)
    assert str(info.value).startswith("broker g1/master: register liveness: ZooKeeper did not answer for 3s")
    assert "\n" not in str(info.value)
    assert 3.0 <= clock.now <= 3.0 + 1e-9  # never sleeps past the bound


@pytest.mark.parametrize("refusal", [NoAuthError(), BadVersionError(), NoNodeError(), ConnectionClosedError(),
                                     NotCoordinatorLeader("x:1"), GroupNotFound("g1")])
def test_retry_zk_does_not_retry_a_definite_answer(refusal: Exception) -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise refusal

    with pytest.raises((OrdqError, KazooException)):
        retry_zk(call, "step", bound_s=30, sleep=lambda _s: pytest.fail("slept"))
    assert len(calls) == 1


def test_a_registration_that_landed_before_its_answer_was_lost_is_ours(zk_server: ZkServer, zk_root: str) -> None:
    with ZkStore.connect(zk_server.connection_string, zk_root, timeout_s=10) as store:
        store.add_group("g1")
        real = store.client.create_async
        lost = []

        def create_then_lose(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if not lost:  # the create lands; its answer is lost with the connection
                lost.append(result.get(timeout=10))
                raise ConnectionLoss()
            return result

        store.client.create_async = create_then_lose  # type: ignore[method-assign]
        retry_zk(lambda: store.register_live("g1", "master", "127.0.0.1:1", "inc-1"), "register", bound_s=10)
        assert lost and store.live_members("g1")["master"].incarnation == "inc-1"
        with pytest.raises(AlreadyExists):  # another incarnation is still refused
            store.register_live("g1", "master", "127.0.0.1:2", "inc-2")


def test_a_registration_again_after_a_lost_session_outlives_the_old_sessions_node(zk_server: ZkServer,
                                                                                    zk_root: str) -> None:
    """A broker whose session was lost registers its liveness again on a new session. After a
    ZooKeeper leader change the old session can outlive that (the new leader expires it only
    one session timeout after it starts): the create finds the old node, with this process's
    incarnation, and took it for its own; when the old session then expired, the node went
    and the group was never live again, so no group could be admitted and the producer
    ended with NoGroupAvailable (issue 26, test_failover_infra at load 22)."""
    with ZkStore.connect(zk_server.connection_string, zk_root, timeout_s=10) as new:
        new.add_group("g1")
        with ZkStore.connect(zk_server.connection_string, zk_root, timeout_s=10) as old:
            old.register_live("g1", "master", "127.0.0.1:1", "inc-1")  # the lost session's node
            new.register_live("g1", "master", "127.0.0.1:1", "inc-1")  # the same process, again
        # the old session has ended (its close: as its expiry would)
        wait_until(lambda: "master" in new.live_members("g1"), timeout_s=10, what="the liveness node")
        _, stat = new.client.get(new.paths.live("g1", "master"))
        assert stat.ephemeralOwner == new.client.client_id[0]
        with pytest.raises(AlreadyExists):  # another incarnation is still refused
            new.register_live("g1", "master", "127.0.0.1:2", "inc-2")


# -- starts while the ZooKeeper server is paused (SIGSTOP), on a server of this module's own ----

@pytest.fixture(scope="module")
def own_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path_factory.mktemp("paused-zk"))
    server.start(timeout_s=90)
    try:
        yield server
    finally:
        server.destroy()


@contextlib.contextmanager
def paused(server: ZkServer) -> Iterator[None]:
    [proc] = server.processes
    proc.pause()
    try:
        yield
    finally:
        proc.resume()


class _Seen(logging.Handler):
    """Set once a record of ``logger`` contains ``text``."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text, self.event, self._logger = text, threading.Event(), logging.getLogger(logger)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()

    def __enter__(self) -> threading.Event:
        self._logger.addHandler(self)
        return self.event

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)


def test_a_broker_started_while_zookeeper_is_paused_serves_once_it_answers(own_zk: ZkServer, tmp_path: Path) -> None:
    root = f"/t{uuid.uuid4().hex[:8]}"
    with ZkStore.connect(own_zk.connection_string, root, timeout_s=10) as store:
        store.add_group("g1")
    broker = Broker(BrokerConfig(gid="g1", role=Role.SLAVE, data_dir=tmp_path / "d", zk_hosts=own_zk.connection_string,
                                 root=root, zk_session_timeout_s=1.0))
    (tmp_path / "d").mkdir()
    outcome: list[object] = []
    try:
        with _Seen("ordq.zk", "retrying") as retrying, paused(own_zk):
            starter = threading.Thread(target=lambda: outcome.append(_outcome(broker.start)), daemon=True)
            starter.start()
            # before: the connect timed out after the 1 s session and the start failed
            wait_until(lambda: retrying.is_set() or outcome, timeout_s=30, what="the start to retry or end")
        starter.join(timeout=60)
        assert outcome and isinstance(outcome[0], str), outcome  # the address, not an error
        with ZkStore.connect(own_zk.connection_string, root, timeout_s=10) as store:
            assert store.live_members("g1")["slave"].incarnation == broker.incarnation
    finally:
        broker.stop()


def test_a_coordinator_started_while_zookeeper_is_paused_serves_once_it_answers(own_zk: ZkServer,
                                                                                tmp_path: Path) -> None:
    root = f"/t{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "ordq.cli", "--zk", own_zk.connection_string, "--root", root, "coordinator", "run",
            "--insecure", "--session-timeout", "1"]
    proc = ManagedProcess("coordinator", argv, run_dir=tmp_path, env={"PYTHONPATH": str(REPO),
                                                                      "PYTHONUNBUFFERED": "1"}, cwd=REPO)
    try:
        with paused(own_zk):
            proc.start()
            # before: "cannot reach ZooKeeper ... within 1s" and exit 1
            proc.wait_ready(lambda: "coordinator: connect to ZooKeeper" in proc.log_path.read_text(), timeout_s=60,
                            what="the coordinator to retry")
        proc.wait_for_line("READY coordinator", timeout_s=60)
    finally:
        proc.stop()


def _outcome(call: Any) -> object:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - handed to the test thread
        return exc
