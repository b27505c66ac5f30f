"""The status document's topics and parked counts (ordq/admin/status_page.py ``topic_rows``,
``add_parked``): pure functions of the queues' rows, tested without a cluster (the Chromium test,
tests/test_status_console.py, shows them on a real one)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ordq.admin.status_page import add_parked, topic_rows


def queue(name: str, stored: int | None, subs: dict[str, int | None] | None = None) -> dict[str, Any]:
    return {"queue": name, "stored": stored,
            "subscriptions": [{"subscription": s, "lag": lag} for s, lag in (subs or {}).items()]}


def test_parked_is_what_the_parking_queue_stores() -> None:
    queues = [queue("orders", 10, {"billing": 3, "audit": 0}), queue("orders.parked.billing", 4),
              queue("t.p0", 1, {"s": 0}), queue("t.p0.parked.s", None)]
    add_parked(queues)
    parked = {(q["queue"], s["subscription"]): s["parked"] for q in queues for s in q["subscriptions"]}
    # billing parked 4; audit has no parking queue (nothing parked); t.p0's replicas did not say
    assert parked == {("orders", "billing"): 4, ("orders", "audit"): 0, ("t.p0", "s"): None}


def test_a_topic_is_one_row_of_its_partitions_in_order_with_their_sums() -> None:
    queues = [queue("clicks.p10", 5, {"s": 1}), queue("clicks.p2", 7, {"s": 2, "t": 0}), queue("other", 1),
              queue("clicks.p0", 0, {"s": 0}), queue("clicks.px", 9), queue("quiet.p0", None, {"s": None})]
    add_parked(queues)
    rows = topic_rows(queues, ["clicks", "quiet", "gone"])
    assert rows[0] == {"topic": "clicks", "partitions": ["clicks.p0", "clicks.p2", "clicks.p10"], "stored": 12,
                       "subscriptions": [{"subscription": "s", "lag": 3, "parked": 0, "partitions": 3},
                                         {"subscription": "t", "lag": 0, "parked": 0, "partitions": 1}]}
    # a figure one partition does not know makes the sum unknown, not smaller
    assert rows[1]["stored"] is None and rows[1]["subscriptions"][0]["lag"] is None
    assert rows[2] == {"topic": "gone", "partitions": [], "stored": 0, "subscriptions": []}


def test_a_corrupt_partition_makes_the_topics_figures_unknown() -> None:
    queues = [queue("t.p0", 3), {"queue": "t.p1", "corrupt": "bad json", "error": "corrupt state"}]
    add_parked(queues)
    assert topic_rows(queues, ["t"]) == [{"topic": "t", "partitions": ["t.p0", "t.p1"], "stored": None,
                                         "subscriptions": []}]


@given(st.dictionaries(st.integers(0, 40), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=12),
       st.lists(st.sampled_from(["a", "a.p", "b", "a.parked.s"]), max_size=4))
def test_every_partition_is_in_its_topic_once_and_the_sums_add_up(
        parts: dict[int, tuple[int, int]], others: list[str]) -> None:
    queues = [queue(f"a.p{i}", stored, {"s": lag}) for i, (stored, lag) in parts.items()]
    queues += [queue(name, 1) for name in dict.fromkeys(others)]
    add_parked(queues)
    [row] = topic_rows(queues, ["a"])
    assert row["partitions"] == [f"a.p{i}" for i in sorted(parts)]
    assert row["stored"] == sum(s for s, _ in parts.values())
    assert row["subscriptions"] == ([{"subscription": "s", "lag": sum(lag for _, lag in parts.values()),
                                      "parked": 0, "partitions": len(parts)}] if parts else [])
