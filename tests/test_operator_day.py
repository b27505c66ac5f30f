"""An operator's day (issue 42): the everyday paths that went wrong, each on one real cluster
(ZooKeeper, a broker group and a coordinator, real processes), the CLI run as a user runs it.

- ``ordq produce --size 1048576`` to a queue of the default 1 MiB limit was refused by the
  producer's own batch limit;
- a stdin batch refused at line 2 did not say that line 1 was acked, so a re-run stored it twice;
- a mistyped ``--root`` showed "no queues", exit 0;
- with a token of one queue, ``ordq top`` showed every queue;
- ``ordq top`` and a producer waiting for its lease must stop on SIGINT, even started with
  SIGINT ignored (a background job of a script); a second consumer of a subscription says it
  waits, and stops on SIGINT.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from ordq.common.proc import load_stretched
from ordq.common.security import register
from ordq.coordinator.tokens import create_token, revoke_token, token_id, touch
from ordq.sdk import Consumer, ConsumerConfig
from tests.cluster import REPO, Cluster, module_cluster
from tests.helpers.stacks import stacks_of
from tests.util import wait_until

pytestmark = pytest.mark.zk


@attrs.frozen
class Env:
    cluster: Cluster
    admin: str  # an admin token on every queue (registered: the default of every command)
    reader: str  # a consume token of queue "a" only


@pytest.fixture(scope="module")
def env(zk_server: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with module_cluster(zk_server, tmp_path_factory, "opday", "g1") as cluster:  # type: ignore[arg-type]
        for queue in ("a", "b"):
            cluster.create_queue(queue)
        cluster.start_daemon("coordinator")
        admin = create_token(cluster.store.client, cluster.root, {"*": ["admin", "produce", "consume"]}, "ops")[1]
        reader = create_token(cluster.store.client, cluster.root, {"a": ["consume"]}, "reader-of-a")[1]
        touch(cluster.store.client, cluster.root)
        register(cluster.hosts, cluster.root, attrs.evolve(cluster.credentials, token=admin))
        e = Env(cluster, admin, reader)

        def knows_tokens() -> bool:
            return run(e, "queue", "list", "--json").returncode == 0

        wait_until(knows_tokens, timeout_s=load_stretched(30), interval_s=0.2, what="the coordinator takes the tokens")
        yield e


def run(env: Env, *args: str, stdin: bytes | None = None, root: str | None = None,
        token: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a separate process, as a user runs it."""
    c = env.cluster
    argv = [sys.executable, "-m", "ordq.cli", "--zk", c.hosts, "--root", root or c.root,
            *(("--token", token) if token else ()), *args]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=load_stretched(120), cwd=REPO,
                          check=False)


def stored(env: Env, queue: str) -> list[bytes]:
    c = env.cluster
    cfg = ConsumerConfig(zk_hosts=c.hosts, root=c.root, queue=queue, subscription=f"check-{time.monotonic_ns()}")
    got: list[bytes] = []
    with Consumer(cfg) as consumer:
        while batch := consumer.poll(timeout_s=1.0):
            got += [m.payload for m in batch]
    return got


