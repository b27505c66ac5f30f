"""The security-control-plane drill's window plan (drills/control_plane_plan.py) and the bound on
its attacker's drain (drills/control_plane_attacks.py, drills/neighbour.py ``CallLoops``): no
window outlasts the drill queue's stream, whatever the seed; the attacker's calls end with their
window, and its threads stop within ``DRAIN_S``, against a server that never answers."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator

import attrs
import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.security import Credentials
from ordq.drills import control_plane as cp
from ordq.drills import control_plane_attacks as cpa
from ordq.drills import control_plane_plan as plan
from ordq.drills import neighbour
from ordq.drills.control_plane_plan import WindowPlan, stream_left_s
from ordq.drills.runner import LoadConfig


@given(seed=st.integers(0, 2**32 - 1), setup_s=st.floats(0, plan.SETUP_S))
def test_no_window_outlasts_the_stream_whatever_the_seed(seed: int, setup_s: float) -> None:
    """The runner's draw of the attacks' moment (``Drill.fault_between``, seeded), a set-up of up
    to SETUP_S, every window at its drain bound: each ends the margin before the stream does."""
    duration_s = plan.MESSAGES / neighbour.NEIGHBOUR_RATE
    start_s = random.Random(seed).uniform(*plan.ATTACKS_FROM) * duration_s + setup_s
    assert plan.PLAN.shortfall(duration_s - start_s) is None
    ends = plan.PLAN.ends(start_s)
    assert len(ends) == plan.ROUNDS and max(ends) <= duration_s - plan.PLAN.margin_s


@given(left_s=st.floats(0, 400), rounds=st.integers(1, 8), drain_s=st.floats(0, 30))
def test_the_plan_fits_exactly_when_every_window_ends_the_margin_before_the_stream(
        left_s: float, rounds: int, drain_s: float) -> None:
    tried = attrs.evolve(plan.PLAN, rounds=rounds, drain_s=drain_s)
    short = tried.shortfall(left_s)
    assert (short is None) == (max(tried.ends(0.0)) + tried.margin_s <= left_s + 1e-9)
    if short is not None:
        assert f"{left_s:.1f} s left" in short and f"{tried.needed_s:g} s" in short


def test_the_latency_drills_run_their_producer_with_the_sdks_send_timeout() -> None:
    """Not the fail-over drills' 1 s: a disk freeze of ~1 s failed the producer over by itself
    (stop 65), and these drills count any fail-over against the attack."""
    from ordq.sdk import ProducerConfig

    base = LoadConfig(messages=10, rate=10.0)
    assert base.send_timeout_s == 1.0
    sdk_default = attrs.fields(ProducerConfig).send_timeout_s.default
    assert sdk_default == 2.0
    assert cp.control_plane_load(base).send_timeout_s == sdk_default
    assert neighbour.neighbour_load(base).send_timeout_s == sdk_default


def test_the_drills_load_is_refused_before_the_run_when_the_windows_cannot_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = LoadConfig(messages=10, rate=10.0)
    assert cp.control_plane_load(base).duration_s == plan.MESSAGES / neighbour.NEIGHBOUR_RATE
    monkeypatch.setattr(cp, "MESSAGES", 180_000)  # 90 s: less than the windows' 165 s after 13.5 s and the set-up
    with pytest.raises(ValueError, match="the windows do not fit in the stream"):
        cp.control_plane_load(base)
    with pytest.raises(ValueError, match="the windows do not fit"):
        WindowPlan(rounds=2, window_s=1, attack_s=1, drain_s=1, settle_s=1, gap_s=1, margin_s=1).check_load(
            10.0, (0.1, 0.5), 1.0)


def test_either_windows_tail_reads_the_leader_to_its_end_and_an_attack_window_on_until_settled() -> None:
    """Stop o: the drill does the same in both kinds of window, reading the leader's calls in
    flight every 0.1 s from ATTACK_S to the window's end. An attack window goes on past that end
    only while the leader still holds more than its quiet window's level (the attacker's calls,
    held), SETTLE_S at most; a read that failed is no answer."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    def clock() -> float:
        return now[0]

    reads, settled = cp.tail_reads(lambda: 3.0, 2.5, clock=clock, sleep=sleep)  # a quiet window's tail
    assert len(reads) == 26 and settled is None and abs(now[0] - 2.5) < 1e-6
    now[0] = 0.0
    values = iter([None, 9.0, 5.0, 2.0, 1.0])
    reads, settled = cp.tail_reads(lambda: next(values, 1.0), 0.2, settle_to=2.0, bound_s=3.0, clock=clock,
                                   sleep=sleep)
    assert reads == [9.0, 5.0, 2.0] and settled is not None and round(settled, 6) == 0.3
    assert round(now[0], 6) == 0.3  # past its end only until settled
    now[0] = 0.0
    values = iter([9.0, 1.0])
    reads, settled = cp.tail_reads(lambda: next(values, 1.0), 2.0, settle_to=2.0, bound_s=3.0, clock=clock,
                                   sleep=sleep)
    assert round(settled or -1, 6) == 0.1 and abs(now[0] - 2.0) < 1e-6  # settled early: read on to the end
    now[0] = 0.0
    reads, settled = cp.tail_reads(lambda: 7.0, 1.0, settle_to=2.0, bound_s=3.0, clock=clock, sleep=sleep)
    assert settled is None and 3.0 <= now[0] < 3.2  # never settled: the bound


