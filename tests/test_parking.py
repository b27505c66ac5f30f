"""Parking by key, replay and drop (issue 13) on real brokers and ZooKeeper, and the pure rules
of the ledger (sdk/failure.py) as properties.

What must hold: in keyed delivery only the failing key stops (block) or is parked (park): every
later message of that key follows it into the parking queue with a record, also after a
consumer restart, while the other keys go on; a replay hands the parked messages to the
handler in seq order before the key goes on, so one key's messages reach the handler in seq
order across parking, restart and replay; a drop is recorded with its reason.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import ConfigError
from ordq.sdk import Consumer, ConsumerConfig, Delivered, FailurePolicy, Producer, ProducerConfig
from ordq.sdk.failure import parked_keys, replay_plan, select, status_of
from ordq.sdk.parking import REPLAYED_HEADER
from ordq.spark_order_check.reference import check
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, SEND_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401
from tests.util import wait_until

KEYS = 8
WORKERS = 3
BAD = 21  # key k5 (seq % KEYS)


def key_of(seq: int) -> bytes:
    return b"k%d" % (seq % KEYS)


def produce(cluster: Cluster, first: int, n: int) -> None:
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, audit_dir=cluster.base / "audit")
    with Producer(cfg) as p:
        futures = [p.send(b"m%d" % s, key=key_of(s)) for s in range(first, first + n)]
        assert [f.result(timeout=60).seq for f in futures] == list(range(first, first + n))


def config(cluster: Cluster, policy: FailurePolicy) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, leader_timeout_s=30, on_failure=policy,
                          audit_dir=cluster.base / "audit")


class Handler:
    """Fails on ``BAD`` while ``broken``; records per key what it handled, in order."""

    def __init__(self) -> None:
        self.broken = threading.Event()
        self.broken.set()
        self.lock = threading.Lock()
        self.by_key: dict[bytes, list[int]] = defaultdict(list)
        self.replayed: list[int] = []

    def __call__(self, m: Delivered) -> None:
        assert m.payload == b"m%d" % m.seq and m.key == key_of(m.seq), m
        if m.seq == BAD and self.broken.is_set():
            raise ValueError(f"cannot handle {m.seq}")
        with self.lock:
            self.by_key[m.key or b""].append(m.seq)
            if dict(m.headers).get(REPLAYED_HEADER) == b"1":
                self.replayed.append(m.seq)

    def seqs(self) -> set[int]:
        with self.lock:
            return {s for seqs in self.by_key.values() for s in seqs}


def running(c: Consumer, handler: Handler) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            c.run_keyed(handler, workers=WORKERS, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, stop, errors


def ledger(cluster: Cluster) -> list[dict]:
    return json.loads(cluster.ordq("sub", "parked", "q", "s", "--json").stdout)["parked"]


def stopped(t: threading.Thread, stop: threading.Event, errors: list[BaseException]) -> None:
    stop.set()
    t.join(60)
    assert not t.is_alive() and not errors, errors


def until(what: str, condition: Callable[[], object]) -> None:
    wait_until(condition, timeout_s=60, interval_s=0.02, what=what)


@pytest.mark.zk
def test_keyed_park_follows_the_key_across_a_restart_then_replay_and_drop(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 0, 200)
    bad_key = [s for s in range(200) if key_of(s) == key_of(BAD)]
    policy = FailurePolicy(on_failure="park", attempts=2, backoff_s=(0.01,))
    handler = Handler()
    others = {s for s in range(200) if key_of(s) != key_of(BAD) or s < BAD}

    with Consumer(config(cluster, policy)) as c:
        t, stop, errors = running(c, handler)
        until("the other keys handled and the key parked", lambda: handler.seqs() >= others
              and len(cluster.store.parked("q", "s")) == len([s for s in bad_key if s >= BAD]))
        stopped(t, stop, errors)
    assert handler.seqs() == others  # nothing of the parked key after BAD was handled
    records = ledger(cluster)
    assert [r["seq"] for r in records] == [s for s in bad_key if s >= BAD]
    assert (records[0]["attempts"], records[0]["follows"], "cannot handle" in records[0]["error"]) == (2, None, True)
    assert all(r["follows"] == BAD and r["attempts"] == 0 and r["status"] == "parked" for r in records[1:])
    assert [r["parked_seq"] for r in records] == list(range(len(records)))  # in order in the parking queue

    # A restarted consumer still follows the parked key (the ledger says so), and the rest go on.
    produce(cluster, 200, 40)
    handler.broken.clear()
    with Consumer(config(cluster, policy)) as c:
        t, stop, errors = running(c, handler)
        until("the new messages handled or parked", lambda: handler.seqs() >= others | {
            s for s in range(200, 240) if key_of(s) != key_of(BAD)} and len(cluster.store.parked("q", "s")) == len(
            [s for s in range(240) if key_of(s) == key_of(BAD) and s >= BAD]))
        assert not handler.replayed

        # Replaying one seq ahead of its key is refused; drop needs a reason: one clear line each.
        ahead = cluster.ordq("sub", "parked", "replay", "q", "s", "--seq", str(BAD + KEYS))
        assert ahead.returncode == 1 and b"waits behind parked seq 21" in ahead.stderr, ahead.stderr
        assert b"Traceback" not in ahead.stderr and len(ahead.stderr.splitlines()) == 1
        no_reason = cluster.ordq("sub", "parked", "drop", "q", "s", "--seq", str(BAD))
        assert no_reason.returncode == 1 and b"--reason" in no_reason.stderr

        # Drop the last parked one, replay the key: the rest comes, in order, and the key goes on.
        parked_seqs = [r["seq"] for r in ledger(cluster)]
        out = cluster.ordq("sub", "parked", "drop", "q", "s", "--seq", str(parked_seqs[-1]), "--reason", "stale")
        assert out.returncode == 0, out.stderr
        out = cluster.ordq("sub", "parked", "replay", "q", "s", "--key", "k5")
        assert out.returncode == 0, out.stderr
        assert out.stdout.decode().startswith(f"q/s: seqs {BAD}, {BAD + KEYS},")
        until("the key replayed", lambda: handler.replayed == parked_seqs[:-1])
        produce(cluster, 240, 8)  # the key goes on: its next message is handled, not parked
        until("the key handled again", lambda: 245 in handler.seqs())
        stopped(t, stop, errors)
    records = ledger(cluster)
    assert [status_of(r) for r in records] == ["replayed"] * (len(records) - 1) + ["dropped"]
    assert records[-1]["reason"] == "stale"
    assert 245 not in [r["seq"] for r in records]
    for key, seqs in handler.by_key.items():
        assert seqs == sorted(set(seqs)), f"key {key!r} out of order or twice: {seqs}"
    listed = cluster.ordq("sub", "parked", "q", "s").stdout.decode()
    assert "STATUS" in listed and "replayed" in listed and "stale" in listed


@pytest.mark.zk
def test_keyed_block_holds_only_the_key_and_raises_the_alarm(cluster: Cluster) -> None:
    """Block in keyed delivery: nothing after the failing message of its key is handled, the
    keys on other workers go on, the alarm names it until it goes through."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 0, 200)
    handler = Handler()
    from ordq.sdk.keyed import worker_of

    stuck_worker = worker_of(key_of(BAD), WORKERS)
    elsewhere = {s for s in range(200) if worker_of(key_of(s), WORKERS) != stuck_worker}
    with Consumer(config(cluster, FailurePolicy(on_failure="block", attempts=3, backoff_s=(0.05,)))) as c:
        started = time.monotonic()
        t, stop, errors = running(c, handler)
        alarm = wait_until(lambda: cluster.store.blocked("q", "s"), timeout_s=60, interval_s=0.005, what="alarm")
        print(f"alarm {time.monotonic() - started:.3f}s after delivery started (3 attempts, 0.05 s apart)")
        assert (alarm["seq"], alarm["key"], alarm["attempts"]) == (BAD, key_of(BAD).hex(), 3)
        until("the other workers' keys handled", lambda: handler.seqs() >= elsewhere)
        assert c.blocked is not None and c.blocked.seq == BAD and c.statistics().alarms == 1
        top = cluster.ordq("top", "--once", "--interval", "0.1").stdout.decode()
        assert "BLOCKED" in top and f"seq {BAD} after" in top  # where operators look, too
        assert not [s for s in handler.by_key[key_of(BAD)] if s >= BAD]
        handler.broken.clear()
        until("everything handled", lambda: handler.seqs() == set(range(200)))
        stopped(t, stop, errors)
    assert cluster.store.blocked("q", "s") is None
    for key, seqs in handler.by_key.items():
        assert seqs == sorted(set(seqs)), f"key {key!r} out of order or twice"


