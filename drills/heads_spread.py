"""The heads-spread-back drill (issue 43): idle queues beside the drill's stream, the head
group's master killed (-9) and brought back.

What must happen: the stream fails over (its producer asks, at once); the dead group's idle
queues move to the other groups (the coordinator's verdict: a probe refused); once the group is
back and live for the spread's grace (``coordinator/daemon_spread.py``), the coordinator moves
idle heads back to it until the heads are even over the groups (within one), at its bounded rate,
and never the drill's queue, written all along. The verifier then finds nothing of the stream
lost or reordered.

Why a drill and not only a test (tests/test_heads_spread.py): it runs beside the drills' load
and checks, on whatever cluster ``ordq drill`` is given, that an operator's kill and return
leaves the cluster balanced rather than each later kill with more to repair.
"""

from __future__ import annotations

from ordq.common.errors import CorruptState
from ordq.common.proc import load_stretched
from ordq.coordinator.rebalance import even, head_counts
from ordq.coordinator.store import ZkStore
from ordq.drills.runner import DrillContext, LoadConfig
from ordq.drills.workload import now_us

IDLE = 30  # idle queues created beside the stream (a third headed by each of 3 groups)
# The stream lasts at least this long: the kill comes at 20-60 % of it, and the spread back
# (grace 10 s, then a pass every 2 s) must happen while the drill's queue is still written.
STREAM_S = 90.0
MOVED_S = 60.0  # the dead group's idle heads off it, the bound without progress
SPREAD_S = 90.0  # the heads even again after the return


def spread_load(load: LoadConfig) -> LoadConfig:
    return load.lasting(STREAM_S)


def idle_names(ctx: DrillContext) -> list[str]:
    return [f"{ctx.queue}-idle-{i:02d}" for i in range(IDLE)]


def heads(store: ZkStore, queues: list[str], gids: tuple[str, ...]) -> dict[str, int]:
    """How many of ``queues`` each of ``gids`` heads now (the spread's own count)."""
    got = store.load_states(queues)
    return head_counts((v[0].head for v in got.values() if not isinstance(v, CorruptState)), gids)


def heads_spread_back(ctx: DrillContext) -> None:
    idle = idle_names(ctx)
    gids = ctx.cluster.gids
    with ctx.cluster.store() as store:
        store.create_queues(idle)
        ctx.event(f"{IDLE} idle queues created beside {ctx.queue}: heads {heads(store, idle, gids)}")
        try:
            _kill_and_return(ctx, store, idle, gids)
        finally:
            for q in idle:
                store.delete_queue(q)
            ctx.event(f"{IDLE} idle queues deleted")


def _kill_and_return(ctx: DrillContext, store: ZkStore, idle: list[str], gids: tuple[str, ...]) -> None:
    gid, seg = ctx.head()
    headed = heads(store, idle, gids)[gid]
    at = now_us()
    ctx.cluster.broker(gid, "master").kill()
    ctx.fault(f"kill -9 master of {gid} (head, segment {seg}; it heads {headed} idle queues)", kind="segment",
              seg=seg, at_us=at)
    ctx.wait_acks_after(seg)
    ctx.wait(lambda: heads(store, idle, gids)[gid] == 0, timeout_s=load_stretched(MOVED_S),
             what=f"every idle head off {gid}")
    ctx.expect(f"the {headed} idle queues {gid} headed moved to the other groups", headed > 0)
    ctx.restart_broker(gid, "master")
    written_head = store.load_state(ctx.queue)[0].head
    every = store.list_queues()
    counts = ctx.wait(lambda: c if even(c := heads(store, every, gids)) else None,
                      timeout_s=load_stretched(SPREAD_S),
                      what=f"the heads even over {', '.join(gids)} again (within one)")
    back = heads(store, idle, gids)[gid]
    ctx.event(f"heads even again: {counts} over every queue, {back} idle ones on {gid}")
    ctx.expect(f"{gid} heads idle queues again after its return", back > 0)
    running = any(w.proc.alive() for w in ctx.producers)
    ctx.expect(f"the stream still written while the heads spread back, and {ctx.queue} not moved "
               f"(head {written_head})", running and store.load_state(ctx.queue)[0].head == written_head)