def test_the_stream_left_is_what_the_producer_has_not_sent_at_its_rate() -> None:
    assert stream_left_s({"total": 300_000, "next_seq": 0, "sent": 100_000}, 2_000.0) == 100.0
    assert stream_left_s({"total": 300_000, "next_seq": 1_000, "sent": 299_000}, 2_000.0) == 0.0
    assert stream_left_s({}, 2_000.0) == 0.0  # no status yet: no stream to place windows in


@contextlib.contextmanager
def _server(behaviour: Callable[[bytes, grpc.ServicerContext], bytes],
            options: list[tuple[str, int]] | None = None) -> Iterator[str]:
    """A gRPC server answering every unary call with ``behaviour`` (with channel ``options``); its address."""
    from concurrent import futures

    class Every(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(behaviour)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[Every()], options=options)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@pytest.fixture
def deaf_server() -> Iterator[str]:
    """A gRPC server that takes every call and never answers it (until the test ends)."""
    release = threading.Event()
    try:
        with _server(lambda req, ctx: release.wait(60) and b"") as address:
            yield address
    finally:
        release.set()


def _attacker(address: str, window_s: float, huge_bytes: int = 1) -> cpa._Attacker:
    return cpa._Attacker(address, Credentials(), "t0ken", "q", cpa.ATTACKS, time.monotonic() + window_s, huge_bytes)


def test_the_attackers_calls_end_at_their_windows_end(deaf_server: str) -> None:
    """Every call's deadline is the window's end: against a server that never answers, each is
    cut there, and the threads have stopped by themselves before the drill says stop."""
    # Armed before the window, as the drill does (``arm``, then ``go``): starting its ~80 threads
    # took 0.05 s on a quiet box but 3.1 s in the loaded tier (stop 62), and kinds started
    # last then found their window over and were never in flight.
    attacker = _attacker(deaf_server, 3.0)
    t0 = time.monotonic()
    attacker.arm()
    started_s = time.monotonic() - t0
    attacker.go(time.monotonic() + 3.0)
    time.sleep(3.0)
    deadline = time.monotonic() + cpa.DRAIN_S
    while any(t.is_alive() for _, t in attacker._threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for _, t in attacker._threads)  # stopped at the window's end, unasked
    t0 = time.monotonic()
    outcomes = attacker.stop()
    assert time.monotonic() - t0 < 1.0
    assert outcomes and all(k.endswith(f" {neighbour.CUT}") for k in outcomes), outcomes
    # every kind was in flight
    assert {k.split(" ")[0].split(":")[0] for k in outcomes} == set(cpa.ATTACKS), (started_s, outcomes)


