"""SealMany at the cost of two syncs (issue 43): a dead group's idle queues' segments, which the
surviving replica never held, are created and sealed in one call whose files are made durable
together (``broker_group/durable.py``), and they are still sealed after the broker is killed
(-9) and started again. Real ZooKeeper and broker processes; the files are read back without
the broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ordq.broker_group import log as seglog
from ordq.broker_group.control import MAX_SEAL_MANY
from ordq.broker_group.durable import syncfs
from ordq.common.errors import OrdqError
from ordq.common.metrics import value
from ordq.coordinator import state as sm
from ordq.wire.batch import Message, encode_batch
from tests.helpers.one_group import Group, Q, one_group
from tests.util import read_metrics, wait_until

IDLE = 120


@pytest.fixture
def group(zk_server: Any, zk_root: str, tmp_path: Path) -> Iterator[Group]:
    with one_group(zk_server.connection_string, zk_root, tmp_path) as g:
        yield g


def _sealing(g: Group, queues: list[str]) -> None:
    """Each queue's segment 0 made ``sealing`` (rolled: segment 1 opened on g1) in batches."""
    states = g.store.load_states(queues)
    writes = []
    for q in queues:
        got = states[q]
        assert not isinstance(got, Exception)
        st, version, _ = got
        writes.append((q, version, sm.roll(st, "g1", 0)))
    for i in range(0, len(writes), 100):
        done, left = g.store.apply_batch(writes[i:i + 100], {})
        assert not left, left


def _counter(g: Group, name: str) -> float:
    url = g.procs.slave.metrics_url
    assert url is not None
    return value(read_metrics(url), name) or 0.0


def test_seal_many_of_segments_never_held_costs_two_syncs_and_survives_a_kill(group: Group) -> None:
    g = group
    idle = [f"idle{i:03d}" for i in range(IDLE)]
    g.store.create_queues(idle, ["g1"])
    # Q's segment 0 is held by both replicas (written), the idle ones by neither
    stream = g.transport.open_produce(g.address("master"), Q, 0, 1)
    try:
        stream.send([encode_batch([Message(payload=b"m%d" % i) for i in range(5)], epoch=1, first_seq=0)])
        next(iter(stream.acks()))
    finally:
        stream.close()
    _sealing(g, [Q, *idle])
    slave_dir = g.procs.slave.data_dir
    assert not (slave_dir / "idle000").exists()
    syncs_before = _counter(g, "ordq_broker_seal_many_syncs_total")

    refs = [(Q, 0), *((q, 0) for q in idle), ("idle000", 7)]  # seg 7 was never placed anywhere
    got = g.transport.seal_many(g.address("slave"), refs)
    assert got[(Q, 0)] is not None and got[(Q, 0)].end == 5
    assert all(got[(q, 0)] is not None and got[(q, 0)].end == 0 for q in idle), got
    assert got[("idle000", 7)] is None

    # one call, IDLE + 1 segments, and (where the C library has syncfs) two syncs for all of it
    assert _counter(g, "ordq_broker_seal_many_calls_total") >= 1
    assert _counter(g, "ordq_broker_seal_many_segments_total") >= IDLE + 1
    syncs = _counter(g, "ordq_broker_seal_many_syncs_total") - syncs_before
    if syncfs(slave_dir):
        assert syncs == 2
    for q in [Q, *idle]:
        folder = seglog.segment_dir(slave_dir, q, 0)
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["sealed"] is True and meta["sealed_end"] == (5 if q == Q else 0), (q, meta)
        assert (folder / seglog.SEGMENT_FILE).exists()
        assert not [p.name for p in folder.iterdir() if ".tmp" in p.name]
        assert not [p.name for p in (slave_dir / q).iterdir() if ".tmp" in p.name]
    assert json.loads((slave_dir / "idle000" / "incarnation").read_text()) == \
        g.store.load_state("idle000")[0].incarnation

    # killed (-9) and started again: every segment is still sealed at its end, from its files
    g.procs.slave.kill()
    g.procs.slave.start()
    wait_until(lambda: "slave" in g.store.live_members("g1"), what="slave back")
    for q in [Q, idle[0], idle[-1]]:
        info = g.transport.segment_info(g.address("slave"), q, 0)
        assert info.sealed and info.end == (5 if q == Q else 0), (q, info)
    # sealing again is idempotent: the same ends, nothing created twice
    again = g.transport.seal_many(g.address("slave"), [(q, 0) for q in idle[:10]])
    assert all(r is not None and r.end == 0 for r in again.values())


    # a call over the bound is refused whole, with the bound in its error
    with pytest.raises(OrdqError, match=f"at most {MAX_SEAL_MANY}"):
        g.transport.seal_many(g.address("slave"), [(Q, s) for s in range(MAX_SEAL_MANY + 1)])
