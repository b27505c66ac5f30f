"""The timing records of a failover's way to its first ack (issue 29): the broker's first-write
line and its reader (bench/bench_queues.py parses what brokers log), the producer's spans."""

from __future__ import annotations

from ordq.broker_group.first_write import FirstWrite, parse_line
from ordq.sdk._producer_types import FailoverTimes


def test_first_write_line_reads_back_with_every_step_and_stamp() -> None:
    fw = FirstWrite("idle-000001.x", 12, arrived=1000.0)
    fw.step("epoch", 0.004)
    fw.step("state", 0.0021)
    fw.step("state", 0.001)  # a step that ran twice adds up
    fw.step("files", 0.0105)
    fw.ready, fw.placed, fw.synced, fw.replicated, fw.done = 1000.02, 1000.0201, 1000.025, 1000.031, 1000.0312
    line = "2026-11-27 23:25:05,123 ordq.broker INFO " + fw.line("master")
    got = parse_line(line)
    assert got is not None
    assert (got.queue, got.seg, got.role, got.arrived) == ("idle-000001.x", 12, "master", 1000.0)
    assert got.ms == {"epoch": 4.0, "state": 3.1, "files": 10.5, "ready_at": 20.0, "placed_at": 20.1,
                      "synced_at": 25.0, "replicated_at": 31.0, "done_at": 31.2}
    assert abs(got.at("replicated_at") - 1000.031) < 1e-9
    assert got.at("absent") == 1000.0


def test_first_write_line_leaves_out_stamps_not_reached() -> None:
    fw = FirstWrite("q", 0, arrived=5.0)
    fw.ready = 5.5
    got = parse_line(fw.line("slave"))
    assert got is not None and got.ms == {"ready_at": 500.0} and got.role == "slave"


def test_parse_line_ignores_other_lines() -> None:
    assert parse_line("segment q/3 removed: its queue was deleted") is None
    assert parse_line("first write of q/x (master): arrived=1.0") is None  # no segment number
    assert parse_line("first write of q/3 (master): ready_at=1.0") is None  # no arrival
    assert parse_line("first write of q/3 (master): arrived=1.0 ready_at=soon") is None


def test_failover_spans_are_each_step_after_the_one_before() -> None:
    fo = FailoverTimes(from_gid="g1", from_seg=3, failed_at=10.0, asked_at=10.001, answered_at=10.101,
                       head_at=10.103, gid="g2", seg=4, opened_at=10.104, sent_at=10.124, acked_at=10.2)
    assert fo.spans_ms() == {"asked": 1.0, "answered": 100.0, "head": 2.0, "opened": 1.0, "sent": 20.0,
                             "acked": 76.0}
    # not reached yet: left out, and the next step counts from the last one reached
    part = FailoverTimes(from_gid="g1", from_seg=3, failed_at=10.0, asked_at=10.5, opened_at=10.75)
    assert part.spans_ms() == {"asked": 500.0, "opened": 250.0}
