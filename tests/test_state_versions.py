"""A write planned on a queue's state never lands on another queue created later under its name
(``store_values.StateVersion``): every deletion bumps the queues' deletion count in the
transaction that deletes the state, and every state write checks it.

Before (until 2026-12-01) a write checked the state node's version alone, which starts at 0
again for a queue created anew: the leader's kept creation (version 0) of a queue that another
process deleted and created again passed that check, and its move wrote the old queue's
segments and groups over the new queue's state.

Against a real ZooKeeper: two stores on two sessions stand for the leader and another process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ordq.coordinator import state as sm
from ordq.coordinator.store import Known, ZkStore
from ordq.coordinator.store_base import WrittenStates
from ordq.coordinator.store_values import DELETION_LOG, DeletionLog, StateVersion
from tests.helpers.groups import add_live_groups

pytestmark = pytest.mark.zk


@pytest.fixture
def two(zk_server) -> Iterator[tuple[ZkStore, ZkStore]]:
    """(the leader's store, another process's store) on one fresh root."""
    root = f"/t-{uuid.uuid4().hex[:10]}"
    with ZkStore.connect(zk_server.connection_string, root) as leader, \
            ZkStore.connect(zk_server.connection_string, root) as other:
        add_live_groups(leader, ("g1", "g2"))
        leader.written.leading(True)
        yield leader, other


def _moved_off(st: sm.QueueState, gid: str) -> sm.QueueState:
    """``st`` with its head moved off ``gid`` (what a verdict on a dead ``gid`` writes)."""
    head = st.open_segment
    assert head is not None and head.gid == gid
    others = frozenset(g for g in st.groups if g != gid)
    return sm.fail_over(st, gid, head.seg, sm.Facts(live_groups=others))


def _read_then_created_again(leader: ZkStore, other: ZkStore) -> tuple[sm.QueueState, StateVersion, sm.QueueState]:
    """Queue "q" created and read by the leader, then deleted and created again by the other
    process: (the leader's copy, its version, the successor's state)."""
    leader.create_queue("q", ["g1", "g2"])
    st, version = leader.load_state_to_write("q")
    other.delete_queue("q")
    successor = other.create_queue("q", ["g1", "g2"])
    assert successor.incarnation != st.incarnation and other.load_state_to_write("q")[1].znode == version.znode
    return st, version, successor


def test_a_kept_creation_s_move_does_not_land_on_a_queue_created_again_under_its_name(two) -> None:
    leader, other = two
    leader.create_queue("q", ["g1", "g2"])
    kept = leader.written.get("q")
    assert kept is not None and kept[1].znode == 0
    other.delete_queue("q")
    successor = other.create_queue("q", ["g2", "g1"])
    assert other.load_state_to_write("q")[1].znode == 0  # the very version the kept creation holds

    done, lost = leader.apply_batch([("q", kept[1], _moved_off(kept[0], "g1"))], {})

    assert (done, lost) == ([], ["q"])
    assert leader.load_state("q")[0] == successor  # the new queue's state, untouched


def test_a_move_on_a_read_copy_fails_after_the_queue_is_deleted_and_created_again(two) -> None:
    st, version, successor = _read_then_created_again(*two)

    [(done, lost)] = two[0].apply_batches([[("q", version, _moved_off(st, "g1"))]], {})

    assert (done, lost) == ([], ["q"])
    assert two[0].load_state("q")[0] == successor


def test_apply_on_a_stale_copy_reads_the_new_queue_and_plans_on_it(two) -> None:
    leader = two[0]
    st, version, successor = _read_then_created_again(*two)
    known = Known(state=st, version=version, facts=sm.Facts(live_groups=frozenset({"g2"})), group_versions={})

    def move(s: sm.QueueState, _facts: sm.Facts) -> sm.QueueState:
        return _moved_off(s, "g1")

    written = leader.apply("q", move, known=known)

    assert written.incarnation == successor.incarnation  # planned on the queue that is there now
    assert leader.load_state("q")[0] == written


def test_each_deletion_counts_once_and_a_state_already_gone_is_not_counted_again(two) -> None:
    leader, other = two
    leader.create_queues(["a", "b"])
    before = leader.load_state_to_write("a")[1].deletions
    other.delete_queue("b")
    assert leader.load_state_to_write("a")[1] == StateVersion(0, before + 1)
    leader.create_queue("c")
    other.client.delete(other.paths.state("c"))  # a deletion cut short after its first step
    other.delete_queue("c")
    assert leader.load_state_to_write("a")[1].deletions == before + 1
    assert "c" not in leader.list_queues()


def test_a_topic_s_deletion_counts_each_partition(two) -> None:
    leader, other = two
    leader.create_queue("q", ["g1", "g2"])
    before = leader.load_state_to_write("q")[1].deletions
    other.create_topic("t", partitions=2)
    other.delete_topic("t")
    assert leader._deletion_log().recent[-2:] == ((before + 1, "t.p0"), (before + 2, "t.p1"))
    assert leader.load_state_to_write("q")[1].deletions == before + 2


def test_a_write_planned_before_its_own_queue_s_deletion_is_left_out_the_others_land(two) -> None:
    leader, other = two
    leader.create_queues(["a", "b"], ["g1", "g2"])
    a, a_version = leader.load_state_to_write("a")
    b, b_version = leader.load_state_to_write("b")
    other.delete_queue("a")
    successor = other.create_queue("a", ["g1", "g2"])

    done, lost = leader.apply_batch([("a", a_version, _moved_off(a, "g1")), ("b", b_version, _moved_off(b, "g1"))], {})

    assert (done, lost) == (["b"], ["a"])
    assert leader.load_state("a")[0] == successor


def test_the_kept_state_of_a_queue_is_dropped_by_a_read_after_a_later_deletion() -> None:
    st = sm.create("q", ["g1"], incarnation="0123456789ab")
    written = WrittenStates()
    written.note("q", st, StateVersion(7, 3))
    written.seen("q", StateVersion(2, 3))  # an older read: what was written is still news
    assert written.get("q") == (st, StateVersion(7, 3))
    written.seen("q", StateVersion(2, 4))  # a read after a deletion: the queue may be another now
    assert written.get("q") is None
    written.note("q", st, StateVersion(5, 4))
    written.note("q", st, StateVersion(4, 4))  # an older write does not replace a later one
    assert written.get("q") == (st, StateVersion(5, 4))
    written.note("q", st, StateVersion(1, 5))  # a write after a deletion does
    assert written.get("q") == (st, StateVersion(1, 5))



def test_a_move_planned_before_another_queue_s_deletion_still_lands_in_its_first_batch(two) -> None:
    """At 10^5 queues a verdict's moves are planned on copies read minutes before; one deletion
    meanwhile must not send every move back to be read again (``DeletionLog``)."""
    leader, other = two
    leader.create_queues(["a", "b", "gone"], ["g1", "g2"])
    a, a_version = leader.load_state_to_write("a")
    other.delete_queue("gone")
    b, b_version = leader.load_state_to_write("b")
    assert b_version.deletions == a_version.deletions + 1

    [(done, lost)] = leader.apply_batches([[("a", a_version, _moved_off(a, "g1")),
                                            ("b", b_version, _moved_off(b, "g1"))]], {})

    assert (sorted(done), lost) == (["a", "b"], [])
    assert leader.load_state("a")[0].head == "g2" and leader.load_state("b")[0].head == "g2"


def test_the_recent_deletions_tell_which_copies_are_still_good() -> None:
    log = DeletionLog.parse(b"", 4)  # a folder deleted from before there was a log: names nothing
    assert log.kept("q", 4) and not log.kept("q", 3)
    for name in ("x", "q", "y"):
        log = DeletionLog.parse(log.with_deletion(name), log.count + 1)
    assert log.recent == ((5, "x"), (6, "q"), (7, "y"))
    assert log.kept("q", 6) and log.kept("z", 4)  # deleted only before, or never
    assert not log.kept("q", 5) and not log.kept("z", 3)  # deleted since, or beyond what the log holds
    assert DeletionLog.parse(b"{not json", 9) == DeletionLog(9, ())
    many = DeletionLog(0, ())
    for i in range(DELETION_LOG + 5):
        many = DeletionLog.parse(many.with_deletion(f"q{i}"), many.count + 1)
    assert len(many.recent) == DELETION_LOG and many.recent[-1] == (DELETION_LOG + 5, f"q{DELETION_LOG + 4}")
