"""The slave's synced end straight to the producer (issue 39; broker_group/synced_watch.py,
ordq/wire/lean_produce.py): over a real TLS group with tokens enforced, an ack still means both
replicas synced (a hung slave holds it back, whatever the master acked), and every guard holds
on the slave's watch against a hand-made client (no certificate, no TLS, no token, a
consume-only token, a token for another queue, a watch on the master, a request on a watch,
watch after watch on one segment), while the slave's one lean port keeps replicating and the
real producer is undisturbed."""

from __future__ import annotations

import asyncio
import ssl
import threading

import attrs
import pytest

from ordq.broker_group.synced_watch import WATCHES_PER_SEGMENT
from ordq.common.errors import BrokerUnavailable, ConfigError, OrdqError, PermissionDenied
from ordq.common.metrics import value
from ordq.common.security import Credentials
from ordq.sdk import Producer, ProducerConfig
from ordq.wire import lean_produce
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import ResourceExhausted, from_error_json
from ordq.wire.lean_produce import ANSWER_LIMIT, LeanProduceStream, frame, open_link, read_frame, shut
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import guard_tokens, load_stretched, read_metrics, wait_until


def _config(cluster: Cluster, creds: Credentials, **kw: object) -> ProducerConfig:
    return ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", credentials=creds, **kw)


def _watch_outcome(p: Producer, *, taken: bool) -> LeanProduceStream:
    """``p``'s stream once its watch was taken up (``taken``), or given up (refused, or not
    opened in time: the stream then stays on the master's acks of both)."""
    stream = p._stream
    assert isinstance(stream, LeanProduceStream)
    if taken:
        wait_until(lambda: stream.watching, timeout_s=load_stretched(30.0), what="the watch taken up")
    else:
        wait_until(lambda: len(stream._readers) == 2 and stream._readers[1].done(), timeout_s=load_stretched(30.0),
                   what="the watch given up")
        assert not stream.watching
    return stream


def _acks_wait_for_the_hung_slave(cluster: Cluster, p: Producer, sent: int) -> None:
    """The slave hangs (SIGSTOP); the master syncs the next batch and acks it ("synced here"):
    the send stays unacked until the slave runs again. ``sent``: what ``p`` had acked before."""
    master, slave = cluster.groups["g1"].master, cluster.groups["g1"].slave
    assert master.metrics_url is not None
    url = master.metrics_url

    def master_acks() -> float:
        return value(read_metrics(url), "ordq_broker_acked_batches_total") or 0.0

    _watch_outcome(p, taken=True)
    before = master_acks()
    slave.pause()
    try:
        pending = p.send(b"held")
        wait_until(lambda: master_acks() > before, timeout_s=load_stretched(30.0),
                   what="the master acked the batch as synced there")
        assert not pending.done(), "acked with the slave hung"
    finally:
        slave.resume()
    assert pending.result(timeout=30).seq == sent
    assert p.statistics().acked == sent + 1 and p.statistics().failovers == 0


