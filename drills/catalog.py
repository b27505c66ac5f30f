"""The drills: every fault of DESIGN §6, plus a stale producer, a torn tail, a corrupt batch and
a replaced disk.

Each ``inject`` runs at a random moment of a steady load (``ordq.drills.runner``), marks the fault
(``ctx.fault``: the failover time runs from there), and plays the fault's story through to
its end — a killed process is restarted, a hung one resumed, a full disk freed — so the run
then finishes and the cluster is whole for the next drill. ``check`` functions add what must
be true of the finished run beyond the verifier's verdict (the fault had its effect).
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

from ordq.broker_group.segment_scan import iter_file_batches
from ordq.coordinator.state import SegStatus
from ordq.drills import (
    control_plane,
    control_plane_attacks,
    control_plane_judge,
    control_plane_plan,
    heads_spread,
    keyed_topic,
    mirror_lab,
    neighbour,
    security,
)
from ordq.drills.audit import AckRow, DeliveryRow
from ordq.drills.cdc import require_servers, run_cdc
from ordq.drills.cdc_mirror import require_all as require_cdc_mirror
from ordq.drills.cdc_mirror import run_cdc_mirror
from ordq.drills.failing import FIXED, HANDLED, order_faults, read_handled
from ordq.drills.runner import SUBSCRIPTION, Drill, DrillContext, DrillError
from ordq.drills.workload import EXIT_DONE, EXIT_FENCED, now_us
from ordq.wire.batch import Message, encode_batch

_ROLES = ("master", "slave")
# Drills that wait for the producer to be acked after a head fault hold the last 20 % of the
# stream until the fault (Drill.hold_at): at load 20-26 the 2 s CI stream had ended before the
# kill in failing-handler-block and failing-handler-park, and no failover could follow.
_HELD = 0.8


# -- head group faults ---------------------------------------------------------------------------


def _kill_head(ctx: DrillContext, roles: tuple[str, ...]) -> tuple[str, int]:
    gid, seg = ctx.head()
    at = now_us()
    for role in roles:
        ctx.cluster.broker(gid, role).kill()
    ctx.fault(f"kill -9 {' and '.join(roles)} of {gid} (head, segment {seg})", kind="segment", seg=seg, at_us=at)
    return gid, seg


def kill_head_master(ctx: DrillContext) -> None:
    gid, seg = _kill_head(ctx, ("master",))
    ctx.wait_acks_after(seg)
    ctx.restart_broker(gid, "master")


def kill_head_slave(ctx: DrillContext) -> None:
    gid, seg = _kill_head(ctx, ("slave",))
    ctx.wait_acks_after(seg)
    ctx.restart_broker(gid, "slave")


def kill_head_group(ctx: DrillContext) -> None:
    gid, seg = _kill_head(ctx, _ROLES)
    ctx.wait_acks_after(seg)
    ctx.hold(1.0, f"both processes of {gid} down: consumers wait at segment {seg}")
    first = ctx.rng.choice(_ROLES)
    ctx.restart_broker(gid, first)  # one process back is enough to seal and drain the segment
    ctx.restart_broker(gid, "slave" if first == "master" else "master")


def _pause_head(ctx: DrillContext, role: str) -> None:
    gid, seg = ctx.head()
    member = ctx.cluster.broker(gid, role)
    at = now_us()
    member.pause()
    ctx.fault(f"SIGSTOP {gid} {role} (head, segment {seg})", kind="segment", seg=seg, at_us=at)
    ctx.wait_acks_after(seg)
    member.resume()
    ctx.event(f"SIGCONT {gid} {role}")
    # Its ZooKeeper session expired while it hung: it registers itself live again.
    ctx.wait(lambda: member.incarnation in {i.incarnation for i in _live(ctx, gid).values()},
             timeout_s=30, what=f"{gid} {role} to be live again after SIGCONT")
    ctx.event(f"{gid} {role} live again")


def pause_head_master(ctx: DrillContext) -> None:
    _pause_head(ctx, "master")


def pause_head_slave(ctx: DrillContext) -> None:
    _pause_head(ctx, "slave")


def _live(ctx: DrillContext, gid: str) -> dict[str, Any]:
    with ctx.cluster.store() as store:
        return store.live_members(gid)


# -- client faults ---------------------------------------------------------------------------------


def kill_producer(ctx: DrillContext) -> None:
    leader = ctx.leader("producer")
    at = now_us()
    leader.proc.kill()
    ctx.notes["killed"] = leader
    ctx.fault(f"kill -9 the producer leader {leader.proc.name}", kind="producer", writer=leader.writer, at_us=at)
    ctx.wait(lambda: any(w is not leader and _took_over(w) for w in ctx.producers),
             timeout_s=30, what="the standby producer to take over and get acks")
    ctx.event("standby producer leads and is acked")


def _took_over(w: Any) -> bool:
    st = w.status()
    return st.get("acked", 0) > 0 or (st.get("state") == "done" and st.get("next_seq") is not None)


def stale_producer(ctx: DrillContext) -> None:
    leader = ctx.leader("producer")
    leader.proc.pause()
    ctx.fault(f"SIGSTOP the producer leader {leader.proc.name} (its connection hangs mid-stream)",
              kind="producer", writer=leader.writer)
    standby = ctx.wait(lambda: next((w for w in ctx.producers if w is not leader and _took_over(w)), None),
                       timeout_s=30, what="the standby producer to take over and get acks")
    ctx.notes["takeover_us"] = standby.status().get("first_ack_us")
    ctx.event(f"standby {standby.proc.name} took over (epoch {standby.status().get('epoch')}); "
              f"resuming the stale leader")
    leader.proc.resume()
    ctx.notes["stale"] = leader
    ctx.wait(lambda: not leader.proc.alive(), timeout_s=30, what="the stale producer to stop")
    ctx.event(f"stale producer exited: {leader.status().get('state')}: {leader.status().get('error', '')[:100]}")


def check_killed_producer(ctx: DrillContext, acks: list[AckRow], _d: list[DeliveryRow]) -> list[tuple[str, bool]]:
    """The killed leader's acks must be in the audit, or the verdict never checked them: its
    last status (written before the kill) is a lower bound of what its application saw."""
    killed = ctx.notes.get("killed")
    if killed is None:
        return [("the producer leader was killed", False)]
    reported = int(killed.status().get("acked", 0))
    rows = sum(1 for a in acks if a.producer == killed.writer)
    return [(f"the killed producer's acks are audited ({rows} rows, its last status said {reported} acked)",
             reported > 0 and rows >= reported)]


def check_stale_producer(ctx: DrillContext, acks: list[AckRow], _d: list[DeliveryRow]) -> list[tuple[str, bool]]:
    stale = ctx.notes.get("stale")
    takeover = ctx.notes.get("takeover_us")
    if stale is None or takeover is None:
        return [("the stale producer was resumed after the takeover", False)]
    # Acks of batches stored before the takeover may reach the stale producer late (they sat
    # in its socket while it hung); a batch it sent late must never be stored: no ack to it
    # may cover a seq the new leader wrote.
    first_new = min((a.seq for a in acks if a.producer != stale.writer and a.ack_us >= takeover), default=None)
    late = [a for a in acks if a.producer == stale.writer and first_new is not None and a.seq >= first_new]
    return [
        ("the stale producer's late batches were refused: it stopped with FencedError",
         stale.proc.returncode == EXIT_FENCED),
        (f"no ack to the stale producer for a seq the new leader wrote ({len(late)} found)", not late),
    ]


def kill_consumer(ctx: DrillContext) -> None:
    leader = ctx.leader("consumer")
    at = now_us()
    leader.proc.kill()
    ctx.fault(f"kill -9 the consumer leader {leader.proc.name}", kind="consumer", writer=leader.writer, at_us=at)
    ctx.wait(lambda: any(w is not leader and w.status().get("delivered", 0) > 0 for w in ctx.consumers),
             timeout_s=30, what="the standby consumer to take over and deliver")
    ctx.event("standby consumer leads and delivers")


def pause_consumer(ctx: DrillContext) -> None:
    leader = ctx.leader("consumer")
    leader.proc.pause()
    ctx.fault(f"SIGSTOP the consumer leader {leader.proc.name} (frozen past its consumer lease)",
              kind="consumer", writer=leader.writer)
    standby = ctx.wait(lambda: next((w for w in ctx.consumers
                                     if w is not leader and w.status().get("delivered", 0) > 0), None),
                       timeout_s=30, what="the standby consumer to take over and deliver")
    ctx.event(f"standby {standby.proc.name} took over and delivers; resuming the frozen leader")
    leader.proc.resume()
    ctx.notes["deposed"] = leader
    # It learns its lease went to the standby and waits to be granted it again (issue 37).
    ctx.wait(lambda: leader.status().get("rejoining") or leader.status().get("rejoins", 0) > 0
             or not leader.proc.alive(), timeout_s=30, what="the resumed consumer to find its lease gone")
    ctx.event(f"resumed consumer {leader.proc.name} waits to rejoin: {leader.status().get('state')}")


def check_deposed_consumer(ctx: DrillContext, _a: list[AckRow], deliveries: list[DeliveryRow]
                           ) -> list[tuple[str, bool]]:
    """One active consumer per subscription: the resumed leader must stop delivering on its own
    clock, deliver nothing once its successor has delivered (the verifier's
    ``concurrent_consumers`` checks the same from the audit files alone), and rejoin by itself
    (issue 37): it finishes once the successor has, from the committed cursor."""
    deposed = ctx.notes.get("deposed")
    if deposed is None:
        return [("the consumer leader was frozen and resumed", False)]
    first_new = min((d.deliver_us for d in deliveries if d.consumer != deposed.writer), default=None)
    late = [d for d in deliveries if d.consumer == deposed.writer and first_new is not None
            and d.deliver_us >= first_new]
    return [
        ("the resumed consumer rejoined by itself and finished",
         deposed.proc.returncode == EXIT_DONE and deposed.status().get("rejoins", 0) >= 1),
        (f"no delivery by it after its successor's first ({len(late)} found)", first_new is not None and not late),
    ]


# -- coordination faults ---------------------------------------------------------------------------


def kill_zk_node(ctx: DrillContext) -> None:
    zk = ctx.cluster.zk
    i = ctx.rng.randrange(len(zk.processes))
    mode = next((s.mode for s in zk.status() if s.node == i), None)
    zk.kill(i)
    ctx.fault(f"kill -9 ZooKeeper node {i + 1} of {len(zk.processes)} ({mode})")
    ctx.hold(2.0, "two of three ZooKeeper nodes serve")
    zk.restart(i)
    ctx.event(f"ZooKeeper node {i + 1} restarted; ensemble serving")


def kill_coordinator(ctx: DrillContext) -> None:
    cluster = ctx.cluster
    leader = ctx.wait(cluster.coordinator_leader, timeout_s=30, what="a coordinator leader")
    proc = next(p for p in cluster.coordinators if p.name == leader)
    proc.kill()
    ctx.fault(f"kill -9 the leading coordinator daemon {leader}")
    if len(cluster.coordinators) > 1:
        new = ctx.wait(lambda: (lambda n: n if n not in (None, leader) else None)(cluster.coordinator_leader()),
                       timeout_s=30, what="a standby coordinator to take over")
        ctx.expect(f"standby coordinator {new} took over the duties", True)
    cluster.restart_coordinator(leader)
    ctx.event(f"restarted {leader}")


def roll_under_failover(ctx: DrillContext) -> None:
    """``ordq queue roll`` every quarter second under traffic, the head master killed among
    the rolls: seal-and-continue and failover racing on the same open segment."""
    from ordq.admin.groups import roll_queue
    from ordq.sdk.replicas import ReplicaReader

    killed: tuple[str, int] | None = None
    with ctx.cluster.store() as store, ReplicaReader(store) as reader:
        for i in range(8):
            if i == 2:
                killed = _kill_head(ctx, ("master",))
            else:
                rolled = roll_queue(store, reader, ctx.queue)
                ctx.event(f"rolled segment {rolled.sealing_seg} of {rolled.head} "
                          f"({'sealed' if rolled.sealed else 'sealing'}), segment {rolled.new_seg} open")
            ctx.hold(0.25, "traffic flows between rolls")
    assert killed is not None
    _wait_sealed(ctx, killed[1])  # traffic may have ended: the seal is the failover's end
    ctx.restart_broker(killed[0], "master")


# -- disk faults -----------------------------------------------------------------------------------


def _wait_sealed(ctx: DrillContext, seg: int) -> None:
    """Until ZooKeeper shows ``seg`` sealed (or already popped)."""
    def sealed(st: Any) -> bool:
        z = st.segment(seg)
        return z is None or z.status is SegStatus.SEALED

    with ctx.cluster.store() as store:
        store.wait_state(ctx.queue, sealed, timeout_s=30)


def torn_tail(ctx: DrillContext) -> None:
    gid, seg = ctx.head()
    role = ctx.rng.choice(_ROLES)
    member = ctx.cluster.broker(gid, role)
    member.kill()
    path = ctx.segment_file(gid, role, seg)
    # An append cut short by the crash: the first part of a valid batch (docs/LOG_FORMAT.md).
    batch = encode_batch([Message(payload=b"torn" * 64)] * 4, epoch=1, first_seq=1 << 40)
    cut = ctx.rng.randrange(20, len(batch) - 1)
    with open(path, "ab") as f:
        f.write(batch[:cut])
    ctx.fault(f"kill -9 {gid} {role} (head, segment {seg}) and append {cut} bytes of a torn batch to its "
              f"segment.log", kind="segment", seg=seg)
    ctx.wait_acks_after(seg)
    ctx.restart_broker(gid, role)
    stats = ctx.broker_stats(gid, role)
    ctx.expect(f"the restarted {role} truncated and counted the torn tail "
               f"({stats.get('torn_bytes_truncated', 0)} bytes)", stats.get("torn_bytes_truncated", 0) >= cut)


def corrupt_batch(ctx: DrillContext) -> None:
    # The master's copy: readers prefer the master, so the consumer (started after the fault,
    # a subscriber that lags) meets the damage and must read the slave until it is repaired.
    gid, seg = ctx.head()
    role = "master"
    member = ctx.cluster.broker(gid, role)
    member.kill()
    ctx.fault(f"kill -9 {gid} {role} (head, segment {seg}); its copy will be corrupted", kind="segment", seg=seg)
    ctx.wait_acks_after(seg)
    _wait_sealed(ctx, seg)  # from the other replica
    path = ctx.segment_file(gid, role, seg)
    positions = []
    pos = 0
    for header, _messages in iter_file_batches(path):
        positions.append((pos, header))
        pos += header.length
    if len(positions) < 3:
        ctx.expect(f"segment {seg} of {gid} {role} has a middle batch ({len(positions)} batches)", False)
        ctx.restart_broker(gid, role)
        return
    at, header = positions[ctx.rng.randrange(1, len(positions) - 1)]
    flip = at + header.length - 1 - ctx.rng.randrange(max(1, min(header.length - 40, 64)))  # inside the payloads
    with open(path, "r+b") as f:
        f.seek(flip)
        byte = f.read(1)
        f.seek(flip)
        f.write(bytes([byte[0] ^ 0x5A]))
    ctx.event(f"flipped byte {flip} of {path.name} (batch at offset {header.first_offset}, "
              f"{len(positions)} batches) in {gid} {role}'s copy of sealed segment {seg}")
    ctx.restart_broker(gid, role)
    stats = ctx.broker_stats(gid, role)
    ctx.expect("the restarted replica reported the corrupt segment instead of serving it",
               stats.get("corrupt_segments", 0) >= 1)
    try:
        ctx.wait(lambda: ctx.broker_stats(gid, role).get("reconciled", 0) >= 1, timeout_s=30,
                 what="the corrupt copy to be rebuilt from the peer")
        rebuilt = True
    except DrillError:
        rebuilt = False
    kept = list(path.parent.glob("segment.log.corrupt-*"))
    ctx.expect(f"the corrupt copy was set aside ({kept[0].name if kept else 'none'}) and rebuilt from the peer",
               rebuilt and bool(kept))


def replace_disk(ctx: DrillContext) -> None:
    gid, seg = ctx.head()
    role = ctx.rng.choice(_ROLES)
    peer = "slave" if role == "master" else "master"
    at = now_us()
    ctx.cluster.broker(gid, role).destroy()  # kill -9, and the data folder is gone
    ctx.fault(f"kill -9 {gid} {role} (head, segment {seg}) and wipe its data folder (a replaced disk)",
              kind="segment", seg=seg, at_us=at)
    ctx.wait_acks_after(seg)
    _wait_sealed(ctx, seg)  # from the surviving replica
    ctx.restart_broker(gid, role)  # on an empty folder
    new, old = ctx.segment_file(gid, role, seg), ctx.segment_file(gid, peer, seg)

    def copied() -> bool:
        return new.exists() and old.exists() and new.read_bytes() == old.read_bytes()

    try:
        ctx.wait(copied, timeout_s=30, what=f"segment {seg} copied to the new disk")
        ok = True
    except DrillError:
        ok = False
    ctx.expect(f"the replica on the new disk copied sealed segment {seg} from its {peer} "
               f"({new.stat().st_size if new.exists() else 0} bytes, identical)", ok)


def disk_full(ctx: DrillContext) -> None:
    gid, seg = ctx.head()
    member = ctx.cluster.broker(gid, "master")
    pid = member.proc.pid
    assert pid is not None
    path = ctx.segment_file(gid, "master", seg)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    # The head master can no longer grow its files: its next write fails (EFBIG) just as a
    # full disk fails it (ENOSPC), without filling the machine's disk.
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (path.stat().st_size, hard))
    ctx.fault(f"disk full on {gid} master (head, segment {seg}): its files cannot grow", kind="segment", seg=seg)
    try:
        ctx.wait_acks_after(seg)
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
    ctx.event(f"space back on {gid} master")
    log = member.proc.log_tail(400)
    ctx.expect("the master reported the failed write", "write failed" in log)
    ctx.restart_broker(gid, "master")


# -- a failing handler (issue 13; the consumer process is ordq.drills.failing) -------------------------


def _failing_consumer(mode: str) -> Callable[[DrillContext], list[str]]:
    def options(ctx: DrillContext) -> list[str]:
        total = ctx.load.messages
        # block: early, so it blocks before the fault moment (20-60 % acked) and the head master
        # dies while it blocks, under load. park: late (a parked key's later messages all follow
        # it), parked after the failover.
        span = range(total // 10, total // 5) if mode == "block" else range(total * 3 // 5, total * 7 // 10)
        fail = sorted(ctx.rng.sample(span, 1 if mode == "block" else 2))
        ctx.notes["fail_seqs"] = fail
        return ["--fail-seqs", ",".join(map(str, fail)), "--fixed-file", str(ctx.run_dir / FIXED),
                "--handled-log", str(ctx.run_dir / HANDLED), "--on-failure", mode,
                *(["--workers", "3"] if mode == "park" else [])]

    return options


def failing_handler_block(ctx: DrillContext) -> None:
    fail = ctx.notes["fail_seqs"][0]
    with ctx.cluster.store() as store:
        alarm, raised_ms = ctx.wait(lambda: store.blocked_alarm(ctx.queue, SUBSCRIPTION), timeout_s=60,
                                    what="the block alarm in ZooKeeper")
    first_failure = ctx.consumers[0].status().get("first_failure_us") or 0
    ctx.notes["alarm_ms"] = raised_ms - first_failure / 1000
    ctx.event(f"alarm for seq {alarm.get('seq')} raised {ctx.notes['alarm_ms']:.0f} ms after its first failure "
              f"(2 attempts, 0.05 s apart; {alarm.get('attempts')} attempts by now)")
    ctx.expect("the alarm names the failing seq", alarm.get("seq") == fail)
    gid, seg = _kill_head(ctx, ("master",))
    ctx.wait_acks_after(seg)
    ctx.restart_broker(gid, "master")
    handled = [seq for seq, _k, _r in read_handled(ctx.run_dir / HANDLED)]
    ctx.expect(f"nothing after seq {fail} handled while it blocks", max(handled, default=-1) < fail)
    (ctx.run_dir / FIXED).touch()
    ctx.event("handler fixed")


def failing_handler_park(ctx: DrillContext) -> None:
    from ordq.admin.parked import resolve_parked

    fail = set(ctx.notes["fail_seqs"])
    gid, seg = _kill_head(ctx, ("master",))
    ctx.wait_acks_after(seg)
    ctx.restart_broker(gid, "master")
    with ctx.cluster.store() as store:
        ctx.wait(lambda: {r["seq"] for r in store.parked(ctx.queue, SUBSCRIPTION)} >= fail, timeout_s=60,
                 what=f"seqs {sorted(fail)} parked")
        ctx.event(f"seqs {sorted(fail)} parked; their keys follow")
        budget = ctx.load.duration_s * 4 + 60
        ctx.wait(lambda: not any(p.proc.alive() for p in ctx.producers), timeout_s=budget, what="the stream's end")
        ctx.wait(lambda: _handled_or_parked(ctx) >= ctx.load.messages, timeout_s=budget,
                 what="every message handled or parked")
        (ctx.run_dir / FIXED).touch()
        seqs = resolve_parked(store, ctx.queue, SUBSCRIPTION, "replay", every=True)
    ctx.event(f"handler fixed; ordq sub parked replay --all: {len(seqs)} parked messages")


def _handled_or_parked(ctx: DrillContext) -> int:
    st = ctx.consumers[0].status()
    return int(st.get("handled", 0)) + int(st.get("parked", 0))


def _check_failing(ctx: DrillContext, *, keyed: bool) -> list[tuple[str, bool]]:
    handled = read_handled(ctx.run_dir / HANDLED)
    seqs = [seq for seq, _k, _r in handled]
    total = ctx.load.messages
    out = [("every seq handled", set(seqs) == set(range(total))),
           (f"in {'per-key ' if keyed else ''}seq order", not order_faults(handled, keyed=keyed))]
    if not keyed:
        return [*out, ("each seq handled once", len(seqs) == total)]
    with ctx.cluster.store() as store:
        records = store.parked(ctx.queue, SUBSCRIPTION)
    fail = ctx.notes["fail_seqs"]
    key_of = {seq: key for seq, key, _r in handled}
    first_of: dict[str | None, int] = {}
    for f in fail:
        first_of.setdefault(key_of.get(f), f)
    must_park = {s for s in range(total) if key_of.get(s) in first_of and s >= first_of[key_of.get(s)]}
    replayed = {seq for seq, _k, r in handled if r}
    return [*out,
            ("the failing messages and every later one of their keys parked, with a record",
             {r["seq"] for r in records} == must_park),
            ("every parked message replayed, and only those", replayed == must_park
             and all(r.get("status") == "replayed" for r in records))]


def check_failing_block(ctx: DrillContext, _a: list[AckRow], _d: list[DeliveryRow]) -> list[tuple[str, bool]]:
    return _check_failing(ctx, keyed=False)


def check_failing_park(ctx: DrillContext, _a: list[AckRow], _d: list[DeliveryRow]) -> list[tuple[str, bool]]:
    return _check_failing(ctx, keyed=True)


# -- the catalogue ---------------------------------------------------------------------------------

DRILLS: dict[str, Drill] = {d.name: d for d in (
    Drill("kill-head-master", "head master killed (-9)",
          "producer fails over to the next group and resends; old segment sealed from the slave; consumer drains "
          "it from the slave, then moves on", kill_head_master, hold_at=_HELD),
    Drill("kill-head-slave", "head slave killed (-9)",
          "master can no longer ack: fail over; seal from the master", kill_head_slave, hold_at=_HELD),
    Drill("kill-head-group", "both processes of the head group killed (-9)",
          "producers fail over; consumers wait at that segment until one process returns", kill_head_group,
          hold_at=_HELD),
    Drill("pause-head-master", "head master hung (SIGSTOP), resumed later",
          "producer deadline expires: fail over; when it resumes it is fenced and reconciles", pause_head_master,
          hold_at=_HELD),
    Drill("pause-head-slave", "head slave hung (SIGSTOP), resumed later",
          "producer deadline expires: fail over; when it resumes it is fenced and reconciles", pause_head_slave,
          hold_at=_HELD),
    Drill("kill-producer", "producer leader killed (-9)",
          "standby takes over, fences, continues", kill_producer, standby_producer=True,
          check=check_killed_producer),
    Drill("stale-producer", "producer leader hung (SIGSTOP) and resumed after a standby took over",
          "standby takes over and fences; the old leader's delayed batches are refused", stale_producer,
          standby_producer=True, check=check_stale_producer),
    Drill("kill-consumer", "consumer leader killed (-9)",
          "standby resumes from the committed cursor, in order", kill_consumer, standby_consumer=True),
    Drill("pause-consumer", "consumer leader hung (SIGSTOP) past its session and resumed after a standby took over",
          "the standby resumes from the committed cursor; the resumed leader delivers nothing beside it, "
          "rejoins by itself and finishes from the committed cursor: one active consumer at a time",
          pause_consumer, standby_consumer=True,
          check=check_deposed_consumer),
    Drill("roll-under-failover", "the open segment rolled every 0.25 s under traffic, the head master killed "
          "among the rolls", "each roll seals and continues on the same head; the kill fails over; producers "
          "resend what was in flight, consumers drop duplicates: nothing lost or reordered", roll_under_failover),
    Drill("heads-spread-back", f"{heads_spread.IDLE} idle queues beside the stream; the head master killed (-9) "
          "and brought back", "the stream fails over; the dead group's idle heads move to the others; once it "
          "is back and live for the spread's grace the coordinator moves idle heads back until they are even "
          "(within one), never the queue being written: nothing lost or reordered",
          heads_spread.heads_spread_back, load=heads_spread.spread_load),
    Drill("kill-zk-node", "one ZooKeeper node of three killed (-9)", "no effect", kill_zk_node,
          needs_ensemble=True),
    Drill("kill-coordinator", "leading coordinator daemon killed (-9)",
          "no effect on produce/consume; a standby takes its duties", kill_coordinator),
    Drill("torn-tail", "head replica killed and restarted with a torn tail",
          "the torn tail is truncated and counted", torn_tail, hold_at=_HELD),
    Drill("corrupt-batch", "a middle batch of one replica's sealed segment corrupted",
          "the replica reports it and does not serve it; rebuilt from its peer; consumers read the peer",
          corrupt_batch, late_consumer=True, hold_at=_HELD),
    Drill("replace-disk", "head replica killed (-9) and restarted on an empty data folder",
          "sealed from the peer; the new disk never vouches for what it did not see and copies the segment "
          "from the peer", replace_disk, late_consumer=True, hold_at=_HELD),
    Drill("disk-full", "disk full on the head master",
          "clear error and fail over, never silent loss", disk_full, hold_at=_HELD),
    Drill("failing-handler-block", "the handler fails on one seq (policy block) and the head master is killed "
          "(-9) while it blocks", "the alarm names it; nothing after it is handled until it goes through; then "
          "every seq handled once, in order", failing_handler_block,
          consumer_options=_failing_consumer("block"), check=check_failing_block, hold_at=_HELD),
    Drill("failing-handler-park", "keyed delivery: the handler fails on two seqs (policy park), the head master "
          "is killed (-9), then an operator replays", "the failing messages and every later one of their keys "
          "parked with records while the other keys go on; the replay hands them over in per-key order",
          failing_handler_park, consumer_options=_failing_consumer("park"), check=check_failing_park,
          hold_at=_HELD),
    Drill("cdc", "MariaDB binlog -> ordq cdc mysql -> queue -> ordq cdc apply -> PostgreSQL under inserts, updates "
          "and deletes; the shipper, a head master and the applier each killed (-9) at random moments",
          "each restarted process resumes: the target tables equal the source row for row, and nothing the "
          "shipper got acked is lost or reordered", run_cdc, own_load=True, requires=require_servers),
    Drill("cdc-mirror", "MariaDB in centre 1 -> ordq cdc mysql -> queue -> ordq mirror -> queue in centre 2 -> ordq "
          "cdc apply -> PostgreSQL in centre 2 (two local clusters); the shipper, the mirror and the applier killed "
          "(-9), the head master killed (-9) in each centre, the link between the centres cut and healed",
          "centre 2 falls behind while the link is cut and catches up: its tables equal centre 1's row for row, "
          "and every row change acked in centre 1 is in centre 2's queue once, in order, at the same seq",
          run_cdc_mirror, own_load=True, requires=require_cdc_mirror),
    Drill("keyed-topic", f"a keyed topic of {keyed_topic.PARTITIONS} partitions read by a consumer group: two head "
          "masters killed (-9), a member joins, a member hangs (SIGSTOP) past its session and resumes, a member "
          "leaves", "the group rebalances after each change (a member gives a partition up only once it stopped "
          "delivering from it): nothing lost, every key in order, no partition delivered by two members at once",
          keyed_topic.keyed_topic, own_load=True, failover=False, topic=True),
    # -- security (drills/security.py, drills/neighbour.py, drills/control_plane.py, docs/SECURITY.md): hostile
    # clients, refused, nothing stored ------------------------------------------------------------
    Drill("security-intruders", "callers without a token, with the wrong role, for another queue, with a revoked "
          "token, in plaintext and without a client certificate, at the head master under load",
          "each refused (PermissionDenied naming queue and role, or no TLS handshake); the load goes on untouched",
          security.intruders, failover=False),
    Drill("security-rogue-epoch", "a hand-made gRPC client claims a producer epoch ZooKeeper never issued: writes "
          "to the head master and fences both replicas", "refused (EpochNotIssued) and counted by each broker; "
          "nothing stored; the real producer is not fenced", security.rogue_epoch, failover=False),
    Drill("security-control-calls", "a consume-only token holder calls Seal and Fence on the head's open segment, "
          "Reconcile (to end 0, from its own address) on both replicas and Replicate into the slave, under load",
          "each refused (PermissionDenied: only brokers and coordinators may) and counted; the head stays, "
          "nothing truncated or forged; the load goes on untouched", security.control_calls, failover=False),
    Drill("security-zk-write", "ZooKeeper clients that are none of the cluster's identities (no credential, or "
          "a client's from before issue 37) plant a node in the alarm folder, forge election contenders and a "
          "parked record, read the tokens, write the queue's state/config, a group, a subscription, the ACL record",
          "each refused by ZooKeeper (NoAuth); nothing changed", security.zk_write_without_acl, failover=False),
    Drill("security-abandoned-streams", "100 produce streams and 100 fetch long-polls opened on the head master "
          "and never read or closed", "the master's memory stays bounded and the real producer keeps being acked",
          security.abandoned_streams, failover=False),
    Drill("security-noisy-neighbour", "the holder of a token for another queue on the head group abuses it in "
          f"{neighbour.ROUNDS} windows of {neighbour.ABUSE_S:g} s between quiet ones: huge fetches, "
          "unread Read streams, unwritten produce streams, oversized and malformed requests"
          f", while the drill queue is written at {neighbour.NEIGHBOUR_RATE:,.0f} msgs/s",
          f"the drill queue's ack p99 stays within {neighbour.LATENCY_RATIO:g}x of the quiet windows' (same run; the "
          "acks in flight during a freeze of the disk left out of both sides) and it never fails over; each abuse "
          "is answered within the budget or refused", neighbour.noisy_neighbour,
          failover=False, load=neighbour.neighbour_load, check=neighbour.check_neighbour),
    Drill("security-control-plane", "hand-made clients attack the leading coordinator in "
          f"{control_plane_plan.ROUNDS} windows of {control_plane_plan.ATTACK_S:g} s (judged over "
          f"{control_plane_plan.WINDOW_S:g} s) between quiet ones as long, from a "
          "process placed as a host of its own (one CPU, a CPU quota; in some windows on every CPU, told): Pop "
          f"naming a {control_plane_attacks.HUGE_NAME_BYTES >> 20} MiB queue with the client certificate and no token, "
          f"{control_plane_attacks.FLOOD_THREADS} threads of Describe and Subscribe with one consume token, Subscribe "
          "past the bound, EnsureParkingQueue for made-up names, undecodable bytes, a queue name with a new line; the "
          "drill queue is written and another token commits on it",
          "every attack refused and counted by the leader (ordq_coordinator_requests_total), which stays under "
          f"{control_plane.RSS_BUDGET_BYTES >> 20} MiB RSS and keeps leading; nothing created or changed; the "
          f"drill queue's produce and commit p99 within {control_plane_judge.LATENCY_RATIO:g}x of the quiet windows'",
          control_plane.control_plane, failover=False, load=control_plane.control_plane_load,
          check=control_plane_judge.check_control_plane, fault_between=control_plane_plan.ATTACKS_FROM),
)}

# Drills across data centres: each deploys its own lab of two clusters (drills/mirror_lab.py), run
# after the lab drills by ``ordq drill NAME`` and ``drill all``: name -> (fault, what must happen).
CENTRES: dict[str, tuple[str, str]] = {mirror_lab.NAME: (mirror_lab.FAULT, mirror_lab.MUST)}

# A lab drill whose verdict comes from a Spark standalone cluster started in its lab (issue 44,
# drills/spark_lab.py): ``ordq drill spark-cluster`` is ``ordq drill LAB_DRILL --spark-cluster``
# (any part-* drill takes the option). Not in ``drill all``: the same fault as its lab drill.
SPARK_CLUSTER = "spark-cluster"
ON_SPARK_CLUSTER: dict[str, tuple[str, str, str]] = {SPARK_CLUSTER: (
    "part-isolate-head-master",
    "the head master's host cut from every other host (part-isolate-head-master); the audits verified on a Spark "
    "standalone cluster started in the lab (master h1, workers h2 and h3, the driver in a client host)",
    "fail over, fence, reconcile; the verdict the executors on h2/h3 give: nothing lost, reordered or delivered "
    "twice, as on local[*]")}

# The CI-sized subset run by the default test run (the rest: tox -e slow). Of the security
# drills only the intruders: the refusals the others drill are each the assertion of a default
# test on real processes (rogue epoch: test_broker.py::test_a_claimed_epoch_zookeeper_never_issued
# _is_refused_and_the_leader_goes_on; control calls: test_control_calls.py; ZooKeeper writes:
# test_zk_acl.py::test_a_protected_root_refuses_writes_without_the_right_credential).
CI_DRILLS = ("kill-head-master", "stale-producer", "corrupt-batch", "failing-handler-block", "failing-handler-park",
             "security-intruders")
