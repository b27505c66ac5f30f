"""The noisy-neighbour drill (docs/SECURITY.md, "Isolation, measured"; issue 25): a token holder
abuses its own queue (huge fetches, unread streams, oversized and malformed requests) beside
the drill queue on the same broker; the drill queue's ack p99, pooled over abuse windows
interleaved with quiet ones, stays within 2x of the quiet windows' and it never fails over.
The abuser's client runs in its own process placed as a host of its own (one CPU, a CPU quota
and a low weight in a cgroup of its own, ``place_abuser``), and the cluster keeps its CPU
(``ordq.drills.cpu_isolation``; without cgroups: idle priority, and the output says so).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import grpc

from ordq.common.metrics import scrape_or_none, value
from ordq.common.security import Credentials, token_metadata
from ordq.coordinator.tokens import create_token, revoke_token, touch
from ordq.drills import cpu_isolation, device_stalls
from ordq.drills.runner import DrillContext
from ordq.drills.security import Stub, denied, fetch_call, within
from ordq.drills.workload import now_us
from ordq.wire import ordq_pb2 as pb

NEIGHBOUR_RATE = 2_000.0  # the drill queue's producer: msgs/s while its neighbour is abused
NEIGHBOUR_MESSAGES = 260_000  # 130 s: the fault comes at 20-60 % of the stream; the fill and the windows
# after it take ~50 s: the drill queue must still be written through the last window
SETTLE_S = 2.0  # after the abuser's fill, before the first quiet window
ROUNDS = 4  # quiet and abuse windows, interleaved: the baseline is pooled from the same minutes
QUIET_S = 3.0  # each quiet window (the drill queue alone)
ABUSE_S = 4.0  # each abuse window
RECOVER_S = 1.0  # after each abuse window ends, still judged as abused (what the abuse left behind)
ABUSER_CORES = 0.5  # the abuser's "host": its client's CPU quota where cgroups are available
FILL_MESSAGES = 24_000  # 1,000-byte messages the abuser writes first: what its huge fetches read
FILL_RATE = 4_000.0  # msgs/s of that fill (4 MB/s)
LATENCY_RATIO = 2.0  # the drill queue's ack p99 under abuse / quiet
HUGE = (1 << 32) - 1  # max_bytes the abuser asks for
OVERSIZED_BYTES = 30 << 20  # a request body past the broker's receive limit (25 MiB by default)
# The kinds of abuse, each on its own: ``ORDQ_NEIGHBOUR_ABUSE=huge,malformed`` sends only those (to
# measure what each costs the neighbour); the drill then says so, and only a run with all of them
# is the acceptance. ``none`` is the idle control: the abuser's process placed and windowed as in
# a real run, sending nothing (what the ratio is when nothing is abused).
ABUSE_KINDS = ("huge", "streams", "oversized", "malformed")
IDLE_CONTROL = "none"
# The CPU control: nothing sent, a thread of the abuser's process spinning (~0.1-0.2 core) in the
# cluster's own cgroup on every CPU (as the control-plane drill's ``hog`` window): what any extra
# work of that size beside the cluster costs the neighbour, the broker aside.
HOG_CONTROL = "hog"
HOG_SPIN_S, HOG_PAUSE_S = 0.002, 0.004  # spin 2 ms, then wait 4 ms: 2/8 ms measured 0.09-0.14 core (stop 63)
CONTROLS = (IDLE_CONTROL, HOG_CONTROL)  # measurements, each alone
ABUSE_ENV = "ORDQ_NEIGHBOUR_ABUSE"


def kinds_from_env(env: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds a run sends: those the environment variable ``env`` names (comma-separated),
    every one of ``known`` by default; ValueError naming an unknown one."""
    asked = tuple(k.strip() for k in os.environ.get(env, "").split(",") if k.strip())
    unknown = [k for k in asked if k not in known]
    if unknown:
        raise ValueError(f"{env}: unknown kind(s) {unknown}; known: {', '.join(known)}")
    return asked or known


def abuse_kinds() -> tuple[str, ...]:
    """The kinds of abuse this run sends (``ABUSE_ENV``; all of them by default; none for
    ``IDLE_CONTROL``; ``(HOG_CONTROL,)`` for the CPU control)."""
    kinds = kinds_from_env(ABUSE_ENV, (*ABUSE_KINDS, *CONTROLS))
    if kinds == (*ABUSE_KINDS, *CONTROLS):  # nothing named: every kind of abuse
        return ABUSE_KINDS
    for control in CONTROLS:
        if control in kinds and len(kinds) > 1:
            raise ValueError(f"{ABUSE_ENV}: {control!r} (a control) goes alone, not with {kinds}")
    return () if kinds == (IDLE_CONTROL,) else kinds


