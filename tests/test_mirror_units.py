"""The mirror's pure parts (issue 40): the x-ordq-mirror chain, where a mirror goes on, the
gate between the source and the target, the names of its two ends. No I/O."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.admin.mirrors import is_mirror_subscription, mirror_lag
from ordq.admin.queue_views import SubscriptionView
from ordq.common.errors import ConfigError, MirrorDiverged, MirrorLoop
from ordq.coordinator.state import Cursor
from ordq.coordinator.topics import TopicConfig, partition_of, partition_queue
from ordq.mirror.chain import MIRROR_HEADER, Hop, SourceFilter, copy_headers, encode_chain, parse_chain, resume_from
from ordq.mirror.config import MirrorConfig, MirrorEnd, RetryPolicy, split_end
from ordq.mirror.topic import partition_pairs


def test_a_copy_keeps_the_applications_headers_and_adds_a_hop() -> None:
    out = copy_headers((("trace", b"t1"),), queue="q", source="A", seq=7, ts_us=99, target="B")
    assert out[0] == ("trace", b"t1")
    assert parse_chain(out) == [Hop("A", 7, 99)]
    again = copy_headers(out, queue="q", source="B", seq=3, ts_us=100, target="C")
    assert parse_chain(again) == [Hop("A", 7, 99), Hop("B", 3, 100)]
    assert [n for n, _ in again].count(MIRROR_HEADER) == 1


def test_a_loop_is_refused_with_the_chain_named() -> None:
    out = copy_headers((), queue="q", source="A", seq=7, ts_us=1, target="B")
    with pytest.raises(MirrorLoop, match="A -> B") as info:
        copy_headers(out, queue="q", source="B", seq=0, ts_us=1, target="A")
    assert info.value.chain == ["A", "B"] and info.value.target == "A"


def test_a_malformed_chain_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="malformed"):
        parse_chain(((MIRROR_HEADER, b"[1,2"),))


def test_resume_from_the_targets_last_message() -> None:
    assert resume_from("q", None, None, source="A") is None  # empty target: the cursor says
    last = ((MIRROR_HEADER, encode_chain([Hop("A", 41, 5)])),)
    assert resume_from("q", last, 9, source="A") == 42
    with pytest.raises(MirrorDiverged, match="no mirror copy"):
        resume_from("q", (("x", b"y"),), 9, source="A")
    with pytest.raises(MirrorDiverged, match="a copy of C"):
        resume_from("q", ((MIRROR_HEADER, encode_chain([Hop("C", 1, 5)])),), 9, source="A")


def test_the_gate_drops_what_the_target_holds_and_refuses_a_gap() -> None:
    gate = SourceFilter("A", 5)
    assert [gate.admit(s) for s in (3, 4, 5, 5, 6)] == [False, False, True, False, True]
    assert gate.skipped == 3 and gate.next_seq == 7
    with pytest.raises(MirrorDiverged, match="seq 9 where the copy needs seq 7") as info:
        gate.admit(9)
    assert (info.value.expected, info.value.got) == (7, 9)
    fresh = SourceFilter("A", None)  # an empty target: the first delivered seq starts the copy
    assert fresh.admit(100) and fresh.next_seq == 101


@given(st.integers(0, 50), st.lists(st.integers(0, 60), max_size=60))
def test_the_gate_lets_through_each_seq_once_in_order(start: int, deliveries: list[int]) -> None:
    """Whatever a source redelivers (rejoins, restarts: any run of already-seen seqs), what
    passes is start, start+1, ... with no gap and no repeat, or the gate refuses."""
    gate = SourceFilter("A", start)
    passed: list[int] = []
    for seq in deliveries:
        try:
            if gate.admit(seq):
                passed.append(seq)
        except MirrorDiverged:
            assert seq > gate.next_seq  # type: ignore[operator]
            break
    assert passed == list(range(start, start + len(passed)))


def test_ends_are_named_as_the_cli_names_clusters() -> None:
    assert split_end("127.0.0.1:2181/ordq/orders") == ("127.0.0.1:2181", "/ordq", "orders")
    assert split_end("h1:1,h2:2/t-1/a/q") == ("h1:1,h2:2", "/t-1/a", "q")
    for bad in ("orders", "127.0.0.1:2181/orders", "/ordq/orders", "127.0.0.1:2181/ordq/"):
        with pytest.raises(ConfigError, match="ZK_HOSTS/ROOT/QUEUE"):
            split_end(bad)


def test_config_refuses_a_mirror_onto_itself_and_names_the_subscription() -> None:
    a = MirrorEnd(name="z:1/a", zk_hosts="z:1", root="/a", queue="q", identity="z:1/a")
    b = MirrorEnd(name="z:1/b", zk_hosts="z:1", root="/b", queue="q", identity="f00d")
    assert MirrorConfig(source=a, target=b).sub == "mirror.f00d"
    assert MirrorConfig(source=b, target=a).sub == "mirror.z_1_a"
    with pytest.raises(ConfigError, match="to itself"):
        MirrorConfig(source=a, target=MirrorEnd(name="z:1/a", zk_hosts="z:1", root="/a", queue="r", identity="z:1/a"))


def test_retry_waits_double_up_to_the_bound() -> None:
    r = RetryPolicy(first_s=0.5, max_s=3.0)
    assert [r.wait_s(n) for n in (1, 2, 3, 4, 9)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ConfigError):
        RetryPolicy(first_s=0)


# -- the lag a source cluster shows of its mirrors (ordq top, the status page) -----------------


def _sub(name: str, last_seq: int, held_by: str | None = None) -> SubscriptionView:
    return SubscriptionView(name, Cursor(seg=0, offset=last_seq + 1, last_seq=last_seq), None, held_by)


def test_mirror_subscriptions_are_named_after_their_target() -> None:
    assert is_mirror_subscription("mirror.dc2") and not is_mirror_subscription("mirror.")
    assert not is_mirror_subscription("billing") and not is_mirror_subscription("mirrors")
    row = mirror_lag("q", _sub("mirror.dc2", 19, "m1"), 49, 1_000_000, 3_500_000)
    assert (row.target, row.copied_seq, row.lag_messages, row.lag_seconds, row.held_by) == ("dc2", 19, 30, 2.5, "m1")


def test_mirror_lag_is_zero_when_caught_up_and_unknown_when_the_source_end_is() -> None:
    caught_up = mirror_lag("q", _sub("mirror.dc2", 49), 49, None, 10)
    assert (caught_up.lag_messages, caught_up.lag_seconds) == (0, 0.0)
    unknown = mirror_lag("q", _sub("mirror.dc2", 10), None, 5, 10)
    assert (unknown.lag_messages, unknown.lag_seconds) == (None, None)
    unread = mirror_lag("q", _sub("mirror.dc2", 10), 12, None, 10)  # the oldest waiting message not read
    assert (unread.lag_messages, unread.lag_seconds) == (2, None)


@given(st.integers(-1, 10**6), st.integers(-1, 10**6), st.integers(0, 10**12), st.integers(0, 10**12))
def test_mirror_lag_is_never_negative_and_zero_only_when_nothing_waits(copied: int, last: int, ts: int,
                                                                      now: int) -> None:
    row = mirror_lag("q", _sub("mirror.x", copied), last, ts, now)
    assert row.lag_messages == max(last - copied, 0)
    assert row.lag_seconds is not None and row.lag_seconds >= 0
    if last <= copied:
        assert row.lag_seconds == 0.0


# -- a mirror of a keyed topic: partition i to partition i ------------------------------------


def test_a_topic_end_names_every_partition_of_the_topic() -> None:
    assert split_end("127.0.0.1:2181/ordq/topic:orders") == ("127.0.0.1:2181", "/ordq", "topic:orders")
    for bad in ("z:1/r/topic:", "z:1/r/topic:a:b", "z:1/r/topic:a b"):
        with pytest.raises(ConfigError):
            split_end(bad)


def _ends(partitions_a: int, partitions_b: int) -> list[tuple[MirrorEnd, MirrorEnd]]:
    a = MirrorEnd(name="z:1/a", zk_hosts="z:1", root="/a", queue="orders", identity="A", topic=True)
    b = MirrorEnd(name="z:1/b", zk_hosts="z:1", root="/b", queue="orders2", identity="B", topic=True)
    return partition_pairs(a, b, TopicConfig(partitions_a), TopicConfig(partitions_b))


@settings(deadline=None)  # up to 256 partitions a case: slow on a loaded box, never wrong
@given(st.integers(1, 256))
def test_each_partition_is_copied_to_the_same_partition_so_every_key_keeps_its_partition(n: int) -> None:
    pairs = _ends(n, n)
    assert [(s.queue, t.queue) for s, t in pairs] == [(f"orders.p{i}", f"orders2.p{i}") for i in range(n)]
    assert all(not s.topic and not t.topic and s.identity == "A" and t.identity == "B" for s, t in pairs)
    # what a key's partition is on the source, it is on the target
    for key in (b"", b"k1", b"customer-42", bytes(range(30))):
        i = partition_of(key, n)
        assert pairs[i][0].queue == partition_queue("orders", i) and pairs[i][1].queue == partition_queue("orders2", i)


def test_topics_of_different_partition_counts_are_refused_saying_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"z:1/a/topic:orders has 4 partitions and z:1/b/topic:orders2 has 3: .* "
                                          r"give the target topic 4 partitions"):
        _ends(4, 3)


def test_a_queue_is_not_mirrored_into_a_topic() -> None:
    a = MirrorEnd(name="z:1/a", zk_hosts="z:1", root="/a", queue="orders", identity="A", topic=True)
    b = MirrorEnd(name="z:1/b", zk_hosts="z:1", root="/b", queue="orders", identity="B")
    with pytest.raises(ConfigError, match="a queue to a queue or a topic to a topic"):
        MirrorConfig(source=a, target=b)


def test_a_topic_mirrors_series_have_a_sample_per_partition() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from ordq.common.metrics import parse, value
    from ordq.mirror.lag import Lag, MirrorMetrics, MirrorSnapshot

    def part(i: int, lag: Lag | None) -> tuple[dict[str, str], Callable[[], MirrorSnapshot]]:
        snap = MirrorSnapshot("leading" if i == 0 else "standby", 10 * i, 0, 0, 1, lag)
        return {"source": f"a/orders.p{i}", "target": f"b/orders.p{i}"}, lambda: snap

    registry = CollectorRegistry()
    metrics = MirrorMetrics([part(0, Lag(9, 4, 5, 1.5, 0.0)), part(1, None)], registry=registry)
    try:
        samples = parse(generate_latest(registry).decode())
        assert value(samples, "ordq_mirror_lag_messages", source="a/orders.p0") == 5
        assert value(samples, "ordq_mirror_lag_messages", source="a/orders.p1") == -1  # unknown
        assert value(samples, "ordq_mirror_lag_seconds", source="a/orders.p0") == 1.5
        assert value(samples, "ordq_mirror_copied_messages_total", target="b/orders.p1") == 10
        assert value(samples, "ordq_mirror_leader") == 1  # one partition led here
    finally:
        metrics.close()
