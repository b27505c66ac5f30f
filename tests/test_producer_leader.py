"""Producer leader faults (DESIGN §5, §6): the producers are separate processes
(``tests.helpers.produce``) under load; the fault hits the leader; a standby waiting for the
producer lease (the coordinator's Acquire) takes over, fences the old epoch and continues the
same seq stream right after the last stored message (``last_committed()``), so the consumer
sees seq 0..N-1 once, in order: every seq below the standby's first one written by the old
leader, every one from it on by the standby (so no late write of the old leader was stored
after the takeover).
"""

from __future__ import annotations

import pytest

from ordq.common.errors import FencedError
from ordq.sdk import Producer, ProducerConfig
from ordq.wire.batch import Message, encode_batch
from tests.cluster import (
    CLIENT_SESSION_TIMEOUT_S,
    FINISH_S,
    LOAD_RATE,
    Cluster,
    LoadConsumer,
    cluster_fixture,  # noqa: F401 - fixture
)
from tests.helpers.load import ProducerProgram, make_payload, parse_payload
from tests.helpers.produce import EXIT_FENCED
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 16_000
# The consumers here only read what the producers stored: one that loses its 2 s ZooKeeper
# session on a loaded box (NotLeader) is replaced, as an application does (``rejoin``), and
# the order check allows the redelivery from its last commit (issue 26).


def wait_standby(program: ProducerProgram) -> None:
    """Until ``program`` waits for the producer lease, refused while another holds it (the
    producer logs that once: sdk/producer.py ``_on_standby``)."""
    wait_until(lambda: "waits as a standby" in program.proc.log_tail(200), timeout_s=30, interval_s=0.05,
               what=f"{program.writer} to wait for the producer lease")