def neighbour_load(load: Any) -> Any:
    """The neighbour drill's load (the control-plane drill's too): 2,000 msgs/s, long enough for
    every window, and the drill queue's producer with the SDK's own send timeout.

    Why the SDK's (2 s) and not the fail-over drills' 1 s (runner.LoadConfig: how fast a hung
    head is given up, what those drills measure): these drills judge what an abuser does to a
    producer as users run it, and count any fail-over against the abuse. With 1 s, a freeze of
    the machine's disk of 1,023 ms (I/O in flight, none completed; stop 65, control-plane run
    6502, round 1, the acks' p99 within bounds) failed the producer over by itself."""
    from ordq.sdk import ProducerConfig

    default = attrs.fields(ProducerConfig).send_timeout_s.default
    return attrs.evolve(load, rate=NEIGHBOUR_RATE, messages=NEIGHBOUR_MESSAGES, send_timeout_s=default)


def _raw(s: Stub, method: str) -> Any:
    """A unary call of the broker's that sends and returns bytes as they are (no protobuf)."""
    return s.channel.unary_unary(f"/ordq.v1.Broker/{method}")


CUT = "cut"  # the outcome of a call its window's end cut (``CallLoops.timed``): neither answered nor refused


class WindowEnded(Exception):
    """A call of ``CallLoops.timed`` that its window's end cut: its deadline (the window's end)
    passed, or ``end_loops`` cancelled it in flight."""


class CallLoops:
    """Calls made over and over, each loop in a thread of its own, until ``stop``: each call's
    outcome counted as ``"<what> <outcome>"`` (``outcome(exc)`` names a refusal; ``ok``). The
    base of a window's hand-made client (the abuser here, the control plane's attacker).

    With ``ends_at`` (a ``time.monotonic()``), the window has an end: the loops stop there by
    themselves, a ``timed`` call's deadline is that end, and ``end_loops`` cancels what is still
    in flight (its ``cancel``: closing the calls' channels) and waits a bounded time for the
    threads. ``arm_loops`` starts the threads ahead of the window, each waiting for
    ``open_loops(ends_at)``."""

    def __init__(self, outcome: Callable[[grpc.RpcError], str] | None = None, ends_at: float | None = None) -> None:
        self.stop_event = threading.Event()
        self.outcomes: dict[str, int] = {}
        self.ends_at = ends_at
        self.opened_at: float | None = None  # when ``open_loops`` let armed threads go
        self.first_calls: list[float] = []  # when each thread began its first call
        self._lock = threading.Lock()
        self._threads: list[tuple[str, threading.Thread]] = []
        self._outcome = outcome or grpc_status
        self._open = threading.Event()
        self._open.set()

    def _ended(self) -> bool:
        return self.stop_event.is_set() or (self.ends_at is not None and time.monotonic() >= self.ends_at)

    def _count(self, what: str, call: Callable[[], object]) -> None:
        try:
            call()
            outcome = "ok"
        except WindowEnded:
            outcome = CUT
        except grpc.RpcError as exc:
            outcome = self._outcome(exc)
        with self._lock:
            self.outcomes[f"{what} {outcome}"] = self.outcomes.get(f"{what} {outcome}", 0) + 1

    def _loop(self, what: str, call: Callable[[], object], every_s: float) -> None:
        self._open.wait()
        if not self._ended():
            with self._lock:
                self.first_calls.append(time.monotonic())
        while not self._ended():
            self._count(what, call)
            if every_s:
                self.stop_event.wait(every_s)

    def timed(self, method: Any, request_of: Callable[[], object], **kwargs: Any) -> Callable[[], object]:
        """A loop's call of the unary ``method`` (``request_of()`` its request) that ends with the
        window (``ends_at``, required): its deadline the window's end, cancelled in flight by
        ``end_loops`` (its channel closed); either is ``WindowEnded``. A deadline or a
        cancellation before the window's end is no cut: it stays the refusal it is.

        A blocking call, as before stop i: its thread waits in gRPC's core, and closing its
        channel ends it. (Run A of stop i, with ``future()`` calls and the huge Pops' and the
        flood's threads started first, never sent the attacks started after them:
        control_plane_attacks ``_Attacker.start``.) A call whose request gRPC's client would
        copy for long is made by hand instead (drills/huge_call.py; stop m)."""

        def call() -> object:
            assert self.ends_at is not None, "a timed call needs the window's end"
            left = self.ends_at - time.monotonic()
            if left <= 0 or self.stop_event.is_set():
                raise WindowEnded
            try:
                return method(request_of(), timeout=left, **kwargs)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED) and self._ended():
                    raise WindowEnded from exc
                raise
            except ValueError as exc:  # its channel closed by end_loops' cancel as the call began
                if self.stop_event.is_set():
                    raise WindowEnded from exc
                raise
        return call

    def start_loops(self, loops: list[tuple[str, Callable[[], object], float]], prefix: str) -> None:
        """One thread per (what, call, pause between calls)."""
        for what, call, every_s in loops:
            t = threading.Thread(target=self._loop, args=(what, call, every_s), name=f"{prefix}-{what}", daemon=True)
            t.start()
            self._threads.append((what, t))

    def arm_loops(self, loops: list[tuple[str, Callable[[], object], float]], prefix: str) -> None:
        """``start_loops`` ahead of the window: each thread waits for ``open_loops``. Starting a
        thread waits until it runs, which a starved process (the placed attacker: ~0.05 core, stop
        l) pays for each of its ~75 threads: started in its window, much of the window went by."""
        self._open.clear()
        self.start_loops(loops, prefix)

    def open_loops(self, ends_at: float) -> None:
        """Let the armed threads go, their window ending at ``ends_at`` (a ``time.monotonic()``)."""
        self.ends_at, self.opened_at = ends_at, time.monotonic()
        self._open.set()

    def begun(self) -> tuple[int, int, float | None]:
        """(threads that began a call, threads, s from ``open_loops`` until the last of them began)."""
        with self._lock:
            firsts = list(self.first_calls)
        last = max(firsts) - self.opened_at if firsts and self.opened_at is not None else None
        return len(firsts), len(self._threads), last

    def join_loops(self, timeout_s: float) -> dict[str, int]:
        """End the window: each thread finishes its call in flight (none is cancelled)."""
        self.stop_event.set()
        for _what, t in self._threads:
            t.join(timeout_s)
        return dict(self.outcomes)

    def end_loops(self, bound_s: float, cancel: Callable[[], object]) -> dict[str, int]:
        """End the window now: the calls still in flight cancelled (``cancel``), the cancel and
        the threads waited for ``bound_s`` in all; one ``"<what> running"`` outcome for each
        thread still running then (a window that did not end)."""
        deadline = time.monotonic() + bound_s
        self.stop_event.set()
        self._open.set()  # armed threads never let go end too
        # Closing a channel waits until each thread with a call on it has taken its end (the GIL,
        # a CPU): unbounded for a starved process, so in a thread of its own, within the bound.
        closing = threading.Thread(target=cancel, name="end-loops-cancel", daemon=True)
        closing.start()
        closing.join(max(0.0, deadline - time.monotonic()))
        for _what, t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            out = dict(self.outcomes)
        for what, t in self._threads:
            if t.is_alive():
                out[f"{what} running"] = out.get(f"{what} running", 0) + 1
        return out


