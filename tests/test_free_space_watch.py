"""What tells a broker to look at its queue folders again (broker_group/segments.py): a state
watch names its queue; a watch fired with no path (the connection dropped or the session was
lost, and every watch with it: kazoo sets none again) makes the next round look at every folder,
which otherwise happens only every ``FULL_SCAN_S`` (issue 43: once a minute it read every
folder's state, ~33,000 reads a broker at 10^5 queues)."""

from __future__ import annotations

from typing import Any

from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from ordq.broker_group.segments import FULL_SCAN_S, SegmentStore


def test_a_watch_fired_without_a_path_makes_the_next_round_scan_every_folder() -> None:
    shared: Any = None  # _on_state touches nothing of the broker's
    store = SegmentStore(shared)
    store._next_full_scan = 1e12  # scanned just now
    store._on_state(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/ordq/queues/q-7/state"))
    assert store._changed == {"q-7"} and store._next_full_scan == 1e12
    store._on_state(WatchedEvent(EventType.NONE, KazooState.CONNECTED, None))  # the connection dropped
    assert store._next_full_scan == 0.0
    assert FULL_SCAN_S >= 300  # otherwise the safety net alone costs every folder's read each few minutes