def test_the_attackers_calls_in_flight_are_cancelled_when_its_window_is_ended(deaf_server: str) -> None:
    """Ended early (its deadline still 60 s away), the calls in flight are cancelled and its
    threads stop within DRAIN_S: nothing left running into the next window."""
    attacker = _attacker(deaf_server, 60.0)
    attacker.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    outcomes = attacker.stop()
    assert time.monotonic() - t0 < cpa.DRAIN_S
    assert not [k for k in outcomes if k.endswith(" running")], outcomes
    assert outcomes and all(k.endswith(f" {neighbour.CUT}") for k in outcomes), outcomes


def test_a_cut_call_is_neither_served_nor_refused_and_a_running_thread_fails_its_attack() -> None:
    refused = {"huge denied": 3, "huge cut": 2}
    assert all(ok for _, ok in cpa.judge_attacks(refused, {"PermissionDenied": 3}, ("huge",)))
    assert not all(ok for _, ok in cpa.judge_attacks({"huge cut": 2}, {}, ("huge",)))  # its refusal never seen
    assert not all(ok for _, ok in cpa.judge_attacks({**refused, "huge running": 1}, {"PermissionDenied": 3},
                                                     ("huge",)))


@pytest.fixture
def quick_server() -> Iterator[str]:
    """A gRPC server that refuses every call at once (as the leader refuses the attacks)."""
    with _server(lambda req, ctx: ctx.abort(grpc.StatusCode.PERMISSION_DENIED, "no")) as address:
        yield address


def test_every_attack_is_sent_in_a_short_window_beside_the_flood(quick_server: str) -> None:
    """Stop i, run A (seed 3821): in its 4 s windows the targeted attacks (bound, parking,
    undecodable, newline), started after the huge Pops and the flood's 64 threads, were never
    sent: the starved attacker's threads began after their window's end. Here, unstarved, with
    the real 200 MiB Pop body and a 1 s window, that order sent nothing but the huge Pops and
    the flood either; every kind must go out within its window, and every targeted kind be
    answered in it. (The huge Pops, started last, may be cut in flight: when gRPC's client copied
    their 200 MiB first, that took over the 1 s window with the default tier's two workers beside
    it, merged main, 18:10.)"""
    attacker = _attacker(quick_server, 1.0, huge_bytes=cpa.HUGE_NAME_BYTES)
    attacker.start()
    time.sleep(1.0)
    outcomes = attacker.stop()

    def kinds(*but: str) -> set[str]:
        return {k.split(" ")[0].split(":")[0] for k in outcomes if not k.endswith(but)}

    assert kinds(" running") == set(cpa.ATTACKS), outcomes  # each kind's calls went out
    assert set(cpa.ATTACKS) - {"huge"} <= kinds(" cut", " running"), outcomes  # and were answered


def test_the_drain_bound_holds_when_closing_the_channels_hangs() -> None:
    """The bound of ``end_loops`` is its whole: a cancel that does not return (a channel's close
    waits for each thread with a call on it to take its end: the GIL and a CPU, unbounded for a
    starved process) is waited for within it, not before it."""
    release = threading.Event()
    loops = neighbour.CallLoops(ends_at=time.monotonic() + 60)
    loops.start_loops([("idle", lambda: loops.stop_event.wait(60), 0.0)], "test")
    try:
        t0 = time.monotonic()
        loops.end_loops(0.5, lambda: release.wait(30))
        assert time.monotonic() - t0 < 5.0
    finally:
        release.set()


def test_the_attackers_window_ends_at_the_drills_end_however_late_it_read_the_order() -> None:
    """The drill's window ends on its clock (``go(ends_at)``): the attacker's calls'
    deadline is that end, not the moment its process read the order plus a window (a starved
    process reads it late, and its calls then outlasted the drill's window until the stop closed
    their channels). Against a server that never answers, every call it got has ended by then,
    before the drill says stop."""
    ended: list[float] = []
    release = threading.Event()

    def deaf(_request: bytes, ctx: grpc.ServicerContext) -> bytes:
        ctx.add_callback(lambda: ended.append(time.monotonic()))
        release.wait(60)
        return b""

    with _server(deaf) as address:
        attacker = cpa.attacker_process(address, Credentials(), "t0ken", "q", idle=False,
                                        kinds=("bound", "parking"))
        try:
            attacker.arm(("bound", "parking"))
            attacker.armed()
            ends_at = time.monotonic() + 2.0
            attacker.go(ends_at)
            while time.monotonic() < ends_at + 3.0 and (not ended or len(ended) < 8):
                time.sleep(0.05)
            before_stop = list(ended)
            outcomes = attacker.pause()
        finally:
            release.set()
            attacker.close()
    assert len(before_stop) >= 8 and max(before_stop) < ends_at + 2.0, (before_stop, ends_at, outcomes)
    assert outcomes and all(k.endswith(f" {neighbour.CUT}") for k in outcomes), outcomes