def grpc_status(exc: grpc.RpcError) -> str:
    return exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__


class _Abuser(CallLoops):
    """One token holder's abuse of its own queue, in threads, until ``stop``: huge fetches (the
    answers read), Read streams never read, produce streams never written, request bodies past
    the receive limit, malformed requests. Each outcome is counted by its gRPC status."""

    def __init__(self, address: str, creds: Credentials, queue: str, seg: int,
                 kinds: tuple[str, ...] = ABUSE_KINDS, connections: list[Stub] | None = None) -> None:
        self.address, self.creds, self.queue, self.seg = address, creds, queue, seg
        self.kinds = kinds
        super().__init__()
        self._ready = list(connections or ())  # made before the window (``connected``), used first
        self._stubs: list[Stub] = []
        self._held: list[Any] = []  # unread streams: a dropped call object is cancelled

    def _stub(self) -> Stub:
        s = self._ready.pop() if self._ready else Stub(self.address, self.creds)
        self._stubs.append(s)
        return s

    def start(self) -> None:
        huge = pb.FetchRequest(queue=self.queue, seg=self.seg, offset=0, max_bytes=HUGE, max_wait_ms=0,
                               known_end=-1)
        if "streams" in self.kinds:
            for _ in range(8):  # 24 Read streams on 8 connections, never read
                s = self._stub()
                for _ in range(3):
                    self._held.append(s.stub.Read(attrs_evolve_read(huge), metadata=s.metadata,
                                                  timeout=ABUSE_S * 6))
            for _ in range(10):  # produce streams never written to
                s = self._stub()
                requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
                self._held.append((requests, s.stub.Produce(iter(requests.get, None), metadata=s.metadata)))
        body = huge.SerializeToString()
        loops: list[tuple[str, Callable[[], object], float]] = []
        meta = token_metadata(self.creds)

        def fetcher() -> Callable[[], object]:
            fetch = _raw(self._stub(), "Fetch")
            return lambda: fetch(body, metadata=meta, timeout=30)

        if HOG_CONTROL in self.kinds:
            loops.append(("hog spin", lambda: spin(HOG_SPIN_S), HOG_PAUSE_S))
        if "huge" in self.kinds:  # huge fetches, answers read (as bytes: the abuser's own CPU spared)
            loops += [("huge fetch", fetcher(), 0.0) for _ in range(4)]
        if "oversized" in self.kinds:
            oversized = _raw(self._stub(), "Fetch")
            padding = b"\x00" * OVERSIZED_BYTES
            loops.append(("oversized request", lambda: oversized(body + length_delimited(15, padding), metadata=meta,
                                                                timeout=30), 0.5))
        if "malformed" in self.kinds:
            garbage = _raw(self._stub(), "Fetch")
            loops.append(("malformed request", lambda: garbage(b"\xff\xff\xff\xff\x0f" + b"\x00" * 64,
                                                              metadata=meta, timeout=10), 0.02))
            s = self._stub()
            bad_batch = pb.ProduceRequest(queue=self.queue, seg=self.seg, epoch=1, batches=[b"\x07" * 200])
            loops.append(("malformed batch",
                          lambda: list(s.stub.Produce(iter([bad_batch]), metadata=s.metadata, timeout=10)), 0.02))
        self.start_loops(loops, "abuse")

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        for held in self._held:
            if isinstance(held, tuple):
                held[0].put(None)
            else:
                held.cancel()
        outcomes = self.join_loops(35)
        for s in self._stubs:
            with contextlib.suppress(Exception):
                s.channel.close()
        return outcomes


