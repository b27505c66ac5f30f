"""The verifier's check of a copy against its source (issue 40): an injected loss, duplicate,
swap and foreign message are each found and named; a clean copy (also one that starts part-way
into the source) passes. Pure logic over seq -> CRC maps, plus one run over audit files."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ordq.sdk.audit import AuditWriter
from ordq.spark_order_check.copy_check import check_copy, copy_rows, source_acks

SOURCE = {seq: 1000 + seq for seq in range(20)}


def copy_of(source_seqs: list[int]) -> dict[int, int]:
    return {i: SOURCE[s] for i, s in enumerate(source_seqs)}


def test_a_clean_copy_passes_also_from_part_way() -> None:
    assert check_copy(SOURCE, copy_of(list(range(20)))).clean
    r = check_copy(SOURCE, copy_of(list(range(5, 20))))
    assert r.clean and r.first_source_seq == 5 and r.source_messages == 15


def test_a_loss_is_found_and_named() -> None:
    r = check_copy(SOURCE, copy_of([0, 1, 2, 4, 5] + list(range(6, 20))))
    assert not r.clean and r.counts == {"lost": 1, "duplicated": 0, "reordered": 0, "foreign": 0}
    d = r.first_divergence
    assert d is not None and (d.kind, d.copy_seq, d.source_seq, d.expected_source_seq) == ("lost", 3, 4, 3)
    assert "copy seq 3 holds source seq 4 where source seq 3 belongs" in d.describe()


def test_a_lost_tail_is_found() -> None:
    r = check_copy(SOURCE, copy_of(list(range(18))))
    assert r.counts["lost"] == 2 and r.first_divergence is not None
    assert r.first_divergence.describe() == "the copy ends before source seq 18"


def test_a_duplicate_is_found_and_named() -> None:
    r = check_copy(SOURCE, copy_of([0, 1, 2, 2] + list(range(3, 20))))
    assert r.counts == {"lost": 0, "duplicated": 1, "reordered": 0, "foreign": 0}
    d = r.first_divergence
    assert d is not None and (d.kind, d.copy_seq, d.source_seq, d.expected_source_seq) == ("duplicated", 3, 2, 3)


def test_a_swap_is_found_and_named() -> None:
    r = check_copy(SOURCE, copy_of([0, 1, 3, 2] + list(range(4, 20))))
    assert r.counts == {"lost": 0, "duplicated": 0, "reordered": 1, "foreign": 0}
    d = r.first_divergence
    assert d is not None and (d.kind, d.copy_seq, d.source_seq, d.expected_source_seq) == ("reordered", 2, 3, 2)


def test_two_source_messages_sharing_a_crc_are_told_apart_by_their_place() -> None:
    """CRC-32 collides (a mirror drill's 74,926 source messages held one pair): a copy holding
    both in order is clean; losing, duplicating or swapping one of them is still found."""
    source = dict(SOURCE)
    source[15] = source[4]  # two different messages, one CRC
    copy = {i: source[s] for i, s in enumerate(range(20))}
    assert check_copy(source, copy).clean
    r = check_copy(source, {i: source[s] for i, s in enumerate([*range(15), *range(16, 20)])})
    assert r.counts["lost"] == 1 and not r.clean
    r = check_copy(source, {i: source[s] for i, s in enumerate([0, 1, 2, 3, 4, 4, *range(5, 20)])})
    assert not r.clean and r.counts["lost"] + r.counts["duplicated"] + r.counts["reordered"] >= 1
    r = check_copy(source, {i: source[s] for i, s in enumerate([0, 1, 2, 3, 5, 4, *range(6, 20)])})
    assert not r.clean and r.counts["reordered"] == 1


def test_a_foreign_message_is_found() -> None:
    copy = copy_of(list(range(20)))
    copy[20] = 7  # a CRC the source never acked
    r = check_copy(SOURCE, copy)
    assert r.counts["foreign"] == 1 and r.first_divergence is not None and r.first_divergence.kind == "foreign"


@given(st.permutations(list(range(12))))
def test_any_permutation_but_the_identity_is_a_divergence(order: list[int]) -> None:
    source = {s: 1000 + s for s in range(12)}
    r = check_copy(source, {i: source[s] for i, s in enumerate(order)})
    assert r.clean == (order == sorted(order))
    assert r.counts["lost"] == 0 and r.counts["duplicated"] == 0


@given(st.sets(st.integers(0, 19), max_size=6))
def test_every_dropped_seq_after_the_first_counts_as_lost(dropped: set[int]) -> None:
    kept = [s for s in range(20) if s not in dropped]
    r = check_copy(SOURCE, copy_of(kept))
    if not kept:
        assert r.copy_messages == 0
        return
    assert r.counts["lost"] == sum(1 for s in dropped if s > kept[0])
    assert r.clean == (r.counts["lost"] == 0)


def test_over_audit_files_from_the_cli(tmp_path: Path) -> None:
    from ordq.cli import main

    src, cp = tmp_path / "a", tmp_path / "b"
    w = AuditWriter(src, "acks", writer_id="p")
    w.write_rows([("q", "p", 1, s, 0, s, "", 1000 + s, 1, 2) for s in range(10)])
    w.close()
    w = AuditWriter(cp, "acks", writer_id="m")
    w.write_rows([("q", "m", 1, s, 0, s, "", 1000 + x, 1, 2) for s, x in enumerate([0, 1, 2, 3, 5, 4, 6, 7, 8, 9])])
    w.close()
    assert source_acks([str(src / "acks")]) == {s: 1000 + s for s in range(10)}
    assert copy_rows([], [str(cp / "acks")])[4] == 1005
    assert main(["verify", "--copy-of", str(src), str(cp)]) == 1