def test_the_attackers_threads_are_started_before_its_window_and_wait_for_the_go(quick_server: str) -> None:
    """Stop l: the placed attacker (~0.05 core) started its ~75 threads one at a time at its
    window's start, each ``Thread.start`` waiting for the new thread to run: much of a 4 s window
    could go by before its flood was whole. Armed ahead, every thread is started and sends
    nothing until the go; then each begins calling, and the attacker tells when the last did."""
    attacker = cpa._Attacker(quick_server, Credentials(), "t0ken", "q", cpa.ATTACKS, huge_bytes=1)
    attacker.arm()
    time.sleep(0.3)
    assert attacker._threads and all(t.is_alive() for _, t in attacker._threads)
    assert attacker.outcomes == {} and attacker.begun() == (0, len(attacker._threads), None)
    attacker.go(time.monotonic() + 1.0)
    time.sleep(1.0)
    begun, threads, last = attacker.begun()
    outcomes = attacker.stop()
    assert begun == threads and last is not None and 0 <= last < 1.0, (begun, threads, last)
    assert {k.split(" ")[0].split(":")[0] for k in outcomes} == set(cpa.ATTACKS), outcomes


def test_an_armed_window_never_let_go_ends_at_its_stop() -> None:
    """A window armed and stopped before its go (the drill's run ended between two windows):
    its waiting threads end within the drain bound, having sent nothing."""
    attacker = cpa._Attacker("127.0.0.1:9", Credentials(), "t0ken", "q", cpa.ATTACKS, huge_bytes=1)
    attacker.arm()
    t0 = time.monotonic()
    assert attacker.stop() == {}
    assert time.monotonic() - t0 < cpa.DRAIN_S and not any(t.is_alive() for _, t in attacker._threads)


def test_the_attacker_process_tells_its_own_times_of_each_window(quick_server: str) -> None:
    """Each window's times as the attacker measured them (stop l's one 7.7 s drain could not be
    told apart): how late it read the go and the stop, its threads calling, the join, its reply."""
    attacker = cpa.attacker_process(quick_server, Credentials(), "t0ken", "q", idle=False, kinds=("bound", "flood"))
    try:
        for kinds in (("bound",), ("bound", "flood")):
            attacker.arm(kinds)
            assert attacker.armed() >= 0
            attacker.go(time.monotonic() + 0.5)
            time.sleep(0.5)
            outcomes = attacker.pause()
            assert {k.split(" ")[0].split(":")[0] for k in outcomes} == set(kinds), outcomes
            times = attacker.times
            assert times is not None and times["begun"] == times["threads"] > 0, times
            assert all(times[k] >= 0 for k in ("go read", "last begun", "stop read", "joined", "reply")), times
            assert "stop read after" in cpa.window_times(times)
    finally:
        attacker.close()


def test_a_window_of_huge_pops_holds_nothing_of_their_size_in_the_attacker(quick_server: str) -> None:
    """Stop m: each drain over its bound was a huge Pop whose 200 MiB body gRPC's client was still
    copying, holding the attacker's GIL (and ~400 MiB of fresh memory) through the window and
    seconds past its end. Made by hand (drills/huge_call.py), a window of them leaves the
    attacker's peak RSS where a window of small calls does, and every huge call is answered."""
    from ordq.drills.control_plane import _rss

    peaks = {}
    for kinds in (("bound",), ("huge",)):
        attacker = cpa.attacker_process(quick_server, Credentials(), "t0ken", "q", idle=False, kinds=kinds)
        try:
            attacker.arm(kinds)
            attacker.armed()
            attacker.go(time.monotonic() + 1.0)
            time.sleep(1.0)
            outcomes = attacker.pause()
            assert attacker.pid is not None
            peaks[kinds[0]] = _rss(attacker.pid)[1]
        finally:
            attacker.close()
        assert [k for k in outcomes if not k.endswith((" cut", " running"))], outcomes  # answered
    assert peaks["huge"] - peaks["bound"] < 32 << 20, peaks