def test_a_message_of_the_queues_default_limit_is_sent(env: Env) -> None:
    """``--size 1048576`` to a queue of the default 1 MiB limit: was refused, "exceeds the
    limit of 1048512 bytes (this producer's max_batch_bytes)"."""
    done = run(env, "queue", "create", "big")
    assert done.returncode == 0, done.stderr
    done = run(env, "produce", "big", "--size", "1048576", "--count", "2", "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["acked"] == 2
    assert [len(p) for p in stored(env, "big")] == [1048576, 1048576]
    over = run(env, "produce", "big", "--size", "1048577", "--count", "1")
    assert over.returncode == 1
    # Refused before any message went out: the error is the one line.
    assert over.stderr.decode().strip().splitlines() == [
        "ordq: error: message of 1048577 bytes exceeds the limit of 1048576 bytes (queue 'big' max_message_bytes)"]


def test_a_count_run_an_error_ends_says_first_how_many_were_acked(env: Env) -> None:
    """``ordq produce --count`` ended by an error mid-run (its token revoked once messages are
    stored) says how many of those sent were acked, then the error: a cluster lost mid-run
    printed the error alone with 10,280 of 20,000 acked."""
    done = run(env, "queue", "create", "midrun")
    assert done.returncode == 0, done.stderr
    c = env.cluster
    token = create_token(c.store.client, c.root, {"midrun": ["produce"]}, "revoked-mid-run")[1]
    touch(c.store.client, c.root)
    argv = [sys.executable, "-m", "ordq.cli", "--zk", c.hosts, "--root", c.root, "--token", token,
            "produce", "midrun", "--count", "1000000", "--rate", "200"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def stored_some() -> bool:
            done = run(env, "queue", "describe", "midrun", "--json")
            assert done.returncode == 0, done.stderr
            return (json.loads(done.stdout)["stored"] or 0) >= 20

        wait_until(stored_some, timeout_s=load_stretched(60), interval_s=0.3, what="20 messages of the run stored")
        revoke_token(c.store.client, c.root, token_id(token))
        touch(c.store.client, c.root)
        _, err = proc.communicate(timeout=load_stretched(60))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert "Traceback" not in err.decode()
    count = re.fullmatch(r"acked (\d+) of (\d+) messages to midrun before the error", lines[-2])
    assert count, lines
    acked, sent = int(count[1]), int(count[2])
    assert 20 <= acked <= sent
    assert lines[-1].startswith("ordq: error: permission denied"), lines
    assert len(stored(env, "midrun")) >= acked


def test_a_refused_stdin_line_says_which_lines_were_acked(env: Env) -> None:
    """A batch on stdin whose line 3 is too large: the error says lines 1-2 were acked, with
    their seqs, and where to resume; exactly they are stored."""
    done = run(env, "queue", "create", "small", "--max-message-bytes", "100")
    assert done.returncode == 0, done.stderr
    done = run(env, "produce", "small", stdin=b"one\ntwo\n" + b"x" * 101 + b"\nfour\n")
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert lines[-1] == ("ordq: error: line 3 refused: message of 101 bytes exceeds the limit of 100 bytes "
                         "(queue 'small' max_message_bytes); lines 1-2 were acked (seqs 0-1): re-send from line 3 "
                         "only"), lines
    assert stored(env, "small") == [b"one", b"two"]
    done = run(env, "produce", "small", stdin=b"five\n" + b"y" * 101 + b"\n")
    assert done.stderr.decode().strip().splitlines()[-1].endswith(
        "; line 1 was acked (seq 2): re-send from line 2 only"), done.stderr
    done = run(env, "produce", "small", stdin=b"z" * 101 + b"\n")
    assert done.stderr.decode().strip().splitlines()[-1].endswith("; no line before it was sent"), done.stderr


@pytest.mark.parametrize("argv", [("top", "--once"), ("group", "list"), ("top", "--once", "--json")])
def test_a_mistyped_root_is_an_error(env: Env, argv: tuple[str, ...]) -> None:
    """A root under which no cluster lives: one line naming it and the roots there, exit 1
    (``top`` printed "no queues", exit 0)."""
    done = run(env, *argv, root=env.cluster.root + "x")
    err = done.stderr.decode().strip()
    assert done.returncode == 1 and done.stdout == b"", (done.stdout, err)
    assert err.startswith(f"ordq: error: no ordq cluster under --root {env.cluster.root}x on ZooKeeper"), err
    assert env.cluster.root in err.removeprefix(f"ordq: error: no ordq cluster under --root {env.cluster.root}x")
    assert len(err.splitlines()) == 1


def test_top_with_a_token_of_one_queue_shows_only_that_queue(env: Env) -> None:
    done = run(env, "top", "--once", "--json", "--interval", "0.1", token=env.reader)
    assert done.returncode == 0, done.stderr
    frame = json.loads(done.stdout)
    assert [q["queue"] for q in frame["queues"]] == ["a"]
    done = run(env, "top", "--once", "--json", "--interval", "0.1")
    assert {"a", "b"} <= {q["queue"] for q in json.loads(done.stdout)["queues"]}


def _background(env: Env, *args: str, name: str) -> subprocess.Popen[bytes]:
    """``ordq ARGS &`` from a script: started with SIGINT ignored, as a shell starts a
    background job when job control is off."""
    c = env.cluster
    argv = [sys.executable, "-m", "ordq.cli", "--zk", c.hosts, "--root", c.root, *args]
    with open(c.base / f"{name}.log", "wb") as log:  # the child has its own copy
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "ORDQ_PROGRESS": "1"},  # its waits said, as on a terminal
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def _stops_on_sigint(env: Env, proc: subprocess.Popen[bytes], name: str, *, ready: str) -> int:
    log = env.cluster.base / f"{name}.log"
    try:
        wait_until(lambda: ready in log.read_text(errors="replace"), timeout_s=load_stretched(60),
                   interval_s=0.05, what=f"{name}: {ready!r}")
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=load_stretched(15))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still ran {load_stretched(15):.0f} s after SIGINT; its stacks:\n"
                                 f"{stacks_of(proc.pid)}\nits log:\n{log.read_text(errors='replace')}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_background_producer_waiting_for_its_lease_stops_on_sigint(env: Env) -> None:
    """A standby (another producer leads ``a``) started as a background job: SIGINT stops it
    while it waits to be elected (it ignored SIGINT until it led)."""
    leader = _background(env, "produce", "a", "--count", "1000000", "--rate", "20", name="leader")
    try:
        wait_until(lambda: env.cluster.state("a").producer_epoch > 0 or None, timeout_s=load_stretched(60),
                   what="the first producer leads")
        standby = _background(env, "produce", "a", "--count", "10", name="standby")
        code = _stops_on_sigint(env, standby, "standby", ready="waiting to be elected")
        assert code == 128 + signal.SIGINT, (env.cluster.base / "standby.log").read_text()
    finally:
        leader.kill()
        leader.wait()