def leader_and_standby(cluster: Cluster, n: int) -> tuple[ProducerProgram, ProducerProgram]:
    """P1 leads (held at seq n/2 until its gate opens: the test's fault finds it sending), P2
    waits as its standby."""
    leader = cluster.spawn_producer("P1", total=n, rate=LOAD_RATE, hold=True, gate_at=n // 2)
    standby = cluster.spawn_producer("P2", total=n, rate=LOAD_RATE, hold=True)
    leader.go()
    leader.wait_leader()
    standby.go()
    wait_standby(standby)
    assert standby.event("leader") is None
    return leader, standby


def check_handover(old: ProducerProgram, new: ProducerProgram, consumer: LoadConsumer, n: int) -> int:
    """The order check, plus: the new leader continued right after the true stored tail."""
    lead = new.event("leader")
    assert lead is not None and lead["last"] is not None
    next_seq = lead["next_seq"]
    old_acks = old.acks()
    summary = check_delivery(old_acks + new.acks(), consumer.instances, redelivery=len(consumer.instances) > 1)
    assert summary.delivered == n
    # last_committed() after the old leader's death: the last stored message, read back whole
    assert lead["last"]["seq"] == lead["last"]["payload_seq"] == next_seq - 1
    assert next_seq - 1 >= max((a.seq for a in old_acks), default=-1)
    wrong = [d.seq for d in consumer.delivered if d.writer != ("P1" if d.seq < next_seq else "P2")]
    assert not wrong, f"seqs stored by the wrong producer around the takeover at {next_seq}: {wrong[:10]}"
    return next_seq


def test_producer_leader_killed(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    consumer = cluster.consumer(until=N - 1, rejoin=True)
    consumer.start()
    p1, p2 = leader_and_standby(cluster, N)
    p1.wait_acked(N // 3)
    p1.proc.kill()
    p2.wait_leader()
    assert p2.wait_exit(FINISH_S) == 0, p2.records()[-2:]
    consumer.join(FINISH_S)
    check_handover(p1, p2, consumer, N)
    done = p2.event("done")
    assert done is not None and done["stats"]["failovers"] == 0


def test_producer_leader_hung_then_resumed_is_fenced(cluster: Cluster) -> None:
    """SIGSTOP the leader until the standby has taken over and written; on SIGCONT its
    in-flight and new writes are refused and it stops with FencedError, without disturbing
    the new leader (which never has to fail over)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    consumer = cluster.consumer(until=N - 1, rejoin=True)
    consumer.start()
    p1, p2 = leader_and_standby(cluster, N)
    p1.wait_acked(N // 4)
    p1.proc.pause()
    p1.open_gate()  # resumed, it sends on: those writes are refused too
    try:
        p2.wait_leader()
        p2.wait_acked(2000)
    finally:
        p1.proc.resume()
    assert p1.wait_exit(30) == EXIT_FENCED, p1.records()[-2:]
    assert p2.wait_exit(FINISH_S) == 0, p2.records()[-2:]
    consumer.join(FINISH_S)
    check_handover(p1, p2, consumer, N)
    done = p2.event("done")
    assert done is not None and done["stats"]["failovers"] == 0, done

    # A batch of the old epoch delayed in the network, arriving now, is refused too.
    st = cluster.state()
    assert st.open_segment is not None
    master = cluster.store.live_members(st.open_segment.gid)["master"]
    old_epoch = st.producer_epoch - 1
    stream = cluster.transport.open_produce(master.address, "q", st.open_segment.seg, old_epoch)
    try:
        stream.send([encode_batch([Message(payload=make_payload(N, "P1", 200))], epoch=old_epoch, first_seq=N)])
        with pytest.raises(FencedError):
            for ack in stream.acks():
                raise AssertionError(f"a write of the fenced epoch was acked: {ack}")
    finally:
        stream.close()


def test_last_committed_after_producer_crash(cluster: Cluster) -> None:
    """A producer flooding the queue (many batches in flight) is killed -9: the next leader's
    ``last_committed()`` is the last message stored on the replicas (at or past the last ack),
    and its next message continues the stream with no gap and no duplicate."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    p1 = cluster.spawn_producer("P1", total=10**7)  # no rate limit: as much in flight as the window allows
    p1.wait_leader()
    p1.wait_acked(N // 4)
    p1.proc.kill()
    acked = p1.acks()
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, leader_timeout_s=30)
    with Producer(cfg) as p2:
        last = p2.last_committed()
        assert last is not None and last.message is not None
        info = parse_payload(last.message.payload)
        assert (info.seq, info.writer, info.intact) == (last.seq, "P1", True)
        assert last.seq >= acked[-1].seq
        result = p2.send(make_payload(last.seq + 1, "P2", 200)).result(timeout=30)
        assert result.seq == last.seq + 1
    consumer = cluster.consumer(until=last.seq + 1, rejoin=True)
    consumer.start()
    consumer.join(FINISH_S)
    summary = check_delivery(acked, consumer.instances, redelivery=len(consumer.instances) > 1)
    assert summary.last_seq == last.seq + 1
    tail = consumer.delivered[-2:]
    assert [(d.seq, d.writer) for d in tail] == [(last.seq, "P1"), (last.seq + 1, "P2")]


@pytest.mark.slow
def test_producer_leaders_killed_and_hung_in_turn_long(cluster: Cluster) -> None:
    """Slow variant: 200,000 messages, four leaders in turn, each killed -9 or hung and
    resumed while the next one takes over."""
    cluster.add_groups("g1", "g2", "g3")
    cluster.create_queue()
    n = 200_000
    consumer = cluster.consumer(until=n - 1)
    consumer.start()
    programs = [cluster.spawn_producer("P1", total=n, rate=LOAD_RATE)]
    programs[0].wait_leader()
    for k in range(2, 6):
        standby = cluster.spawn_producer(f"P{k}", total=n, rate=LOAD_RATE, hold=True)
        standby.go()
        wait_standby(standby)
        old = programs[-1]
        old.wait_acked(3000, timeout_s=120)
        if k % 2:
            old.proc.pause()
            standby.wait_leader()
            old.proc.resume()
            assert old.wait_exit(30) == EXIT_FENCED
        else:
            old.proc.kill()
            standby.wait_leader()
        programs.append(standby)
    assert programs[-1].wait_exit(FINISH_S * 2) == 0
    consumer.join(FINISH_S)
    acked = [a for p in programs for a in p.acks()]
    check_delivery(acked, [consumer.delivered])
    starts = [p.event("leader")["next_seq"] for p in programs]  # type: ignore[index]
    for d in consumer.delivered:
        owner = max(i for i, s in enumerate(starts) if s <= d.seq)
        assert d.writer == programs[owner].writer, (d, starts)