@contextlib.contextmanager
def _counting_relay(target: str) -> Iterator[tuple[str, list[int]]]:
    """A TCP relay to ``target``: its address, and the connections it took so far (one list item)."""
    import socket

    host, port = target.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    taken = [0]
    done = threading.Event()
    opened: list[socket.socket] = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(1 << 16):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while not done.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            taken[0] += 1
            server = socket.create_connection((host, int(port)))
            opened.extend((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", taken
    finally:
        done.set()
        listener.close()
        for s in opened:
            s.close()


def test_the_attackers_connections_are_made_before_its_first_window_and_kept(quick_server: str) -> None:
    """Stop n: the attacker built its channels and huge Pops' connections anew for each window,
    and each connected at its first call: ~9 TLS handshakes reached the leader at every go, with
    the window's first calls. Now the process connects once, before its first window, and every
    window calls over the same connections: no connection is made in a window."""
    with _counting_relay(quick_server) as (address, taken):
        attacker = cpa.attacker_process(address, Credentials(), "t0ken", "q", idle=False, kinds=cpa.ATTACKS)
        try:
            told = attacker.connect()
            made = taken[0]
            assert made == 7 + cpa.HUGE_AT_ONCE and told.startswith(f"{made} of {made} connections"), (told, made)
            for _ in range(2):
                attacker.arm(cpa.ATTACKS)
                attacker.armed()
                attacker.go(time.monotonic() + 0.5)
                time.sleep(0.5)
                outcomes = attacker.pause()
                assert {k.split(" ")[0].split(":")[0] for k in outcomes} == set(cpa.ATTACKS), outcomes
                assert not [k for k in outcomes if k.endswith(" running")], outcomes
        finally:
            attacker.close()
        assert taken[0] == made, (taken[0], made)


def test_a_stream_the_servers_http2_layer_refuses_is_named_and_judged_refused_not_untyped() -> None:
    """Stop 63's untyped UNAVAILABLE, made: a server counts a connection's calls against its
    ``grpc.max_concurrent_streams`` until it has released them (gRPC's overload protection), so
    calls the client cut while their handlers still run keep their slots, and the next call is
    refused by the HTTP/2 layer (``REFUSED_STREAM``) though the client has none in flight. The
    drill names it ``refused_stream``: a refusal (not served, not untyped), before any handler."""
    release = threading.Event()
    handled = []

    def hold(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        handled.append(1)
        release.wait(30)
        return b""

    outcomes: list[str] = []
    with _server(hold, [("grpc.max_concurrent_streams", 2)]) as address:
        ch = grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)])
        call = ch.unary_unary("/t.S/M")
        try:
            for _ in range(6):  # each cut by its deadline, its handler still holding it
                try:
                    call(b"", timeout=0.3)
                except grpc.RpcError as exc:
                    outcomes.append(cpa._outcome(exc))
        finally:
            release.set()  # the handlers end before the server stops
            ch.close()
    assert cpa.REFUSED_STREAM in outcomes and len(handled) <= 3, (outcomes, len(handled))
    assert set(outcomes) <= {"DEADLINE_EXCEEDED", cpa.REFUSED_STREAM}, outcomes
    judged = cpa.judge_attacks({"flood:Describe exhausted+hint": 2, f"flood:Describe {cpa.REFUSED_STREAM}": 40,
                                "flood:Subscribe bad_request": 1, f"flood:Subscribe {cpa.REFUSED_STREAM}": 9},
                               {"ResourceExhausted": 2, "ConfigError": 1}, ("flood",))
    assert judged and all(ok for _, ok in judged), judged
    untyped = cpa.judge_attacks({"flood:Describe exhausted+hint": 2, "flood:Describe UNAVAILABLE": 1,
                                 "flood:Subscribe bad_request": 1}, {"ResourceExhausted": 2, "ConfigError": 1},
                                ("flood",))
    assert not all(ok for _, ok in untyped), untyped
