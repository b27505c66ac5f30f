"""A message the application cannot handle (``Consumer.run`` and ``ConsumerConfig.on_failure``):
the pure decision, then each policy on real brokers — block never skips and never delivers
what comes after the failing message, park moves it aside with a record and goes on in order,
raise stops with HandlerError and commits nothing at or past it."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import ConfigError, HandlerError
from ordq.sdk import Consumer, ConsumerConfig, FailurePolicy
from ordq.sdk.failure import after_failure, parking_queue
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.test_everyday import (
    N,
    committed,
    queue_fixture,  # noqa: F401 - the "queue" fixture: N messages on g1, g2
)
from tests.util import wait_until


@given(st.sampled_from(["block", "park", "raise"]), st.integers(1, 20), st.integers(1, 100),
       st.lists(st.floats(0, 60), min_size=1, max_size=8))
def test_the_decision(mode: str, attempts: int, failures: int, ladder: list[float]) -> None:
    policy = FailurePolicy(on_failure=mode, attempts=attempts, backoff_s=tuple(ladder))
    step = after_failure(policy, failures)
    if failures < attempts:  # every mode retries first, on the ladder (its last wait repeats)
        assert step.action == "retry" and not step.alarm
        assert step.delay_s == ladder[min(failures - 1, len(ladder) - 1)]
    elif mode == "block":  # never skips: retries for ever, with the alarm
        assert step.action == "retry" and step.alarm
    else:
        assert step.action == mode


@pytest.mark.parametrize("bad", [{"on_failure": "skip"}, {"attempts": 0}, {"backoff_s": ()},
                                 {"backoff_s": (float("nan"),)}, {"backoff_s": (-1.0,)}])
def test_bad_policies_are_clear_errors(bad: dict) -> None:
    with pytest.raises(ConfigError):
        FailurePolicy(**bad)


def config(cluster: Cluster, policy: FailurePolicy) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, on_failure=policy)


def test_block_retries_the_same_message_and_delivers_nothing_after_it(queue: Cluster) -> None:
    handled: list[int] = []
    failures = {50: 4}  # seq 50 fails four times, then works
    stop = threading.Event()
    seen_blocked = []

    def handler(m) -> None:  # noqa: ANN001
        if failures.get(m.seq, 0) > 0:
            failures[m.seq] -= 1
            seen_blocked.append(c.blocked)
            raise ValueError(f"cannot handle {m.seq}")
        handled.append(m.seq)
        if m.seq == N - 1:
            stop.set()

    with Consumer(config(queue, FailurePolicy(on_failure="block", attempts=2, backoff_s=(0.01,)))) as c:
        c.run(handler, stop=stop)
        assert c.blocked is None
    assert handled == list(range(N))  # in order, 50 exactly once, nothing skipped
    assert [b.attempts for b in seen_blocked[1:]] == [1, 2, 3]  # what the status showed while retrying
    assert all(b.seq == 50 and "cannot handle 50" in b.last_error for b in seen_blocked[1:])
    assert committed(queue) == N - 1


def test_park_moves_the_message_aside_with_a_record_and_goes_on(queue: Cluster) -> None:
    handled: list[int] = []
    stop = threading.Event()

    def handler(m) -> None:  # noqa: ANN001
        if m.seq in (7, 120):
            raise ValueError(f"poison {m.seq}")
        handled.append(m.seq)
        if m.seq == N - 1:
            stop.set()

    with Consumer(config(queue, FailurePolicy(on_failure="park", attempts=3, backoff_s=(0.01,)))) as c:
        c.run(handler, stop=stop)
    assert handled == [s for s in range(N) if s not in (7, 120)]
    assert committed(queue) == N - 1
    listed = json.loads(queue.ordq("sub", "parked", "q", "s", "--json").stdout)["parked"]
    assert [(r["seq"], r["attempts"], r["parking_queue"], r["parked_seq"]) for r in listed] == [
        (7, 3, "q.parked.s", 0), (120, 3, "q.parked.s", 1)]
    assert "poison 7" in listed[0]["error"]
    human = queue.ordq("sub", "parked", "q", "s").stdout.decode()
    assert "PARKING_QUEUE" in human and "q.parked.s" in human
    # The parking queue is an ordinary queue: the parked messages, in order, with their origin.
    with Consumer(ConsumerConfig(zk_hosts=queue.hosts, root=queue.root, queue=parking_queue("q", "s"),
                                 subscription="ops", lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)) as ops:
        got = []
        while len(got) < 2:
            got.extend(ops.poll())
    assert [dict(m.headers)["x-ordq-parked-from"] for m in got] == [b"q/s/7", b"q/s/120"]
    assert [m.payload for m in got] == [b"m7", b"m120"]


def test_raise_stops_with_handler_error_and_commits_nothing_at_or_past_it(queue: Cluster) -> None:
    def handler(m) -> None:  # noqa: ANN001
        if m.seq == 30:
            raise ValueError("no")

    with pytest.raises(HandlerError) as err, Consumer(config(queue, FailurePolicy(on_failure="raise", attempts=2,
                                                                                   backoff_s=(0.01,)))) as c:
        c.run(handler)
    assert err.value.seq == 30 and isinstance(err.value.__cause__, ValueError)
    assert committed(queue) == 29
    assert queue.ordq("sub", "parked", "q", "s").stdout.decode().strip() == "nothing parked for q/s"


def test_the_subscription_policy_and_the_blocked_alarm_seen_by_operators(queue: Cluster,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """`ordq sub policy` sets what a consumer without its own policy does; a consumer blocked
    past its attempts shows in `ordq sub list` until the message goes through."""
    shown = queue.ordq("sub", "policy", "q", "s")
    assert shown.returncode == 1 and "subscription" in shown.stderr.decode()  # none yet: a clear error
    with Consumer(config(queue, FailurePolicy())) as c:  # creates the subscription
        c.commit()
    out = queue.ordq("sub", "policy", "q", "s", "--on-failure", "block", "--attempts", "2", "--backoff", "0.02")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == "q/s: on failure block after 2 attempts, waits 0.02 s"
    bad = queue.ordq("sub", "policy", "q", "s", "--backoff", "nan")
    assert bad.returncode == 1 and b"Traceback" not in bad.stderr

    fixed = threading.Event()
    stop = threading.Event()
    handled: list[int] = []

    def handler(m) -> None:  # noqa: ANN001
        if m.seq == 10 and not fixed.is_set():
            raise ValueError("downstream is down")
        handled.append(m.seq)
        if m.seq == N - 1:
            stop.set()

    def blocked() -> dict | None:
        listed = json.loads(queue.ordq("sub", "list", "q", "--json").stdout)["subscriptions"]
        return next(s for s in listed if s["subscription"] == "s")["blocked"]

    cfg = ConsumerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)  # no policy: the subscription's
    with Consumer(cfg) as c:
        runner = threading.Thread(target=c.run, args=(handler,), kwargs={"stop": stop})
        runner.start()
        alarm = wait_until(blocked, timeout_s=30, what="the blocked message in sub list")
        assert alarm["seq"] == 10 and alarm["attempts"] >= 2 and "downstream is down" in alarm["error"]
        assert handled == list(range(10))  # nothing after the blocked message
        assert "BLOCKED" in queue.ordq("sub", "list", "q").stdout.decode()
        stop.set()  # stopped while blocked: seq 10 is not done, and the log says so (issue 24)
        runner.join(60)
        assert not runner.is_alive()
    assert "seq 10 not done (stopped) after" in caplog.text and "seq 10 done" not in caplog.text
    fixed.set()
    stop.clear()
    with Consumer(cfg) as c:  # the next one starts at seq 10 (never committed)
        c.run(handler, stop=stop)
    assert handled == list(range(N))
    assert blocked() is None


def test_a_stored_park_policy_applies(queue: Cluster) -> None:
    with Consumer(config(queue, FailurePolicy())) as c:
        c.commit()
    assert queue.ordq("sub", "policy", "q", "s", "--on-failure", "park", "--attempts", "1").returncode == 0
    stop = threading.Event()

    def handler(m) -> None:  # noqa: ANN001
        if m.seq == 3:
            raise ValueError("poison")
        if m.seq == N - 1:
            stop.set()

    cfg = ConsumerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Consumer(cfg) as c:
        c.run(handler, stop=stop)
    parked = json.loads(queue.ordq("sub", "parked", "q", "s", "--json").stdout)["parked"]
    assert [(r["seq"], r["attempts"]) for r in parked] == [(3, 1)]


def test_a_dead_consumers_alarm_goes_when_its_lease_is_granted_to_another(queue: Cluster) -> None:
    """Guard: the coordinator writes a consumer's alarm (``blocked/<holder>``, no client session
    to take it away) and clears the alarms of every other holder when it grants the
    subscription's lease (coordinator/service_leases.py ``_clear_alarms``), and the holder's own
    on release. Failing first: the alarm of a consumer that died while blocked stayed in
    ``ordq sub list`` for good (written on the coordinator's session, not the dead consumer's)."""
    from ordq.coordinator.client import CoordinatorClient
    from ordq.sdk._lease_client import CoordinatorLease

    def blocked() -> dict | None:
        listed = json.loads(queue.ordq("sub", "list", "q", "--json").stdout)["subscriptions"]
        return next(s for s in listed if s["subscription"] == "s")["blocked"]

    cfg = ConsumerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Consumer(cfg):
        pass  # the subscription exists
    coord = CoordinatorClient(bootstrap=queue.bootstrap, credentials=queue.credentials)
    dead = CoordinatorLease(coord, "consumer", "q", "s", "dead-consumer", ttl_s=CLIENT_SESSION_TIMEOUT_S)
    try:
        assert dead.acquire(30)
        coord.record(dead.held, "set_blocked", {"seq": 10, "key": None, "attempts": 7, "error": "down",
                                                "consumer": "dead-consumer"})
        alarm = wait_until(blocked, timeout_s=30, what="the alarm in sub list")
        assert alarm["seq"] == 10 and alarm["consumer"] == "dead-consumer"
        dead.stop(release=False)  # it dies: no release, no clearing of its own
        assert blocked() is not None
        with Consumer(cfg) as c:  # granted once the dead one's lease ran out: its alarm goes
            assert c.statistics().delivered == 0
            assert blocked() is None
        # A consumer that leaves takes its alarm with it too (release).
        again = CoordinatorLease(coord, "consumer", "q", "s", "leaving-consumer", ttl_s=CLIENT_SESSION_TIMEOUT_S)
        assert again.acquire(30)
        coord.record(again.held, "set_blocked", {"seq": 11, "attempts": 3, "error": "down",
                                                 "consumer": "leaving-consumer"})
        assert blocked() is not None
        again.stop()
        assert blocked() is None
    finally:
        dead.stop(release=False)
        coord.close()
