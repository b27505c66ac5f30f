"""The everyday paths of the CLI and the SDK, driven as a user drives them, on real brokers.

What is committed when (docs/SDK.md, "What is committed"), each case on real processes: a
message counts as finished once the application asks for another or says so; the message in
hand when a loop breaks or raises, and the last ``poll`` batch, are not finished and come
again to the next consumer. Also the cases of issue 11 that lost messages or crashed: ``ordq
consume --count`` committing a whole batch, a new subscription at ``latest``, and
``last_committed()`` with the tail's group down.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time

import pytest

from ordq.common.errors import ConfigError, MessageTooLarge
from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from ordq.wire.batch import Message, encode_batch
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture

pytestmark = pytest.mark.zk

N = 3000


def produce(cluster: Cluster, n: int, first: int = 0) -> None:
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q")
    with Producer(cfg) as p:
        futures = [p.send(b"m%d" % (first + i)) for i in range(n)]
        futures[-1].result(30)


def consumer_config(cluster: Cluster, sub: str = "s", **options: object) -> ConsumerConfig:
    # Periodic commits far apart: every cursor these tests see was written by the path under test.
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription=sub,
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                          commit=CommitConfig(every_messages=10**9, every_ms=10**9), **options)  # type: ignore[arg-type]


def committed(cluster: Cluster, sub: str = "s") -> int:
    return cluster.store.get_cursor("q", sub)[0].last_seq


def first_seq(cluster: Cluster, sub: str = "s") -> int:
    with Consumer(consumer_config(cluster, sub)) as c:
        while not (batch := c.poll(max_messages=1)):
            pass
        return batch[0].seq


@pytest.fixture(name="queue")
def queue_fixture(cluster: Cluster) -> Cluster:
    """A queue ``q`` on g1 and g2 holding N messages (``m0`` ...)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, N)
    return cluster


def test_cli_consume_count_commits_exactly_what_it_printed(queue: Cluster) -> None:
    """Issue 11 case 1: `ordq consume --count 10` printed 10 and committed the whole batch."""
    out = queue.ordq("consume", "q", "-s", "s1", "--count", "10")
    assert out.returncode == 0, out.stderr
    assert [int(line.split(b"\t")[0]) for line in out.stdout.splitlines()] == list(range(10))
    subs = json.loads(queue.ordq("sub", "list", "q", "--json").stdout)
    s1 = next(s for s in subs["subscriptions"] if s["subscription"] == "s1")
    assert s1["last_seq"] == 9 and s1["lag"] == N - 10, s1
    again = queue.ordq("consume", "q", "-s", "s1", "--count", "5")
    assert [int(line.split(b"\t")[0]) for line in again.stdout.splitlines()] == list(range(10, 15))


def test_poll_batch_is_committed_only_once_the_application_asks_again_or_says_so(queue: Cluster) -> None:
    with Consumer(consumer_config(queue)) as c:
        batch = c.poll(max_messages=100)
        assert [m.seq for m in batch] == list(range(100))
    assert committed(queue) == -1  # close: the batch in hand is not finished
    with Consumer(consumer_config(queue)) as c:
        assert c.poll(max_messages=100)[0].seq == 0
        second = c.poll(max_messages=50)  # asking again: the first 100 are finished
        assert second[0].seq == 100
    assert committed(queue) == 99
    with Consumer(consumer_config(queue)) as c:
        batch = c.poll(max_messages=50)
        c.commit(through=batch[9])  # the application finished 100..109
    assert committed(queue) == 109
    with Consumer(consumer_config(queue)) as c:
        c.poll(max_messages=20)
        c.commit()  # everything handed out
    assert committed(queue) == 129


def test_poll_max_messages_keeps_the_rest_for_the_next_call(queue: Cluster) -> None:
    with Consumer(consumer_config(queue)) as c:
        seqs = []
        while len(seqs) < N:
            batch = c.poll(max_messages=7)
            assert len(batch) <= 7
            seqs.extend(m.seq for m in batch)
        c.commit()
    assert seqs == list(range(N))
    assert committed(queue) == N - 1


def test_iteration_break_exception_and_commit(queue: Cluster) -> None:
    class AppFailed(Exception):
        pass

    with Consumer(consumer_config(queue)) as c:  # break: the message in hand is not finished
        for m in c:
            if m.seq == 10:
                break
    assert committed(queue) == 9
    with pytest.raises(AppFailed), Consumer(consumer_config(queue)) as c:  # an exception: likewise
        for m in c:
            if m.seq == 20:
                raise AppFailed
    assert committed(queue) == 19
    with Consumer(consumer_config(queue)) as c:  # commit() before break: it is finished
        for m in c:
            if m.seq == 30:
                c.commit()
                break
    assert committed(queue) == 30
    with Consumer(consumer_config(queue)) as c:  # a new loop asks for more: the held one is done
        for m in c:
            if m.seq == 40:
                break
        for m in c:
            assert m.seq == 41
            break
    assert committed(queue) == 40
    assert first_seq(queue) == 41