def test_a_second_consumer_of_a_subscription_says_it_waits_and_stops_on_sigint(env: Env) -> None:
    """Anything that waits longer than 1 s says what it waits for (issue 42): a second ``ordq
    consume`` of a subscription another consumer holds waited without a word; it says whose
    turn it waits for, and SIGINT stops it there."""
    holder = _background(env, "consume", "b", "-s", "held", "--count", "1000000", "--quiet", name="holder")
    try:
        wait_until(lambda: env.cluster.consumer_lease("b", "held"), timeout_s=load_stretched(60),
                   what="the first consumer holds b/held")
        second = _background(env, "consume", "b", "-s", "held", "--count", "1", name="second")
        code = _stops_on_sigint(env, second, "second", ready="waiting to be the consumer of b/held")
        assert code == 128 + signal.SIGINT, (env.cluster.base / "second.log").read_text()
    finally:
        holder.kill()
        holder.wait()


def test_a_tls_mismatch_is_named_not_taken_for_a_cluster_that_does_not_answer(env: Env, tmp_path: Path) -> None:
    """Errors name the real cause (issue 42): a command without the cluster's TLS credentials,
    or with another cluster's CA, read "no coordinator answered ... is the cluster running?"
    after --zk-timeout while the coordinator ran."""
    from ordq.common.security import ensure_pki

    c = env.cluster

    def queue_list(credentials: dict[str, object]) -> str:
        path = tmp_path / f"credentials-{len(credentials)}.json"
        path.write_text(json.dumps({"clusters": {f"{c.hosts}{c.root}": credentials}}))
        done = subprocess.run([sys.executable, "-m", "ordq.cli", "--bootstrap", c.bootstrap, "--zk-timeout", "1",
                               "queue", "list"], capture_output=True, text=True, timeout=load_stretched(120), cwd=REPO,
                              env={**os.environ, "ORDQ_CREDENTIALS": str(path), "ORDQ_TOKEN": env.admin}, check=False)
        assert done.returncode == 1 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done
        return done.stderr

    coordinators = {"coordinators": c.bootstrap.split(",")}
    assert "speaks TLS and this command has no TLS credentials for the cluster" in queue_list(coordinators)
    _, other = ensure_pki(tmp_path / "another-cluster")
    err = queue_list({**coordinators, **other.to_dict()})
    assert f"not signed by the CA this command trusts ({other.ca_file})" in err, err


def _catches_sigint(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGINT (/proc: SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_top_started_in_the_background_stops_on_sigint_during_its_start(env: Env) -> None:
    """``ordq top`` started as a background job (SIGINT ignored), signalled as soon as it
    takes SIGINT, which is while it starts (imports, connects): it ends, and does not redraw
    on (it went on for 10 minutes once)."""
    proc = _background(env, "top", "--interval", "0.2", name="top")
    try:
        wait_until(lambda: proc.poll() is not None or _catches_sigint(proc.pid), timeout_s=load_stretched(30),
                   interval_s=0.002, what="ordq top takes SIGINT")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=load_stretched(15))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code in (0, 128 + signal.SIGINT), (env.cluster.base / "top.log").read_text()
    assert "Traceback" not in (env.cluster.base / "top.log").read_text()
