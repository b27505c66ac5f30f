"""The failover tests' order checker catches what it must (pure, no processes)."""

from __future__ import annotations

import zlib

import pytest

from tests.helpers.load import AckRec, DeliveryRec, delivery_of, make_payload, parse_payload
from tests.order_check import check_delivery


def msgs(seqs: list[int], writer: str = "P") -> list[DeliveryRec]:
    return [delivery_of(s, make_payload(s, writer, 64)) for s in seqs]


def acks(seqs: list[int], writer: str = "P") -> list[AckRec]:
    return [AckRec(seq=s, crc=zlib.crc32(make_payload(s, writer, 64)), writer=writer) for s in seqs]


def test_payload_carries_seq_and_detects_change() -> None:
    p = make_payload(42, "P1", 100)
    assert len(p) == 100 and parse_payload(p).seq == 42 and parse_payload(p).intact
    assert not parse_payload(p[:-1] + bytes([p[-1] ^ 1])).intact
    assert parse_payload(b"garbage").seq == -1


def test_a_clean_run_passes() -> None:
    s = check_delivery(acks(list(range(10))), [msgs(list(range(12)))])  # 10, 11 stored, never acked
    assert (s.acked, s.delivered, s.redelivered, s.last_seq) == (10, 12, 0, 11)


@pytest.mark.parametrize(
    ("delivered", "match"),
    [
        ([0, 1, 3, 4], "gap: seq 3 after 1"),
        ([0, 1, 1, 2, 3, 4], "duplicate or reorder"),
        ([0, 2, 1, 3, 4], "gap"),
        ([0, 1, 2], "2 acked seqs never delivered, e.g. 3..4"),
        ([1, 2, 3, 4], "first delivered seq 1, expected 0|begins at seq 1"),
    ],
)
def test_order_faults_are_caught(delivered: list[int], match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        check_delivery(acks([0, 1, 2, 3, 4]), [msgs(delivered)])


def test_corrupt_foreign_or_other_writers_payload_is_caught() -> None:
    bad = msgs([0, 1, 2])
    flipped = make_payload(1, "P", 64)
    bad[1] = delivery_of(1, flipped[:-1] + b"?")
    with pytest.raises(AssertionError, match="corrupt or foreign"):
        check_delivery(acks([0, 1, 2]), [bad])
    with pytest.raises(AssertionError, match="corrupt or foreign"):
        check_delivery([], [[*msgs([0]), delivery_of(1, make_payload(7, "P", 64))]])
    with pytest.raises(AssertionError, match="acked as crc"):
        check_delivery(acks([0, 1]), [msgs([0]) + msgs([1], writer="Q")])


def test_redelivery_only_when_allowed_and_only_after_the_cursor() -> None:
    first, second = msgs([0, 1, 2, 3]), msgs([2, 3, 4, 5])
    with pytest.raises(AssertionError, match="no redelivery allowed"):
        check_delivery(acks(list(range(6))), [first, second])
    s = check_delivery(acks(list(range(6))), [first, second], redelivery=True, starts=[None, 1])
    assert s.redelivered == 2
    with pytest.raises(AssertionError, match="started from a cursor at seq 2"):
        check_delivery(acks(list(range(6))), [first, second], redelivery=True, starts=[None, 2])
    with pytest.raises(AssertionError, match="seqs 4..4 skipped"):
        check_delivery(acks(list(range(6))), [first, msgs([5])], redelivery=True)
    # a standby that resumed past what its predecessor handled, delivering nothing itself
    with pytest.raises(AssertionError, match="skipped"):
        check_delivery(acks([0, 1, 2, 3]), [first, []], redelivery=True, starts=[None, 9])