def connections_of(kinds: tuple[str, ...]) -> int:
    """The connections a window of these kinds opens (``_Abuser.start``: one per ``_stub``)."""
    return 18 * ("streams" in kinds) + 4 * ("huge" in kinds) + ("oversized" in kinds) + 2 * ("malformed" in kinds)


def connected(address: str, creds: Credentials, n: int, timeout_s: float = 10.0) -> list[Stub]:
    """``n`` connections of the abuser's, opened at once and waited for (``timeout_s`` in all;
    one not up by then connects on its first call)."""
    stubs = [Stub(address, creds) for _ in range(n)]
    deadline = time.monotonic() + timeout_s
    for f in [grpc.channel_ready_future(s.channel) for s in stubs]:
        with contextlib.suppress(grpc.FutureTimeoutError):
            f.result(timeout=max(0.0, deadline - time.monotonic()))
    return stubs


def spin(seconds: float) -> None:
    """Take a CPU for ``seconds``, doing nothing (a hog control's call; both drills')."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


ABUSER_START_S = 60.0  # how long the abuser's process may take to start (a loaded box)


def idle_priority() -> str:
    """Make this process (and the threads it starts afterwards: gRPC's included) run only on CPU
    nothing else wants: nice 19 and, where Linux allows it, SCHED_IDLE. Returns what was set."""
    os.nice(19 - os.nice(0))
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError, PermissionError):
        return "nice 19"
    return "nice 19, SCHED_IDLE"


def _abuser_process(address: str, creds: Credentials, queue_: str, seg: int, conn: Any, idle: bool,
                    kinds: tuple[str, ...] = ABUSE_KINDS) -> None:
    """The abuser's own process (spawned): at idle priority if ``idle``; each ``go`` starts a
    window of abuse, the next ``stop`` ends it (everything it opened closed) and sends back its
    outcomes; ``exit`` ends the process.

    Each window's connections are opened before it: the first window's before "ready", the
    next one's at the end of this one, before its outcomes go back (so within the span judged
    abused: ``pause`` waits for them). Opened at the window's start instead, the abuser's 25
    TLS handshakes (~0.75 ms of the broker's CPU each, and as much of the abuser's own on the
    same 2-core machine, which in production is another host's) landed on its first calls:
    40-65 % of the abused windows' slowest 1 % of acks came in their first 500 ms
    (docs/BENCHMARKS.md, stop 70)."""
    priority = idle_priority() if idle else "normal priority"
    ready = connected(address, creds, connections_of(kinds))
    conn.send(("ready", priority))
    while conn.recv() == "go":
        abuser = _Abuser(address, creds, queue_, seg, kinds, ready)
        abuser.start()
        conn.recv()
        outcomes = abuser.stop()
        ready = connected(address, creds, connections_of(kinds))
        conn.send(outcomes)


class WindowedProcess:
    """A hand-made client in a process of its own, driven in windows. In production an abuser
    is on another host: its client's CPU (TLS, gRPC threads, reading huge answers) is not taken
    from the cluster or the neighbour's clients. The drill puts this process in a cgroup under a
    CPU quota (``ordq.drills.cpu_isolation``); where there are no cgroups it runs at idle
    priority. ``target(*head, conn, *tail)`` runs in the child: it sends ``(ready, priority)``,
    then for each "go" starts a window and for the next message ends it and sends its
    outcomes; "exit" ends it. ``go()`` starts one window, ``pause()`` ends it and returns them."""

    def __init__(self, target: Callable[..., None], head: tuple[Any, ...], tail: tuple[Any, ...], *, name: str,
                 end_s: float) -> None:
        mp = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
        self._name, self._end_s = name, end_s
        self._conn, child = mp.Pipe()
        self._proc = mp.Process(target=target, args=(*head, child, *tail), name=f"ordq-{name}", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(ABUSER_START_S):
            self.close()
            raise RuntimeError(f"the {name}'s process did not start within {ABUSER_START_S:g} s")
        _ready, self.priority = self._conn.recv()
        assert self._proc.pid is not None  # started above
        self.pid: int = self._proc.pid

    def send(self, order: Any) -> None:
        self._conn.send(order)

    def reply(self, to: str) -> Any:
        """The process's answer to its last order (``to`` names it), within ``end_s``."""
        if not self._conn.poll(self._end_s):
            raise RuntimeError(f"the {self._name} did not {to} within {self._end_s:g} s")
        return self._conn.recv()

    def go(self) -> None:
        """Start a window."""
        self.send("go")

    def pause(self) -> dict[str, int]:
        self.send("stop")
        outcomes: dict[str, int] = self.reply("end its window")
        return outcomes

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send("exit")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
        self._conn.close()


def abuser_process(address: str, creds: Credentials, queue_: str, seg: int, *, idle: bool,
                   kinds: tuple[str, ...] = ABUSE_KINDS) -> WindowedProcess:
    """``_Abuser`` in a process of its own (``WindowedProcess``): ``go()`` starts one window
    of abuse, ``pause()`` ends it (streams cancelled, calls finished)."""
    return WindowedProcess(_abuser_process, (address, creds, queue_, seg), (idle, kinds), name="abuser", end_s=60)


def attrs_evolve_read(req: pb.FetchRequest) -> pb.FetchRequest:
    """``req`` as a Read stream's request (held open a minute)."""
    out = pb.FetchRequest()
    out.CopyFrom(req)
    out.stream_ms = 60_000
    return out


def field_header(number: int, length: int) -> bytes:
    """The tag and length of a protobuf length-delimited field ``number`` of ``length`` bytes."""
    n, varint = length, bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([(number << 3) | 2]) + bytes(varint)


def length_delimited(number: int, data: bytes) -> bytes:
    """``data`` as protobuf length-delimited field ``number``: a request made by hand, as large
    as wanted (field 15, which FetchRequest does not have, keeps it well-formed)."""
    return field_header(number, len(data)) + data


def _fill(c: Any, queue_: str, creds: Credentials) -> None:
    """The abuser writes its own queue first (what its huge fetches then read)."""
    from ordq.sdk import Producer, ProducerConfig

    producer = Producer(ProducerConfig(zk_hosts=c.zk_hosts, root=c.root, queue=queue_, credentials=creds,
                                       send_timeout_s=10.0))
    producer.start()
    try:
        payload = b"n" * 1000
        start = time.monotonic()
        for i in range(FILL_MESSAGES):
            if i % 100 == 0:  # paced: a bulk writer at full speed delays the neighbour's acks by itself
                time.sleep(max(0.0, start + i / FILL_RATE - time.monotonic()))
            producer.send(payload)
        producer.flush(timeout_s=120)
    finally:
        producer.close()


def cpu_seconds(pids: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far, from /proc; ``machine busy``:
    the whole machine's non-idle CPU seconds; ``machine steal``: of them, the seconds the host ran
    something else on this guest's CPUs (a page the host has to back first is one). What the
    drill reports beside the p99 to say where the CPU went."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
    with contextlib.suppress(OSError, ValueError):
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        out["machine busy"] = (sum(cpu) - cpu[3] - cpu[4]) / tick
        out["machine steal"] = cpu[7] / tick
    return out


def _cpu_story(a: dict[str, float], b: dict[str, float], seconds: float) -> str:
    return ", ".join(f"{k} {(b[k] - a[k]) / seconds:.2f}" for k in b if k in a)


def isolate(pids: dict[str, int | None]) -> tuple[cpu_isolation.CpuIsolation | None, str]:
    """The drill's CPU isolation (``ordq.drills.cpu_isolation``): the cluster, the drill's clients and
    this process in a group with the highest shares; returns it (None where cgroups cannot be
    used) and the judgement in words, which the drill logs and its verdict repeats."""
    iso, how = cpu_isolation.open_isolation()
    if iso is None:
        return None, (f"WITHOUT CPU isolation ({how}): the abuser's client at idle priority, the cluster "
                      "sharing the cores with everything else; the ratio also measures this machine's contention")
    try:
        iso.group("protected")
        iso.group("capped", quota_cores=ABUSER_CORES, shares=cpu_isolation.ATTACKER_SHARES)
        moved = iso.add("protected", [os.getpid(), *pids.values()])
        compilers = iso.leave_compilers(list(pids.values()))
        flusher = iso.raise_flusher()
    except ValueError:  # a bad ORDQ_DRILL_FLUSHER_NICE: its message says so
        iso.close()
        raise
    except OSError as exc:
        iso.close()
        return None, (f"WITHOUT CPU isolation (cgroup setup failed: {exc}): the abuser's client at idle priority; "
                      "the ratio also measures this machine's contention")
    return iso, (f"CPU isolated by cgroups ({how}): the cluster, the drill's clients and the drill ({moved} "
                 f"processes) at cpu.shares {cpu_isolation.MAX_SHARES} (busy loops cannot take their CPU), the "
                 f"abuser's client placed as a host of its own (on one CPU, capped at {ABUSER_CORES:g} core, at "
                 f"cpu.shares {cpu_isolation.ATTACKER_SHARES}: CPU the cluster does not want), {compilers} JIT "
                 f"compiler threads (ZooKeeper's, nice 19) left in the root group, {flusher}; the "
                 "ratio judges the broker")


def place_abuser(iso: cpu_isolation.CpuIsolation | None, pid: int, kinds: tuple[str, ...] = ABUSE_KINDS) -> None:
    """Put the abuser's process ``pid`` where a host of its own would leave the cluster's CPU
    alone (cpu_isolation.ATTACKER_SHARES, as the control-plane drill's attacker): on one CPU and,
    with cgroups, in ``isolate``'s capped group (its quota, a weight 32x below the cluster's).
    The CPU control (``HOG_CONTROL``) goes in the cluster's own group instead, on every CPU."""
    if kinds == (HOG_CONTROL,):
        if iso is not None:
            iso.add("protected", [pid])
        return
    if iso is not None:
        iso.add("capped", [pid])
    cpu_isolation.set_cpus(pid, cpu_isolation.attacker_cpus()[0])


def noisy_neighbour(ctx: DrillContext) -> None:
    """The ``security-noisy-neighbour`` drill: a second queue on the head group, written by its
    own token holder; then ROUNDS of QUIET_S of the drill queue alone and ABUSE_S of abuse of the
    second queue (+ RECOVER_S after it, judged as abused), interleaved; ``check_neighbour``
    judges the drill queue's producer over the finished run (pooled ack p99 of the abuse windows
    <= 2x the pooled p99 of the quiet windows; no fail-over).

    In production the abuser is on another host. Here, with cgroups (``isolate``), its client
    runs on one CPU under a CPU quota of its own at a weight the cluster always wins against
    (``place_abuser``), and the cluster and the drill's clients keep their CPU
    against busy loops, so the ratio judges what the abuse costs the broker (TLS decryption,
    typed refusals, the memory budget, answers built and encrypted), not the machine. Before
    (no isolation, one quiet window before the abuse) the 2-core machine gave 0.6-9.7x, the
    baseline moved 41-222 ms between runs, and abuse aimed at another group gave 2.9x. Without
    cgroups the abuser runs at idle priority and the output says the judgement had no
    isolation. Each kind of abuse must have been sent and refused or bounded."""
    gid, _seg = ctx.head()
    c = ctx.cluster
    abused = ctx.queue + "-abused"
    with c.store() as store:
        store.create_queue(abused, [gid])
        st = store.wait_state(abused, lambda s: s.open_segment is not None, timeout_s=30)
        aseg = st.open_segment
        assert aseg is not None
        address = store.live_members(gid)["master"].address
        rec, token = create_token(store.client, store.paths.root, {abused: ["produce", "consume"]},
                                  "drill: noisy neighbour")
        touch(store.client, store.paths.root)
    creds = attrs.evolve(c.credentials, token=token)
    pids = {name: p.pid for name, p in c.processes()}
    pids |= {f"producer {i}": w.proc.pid for i, w in enumerate(ctx.producers)}
    pids |= {f"consumer {i}": w.proc.pid for i, w in enumerate(ctx.consumers)}
    iso, judgement = isolate(pids)
    kinds = abuse_kinds()
    if kinds != ABUSE_KINDS:
        if kinds == (HOG_CONTROL,):
            sent = (f"NO abuse, a thread spinning {HOG_SPIN_S * 1e3:g} ms then waiting {HOG_PAUSE_S * 1e3:g} ms in "
                    f"the cluster's group (the CPU control, {HOG_CONTROL}; its CPU is told below)")
        else:
            sent = f"{'+'.join(kinds)} abuse" if kinds else f"NO abuse (the idle control, {IDLE_CONTROL})"
        judgement += f"; ONLY {sent} ({ABUSE_ENV}): a measurement, not the acceptance"
    ctx.notes["neighbour_judgement"] = judgement
    ctx.event(f"judgement: {judgement}")
    abuser: WindowedProcess | None = None
    windows: list[tuple[int, int, int]] = []
    outcomes: dict[str, int] = {}
    try:
        ctx.expect("the abuser's token works on its own queue",
                   within(lambda: not denied(fetch_call(creds, address, abused, aseg.seg), "consume", abused)))
        ctx.event(f"the abuser fills {abused} on {gid} ({FILL_MESSAGES} x 1,000 B), then {SETTLE_S:g} s to settle")
        _fill(c, abused, creds)
        abuser = abuser_process(address, creds, abused, aseg.seg, idle=iso is None, kinds=kinds)
        place_abuser(iso, abuser.pid, kinds)
        cpu_pids = {f"{gid}/master": pids[f"{gid}/master"], f"{gid}/slave": pids[f"{gid}/slave"],
                    "producer": ctx.producers[0].proc.pid, "abuser": abuser.pid}
        time.sleep(SETTLE_S)
        ctx.fault(f"the holder of a token for {abused} (on {gid}, beside {ctx.queue}) abuses it in {ROUNDS} windows "
                  f"of {ABUSE_S:g} s, each after {QUIET_S:g} s quiet, from a process of its own "
                  f"({abuser.priority}): 4 loops of huge fetches, 24 unread Read streams, 10 unwritten produce "
                  "streams, a 30 MiB request every 0.5 s, malformed requests and batches every 20 ms")
        cpu = {"quiet": 0.0, "abused": 0.0}
        use: dict[str, dict[str, float]] = {"quiet": {}, "abused": {}}
        counted = MasterCounters(c.metrics_urls().get(f"{gid}/master"))
        with device_stalls.watched(ctx):  # its freezes left out of both sides (check_neighbour)
            for _ in range(ROUNDS):
                for kind in ("quiet", "abused"):
                    t0, c0 = now_us(), cpu_seconds(cpu_pids)
                    counted.start()
                    if kind == "quiet":
                        q0 = t0
                        time.sleep(QUIET_S)
                    else:
                        abuser.go()
                        time.sleep(ABUSE_S)
                        for k, n in abuser.pause().items():
                            outcomes[k] = outcomes.get(k, 0) + n
                        time.sleep(RECOVER_S)
                        windows.append((q0, t0, now_us()))
                        ctx.event(f"window (quiet from, abuse from, abuse to; µs): {windows[-1]}")
                    c1 = cpu_seconds(cpu_pids)
                    counted.stop(kind)
                    cpu[kind] += (now_us() - t0) / 1e6
                    for k in c1:
                        if k in c0:
                            use[kind][k] = use[kind].get(k, 0.0) + c1[k] - c0[k]
        ctx.expect("the drill queue's producer ran through every window (else: NEIGHBOUR_MESSAGES is too few for "
                   "this machine's speed)", ctx.producers[0].proc.alive())
        ctx.event("CPU cores used, " + "; ".join(
            f"{kind}: " + ", ".join(f"{k} {v / cpu[kind]:.2f}" for k, v in use[kind].items()) for kind in use))
        ctx.event(f"{gid}/master's counters per second, {counted.told(cpu)}")
    finally:
        ctx.notes["neighbour_windows"] = windows
        if abuser is not None:
            abuser.close()
        if iso is not None:
            left = iso.close()
            ctx.event("cgroups removed, processes back in the root group" if not left
                      else f"cgroups NOT removed (swept by the next run): {left}")
    ctx.event(f"abuse ended: {outcomes}")
    ctx.expect(f"every kind of abuse was sent ({', '.join(kinds)}; {ABUSE_ENV} unset)", kinds == ABUSE_KINDS)
    if "huge" in kinds:
        ctx.expect("the abuser's huge fetches were answered (bounded) or refused (typed)",
                   any(k.startswith("huge fetch") for k in outcomes))
    if "oversized" in kinds:
        ctx.expect("the oversized requests were refused (RESOURCE_EXHAUSTED)",
                   outcomes.get("oversized request RESOURCE_EXHAUSTED", 0) > 0
                   and not outcomes.get("oversized request ok"))
    if "malformed" in kinds:
        ctx.expect("the malformed requests and batches were sent and refused",
                   all(any(k.startswith(what) for k in outcomes) and not outcomes.get(f"{what} ok")
                       for what in ("malformed request", "malformed batch")))
    with c.store() as store:
        revoke_token(store.client, store.paths.root, rec.tid)
        touch(store.client, store.paths.root)
        store.delete_queue(abused)


class MasterCounters:
    """The abused master's own counters, summed per kind of window (what its read rate and
    request-time shares did: answers paced, steps held, bytes answered; and how often its
    loop was held: loop-lag ticks 5 and 20 ms or more late). A scrape that fails
    counts nothing for its window (told: the counters are a reading, not a check)."""

    COUNTERS = {"answers": "ordq_broker_fetch_requests", "answer MB": "ordq_broker_fetch_bytes",
                "paced": "ordq_broker_read_paced", "paced s": "ordq_broker_read_paced_seconds",
                "held": "ordq_broker_request_time_throttled", "held s": "ordq_broker_request_time_throttled_seconds",
                # where its group commits ran: a lone request's on the loop, the rest (and every
                # one for 1 s after a slow one) on its sync thread (broker_group/loop_sync.py)
                "commits": "ordq_broker_syncs", "on loop": "ordq_broker_loop_commits",
                "slow syncs": "ordq_broker_slow_syncs"}

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.sums: dict[str, dict[str, float]] = {}
        self.failed = 0
        self._at: dict[str, float] | None = None

    def _read(self) -> dict[str, float] | None:
        samples = scrape_or_none(self.url, timeout_s=1.0)
        if samples is None:
            self.failed += self.url is not None
            return None
        read = {k: value(samples, name + "_total") or 0.0 for k, name in self.COUNTERS.items()}  # counters
        # the loop-lag probe's ticks (every 20 ms) that ran 5 and 20 ms or more late: the loop held
        lag = "ordq_broker_loop_lag_seconds"
        ticks = value(samples, lag + "_count") or 0.0
        for late, le in (("5", "0.005"), ("20", "0.02")):
            read[f"lag>={late}ms"] = ticks - (value(samples, lag + "_bucket", le=le) or 0.0)
        # its full garbage collections (each holds the loop; stop 86: 20-35 ms under abuse, the
        # spikes' cause until refused calls stopped leaving cycles) and the objects they freed
        read["full gcs"] = value(samples, "python_gc_collections_total", generation="2") or 0.0
        read["full gc objects"] = value(samples, "python_gc_objects_collected_total", generation="2") or 0.0
        return read

    def start(self) -> None:
        self._at = self._read()

    def stop(self, kind: str) -> None:
        now, then = self._read(), self._at
        if now is None or then is None:
            return
        sums = self.sums.setdefault(kind, {})
        for k in now:
            sums[k] = sums.get(k, 0.0) + now[k] - then[k]

    def told(self, seconds: dict[str, float]) -> str:
        if not self.sums:
            return f"not read ({self.url or 'no metrics URL'})"
        per = [f"{kind}: " + ", ".join(f"{k} {v / (1e6 if k == 'answer MB' else 1) / seconds[kind]:.1f}"
                                       for k, v in sums.items()) for kind, sums in self.sums.items()]
        return "; ".join(per) + (f" ({self.failed} scrapes failed)" if self.failed else "")


def _p99_ms(values: list[float]) -> float:
    lat = sorted(values)
    return lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")


def check_neighbour(ctx: DrillContext, acks: list[Any], _d: list[Any]) -> list[tuple[str, bool]]:
    """The drill queue's ack p99 (batch sent -> acked) pooled over the abuse windows, against
    its p99 pooled over the quiet windows interleaved with them (same run, same minutes); and
    its producer never failed over. The acks in flight while the disk under the cluster froze
    are left out of both sides, and the freezes told per kind of window (``device_stalls``, as
    the security-control-plane drill's: the machine's, not the abuse's)."""
    windows = ctx.notes.get("neighbour_windows")
    if not windows or not acks:
        return [("the abuse ran", False)]
    spans = {"quiet": [(q0, a0) for q0, a0, _ in windows], "abused": [(a0, a1) for _, a0, a1 in windows]}
    samples = device_stalls.leave_out(ctx, {"ack": [(a.send_us, (a.ack_us - a.send_us) / 1000.0) for a in acks]},
                                      spans)["ack"]
    quiet = [ms for at, ms in samples if any(q0 <= at < a0 for q0, a0, _ in windows)]
    abused = [ms for at, ms in samples if any(a0 <= at < a1 for _, a0, a1 in windows)]
    q, b = _p99_ms(quiet), _p99_ms(abused)
    ctx.notes["neighbour_p99_ms"] = (q, b)
    per = [(_p99_ms([ms for at, ms in samples if q0 <= at < a0]), _p99_ms([ms for at, ms in samples if a0 <= at < a1]))
           for q0, a0, a1 in windows]
    failovers = sum(int(w.status().get("failovers") or 0) for w in ctx.producers)
    segs = {a.seg for a in acks}
    judgement = ctx.notes.get("neighbour_judgement", "?")
    ctx.event(f"ack p99 quiet {q:.1f} ms, abused {b:.1f} ms (per window quiet/abused: "
              + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in per) + ")")
    return [
        (f"ack p99 abused/quiet {b:.1f}/{q:.1f} ms = {b / q:.2f}x, bound {LATENCY_RATIO:g}x (the neighbour's "
         f"acks: {len(abused)} in {len(windows)} abuse windows, {len(quiet)} in the quiet windows between them; "
         f"judged {judgement.split(':')[0]})",
         len(quiet) > 1000 and len(abused) > 1000 and b <= LATENCY_RATIO * q),
        (f"the neighbour never failed over (failovers {failovers}, segments {sorted(segs)})",
         failovers == 0 and len(segs) == 1),
    ]
