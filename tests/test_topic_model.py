"""The pure topic model (coordinator/topics.py): routing is stable and in range."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.coordinator.topics import MAX_PARTITIONS, TopicConfig, partition_of, partition_queue


@given(st.binary(max_size=64), st.integers(1, MAX_PARTITIONS))
def test_every_key_has_one_partition_in_range(key: bytes, partitions: int) -> None:
    assert 0 <= partition_of(key, partitions) < partitions


def test_routing_is_the_documented_hash_for_ever() -> None:
    # Golden values: a change of the hash breaks every topic's key order, so it must fail here.
    assert [partition_of(str(i).encode(), 4) for i in range(10)] == [1, 2, 0, 1, 2, 0, 0, 2, 2, 1]
    assert partition_of(b"", 7) == partition_of(b"", 7)


def test_a_partition_is_a_queue_named_after_its_topic() -> None:
    assert partition_queue("orders", 3) == "orders.p3"


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITIONS + 1, 1.5])
def test_a_bad_partition_count_is_refused(partitions: object) -> None:
    with pytest.raises(ConfigError, match="partitions"):
        TopicConfig(partitions=partitions)  # type: ignore[arg-type]


def test_an_unknown_hash_is_refused() -> None:
    with pytest.raises(ConfigError, match="hash"):
        TopicConfig(partitions=2, hash="crc32")
