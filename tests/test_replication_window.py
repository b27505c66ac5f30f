"""The master → slave pipeline's rules, without I/O (issue 39): the master's window of
unanswered bytes (replication.py ``window_share``), the slave's group commit of what arrives
while it syncs (replica_commits.py), and its one answer for what one commit synced
(``_Answers``). The real processes are in test_broker.py and test_control_calls.py (both
links)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.broker_group.replica import Role, SegmentReplica
from ordq.broker_group.replica_commits import ReplicaCommits
from ordq.broker_group.replication import (
    REPLICATE_STEP_BYTES,
    WINDOW_BYTES,
    Owed,
    _Answers,
    ready_to_answer,
    window_share,
)
from ordq.broker_group.shared import BrokerStats, Segment
from ordq.broker_group.synced_watch import SyncedWatches
from ordq.wire import ordq_pb2 as pb

MIB = 1 << 20


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 3 * MIB), max_size=40), st.integers(0, 3 * WINDOW_BYTES // 2))
def test_what_goes_keeps_the_window_and_fills_it(sizes: list[int], unanswered: int) -> None:
    n = window_share(sizes, unanswered)
    if n:
        # within the window, but for one batch when nothing is unanswered (however large)
        assert unanswered + sum(sizes[:n]) <= WINDOW_BYTES or (n == 1 and unanswered == 0)
    else:
        assert not sizes or unanswered > 0
    if n < len(sizes):  # nothing left behind that would have fitted
        assert unanswered + sum(sizes[: n + 1]) > WINDOW_BYTES


def test_a_small_request_in_flight_does_not_hold_back_the_next() -> None:
    """The rule it replaces: two requests in flight. After a large request and a small one
    (the next produce request, forwarded at once), batches that arrived while the slave synced
    the large one waited for both answers, so the next transfer began only after that sync."""
    large, small = 6 * MIB, 100 << 10
    waiting = [64 << 10] * 32  # 2 MiB placed meanwhile
    assert window_share(waiting, large + small) == len(waiting)
    assert window_share(waiting, WINDOW_BYTES - 3 * (64 << 10)) == 3
    assert window_share(waiting, WINDOW_BYTES) == 0
    assert REPLICATE_STEP_BYTES < WINDOW_BYTES // 2  # several requests in flight, not one or two


def _segment(tmp_path: Path, queue: str) -> Segment:
    return Segment(replica=SegmentReplica(queue, 0, Role.SLAVE), directory=tmp_path, log=None)


def test_what_arrives_while_a_commit_runs_is_committed_next_as_one_per_segment(tmp_path: Path) -> None:
    a, b = _segment(tmp_path, "a"), _segment(tmp_path, "b")
    first_started, release = threading.Event(), threading.Event()
    commits: list[tuple[str, list[bytes]]] = []
    merged: list[tuple[str, int]] = []
    running = [0]

    def commit(s: Segment, batches: list[bytes]) -> None:
        running[0] += 1
        assert running[0] == 1, "two commits at once"
        if not commits:
            first_started.set()
            assert release.wait(10)
        commits.append((s.replica.queue, batches))
        running[0] -= 1

    rc = ReplicaCommits(commit, lambda s, n: merged.append((s.replica.queue, n)))
    assert rc.idle()
    f1 = rc.add(a, [b"1"])
    assert first_started.wait(10)  # the first commit is running (its sync, say)
    assert not rc.idle()
    f2 = rc.add(a, [b"2", b"3"])
    f3 = rc.add(b, [b"x"])
    f4 = rc.add(a, [b"4"])
    assert f2 is f3 is f4 and f2 is not f1  # one commit takes all that arrived meanwhile
    assert not f1.done() and not f2.done()
    release.set()
    f2.result(10)
    assert f1.done()
    assert commits == [("a", [b"1"]), ("a", [b"2", b"3", b"4"]), ("b", [b"x"])]  # per segment, in order
    assert merged == [("a", 2)]  # a's two requests' syncing counts are now one commit's
    assert rc.commits == 2 and rc.idle()
    f5 = rc.add(b, [b"y"])  # the next one starts a commit of its own
    f5.result(10)
    assert commits[-1] == ("b", [b"y"]) and rc.commits == 3


# -- the slave's answers: one for every request a group commit synced (issue 39) ------------------


def _owed(tmp_path: Path, done: list[bool | None]) -> list[Owed]:
    """Answers owed for requests of one segment; ``done[i]`` None: nothing to wait for."""
    s = _segment(tmp_path, "q")
    out = []
    for d in done:
        f: concurrent.futures.Future[None] | None = None
        if d is not None:
            f = concurrent.futures.Future()
            if d:
                f.set_result(None)
        out.append(Owed(s, f, 10, ()))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([True, False, None]), min_size=1, max_size=12), st.booleans())
def test_one_answer_takes_what_is_synced_in_order_and_never_waits(tmp_path_factory: pytest.TempPathFactory,
                                                                  done: list[bool | None], many: bool) -> None:
    done[0] = True  # the first's commit is done: that is when an answer is made
    owed = _owed(tmp_path_factory.getbasetemp(), done)
    n = ready_to_answer(owed, many)
    assert n >= 1
    if not many:
        assert n == 1  # a master that did not say answers_many counts one answer per request
        return
    # a prefix: every one taken is synced (or had nothing to sync) ...
    assert all(o.commit is None or o.commit.done() for o in owed[:n])
    # ... and the next one is not, or there is none: no answer waits, none is left behind
    assert n == len(owed) or not owed[n].commit.done()  # type: ignore[union-attr]


def _answers_sent(tmp_path: Path, many: bool) -> list[pb.ReplicateResponse]:
    """Three requests of one segment in one group commit, and a fourth in the next: what the
    slave's answer task sends once the first commit is done, then the second."""
    s = _segment(tmp_path, "q")
    shared = types.SimpleNamespace(cv=threading.Condition(), stats=BrokerStats(), synced_watches=SyncedWatches())
    sent: list[pb.ReplicateResponse] = []

    async def run() -> None:
        more = asyncio.Event()

        async def send(resp: pb.ReplicateResponse) -> None:
            sent.append(resp)
            more.set()

        async def answered(n: int) -> None:  # until n requests are answered
            while sum(max(r.answered, 1) for r in sent) < n:
                more.clear()
                await asyncio.wait_for(more.wait(), 10)

        answers = _Answers(shared, send)  # type: ignore[arg-type]
        answers.many = many
        first, second = concurrent.futures.Future[None](), concurrent.futures.Future[None]()
        for commit in (first, first, first, second):
            answers.owe(s, commit, 100)
        await asyncio.sleep(0)
        assert not sent  # nothing is answered before its commit is done
        s.replica.local_synced = 30
        first.set_result(None)
        await answered(3)
        s.replica.local_synced = 40
        second.set_result(None)
        await answered(4)
        await answers.close()

    asyncio.run(run())
    return sent


def test_the_requests_one_group_commit_synced_get_one_answer(tmp_path: Path) -> None:
    """Fails on the code before (one stream write per request: 4 answers for 2 syncs)."""
    sent = _answers_sent(tmp_path, many=True)
    assert [(r.answered, [x.synced_end for x in r.synced]) for r in sent] == [(3, [30]), (0, [40])]


def test_a_master_that_counts_one_per_answer_gets_one_per_request(tmp_path: Path) -> None:
    sent = _answers_sent(tmp_path, many=False)
    assert [(r.answered, [x.synced_end for x in r.synced]) for r in sent] == [(0, [30]), (0, [30]), (0, [30]),
                                                                              (0, [40])]
