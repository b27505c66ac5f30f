"""Shorter full garbage collections in a long-running process (issue 39: 14-35 ms pauses in the
SDK's processes, on the path of whatever message was in flight).

A full (generation 2) collection walks every container object alive: in a client or broker
that is mostly what its imports and start-up made (gRPC, protobuf, kazoo, the config), which
live for the whole process and never become garbage. ``freeze_startup_objects`` collects once
and then moves every object alive into the permanent generation (``gc.freeze``), which later
collections skip; what the process allocates from then on is collected as before.

Guarantee: no object is freed that would not be, and garbage made after the call is collected
as before; a cycle alive at the call and dropped later is never freed (that is the trade, so
call it once start-up is done, not in a loop). Process-wide: ``ordq broker run`` calls it
before it starts serving; an application makes the choice for its own process
(``ordq.sdk.freeze_startup_objects``, docs/SDK.md); the SDK never calls it by itself.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect, then freeze every object alive now out of later collections; return how
    many objects are frozen in all (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