def test_iteration_over_a_whole_queue_commits_on_close(queue: Cluster) -> None:
    """Iteration, then close from another point in the loop: everything before the message
    in hand is committed, across many fetches."""
    with Consumer(consumer_config(queue)) as c:
        for m in c:
            if m.seq == N - 1:
                break
    assert committed(queue) == N - 2


def test_new_subscription_at_latest_sdk_and_cli(queue: Cluster) -> None:
    """Issue 11 case 2: a new subscription at `latest` failed with 'consumer not started'."""
    with Consumer(consumer_config(queue, "late", start="latest")) as c:
        assert c.poll(timeout_s=0.2) == []
        produce(queue, 5, first=N)
        got = []
        while len(got) < 5:
            got.extend(m.seq for m in c.poll())
        c.commit()
    assert got == list(range(N, N + 5))
    out = queue.ordq("consume", "q", "-s", "late-cli", "--start", "latest", "--idle-exit", "0.5")
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"" and out.stderr.endswith(b"delivered 0 messages from q/late-cli\n"), out.stderr


def test_last_committed_with_the_tail_group_down(queue: Cluster) -> None:
    """Issue 11 case 6: `last_committed()` raised when the tail's group could not be read."""
    cfg = ProducerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q")
    with Producer(cfg) as p:
        assert p.last_committed().message.payload == b"m%d" % (N - 1)
        group = queue.groups["g1"]
        group.master.kill()
        group.slave.kill()
        last = p.last_committed()
        assert last.seq == N - 1 and last.seg == 0 and last.message is None
        assert last.message_error and "g1" in last.message_error


def test_max_message_bytes_is_enforced_by_the_producer_and_the_broker(cluster: Cluster) -> None:
    """Issue 11 case 4: `--max-message-bytes 100` was stored and enforced nowhere."""
    cluster.add_groups("g1", "g2")
    out = cluster.ordq("queue", "create", "small", "--max-message-bytes", "100")
    assert out.returncode == 0, out.stderr
    ok = cluster.ordq("produce", "small", stdin=b"x" * 100 + b"\n")
    assert ok.returncode == 0, ok.stderr
    big = cluster.ordq("produce", "small", stdin=b"y" * 200 + b"\n")
    assert big.returncode == 1 and b"Traceback" not in big.stderr, big.stderr
    assert big.stderr.decode().strip().splitlines()[-1] == (
        "ordq: error: line 1 refused: message of 200 bytes exceeds the limit of 100 bytes (queue 'small' "
        "max_message_bytes); no line before it was sent")
    # Key and headers count too (as stored: each header 6 bytes of lengths + name + value).
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="small")
    with Producer(cfg) as p:
        with pytest.raises(MessageTooLarge, match="101 bytes"):
            p.send(b"p" * 80, key=b"k" * 10, headers=[("h", b"v" * 4)])
        assert p.send(b"p" * 80, key=b"k" * 10, headers=[("h", b"v" * 3)]).result(30).seq == 1

        # A hand-made client that skips the SDK's check: the head master refuses the batch.
        st = cluster.state("small")
        head = st.open_segment
        assert head is not None
        master = cluster.store.live_members(head.gid)["master"].address
        batch = encode_batch([Message(b"z" * 300, None, (), 0)], epoch=st.producer_epoch, first_seq=2)
        stream = cluster.transport.open_produce(master, "small", head.seg, st.producer_epoch, p._epoch_key)
        try:
            stream.send([batch])
            with pytest.raises(MessageTooLarge, match="300 bytes exceeds the limit of 100"):
                list(stream.acks())
        finally:
            stream.close()
    seqs = []
    with Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="small", subscription="s")) as c:
        while len(seqs) < 2:
            seqs.extend((m.seq, len(m.payload)) for m in c.poll(timeout_s=0.2))
        assert c.poll(timeout_s=0.3) == []  # nothing of the refused messages was stored
    assert seqs == [(0, 100), (1, 80)]


def _seqs(lines: bytes) -> list[int]:
    return [int(line.split(b"\t")[0]) for line in lines.splitlines()]