@pytest.mark.zk
def test_global_park_replay_and_drop(cluster: Cluster) -> None:
    """``run``: parked seqs replayed from the parking queue by a later consumer, one dropped."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 0, 100)
    handler = Handler()
    handled_all = threading.Event()
    policy = FailurePolicy(on_failure="park", attempts=1)

    def handle(m: Delivered) -> None:
        if m.seq in (7, 8) and not handled_all.is_set():
            raise ValueError("poison")
        handler(m)
        if m.seq == 99:
            handled_all.set()

    handler.broken.clear()
    with Consumer(config(cluster, policy)) as c:
        c.run(handle, stop=handled_all)
    assert [r["seq"] for r in ledger(cluster)] == [7, 8]
    assert cluster.ordq("sub", "parked", "drop", "q", "s", "--seq", "7", "--reason", "bad data").returncode == 0
    assert cluster.ordq("sub", "parked", "replay", "q", "s", "--all").returncode == 0
    done = threading.Event()
    with Consumer(config(cluster, policy)) as c:
        t = threading.Thread(target=c.run, args=(handle,), kwargs={"stop": done}, daemon=True)
        t.start()
        until("seq 8 replayed", lambda: handler.replayed == [8])
        done.set()
        t.join(30)
    assert [(r["seq"], status_of(r), r.get("reason")) for r in ledger(cluster)] == [
        (7, "dropped", "bad data"), (8, "replayed", None)]
    again = cluster.ordq("sub", "parked", "replay", "q", "s", "--seq", "8")
    assert again.returncode == 1 and b"seq 8 is replayed: cannot replay it" in again.stderr

    # The skip records in the audit files: 7 parked (then dropped), 8 parked and replayed. The
    # verifier's rules count 7 as skipped, not lost, also once its delivery row is gone.
    audit = cluster.base / "audit"
    rows = [line.split("\t") for f in sorted((audit / "skips").glob("*.tsv*"))
            for line in f.read_text().splitlines()[1:]]
    assert [(r[3], r[5]) for r in sorted(rows, key=lambda r: int(r[8]))] == [
        ("7", "parked"), ("8", "parked"), ("8", "replayed")]
    assert check(audit / "acks", audit / "deliveries", skips=audit / "skips").counts.get("skipped") == 1
    for f in (audit / "deliveries").glob("*.tsv*"):  # as if seq 7 had never been handed out
        f.write_text("".join(line for line in f.read_text().splitlines(keepends=True)
                             if line.split("\t")[3] != "7"))
    result = check(audit / "acks", audit / "deliveries", skips=audit / "skips")
    assert (result.counts.get("skipped"), result.counts.get("lost", 0)) == (1, 0)
    assert check(audit / "acks", audit / "deliveries").counts.get("lost") == 1  # without its record: lost


@pytest.mark.zk
def test_a_replay_changes_each_record_alone_not_reading_the_ledger_per_record(cluster: Cluster,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay of N parked records asks the coordinator for the whole ledger a few times, not
    once per record: each record's change decides on the record as the replay plan read it,
    and reads that record alone (``parked`` with its seq) only when an operator changed it
    meanwhile. Failing first (issue 37 regression): every settled replay read the whole ledger
    (a ZooKeeper read per record on the coordinator), so replaying the drill's 689 records took
    minutes and the failing-handler-park drill timed out."""
    from ordq.coordinator.client import CoordinatorClient
    from ordq.sdk._lease_client import CoordinatorLease

    n, poison = 60, set(range(10, 70))
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 0, 100)
    policy = FailurePolicy(on_failure="park", attempts=1)
    fixed = threading.Event()
    handled: list[tuple[int, bool]] = []
    dropped_meanwhile = 40  # an operator drops this one while its replay runs: it ran anyway

    def handle(m: Delivered) -> None:
        if m.seq in poison and not fixed.is_set():
            raise ValueError("poison")
        replayed = dict(m.headers).get(REPLAYED_HEADER) == b"1"
        if replayed and m.seq == dropped_meanwhile:
            out = cluster.ordq("sub", "parked", "drop", "q", "s", "--seq", str(m.seq), "--reason", "meanwhile")
            assert out.returncode == 0, out.stderr
        handled.append((m.seq, replayed))

    done = threading.Event()
    with Consumer(config(cluster, policy)) as c:
        t = threading.Thread(target=c.run, args=(handle,), kwargs={"stop": done}, daemon=True)
        t.start()
        until("everything handled or parked", lambda: c.statistics().parked == n and len(handled) == 100 - n)
        done.set()
        t.join(30)
    assert [r["seq"] for r in ledger(cluster)] == sorted(poison)

    # The coordinator's op: one record by seq (a list of at most one), the ledger without a body.
    coord = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials)
    holder = CoordinatorLease(coord, "consumer", "q", "s", "a-reader", ttl_s=CLIENT_SESSION_TIMEOUT_S)
    try:
        assert holder.acquire(30)
        assert [r["seq"] for r in coord.record(holder.held, "parked", {"seq": 11})] == [11]
        assert coord.record(holder.held, "parked", {"seq": 9}) == []
        assert len(coord.record(holder.held, "parked")) == n
        with pytest.raises(ConfigError, match="parked: the body"):
            coord.record(holder.held, "parked", {"seq": "11"})
    finally:
        holder.stop()
        coord.close()

    asked: list[tuple[str, object]] = []
    record = CoordinatorClient.record

    def counted(self: CoordinatorClient, lease: object, op: str, body: object = None, **kw: object) -> object:
        asked.append((op, body))
        return record(self, lease, op, body, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(CoordinatorClient, "record", counted)
    fixed.set()
    assert cluster.ordq("sub", "parked", "replay", "q", "s", "--all").returncode == 0
    done = threading.Event()
    with Consumer(config(cluster, policy)) as c:
        t = threading.Thread(target=c.run, args=(handle,), kwargs={"stop": done}, daemon=True)
        t.start()
        until("every parked seq replayed", lambda: {s for s, r in handled if r} == poison)
        done.set()
        t.join(30)
    whole = [op for op, body in asked if op == "parked" and body is None]
    assert 1 <= len(whole) <= 5, f"the whole ledger read {len(whole)} times for a replay of {n} records"
    assert [body for op, body in asked if op == "parked" and body is not None] == [{"seq": dropped_meanwhile}]
    assert [(r["seq"], status_of(r)) for r in ledger(cluster)] == [
        (s, "dropped" if s == dropped_meanwhile else "replayed") for s in sorted(poison)]


# -- the rules, as properties ----------------------------------------------------------------

records_st = st.lists(
    st.tuples(st.sampled_from(["", "61", "62", "63"]), st.sampled_from(["parked", "replay", "replayed", "dropped"]),
              st.booleans()),
    max_size=12,
).map(lambda rows: [{"seq": i * 3, "key": k, "status": s, "keyed": keyed} for i, (k, s, keyed) in enumerate(rows)])


@given(records_st)
def test_replay_never_passes_a_parked_record_of_its_key(records: list[dict]) -> None:
    plan = replay_plan(records)
    assert [r["seq"] for r in plan] == sorted(r["seq"] for r in plan)
    for r in plan:
        assert status_of(r) == "replay"
        if r["keyed"]:
            assert not [b for b in records if b["keyed"] and b["key"] == r["key"] and b["seq"] < r["seq"]
                        and status_of(b) == "parked"]


@given(records_st, st.sampled_from(["replay", "drop"]), st.integers(0, 40), st.sampled_from(["", "61", "9"]))
def test_selection_chooses_only_unresolved_records_and_keeps_key_order(records: list[dict], action: str,
                                                                        seq: int, key: str) -> None:
    for how in ({"seq": seq}, {"key": key}, {"every": True}):
        try:
            chosen = select(records, action, **how)  # type: ignore[arg-type]
        except ConfigError:
            continue
        by_seq = {r["seq"]: r for r in records}
        assert all(status_of(by_seq[s]) in ("parked", "replay") for s in chosen)
        if action == "replay" and "seq" in how and by_seq[seq]["keyed"]:
            r = by_seq[seq]
            assert not [b for b in records if b["keyed"] and b["key"] == r["key"] and b["seq"] < seq
                        and status_of(b) == "parked"]
        # After the operator's change, a key is parked exactly while it has unresolved keyed records.
        after = [{**r, "status": ("replay" if action == "replay" else "dropped")} if r["seq"] in chosen else r
                 for r in records]
        for k, first in parked_keys(after).items():
            assert min(r["seq"] for r in after if r["keyed"] and (r["key"] or "") == k
                       and status_of(r) in ("parked", "replay")) == first


def test_selection_needs_exactly_one_target() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        select([], "replay")
    with pytest.raises(ConfigError, match="exactly one"):
        select([], "drop", seq=1, every=True)


def test_sub_parked_shows_a_key_as_replay_takes_it() -> None:
    from ordq.commands.sub import key_text

    assert key_text(b"acct-3".hex()) == "acct-3"  # what --key takes
    for raw in (b"\x00\xff", b" padded", b"tab\there", "é\n".encode(), b"hex:ab"):
        assert key_text(raw.hex()) == f"hex:{raw.hex()}"  # what --key-hex takes
    assert key_text(None) is None