def test_an_ack_waits_for_the_slaves_sync_whatever_the_master_acked(cluster: Cluster) -> None:
    """Guard: ``BothSynced`` (the producer settles a batch only where the slave's end covers it
    too). Settling on the master's local ack alone fails this test."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, _, _ = guard_tokens(cluster)
    with Producer(_config(cluster, creds, send_timeout_s=load_stretched(60.0))) as p:
        p.send(b"first").result(timeout=30)
        _acks_wait_for_the_hung_slave(cluster, p, 1)


def test_writes_do_not_wait_for_the_watch_and_the_stream_switches_once_it_is_accepted(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream writes at once, on the master's acks of both replicas; once the slave accepts
    its watch (here: held back until the test lets it go), it asks the master for local acks and
    settles on both from then on. A first write that waited for the watch made every failover
    ~13 ms slower (bench_failover, stop 78), and up to 0.5 s with a hung slave."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, _, _ = guard_tokens(cluster)
    release = threading.Event()
    opened = LeanProduceStream._open_watch

    async def late(self: LeanProduceStream, c: Credentials) -> object:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return await opened(self, c)

    monkeypatch.setattr(LeanProduceStream, "_open_watch", late)
    with Producer(_config(cluster, creds, send_timeout_s=load_stretched(60.0))) as p:
        for i in range(3):
            assert p.send(b"before the watch").result(timeout=30).seq == i
        assert isinstance(p._stream, LeanProduceStream) and not p._stream.watching
        release.set()
        _acks_wait_for_the_hung_slave(cluster, p, 3)


def test_without_the_watch_the_masters_ack_means_both(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ORDQ_SLAVE_ACKS=off`` (the A/B switch), or a watch that cannot be opened: the stream
    asks for no local acks and the master's ack means both, as before."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, _, _ = guard_tokens(cluster)
    monkeypatch.setenv(lean_produce.SLAVE_ACKS_ENV, "off")
    with Producer(_config(cluster, creds)) as p:
        p.send(b"a").result(timeout=30)
        assert isinstance(p._stream, LeanProduceStream) and p._stream._both is None
    monkeypatch.setenv(lean_produce.SLAVE_ACKS_ENV, "on")
    with Producer(_config(cluster, creds)) as p:
        p.send(b"b").result(timeout=30)
        assert _watch_outcome(p, taken=True).watch == cluster.store.live_members("g1")["slave"].produce
    # a watch that cannot be opened in time (a hung slave finishes no TLS): the stream goes without it
    monkeypatch.setattr(lean_produce, "WATCH_OPEN_S", 0.0)
    with Producer(_config(cluster, creds)) as p:
        p.send(b"c").result(timeout=30)
        _watch_outcome(p, taken=False)
        p.send(b"d").result(timeout=30)


def test_a_watch_the_slave_refuses_leaves_the_stream_on_the_masters_acks(cluster: Cluster) -> None:
    """A slave that refuses the watch (here: the token holds its one call there already, the
    other producer's watch) holds no producer back: the stream goes without the watch, and the
    master's acks mean both."""
    cluster.add_groups("g1", extra_args={"slave": ["--calls-per-token", "1"]})
    cluster.create_queue("q")
    cluster.create_queue("q2")
    creds, _, _ = guard_tokens(cluster)
    with Producer(_config(cluster, creds)) as first:
        first.send(b"a").result(timeout=30)
        _watch_outcome(first, taken=True)
        with Producer(attrs.evolve(_config(cluster, creds), queue="q2")) as second:
            second.send(b"b").result(timeout=30)
            _watch_outcome(second, taken=False)
            second.send(b"c").result(timeout=30)
            assert second.statistics().acked == 2 and second.statistics().failovers == 0
        first.send(b"d").result(timeout=30)
        assert first.statistics().acked == 2


async def _watch(link: str, creds: Credentials, *, hello: pb.ProduceLinkHello, after: bytes = b"",
                 answers: int = 1) -> list[object]:
    """A hand-made watch: connect, send ``hello`` (its token from ``creds``), then ``after`` raw;
    the first ``answers`` answers (a synced end, or the refusal as the SDK raises it), or the
    failure."""
    out: list[object] = []
    try:
        reader, writer = await open_link(link, creds, hello=hello)
    except (OSError, ssl.SSLError) as exc:
        return [BrokerUnavailable(link, repr(exc))]
    try:
        writer.write(after)
        for _ in range(answers):
            body = await asyncio.wait_for(read_frame(reader, ANSWER_LIMIT, "answer"), 30)
            if body is None:
                out.append(BrokerUnavailable(link, "closed"))
                break
            answer = pb.ProduceLinkAnswer.FromString(body)
            if answer.error_json:
                out.append(from_error_json(answer.error_json, answer.error_text, link))
                break
            out.append(answer.synced.synced_end)
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
        out.append(BrokerUnavailable(link, repr(exc)))
    finally:
        await shut(writer)
    return out


def test_every_guard_holds_on_the_slaves_watch(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, consume, other = guard_tokens(cluster)
    live = cluster.store.live_members("g1")
    slave_link, master_link = live["slave"].produce, live["master"].produce
    assert slave_link and slave_link == live["slave"].replication, "the slave's one lean port serves clients too"
    with Producer(_config(cluster, creds)) as p:
        p.send(b"before").result(timeout=30)
        open_seg = cluster.state("q").open_segment
        assert open_seg is not None
        hello = pb.ProduceLinkHello(watch=pb.ReplicaSegment(queue="q", seg=open_seg.seg))

        def watch(c: Credentials, link: str = slave_link, **kw: object) -> list[object]:
            return asyncio.run(_watch(link, c, hello=hello, **kw))  # type: ignore[arg-type]

        assert watch(creds) == [1], "the segment's synced end on the slave: one message"
        # No certificate of the CA, or no TLS at all: the link does not talk.
        got = watch(Credentials(ca_file=creds.ca_file, token=creds.token))
        assert isinstance(got[0], BrokerUnavailable), got
        assert isinstance(watch(Credentials(token=creds.token))[0], BrokerUnavailable)

        def refused(c: Credentials, kind: type[OrdqError], **kw: object) -> OrdqError:
            got = watch(c, **kw)
            assert isinstance(got[-1], kind), got
            return got[-1]  # type: ignore[return-value]

        for token in (None, consume):
            denied = refused(attrs.evolve(creds, token=token), PermissionDenied)
            assert denied.role == "produce"  # type: ignore[attr-defined]
        denied = refused(attrs.evolve(creds, token=other), PermissionDenied)
        assert denied.queue == "q"  # type: ignore[attr-defined]
        assert "slave" in str(refused(creds, ConfigError, link=master_link))
        asked = refused(creds, ConfigError, after=frame(pb.FetchRequest(queue="q")), answers=2)
        assert "no requests" in str(asked)
        p.send(b"after").result(timeout=30)  # the owner and the replication beside it undisturbed
        assert p.statistics().acked == 2 and p.statistics().failovers == 0
    slave = cluster.groups["g1"].slave
    assert slave.metrics_url is not None
    metrics = read_metrics(slave.metrics_url)
    counted = value(metrics, "ordq_broker_refused_requests_total", reason="PermissionDenied")
    assert counted is not None and counted >= 3
    watches = value(metrics, "ordq_broker_synced_watches_total")
    assert watches is not None and watches >= 2  # the producer's and the hand-made one that was told its end


async def _hold_watches(link: str, creds: Credentials, hello: pb.ProduceLinkHello, n: int) -> list[object]:
    """A hand-made client opens ``n`` watches one after the other and holds every one open
    until the last answered: each one's first answer (a synced end, or the refusal)."""
    held: list[asyncio.StreamWriter] = []
    out: list[object] = []
    try:
        for _ in range(n):
            reader, writer = await open_link(link, creds, hello=hello)
            held.append(writer)
            body = await asyncio.wait_for(read_frame(reader, ANSWER_LIMIT, "answer"), 30)
            assert body is not None, "the slave closed a watch without an answer"
            answer = pb.ProduceLinkAnswer.FromString(body)
            out.append(from_error_json(answer.error_json, answer.error_text, link) if answer.error_json
                       else answer.synced.synced_end)
    finally:
        for writer in held:
            await shut(writer)
    return out


def test_one_token_cannot_multiply_the_slaves_writes_by_watching_one_segment(cluster: Cluster) -> None:
    """The attack: with its own queue's produce token (all a watch needs), a client opens watch
    after watch on its segment. Each watch costs the slave's loop a TLS write at every commit of
    that segment, the loop every queue of the group shares: 256 of them (the token's calls)
    turned each commit into 256 writes. The guard: a segment holds ``WATCHES_PER_SEGMENT``
    watches (synced_watch.py), the producer's own among them; the next is refused
    (ResourceExhausted, counted), and a slot is free again once its watch closed. The producer
    keeps its watch and its acks."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, _, _ = guard_tokens(cluster)
    slave_link = cluster.store.live_members("g1")["slave"].produce
    with Producer(_config(cluster, creds)) as p:
        p.send(b"before").result(timeout=30)
        stream = _watch_outcome(p, taken=True)
        open_seg = cluster.state("q").open_segment
        assert open_seg is not None
        hello = pb.ProduceLinkHello(watch=pb.ReplicaSegment(queue="q", seg=open_seg.seg))
        got = asyncio.run(_hold_watches(slave_link, creds, hello, WATCHES_PER_SEGMENT + 2))
        free = WATCHES_PER_SEGMENT - 1  # the producer holds one
        assert got[:free] == [1] * free, got
        assert all(isinstance(g, ResourceExhausted) for g in got[free:]), got
        assert "watched" in str(got[free])
        # The flood's watches closed: their slots are free again (once the slave saw the closes).
        wait_until(lambda: asyncio.run(_hold_watches(slave_link, creds, hello, free)) == [1] * free,
                   timeout_s=30, what="the closed watches' slots free again")
        p.send(b"after").result(timeout=30)
        assert p.statistics().acked == 2 and p.statistics().failovers == 0
        assert p._stream is stream and stream.watching
    slave = cluster.groups["g1"].slave
    assert slave.metrics_url is not None
    refused = value(read_metrics(slave.metrics_url), "ordq_broker_refused_requests_total", reason="ResourceExhausted")
    assert refused is not None and refused >= 2
