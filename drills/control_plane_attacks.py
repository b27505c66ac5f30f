"""The attacker of the ``security-control-plane`` drill (drills/control_plane.py): hand-made
clients of the coordinator service holding real credentials (the client certificate with no
token; a consume token for one queue), in a process of its own, and the judgement of what it was
answered against what the leader counted.

Each attack outcome is the ordq error kind of the refusal (the ``ordq-error`` trailer;
``exhausted+hint``: a refused turn with its ``ordq-retry-ms`` hint), ``ok``, ``cut`` (a call the
window's end cut: every call's deadline is its window's end, and what is still in flight then is
cancelled), ``refused_stream`` (the leader's HTTP/2 layer refused the call before any handler:
``REFUSED_STREAM``, below), or the bare gRPC status when ordq did not type it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import grpc

from ordq.common.security import Credentials, channel
from ordq.coordinator.service_frame import RETRY_METADATA_KEY
from ordq.drills import neighbour
from ordq.drills.huge_call import CallEnded, HugeCall
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.errors import METADATA_KEY

HUGE_NAME_BYTES = 200 << 20  # the queue name of the huge Pop requests (a QueueRef's field 1)
HUGE_AT_ONCE = 2
# A huge Pop's thread calls again this long after its last call ended. Made by hand (huge_call.py)
# a refused call costs the attacker next to nothing, where gRPC's client first spent ~0.17 s of CPU
# copying its body (so at most ~5 calls a second a thread, unstarved). Paced so, the attack stays
# what it was: the size of a request, not a rate (``newline:anonymous`` sends a no-token Pop every
# 0.1 s).
HUGE_EVERY_S = 0.2
FLOOD_THREADS = 64
FLOOD_CONNECTIONS = 4
TARGETED_THREADS = 4  # of each attack but the huge one and the flood
# The attacker's threads have all stopped within this of its window's end (its calls' deadline,
# then cancelled): else the window reports them ``running`` and is judged failed. Stop h, with no
# deadline and the attacker at ATTACKER_SHARES: its calls in flight took 12-21 s to end.
DRAIN_S = 4.0
FORGED = "FORGED-LINE"  # what the newline attack tries to start a log line with
# The attack kinds and the leader's outcome label each refusal is counted under (the client sees
# the ordq error kind in the ``ordq-error`` trailer; "exhausted" is a refused turn, with its hint).
ATTACKS = ("huge", "flood", "bound", "parking", "undecodable", "newline")
# Not an attack: a control for measurements only (never sent unless asked for by name). ``hog``
# spins one thread in the attacker's process, so that its cgroup takes its CPU quota (0.5 core)
# and nothing else: the same windows with the attacker's CPU and no call to the coordinator.
CONTROLS = ("hog",)
HOG_SPIN_S = 0.05  # one hog "call": this long spinning, then again at once
COUNTED_AS = {"denied": "PermissionDenied", "exhausted": "ResourceExhausted", "sub_not_found": "SubscriptionNotFound"}
UNDECODABLE_RPCS = ("Pop", "Commit", "Acquire", "Describe")
# ``ORDQ_CONTROL_PLANE_ATTACKS=huge,flood`` sends only those kinds (to measure what each costs the
# neighbour); the drill then says so and fails its "every kind sent" check: only a full run is the
# acceptance (as ``ORDQ_NEIGHBOUR_ABUSE`` for the noisy-neighbour drill).
ATTACKS_ENV = "ORDQ_CONTROL_PLANE_ATTACKS"


def attack_kinds() -> tuple[str, ...]:
    """The kinds of attack this run sends (``ATTACKS_ENV``; all of them by default, never a
    control of ``CONTROLS`` unless named)."""
    kinds = neighbour.kinds_from_env(ATTACKS_ENV, ATTACKS + CONTROLS)
    return ATTACKS if kinds == ATTACKS + CONTROLS else kinds


_UNTYPED_TOLD: set[str] = set()  # the untyped refusals' details written to stderr so far
UNTYPED_TOLD_MAX = 20


# The leader's HTTP/2 layer refused the stream (RST_STREAM REFUSED_STREAM, gRPC's "overload
# protection", on by default): a connection's calls count against its ``max_streams_per_connection``
# until the server has *released* them, not until they end, so calls the attacker cut, or that
# the leader answered and its Python threads have not yet let go of, hold their slots, and past
# 100 a new call is refused before any handler sees it: it cost the leader nothing, and gRPC gives
# the leader no count of it (stop 63: 1,000s a round on the flood's connections, at 16 calls
# each in flight). tests/test_control_plane_plan.py makes one.
REFUSED_STREAM = "refused_stream"
_REFUSED_STREAM_DETAIL = "RST_STREAM with error code 7"


def _outcome(exc: grpc.RpcError) -> str:
    """An attack call's outcome: the ordq error kind of its refusal (``exhausted+hint`` for a refused
    turn carrying its retry hint), ``refused_stream`` (``REFUSED_STREAM``), else the bare gRPC
    status (not typed by ordq). Each new detail of an untyped one is written to stderr (the
    drill's output), up to UNTYPED_TOLD_MAX: which layer answered it."""
    typed = isinstance(exc, (grpc.Call, CallEnded))  # CallEnded: a hand-made call's, read alike
    trailers = dict(exc.trailing_metadata() or ()) if typed else {}
    raw = trailers.get(METADATA_KEY)
    if raw:
        kind = str(json.loads(raw)["kind"])
        return kind + ("+hint" if RETRY_METADATA_KEY in trailers else "")
    name = exc.code().name if typed else type(exc).__name__
    details = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
    if name == "UNAVAILABLE" and _REFUSED_STREAM_DETAIL in details:
        return REFUSED_STREAM
    if name not in ("DEADLINE_EXCEEDED", "CANCELLED") and len(_UNTYPED_TOLD) < UNTYPED_TOLD_MAX:
        told = f"{name}: {details}"[:300]
        if told not in _UNTYPED_TOLD:
            _UNTYPED_TOLD.add(told)
            print(f"attacker: an untyped refusal: {told}", file=sys.stderr, flush=True)
    return name


CONNECT_S = 10.0  # the attacker's connections, made before its first window, each within this


class _Links:
    """The attacker's connections to the leader, one per channel (gRPC shares one between
    channels alike unless told not to: a plaintext cluster's "4 connections" were one), and one
    per huge Pop (by hand); the token travels in each call's metadata.

    In the drill's attacker process they are made once, before its first window (``connect``),
    and reused by every window, as a persistent client's are (stop n: built anew for each window
    and connected at its first call, ~9 TLS handshakes reached the leader at every go, with the
    window's first calls). A call in flight at a window's end ends at its deadline, that end."""

    def __init__(self, address: str, creds: Credentials, huge_bytes: int) -> None:
        self.address, self.anonymous = address, attrs.evolve(creds, token=None)
        self.channels: list[grpc.Channel] = []
        self.own = pb_grpc.CoordinatorStub(self._channel())  # type: ignore[no-untyped-call]
        self.raw = self._channel()
        self.no_token = pb_grpc.CoordinatorStub(self._channel())  # type: ignore[no-untyped-call]
        self.flood = [pb_grpc.CoordinatorStub(self._channel())  # type: ignore[no-untyped-call]
                      for _ in range(FLOOD_CONNECTIONS)]
        self.huge = [HugeCall(address, self.anonymous, "/ordq.v1.Coordinator/Pop", 1, huge_bytes)
                     for _ in range(HUGE_AT_ONCE)]

    def _channel(self) -> grpc.Channel:
        ch = channel(self.address, self.anonymous, [("grpc.use_local_subchannel_pool", 1)])
        self.channels.append(ch)
        return ch

    def connect(self, timeout_s: float = CONNECT_S) -> tuple[int, int]:
        """Every connection made now: (how many are up, how many there are)."""
        up = 0
        for ch in self.channels:
            try:
                grpc.channel_ready_future(ch).result(timeout=timeout_s)
                up += 1
            except grpc.FutureTimeoutError:
                pass
        for call in self.huge:
            try:
                call.open(timeout_s)
                up += 1
            except (OSError, CallEnded):
                pass
        return up, len(self.channels) + len(self.huge)

    def close(self) -> None:
        """Every call in flight ended at once (the huge Pops' sockets shut, the channels closed)."""
        for call in self.huge:  # first: each ends its call in flight at once
            call.close()
        for ch in self.channels:
            with contextlib.suppress(Exception):
                ch.close()


class _Attacker(neighbour.CallLoops):
    """One window of every attack, in threads, until ``stop``; outcomes counted per attack (an
    attack's sub-kind after a colon: ``newline:anonymous``, ``flood:Subscribe``). Over ``links``
    when given (the process's, kept after ``stop``), else over links of its own, closed at
    ``stop`` (which so cancels the calls in flight)."""

    def __init__(self, address: str, creds: Credentials, token: str, queue: str, kinds: tuple[str, ...],
                 ends_at: float | None = None, huge_bytes: int = HUGE_NAME_BYTES, links: _Links | None = None
                 ) -> None:
        self.queue, self.kinds = queue, kinds
        self.md = (("authorization", f"Bearer {token}"),)
        super().__init__(_outcome, ends_at)
        self._own_links = links is None
        self.links = links if links is not None else _Links(address, creds, huge_bytes)
        self._made_up = 0

    def _call(self, method: Callable[..., object], request: object) -> Callable[[], object]:
        """``method(request)`` with the token, as a loop's call ending with the window."""
        return self.timed(method, lambda: request, metadata=self.md)

    def _name(self, prefix: str) -> str:
        with self._lock:
            self._made_up += 1
            return f"{prefix}{self._made_up}"

    def start(self) -> None:
        """The window's attacks, at once (its end given at construction)."""
        self.start_loops(self._loops(), "attack")

    def arm(self) -> None:
        """The window's attacks, each thread started and waiting for ``go``."""
        self.arm_loops(self._loops(), "attack")

    def go(self, ends_at: float) -> None:
        self.open_loops(ends_at)

    def _loops(self) -> list[tuple[str, Callable[[], object], float]]:
        loops: list[tuple[str, Callable[[], object], float]] = []
        # Started in this order, the huge Pops last: in stop i's run A the attacks started after the
        # huge Pops and the flood (bound, parking, undecodable, newline) were never sent in its 4 s
        # windows, the starved attacker's threads starting after the window's end (the huge Pops'
        # 200 MiB bodies, then copied by gRPC's client, held the GIL; since stop n none is copied).
        # Each of these in TARGETED_THREADS threads: the token is the flood's, so most of its calls
        # are refused a turn (RESOURCE_EXHAUSTED) before their body is read; the guard behind the
        # turn must still be reached (its own refusal seen) in every run.
        own = self.links.own
        forged = pb.QueueRef(queue=f"{self.queue}\n{FORGED} coordinator elected")
        garbage = b"\xff\xff\xff\xff\x0f" + b"\x00" * 64
        raw = self.links.raw
        for i in range(TARGETED_THREADS):
            if "bound" in self.kinds:
                loops.append(("bound", self.timed(own.Subscribe, lambda: pb.SubscribeRequest(
                    queue=self.queue, subscription=self._name("over")), metadata=self.md), 0.05))
            if "parking" in self.kinds:
                loops.append(("parking", self.timed(own.EnsureParkingQueue, lambda: pb.SubscriptionRef(
                    queue=self.queue, subscription=self._name("made-up")), metadata=self.md), 0.05))
            if "undecodable" in self.kinds:
                rpc = UNDECODABLE_RPCS[i % len(UNDECODABLE_RPCS)]
                loops.append((f"undecodable:{rpc}",
                              self._call(raw.unary_unary(f"/ordq.v1.Coordinator/{rpc}"), garbage), 0.05))
            if "newline" in self.kinds:
                loops.append(("newline:token", self._call(own.Pop, forged), 0.05))
        if "newline" in self.kinds:
            loops.append(("newline:anonymous", self.timed(self.links.no_token.Pop, lambda: forged), 0.1))
        if "flood" in self.kinds:  # one token, 64 threads, 4 connections, Describe and Subscribe as fast as answered
            for i in range(FLOOD_THREADS):
                stub = self.links.flood[i % FLOOD_CONNECTIONS]
                if i % 2:
                    describe = pb.DescribeRequest(queue=self.queue, with_config=True, with_live=True)
                    loops.append(("flood:Describe", self._call(stub.Describe, describe), 0.0))
                else:
                    subscribe = pb.SubscribeRequest(queue=self.queue, subscription=f"flood{i}")
                    loops.append(("flood:Subscribe", self._call(stub.Subscribe, subscribe), 0.0))
        if "huge" in self.kinds:  # the certificate, no token; a connection each, by hand (drills/huge_call.py)
            for huge_pop in self.links.huge:
                loops.append(("huge", self.timed(huge_pop, lambda: None), HUGE_EVERY_S))
        if "hog" in self.kinds:  # a control: the cgroup's quota of CPU, no call at all
            loops.append(("hog", lambda: neighbour.spin(HOG_SPIN_S), 0.0))
        return loops

    def stop(self) -> dict[str, int]:
        """End the window: the calls in flight cancelled (its own links closed; the process's
        end at their deadline, the window's end, which the drill's stop follows), the threads
        waited for ``DRAIN_S``."""
        return self.end_loops(DRAIN_S, self.links.close if self._own_links else lambda: None)


def _attacker_process(address: str, creds: Credentials, token: str, queue: str, conn: Any, idle: bool,
                      kinds: tuple[str, ...]) -> None:
    """The attacker's own process (spawned). Orders: ``("connect",)`` makes its connections to the
    leader (``_Links``, kept for every window; answered ``("connected", up, of, s it took)``;
    without it each connects at its first call); ``("arm", some)`` builds the next window of
    the attacks of ``kinds`` among ``some``, its threads started and waiting (answered
    ``("armed", s it took)``); ``("go", ends_at, sent_at)`` lets them go until ``ends_at``;
    ``("stop", sent_at)`` ends the window, answered ``(outcomes, its own times, sent_at)``
    (``AttackerProcess``); anything else ends the process. Every time is a ``time.monotonic()``:
    one clock for every process here, so the drill's end holds however late this process read
    the order, and each delay is told where it was spent."""
    priority = neighbour.idle_priority() if idle else "normal priority"
    conn.send(("ready", priority))
    links = _Links(address, creds, HUGE_NAME_BYTES)
    attacker: _Attacker | None = None
    times: dict[str, float] = {}
    try:
        while True:
            order = conn.recv()
            read_at = time.monotonic()
            if order[0] == "connect":
                up, of = links.connect()
                conn.send(("connected", up, of, time.monotonic() - read_at))
            elif order[0] == "arm":
                attacker = _Attacker(address, creds, token, queue, tuple(k for k in order[1] if k in kinds),
                                     links=links)
                attacker.arm()
                conn.send(("armed", time.monotonic() - read_at))
            elif order[0] == "go" and attacker is not None:
                attacker.go(order[1])
                times = {"go read": read_at - order[2]}
            elif order[0] == "stop" and attacker is not None:
                begun, threads, last = attacker.begun()
                outcomes = attacker.stop()
                times |= {"threads": threads, "begun": begun, "last begun": -1.0 if last is None else last,
                          "stop read": read_at - order[1], "joined": time.monotonic() - read_at}
                attacker = None
                conn.send((outcomes, times, time.monotonic()))
            else:
                break
    finally:  # an interrupted drill (EOFError, KeyboardInterrupt): a window in flight stopped first,
        if attacker is not None:  # so that its threads do not call on closed channels (a traceback each)
            attacker.stop()
        links.close()


class AttackerProcess(neighbour.WindowedProcess):
    """``_Attacker`` in a process of its own (drills/neighbour.py ``WindowedProcess``), each window
    armed ahead (``arm``, ``armed``), then let go (``go``) and ended (``pause``); ``times``: the
    last window's own times, as the attacker measured them (``window_times``)."""

    times: dict[str, float] | None = None

    def connect(self) -> str:
        """Make the attacker's connections to the leader now, kept for every window: told."""
        self.send(("connect",))
        _what, up, of, took = self.reply("make its connections")
        return f"{up} of {of} connections made in {took:.2f} s"

    def arm(self, kinds: tuple[str, ...]) -> None:
        """Build the next window of ``kinds`` in the process, its threads started (not waited for)."""
        self.send(("arm", kinds))

    def armed(self) -> float:
        """Wait until the last ``arm`` is done: the s it took in the process."""
        _what, took = self.reply("arm its window")
        return float(took)

    def go(self, ends_at: float) -> None:  # type: ignore[override]
        """Let the armed window go, until ``ends_at`` (a ``time.monotonic()``)."""
        self.send(("go", ends_at, time.monotonic()))

    def pause(self) -> dict[str, int]:
        self.send(("stop", time.monotonic()))
        outcomes, times, sent_at = self.reply("end its window")
        self.times = {**times, "reply": time.monotonic() - sent_at}
        return dict(outcomes)


def window_times(times: dict[str, float] | None) -> str:
    """The attacker's own times of a window, told (``AttackerProcess.times``)."""
    if not times:
        return "not told"
    last = times.get("last begun", -1.0)
    return (f"go read after {times['go read']:.2f} s, {times['begun']:.0f} of {times['threads']:.0f} threads "
            f"calling" + (f" (the last {last:.2f} s after the go)" if last >= 0 else "")
            + f"; stop read after {times['stop read']:.2f} s, threads joined in {times['joined']:.2f} s, "
            f"reply read after {times['reply']:.2f} s")


def attacker_process(address: str, creds: Credentials, token: str, queue: str, *, idle: bool,
                     kinds: tuple[str, ...]) -> AttackerProcess:
    """``_Attacker`` in a process of its own (``AttackerProcess``); each ``pause`` is answered
    within ``DRAIN_S`` or reports the threads still running (the drill judges how long each took;
    it gives up on the process only after a minute, a round lost rather than a verdict)."""
    return AttackerProcess(_attacker_process, (address, creds, token, queue), (idle, kinds), name="attacker",
                           end_s=60)


def _server_label(attack: str, outcome: str) -> str | None:
    """The leader's outcome label an attack's refusal is counted under (None: not a refusal)."""
    kind = outcome.split("+")[0]
    if kind in COUNTED_AS:
        return COUNTED_AS[kind]
    if kind == "bad_request":
        return {"bound": "ConfigError", "flood": "ConfigError", "undecodable": "Undecodable",
                "newline": "InvalidName"}.get(attack)
    return None


# The refusal each attack must have got at least once (besides a refused turn, "exhausted+hint"),
# over its calls of every method ("undecodable": Pop, Commit, Acquire and Describe together).
OWN_REFUSAL = {"huge": "denied", "flood:Describe": "exhausted+hint", "flood:Subscribe": "bad_request",
               "bound": "bad_request", "parking": "sub_not_found", "undecodable": "bad_request",
               "newline:token": "bad_request", "newline:anonymous": "denied"}


def judge_attacks(outcomes: dict[str, int], counted: dict[str, float], kinds: tuple[str, ...] = ATTACKS
                  ) -> list[tuple[str, bool]]:
    """Every attack refused (``flood:Describe`` may be served: a consume token may describe its
    queue; its excess is refused) with its own refusal seen, and counted by the leader. A call
    its window's end cut (``cut``) is neither served nor refused; one the leader's HTTP/2 layer
    refused (``refused_stream``) is refused, uncounted (the leader has no count of it); a thread
    still running after its window's drain (``running``) fails its attack."""
    out: list[tuple[str, bool]] = []
    per: dict[str, dict[str, int]] = {}
    for key, n in outcomes.items():
        what, _, outcome = key.partition(" ")
        per.setdefault(what, {})[outcome] = n
    for what, own in OWN_REFUSAL.items():
        if what.split(":")[0] not in kinds:
            continue
        seen: dict[str, int] = {}
        for sub, outcomes_of in per.items():
            if sub == what or sub.startswith(what + ":"):
                for outcome, n in outcomes_of.items():
                    seen[outcome] = seen.get(outcome, 0) + n
        served = seen.get("ok", 0) if what != "flood:Describe" else 0
        # A call its window's end cut was neither answered nor refused: told, never its refusal.
        untyped = {k: v for k, v in seen.items()
                   if k not in (own, "exhausted+hint", "ok", neighbour.CUT, REFUSED_STREAM)}
        out.append((f"{what}: refused {own} {seen.get(own, 0)}x ({seen or 'never sent'})",
                    seen.get(own, 0) > 0 and not served and not untyped))
    expected: dict[str, int] = {}
    for what, seen in per.items():
        for outcome, n in seen.items():
            label = _server_label(what.split(":")[0], outcome)
            if label is not None:
                expected[label] = expected.get(label, 0) + n
    for label, n in sorted(expected.items()):
        out.append((f"the leader counted {label}: {counted.get(label, 0):.0f} >= the attacker's {n}",
                    counted.get(label, 0) >= n))
    return out
