"""Many queues at once against a real ZooKeeper (issue 43): ``ZkStore.create_queues`` in
batched transactions, each queue as ``create_queue`` makes it (spread heads, admitted groups);
names that exist are left alone and named; ``load_states`` reads many states pipelined."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from ordq.common.errors import CorruptState
from ordq.coordinator.store import ZkStore
from tests.test_store import both, live  # noqa: F401 - the fixture

pytestmark = pytest.mark.zk


@pytest.fixture
def store(zk_server, zk_root) -> Iterator[ZkStore]:
    with ZkStore.connect(zk_server.connection_string, zk_root) as s:
        yield s


def test_many_queues_in_batches_as_one_at_a_time_would_make_them(store: ZkStore, live) -> None:  # noqa: F811
    for gid in ("g1", "g2", "g3"):
        store.add_group(gid)
    live(*both("g1"), *both("g2"), *both("g3"))
    one = store.create_queue("single")
    assert one.send  # admitted in its creating write
    names = [f"q{i:04d}" for i in range(250)]
    created, existing = store.create_queues([*names, "single", "q0001"], batch=100)
    assert existing == ["single"] and [st.queue for st in created] == names  # a name twice: once
    assert set(store.list_queues()) == {"single", *names}
    heads = Counter(st.head for st in created)
    assert set(heads) == {"g1", "g2", "g3"} and max(heads.values()) - min(heads.values()) <= 1  # spread
    for st in created[:5]:
        assert store.load_state(st.queue)[0] == st and st.open_segment is not None
    again, existing = store.create_queues(["q0000", "new-one"], groups=["g2"])
    assert existing == ["q0000"] and [st.queue for st in again] == ["new-one"] and again[0].groups == ("g2",)

    # a request sent again (its answer lost): what its first attempt made counts as created
    first, _ = store.create_queues(["r1", "r2"], request="0123456789ab")
    second, existing = store.create_queues(["r1", "r2", "q0002"], request="0123456789ab")
    assert existing == ["q0002"] and second == first

    got = store.load_states(["q0003", "gone", "new-one"], with_subs=True, slice_size=2)
    assert set(got) == {"q0003", "new-one"}  # a missing queue is left out
    state, version, subs = got["q0003"]  # type: ignore[misc]
    assert (state, version) == store.load_state_to_write("q0003") and subs == []
    store.client.set(store.paths.state("new-one"), b"{not json")
    assert isinstance(store.load_states(["new-one"])["new-one"], CorruptState)
