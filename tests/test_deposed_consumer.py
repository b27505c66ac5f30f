"""A consumer deposed while it was inside a blocking call (issue 26), reproduced in-process and
deterministically: the "freeze" is a hook in the consumer's own commit that stops its lease's
heartbeats (as a SIGSTOP past the lease does), lets a successor take over and deliver, and only
then lets the heartbeats go on.

The promise (DESIGN §5 Consumer, sdk/consumer.py): no hand-out without a lease check after
any blocking call; a resumed deposed consumer learns its lease went to another and rejoins
(issue 37): it hands out nothing beside its successor, waits as a standby, and reads on from
the committed cursor — never ``RetentionOvertook`` with advice to reset the subscription to
earliest (that would redeliver all of it), never a gap, never an exception.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from ordq.common.errors import OrdqError
from ordq.common.proc import ManagedProcess, load_stretched
from ordq.coordinator.state import Cursor
from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.sdk._lease_client import CoordinatorLease
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, REPO, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.helpers.stacks import stacks_of
from tests.util import wait_until

pytestmark = pytest.mark.zk


def produce(cluster: Cluster, n: int) -> None:
    # A long send timeout: on a loaded machine a 1 s one fails over, and this test is not about that.
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=30.0)) as p:
        futures = [p.send(b"m%06d" % i) for i in range(n)]
        futures[-1].result(60)


def consumer_config(cluster: Cluster) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                          commit=CommitConfig(every_messages=1, every_ms=50.0))


def freeze_heartbeats(consumer: Consumer) -> Callable[[], None]:
    """What a freeze past the lease does to ``consumer``: no heartbeat reaches the coordinator
    (the renewal thread's calls do nothing), so the lease runs out on both clocks and the
    coordinator grants it to a standby. Returns the thaw (heartbeats go on: the next one is
    refused, the lease having gone to another)."""
    lease = consumer._lease
    assert isinstance(lease, CoordinatorLease)
    real = lease._renew_once
    lease._renew_once = lambda: None  # type: ignore[method-assign]

    def thaw() -> None:
        lease._renew_once = real  # type: ignore[method-assign]

    return thaw


def test_consumer_deposed_while_its_periodic_commit_is_in_flight_hands_out_nothing_more(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 20)
    first = Consumer(consumer_config(cluster))
    first.start()
    successor: list[int] = []
    successor_done, tried = threading.Event(), threading.Event()
    try:
        got = first.poll(max_messages=1)  # one read buffers all 20; seq 0 is in hand
        assert [m.seq for m in got] == [0]
        coord = first._coord
        assert coord is not None
        real_commit: Callable = coord.commit

        def frozen_commit(*args: object, **kwargs: object) -> int:
            # The periodic commit of seq 0, on the commit thread: it lands, then the process
            # "freezes" past its lease (no heartbeat) while a successor takes over, delivers,
            # commits and leaves; the delivering thread tries to hand out meanwhile.
            coord.commit = real_commit  # type: ignore[method-assign]  # once
            version = real_commit(*args, **kwargs)
            thaw = freeze_heartbeats(first)
            lease = first._lease
            assert lease is not None
            wait_until(lambda: not lease.valid(), timeout_s=30, what="the frozen consumer's lease to run out")
            with Consumer(consumer_config(cluster)) as second:
                while len(successor) < 5:
                    successor.extend(m.seq for m in second.poll(timeout_s=0.1, max_messages=5 - len(successor)))
                second.commit()
            successor_done.set()
            tried.wait(60)
            thaw()
            return version

        coord.commit = frozen_commit  # type: ignore[method-assign]
        # Finishes seq 0, so a commit is due (every message): it starts on the commit thread
        # and the lease, still sure, lets seq 1 out (nothing if the box held this thread past
        # the lease meanwhile: the rest holds either way).
        assert [m.seq for m in first.poll(max_messages=1)] in ([1], [])
        assert successor_done.wait(60)
        # Its lease ran out by its own clock while the commit hung: the check before handing
        # out (LeaseChecks.before_hand_out) lets nothing out of what it buffered (seqs 2..19).
        late = first.poll(max_messages=1)
        tried.set()
        assert not late, f"the deposed consumer handed out {[m.seq for m in late]} after its successor " \
                         f"delivered {successor}"
        deadline = time.monotonic() + 60
        while first.statistics().rejoins == 0:
            assert time.monotonic() < deadline, first.statistics()
            late = first.poll(max_messages=1)
            assert not late, f"the deposed consumer handed out {[m.seq for m in late]}"
        assert successor == [1, 2, 3, 4, 5]  # the successor resumed after the committed seq 0
        assert first.statistics().rejoins == 1
        rest: list[int] = []
        while len(rest) < 14:
            assert time.monotonic() < deadline, rest
            rest.extend(m.seq for m in first.poll(timeout_s=0.1))
        assert rest == list(range(6, 20))  # from the successor's committed cursor, in order
    finally:
        tried.set()
        first.close()


def test_a_periodic_commit_that_hangs_holds_no_hand_out_and_covers_only_what_was_finished(
        cluster: Cluster) -> None:
    """Issue 39: the periodic commit is written off the hand-out path. While one hangs, poll
    goes on handing out; the cursor it writes is what was finished when it was taken, never
    what was handed out since; a consumer gone before the next commit is redelivered from it."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 20)
    first = Consumer(consumer_config(cluster))
    first.start()
    entered, release = threading.Event(), threading.Event()
    written: list[object] = []
    try:
        assert [m.seq for m in first.poll(max_messages=1)] == [0]
        coord = first._coord
        assert coord is not None
        real_commit: Callable = coord.commit

        def hanging_commit(*args: object, **kwargs: object) -> int:
            entered.set()
            release.wait(120)
            version = real_commit(*args, **kwargs)
            written.append(args[2])  # (queue, subscription, cursor, ...)
            return version

        coord.commit = hanging_commit  # type: ignore[method-assign]
        handed: list[int] = []

        def poll_some() -> None:
            while len(handed) < 5:  # seqs 1..5; seq 0 finished: a commit is due at once
                handed.extend(m.seq for m in first.poll(max_messages=1))

        poller = threading.Thread(target=poll_some, daemon=True)
        poller.start()
        poller.join(60)
        assert not poller.is_alive(), f"poll waited for the periodic commit (handed out {handed})"
        assert handed == [1, 2, 3, 4, 5]
        assert entered.is_set() and not written  # the commit of seq 0 still hangs
        release.set()
        wait_until(lambda: bool(written), timeout_s=60, what="the hanging commit to be written")
        seg = cluster.state().consume[0].seg
        assert written == [Cursor(seg=seg, offset=1, last_seq=0)]  # finished when taken: seq 0 only
        assert coord.describe("q", subscription="s").cursor == written[0]
    finally:
        release.set()
        first._shutdown()  # gone without its last commit, as a crash
    with Consumer(consumer_config(cluster)) as second:
        again: list[int] = []
        deadline = time.monotonic() + 60
        while len(again) < 19:
            assert time.monotonic() < deadline, again
            again.extend(m.seq for m in second.poll(timeout_s=0.1))
        assert again == list(range(1, 20))  # from the committed cursor, in order, once each


def test_resumed_deposed_consumer_behind_popped_segments_rejoins_at_the_successors_cursor(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 10)
    first = Consumer(consumer_config(cluster))
    first.start()
    try:
        seqs: list[int] = []
        while len(seqs) < 10:
            seqs.extend(m.seq for m in first.poll(timeout_s=0.1))
        first.commit()  # its cursor: segment 0, offset 10, seq 9
        thaw = freeze_heartbeats(first)  # frozen from here on
        lease = first._lease
        assert lease is not None
        wait_until(lambda: not lease.valid(), timeout_s=30, what="the frozen consumer's lease to run out")
        # Meanwhile the queue moves on: more in segment 0, a roll, segment 1; the successor
        # reads it all and segment 0 is popped.
        produce(cluster, 40)
        assert cluster.ordq("queue", "roll", "q").returncode == 0
        produce(cluster, 10)
        with Consumer(consumer_config(cluster)) as second:
            last = -1
            give_up = time.monotonic() + 120
            while last < 59 or cluster.state().segment(0) is not None:
                assert time.monotonic() < give_up, f"successor at seq {last}, segment 0 not popped"
                for m in second.poll(timeout_s=0.1):
                    last = m.seq
                second.commit()
        assert cluster.state().trimmed_seq >= 49
        # The first resumes: its next reads would find segment 0 gone and seqs 10..49 with it;
        # it learns its lease went to another instead, and reads on after seq 59.
        thaw()
        deadline = time.monotonic() + 30
        while first.statistics().rejoins == 0:  # RetentionOvertook here advised a reset to earliest
            assert time.monotonic() < deadline, first.statistics()
            assert not first.poll(timeout_s=0.1), "the deposed consumer handed out messages"
        assert first.statistics().last_seq == 59
        produce(cluster, 3)
        more: list[int] = []
        while len(more) < 3:
            assert time.monotonic() < deadline + 60, more
            more.extend(m.seq for m in first.poll(timeout_s=0.1))
        assert more == [60, 61, 62]
    finally:
        first.close()


def test_close_while_no_coordinator_answers_finishes_within_seconds(cluster: Cluster) -> None:
    """Ctrl-C on `ordq consume` (issue 26): closing must not wait on an answer that never comes.
    Here every coordinator is frozen (SIGSTOP): the last commit rides out ``coordinator_outage_s``
    and the lease's release gives up after its own short timeout."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 5)
    cfg = attrs.evolve(consumer_config(cluster), coordinator_outage_s=1.0)
    c = Consumer(cfg)
    c.start()
    seqs: list[int] = []
    while len(seqs) < 5:
        seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
    errors: list[BaseException] = []

    def close() -> None:
        try:
            c.close()
        except OrdqError as exc:  # the last commit got no answer: said so, not hung
            errors.append(exc)

    frozen = [p for p in cluster.coordinators if p.alive()]
    for p in frozen:
        p.pause()
    try:
        closer = threading.Thread(target=close, daemon=True)
        started = time.monotonic()
        closer.start()
        closer.join(timeout=60)
        assert not closer.is_alive(), "close() still waiting after 60 s"
        assert time.monotonic() - started < 30
    finally:
        for p in frozen:
            p.resume()


def _frozen_coordinators(cluster: Cluster) -> list[ManagedProcess]:
    frozen = [p for p in cluster.coordinators if p.alive()]
    for p in frozen:
        p.pause()
    return frozen


def test_close_with_nothing_new_to_commit_waits_for_no_coordinator(cluster: Cluster) -> None:
    """A consumer that finished nothing since its cursor was written has nothing to commit on
    close. It used to write the same cursor again, riding out a coordinator outage for
    ``coordinator_outage_s`` (30 s by default): `ordq consume` took 32 s to exit on SIGTERM
    with every coordinator down. Guard: ``Committer.committed``, compared in ``_close``."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 5)
    c = Consumer(attrs.evolve(consumer_config(cluster), commit=CommitConfig()))  # the default outage: 30 s
    c.start()
    seqs: list[int] = []
    while len(seqs) < 5:
        seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
    c.commit()
    commits = c.statistics().commits
    frozen = _frozen_coordinators(cluster)
    try:
        started = time.monotonic()
        c.close()  # nothing to write; the lease's release gives up after its own 2 s
        took = time.monotonic() - started
    finally:
        for p in frozen:
            p.resume()
    assert took < load_stretched(8, most=3), f"close() took {took:.1f} s with nothing to commit"
    assert c.statistics().commits == commits


def test_leaving_with_on_an_error_tries_the_last_commit_once(cluster: Cluster) -> None:
    """Leaving the ``with`` block on an exception (Ctrl-C in an application) tries the closing
    commit once, bounded by COMMIT_TIMEOUT_S: it rode out the outage for 30 s before the
    exception was seen. What it could not commit is delivered again, not lost."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 5)
    cfg = attrs.evolve(consumer_config(cluster), commit=CommitConfig())
    seqs: list[int] = []
    frozen: list[ManagedProcess] = []
    started = math.nan
    try:
        with pytest.raises(KeyboardInterrupt), Consumer(cfg) as c:
            while len(seqs) < 5:
                seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
            c.poll(timeout_s=0.1)  # the 5 are finished: the closing commit would cover them
            frozen = _frozen_coordinators(cluster)
            started = time.monotonic()
            raise KeyboardInterrupt
        took = time.monotonic() - started
    finally:
        for p in frozen:
            p.resume()
    assert took < load_stretched(10, most=2.5), f"leaving on an error took {took:.1f} s"
    again: list[int] = []
    with Consumer(attrs.evolve(cfg, consumer_id="second")) as second:
        while len(again) < 5:
            again.extend(m.seq for m in second.poll(timeout_s=0.1))
    assert again == seqs == list(range(5))


def test_consume_interrupted_while_no_coordinator_answers_says_so_and_stops_on_the_second_signal(
        cluster: Cluster, tmp_path: Path) -> None:
    """`ordq consume` signalled while every coordinator is frozen (stop 94's drive: it ran on
    for tens of seconds after SIGTERM and then SIGINT). SIGTERM: it commits what it printed,
    riding out a coordinator's failover, and says that it waits; SIGINT then ends it: exit 130
    within seconds (what was not committed comes again: the test above). Guard:
    ``Consumer.__exit__`` on an error tries the closing commit once (COMMIT_TIMEOUT_S), not
    through the outage."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 5)
    audit, log = tmp_path / "audit", tmp_path / "consume.log"
    argv = [sys.executable, "-m", "ordq.cli", "--zk", cluster.hosts, "--root", cluster.root, "consume", "q",
            "-s", "s", "--start", "earliest", "--quiet", "--audit-dir", str(audit)]
    with open(log, "wb") as out:  # the child has its own copy
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO), "ORDQ_PROGRESS": "1"})
    frozen: list[ManagedProcess] = []
    try:
        wait_until(lambda: _audited(audit) >= 5, timeout_s=load_stretched(60), interval_s=0.05,
                   what="ordq consume printed the 5 messages")
        frozen = _frozen_coordinators(cluster)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "committing what was printed: no coordinator answers yet" in log.read_text(),
                   timeout_s=load_stretched(30), interval_s=0.05, what="ordq consume says why it waits")
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        try:
            code = proc.wait(timeout=load_stretched(10, most=2.5))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ordq consume still ran {time.monotonic() - started:.0f} s after SIGINT; its "
                                 f"stacks:\n{stacks_of(proc.pid)}\nits log:\n{log.read_text()}") from None
    finally:
        for p in frozen:
            p.resume()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + signal.SIGINT, log.read_text()


def _audited(audit: Path) -> int:
    """Rows in the consumer's audit files under ``audit`` (each file's first line names the columns)."""
    return sum(max(len(f.read_bytes().splitlines()) - 1, 0) for f in audit.rglob("*.tsv*"))