def _interrupt_after(proc: subprocess.Popen[bytes], lines: int, *,
                     timeout_s: float = 120.0) -> tuple[list[int], str]:
    """Read ``lines`` lines of ``ordq consume`` output (within ``timeout_s``), press Ctrl-C,
    collect the rest."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout_s
    while seen.count(b"\n") < lines:
        ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            proc.kill()
            proc.communicate()  # closes its pipes
            printed = seen.count(b"\n")
            raise AssertionError(f"ordq consume printed {printed} of {lines} lines in {timeout_s:g} s")
        chunk = proc.stdout.read1(65536)
        assert chunk, "ordq consume ended before it was interrupted"
        seen += chunk
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return _seqs(seen + rest), err.decode()


def test_ctrl_c_on_consume_commits_exactly_what_it_printed(queue: Cluster) -> None:
    """Ctrl-C at any point of a running `ordq consume` (traffic still arriving): the commit
    covers exactly the messages printed, so the next run starts right after the last one."""
    # Traffic arrives for as long as the runs below take (on a busy machine a run's start alone
    # takes seconds; a bounded count ran out, and a run then waited for lines that never came).
    traffic = queue.spawn_ordq("traffic", "produce", "q", "--count", "100000000", "--rate", "2000")
    start = 0
    try:
        for lines in (1, 300, 1000, 2000):
            seqs, err = _interrupt_after(queue.ordq_piped("consume", "q", "-s", "ctrlc"), lines)
            assert seqs == list(range(start, start + len(seqs))), (start, seqs[:3], seqs[-3:])
            assert f"delivered {len(seqs)} messages from q/ctrlc, last seq {seqs[-1]}" in err
            assert committed(queue, "ctrlc") == seqs[-1]
            start = seqs[-1] + 1
    finally:
        traffic.stop()


def test_ctrl_c_on_keyed_consume_loses_nothing(queue: Cluster) -> None:
    """Keyed delivery commits what finished: everything up to the cursor was printed, and
    the next run resumes right after it."""
    seqs, _ = _interrupt_after(queue.ordq_piped("consume", "q", "-s", "keyed", "--workers", "3"), 1000)
    cursor = committed(queue, "keyed")
    assert cursor >= 0 and set(range(cursor + 1)) <= set(seqs)
    assert len(seqs) == len(set(seqs))
    assert first_seq(queue, "keyed") == cursor + 1


def test_ctrl_c_on_produce_flushes_what_was_read(cluster: Cluster) -> None:
    """Ctrl-C while `ordq produce` waits on stdin: the lines typed so far are acked and the
    summary says so; Ctrl-C during generated load: every message sent is acked."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("typed")
    proc = cluster.ordq_piped("produce", "typed")
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(b"one\ntwo\nthree\n")
    proc.stdin.flush()
    with Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="typed",
                                 subscription="check")) as c:
        got: list[bytes] = []
        while len(got) < 3:  # the lines were sent without waiting for the end of input
            got.extend(m.payload for m in c.poll())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert got == [b"one", b"two", b"three"]
    assert "acked 3 of 3 messages to typed" in err.decode()

    cluster.create_queue("load")
    load = cluster.ordq_piped("produce", "load", "--count", "1000000", "--rate", "2000")
    with Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="load",
                                 subscription="check")) as c:
        seqs: list[int] = []
        while len(seqs) < 500:  # interrupted in full flow
            seqs.extend(m.seq for m in c.poll())
        load.send_signal(signal.SIGINT)
        _, err = load.communicate(timeout=60)
        assert load.returncode == 0, err.decode()
        sent = int(err.decode().split("acked ")[1].split(" of ")[0])
        assert f"acked {sent} of {sent} messages to load" in err.decode()
        while seqs[-1] < sent - 1:
            seqs.extend(m.seq for m in c.poll())
    assert seqs == list(range(sent))


def test_consumer_config_start_at_a_seq_or_a_time(queue: Cluster) -> None:
    """An application that keeps its position in its own database starts a new subscription
    exactly there (`start="seq N"`), or at a time (`start="time T"`), as `ordq sub create`."""
    with Consumer(consumer_config(queue, "from-db", start="seq 1500")) as c:
        assert first_poll(c) == 1500
    t = time.time()
    produce(queue, 5, first=N)
    with Consumer(consumer_config(queue, "from-time", start=f"time {t}")) as c:
        assert first_poll(c) == N
    with pytest.raises(ConfigError, match="bad seq 'x'"):
        consumer_config(queue, "bad", start="seq x")
    with pytest.raises(ConfigError, match="bad reset target 'soon'"):
        consumer_config(queue, "bad", start="soon")


def first_poll(c: Consumer) -> int:
    while not (batch := c.poll(max_messages=1)):
        pass
    return batch[0].seq
