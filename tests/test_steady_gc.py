"""``freeze_startup_objects`` (ordq/common/steady_gc.py, issue 39): what is alive at the call
leaves the collector's generations; garbage made after it is still collected."""

from __future__ import annotations

import gc
import weakref

from ordq.common.steady_gc import freeze_startup_objects


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def cycle() -> tuple[Node, Node]:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return a, b


def test_objects_alive_at_the_call_are_frozen_and_later_cycles_still_collected() -> None:
    kept = cycle()
    try:
        frozen = freeze_startup_objects()
        # Only fewer since: a frozen object that dies (in another thread of this process, too)
        # leaves the permanent generation.
        assert 0 < gc.get_freeze_count() <= frozen
        # What was alive at the call is out of every generation the collector walks.
        assert not any(o is kept[0] for g in range(3) for o in gc.get_objects(generation=g))
        later = cycle()
        gone = weakref.ref(later[0])
        del later
        gc.collect()
        assert gone() is None  # a cycle made after the call is freed as before
    finally:
        gc.unfreeze()  # the rest of this test process as it was
