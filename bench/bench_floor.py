"""What the stack allows a synchronous send at best: the floor under bench_broker/bench_e2e.

    .venv/bin/python -m bench.bench_floor [--round-trips 3000] [--syncs 1000] [--disk]

- gRPC round trip: one bidi stream between two processes on loopback, 1 KiB request, tiny
  reply, the server answering from its handler thread (no hand-off): the cost of one
  request/reply hop pair in Python gRPC. Shown twice: with the reply produced in the handler
  thread, and with one thread hand-off in between (a reader thread passing requests on, as
  any server that reads and answers independently does).
- lean round trip: the same exchange on what ordq's data path runs on since issue 39's lean
  links (ordq/wire/lean_produce.py, broker_group/lean_link.py): length-prefixed frames over
  mutual TLS with the project's own contexts, on an asyncio loop of the project's kind
  (uvloop), the reply written as the frame is read. Its floor (2 lean round trips + 1 sync) is
  printed beside the issue's (2 gRPC round trips + 1 sync): the gap between a send and the
  lean floor is ordq's own handling, not the stack's.
- fdatasync: append 1 KiB to a file and fdatasync it, one at a time, in --dir.
- the same fdatasync at a synchronous send's cadence: each 1 ms after the last ended. On the
  development box's virtual disk a sync after the disk sat idle is slower whether this CPU
  slept or spun meanwhile (stop 89: 176 µs back to back, ~300 after 1 ms, ~500 after 5 ms), so
  the back-to-back figure understates what a send that waits for its ack pays. Its floor (2
  lean round trips + that sync) is printed beside the others.
- the pair: two such fdatasyncs let go together, each on a file of its own, as a master and
  its slave sync a batch when both replicas share one disk (this box): each append's new size
  is written (a journal commit, or on ext4 without a journal the inode itself), and the two
  share the disk: the pair took 1.6-2x one (stop 79). Printed beside the floor, which counts one
  sync (issue 39's definition, the goal's yardstick).
- ``--disk`` (issue 39: is the p99 the disk's?): only fdatasyncs of 1 KiB, in three kinds of
  file: an append (the file grows: the sync writes its new size, a journal commit or the
  inode), a write into space ``posix_fallocate`` reserved (unwritten extents turned written:
  metadata too), and an overwrite of blocks written and synced before (a preallocated,
  zero-filled segment: data only). Each quiet, beside a thread that rewrites one 4 MiB
  file in place and syncs it (other writers, no blocks freed), and beside one that writes 4 MiB
  files and deletes them (blocks freed, as segment removals, test teardowns and other
  sessions do: on ext4 mounted with ``discard`` they are discarded when the journal commits).

The CPU each round trip costs client and server is printed too: on a small box that cost
(every message wakes threads in both processes), more than the wait, caps messages per second.

An acked ordq send needs two round trips in sequence (producer ↔ master, master ↔ slave) and
an fdatasync on each replica (in parallel with the replication), so 1 / (2 round trips +
1 sync) bounds synchronous sends per second on this machine, whatever the broker does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import attrs
import grpc

from bench._cluster import cpu_seconds, percentile
from ordq.common.loop import new_loop
from ordq.common.security import Credentials, ensure_pki
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.lean_frames import frame, read_frame
from ordq.wire.lean_produce import open_tls, tls_context, tune

# Every round trip's messages, both kinds: a 1 KiB request, a tiny reply
_REQUEST = pb.ProduceRequest(queue="q", seg=0, epoch=1, batches=[b"x" * 1024])
_REPLY = pb.ProduceResponse(acks=[pb.Ack(seg=0, first_offset=0, first_seq=0, count=1)])
_LEAN_REPLY = frame(_REPLY)
_LEAN_FRAME_LIMIT = 1 << 20  # either side's read_frame limit: the messages above are far below it


class _Echo(pb_grpc.BrokerServicer):
    def Produce(self, request_iterator: Any, context: Any) -> Iterator[pb.ProduceResponse]:
        meta = dict(context.invocation_metadata())
        if meta.get("mode") == "inline":
            for _ in request_iterator:
                yield _REPLY
            return
        handed: queue.SimpleQueue[object] = queue.SimpleQueue()

        def read() -> None:
            try:
                for req in request_iterator:
                    handed.put(req)
            except grpc.RpcError:
                pass  # the client cancelled the stream: that measurement is over
            handed.put(None)

        threading.Thread(target=read, daemon=True).start()
        while handed.get() is not None:
            yield _REPLY


def serve() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_BrokerServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


class _Timing:
    """Round trips' latencies without the first tenth (the warm-up), and the CPU each measured
    one cost this process and the server's: ``begin(i)`` before round trip ``i``, ``end``
    after it, ``result()`` at the end."""

    def __init__(self, n: int, server_pid: int) -> None:
        self.n, self.server_pid = n, server_pid
        self.warm = n // 10
        self.out: list[float] = []
        self._cpu0 = (0.0, 0.0)
        self._t0 = 0.0

    def begin(self, i: int) -> None:
        if i == self.warm:
            self._cpu0 = time.process_time(), cpu_seconds(self.server_pid)
        self._t0 = time.perf_counter()

    def end(self) -> None:
        self.out.append(time.perf_counter() - self._t0)

    def result(self) -> tuple[list[float], float, float]:
        measured = self.n - self.warm
        return (self.out[self.warm:], (time.process_time() - self._cpu0[0]) / measured,
                (cpu_seconds(self.server_pid) - self._cpu0[1]) / measured)


def round_trips(address: str, mode: str, n: int, server_pid: int) -> tuple[list[float], float, float]:
    """Latencies of n round trips (without the first tenth, the warm-up) and the CPU each round
    trip of the measured part cost the client and the server process."""
    channel = grpc.insecure_channel(address)
    requests: queue.SimpleQueue[pb.ProduceRequest] = queue.SimpleQueue()
    call = pb_grpc.BrokerStub(channel).Produce(iter(requests.get, None), metadata=(("mode", mode),))
    timing = _Timing(n, server_pid)
    try:
        for i in range(n):
            timing.begin(i)
            requests.put(_REQUEST)
            next(call)
            timing.end()
        return timing.result()
    finally:
        call.cancel()
        channel.close()


def lean_serve(pki: Path) -> None:
    """The lean echo: every frame read is answered with a small frame at once; prints the port.
    ``pki``: where ``measure`` made the credentials (``ensure_pki``)."""
    async def run() -> None:
        ctx = tls_context(ensure_pki(pki, create=False)[0], ssl.Purpose.CLIENT_AUTH)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tune(writer)
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
                while await read_frame(reader, _LEAN_FRAME_LIMIT, "echo frame") is not None:
                    writer.write(_LEAN_REPLY)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    new_loop().run_until_complete(run())


def lean_round_trips(address: str, creds: Credentials, n: int, server_pid: int) -> tuple[list[float], float, float]:
    """As ``round_trips``, on a lean link to ``lean_serve`` (``creds``: the client's): one 1 KiB
    frame out, the reply in."""
    async def run() -> tuple[list[float], float, float]:
        reader, writer = await open_tls(address, tls_context(creds, ssl.Purpose.SERVER_AUTH))
        request = frame(_REQUEST)
        timing = _Timing(n, server_pid)
        try:
            for i in range(n):
                timing.begin(i)
                writer.write(request)
                await read_frame(reader, _LEAN_FRAME_LIMIT, "echo reply")
                timing.end()
            return timing.result()
        finally:
            writer.close()

    loop = new_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


@contextlib.contextmanager
def _echo_server(*args: str) -> Iterator[tuple[str, int]]:
    """This module run as an echo server (``--serve`` or ``--serve-lean``): its address and pid."""
    server = subprocess.Popen([sys.executable, "-m", "bench.bench_floor", *args], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield f"127.0.0.1:{server.stdout.readline().strip()}", server.pid
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def _scratch_file(directory: Path) -> Iterator[int]:
    """A new file in ``directory``, open for writing, removed afterwards: its descriptor."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        yield fd
    finally:
        os.close(fd)
        os.unlink(path)


def _append_syncs(fd: int, n: int, before: Callable[[], object] = lambda: None) -> list[tuple[float, float]]:
    """``n`` times (each after ``before()``): append 1 KiB to ``fd`` and fdatasync it; each
    sync's (start, end) on ``time.perf_counter``."""
    spans = []
    for _ in range(n):
        before()
        os.write(fd, b"x" * 1024)
        t0 = time.perf_counter()
        os.fdatasync(fd)
        spans.append((t0, time.perf_counter()))
    return spans


# A synchronous send's cadence: each of its syncs comes about this long after the last one
SEND_CADENCE_S = 0.001


def fdatasyncs(directory: Path, n: int, *, pause_s: float = 0.0) -> list[float]:
    """``n`` appends of 1 KiB, each fdatasynced, each ``pause_s`` after the last sync ended."""
    with _scratch_file(directory) as fd:
        spans = _append_syncs(fd, n, lambda: time.sleep(pause_s)) if pause_s else _append_syncs(fd, n)
        return [end - start for start, end in spans]


def paired_fdatasyncs(directory: Path, n: int) -> list[float]:
    """``n`` times: two threads each append 1 KiB to a file of their own and fdatasync it, let
    go together, as a master and its slave sync the same batch on a machine where both
    replicas share one disk (the development box, the default test run, one-host clusters).
    Each sample is the pair's time, from the first sync's start to the later one's end:
    ext4 commits its journal for each append's new size, and two commits share the disk."""
    barrier = threading.Barrier(2)
    spans: list[list[tuple[float, float]]] = [[], []]

    def side(i: int) -> None:
        with _scratch_file(directory) as fd:
            spans[i] = _append_syncs(fd, n, barrier.wait)

    other = threading.Thread(target=side, args=(1,), daemon=True)
    other.start()
    side(0)
    other.join()
    return [max(a[1], b[1]) - min(a[0], b[0]) for a, b in zip(*spans, strict=True)]


# The kinds of file ``disk_syncs`` writes into, and what runs beside it (module docstring)
SYNC_KINDS = ("append", "fallocated", "overwrite")
CHURNS = ("", "rewrite", "delete")


def disk_syncs(directory: Path, n: int, kind: str, *, churn: str = "") -> list[float]:
    """``n`` fdatasyncs of a 1 KiB write each into a file of ``kind`` (``SYNC_KINDS``), beside
    a thread that meanwhile rewrites a 4 MiB file in ``directory`` (``churn`` "rewrite") or
    writes 4 MiB files there and deletes them ("delete")."""
    stop = threading.Event()
    churner = threading.Thread(target=_churn, args=(directory, stop, churn == "delete"),
                               daemon=True) if churn else None
    out = []
    with _scratch_file(directory) as fd:
        try:
            if kind == "fallocated":
                os.posix_fallocate(fd, 0, n * 1024)
            elif kind == "overwrite":
                os.write(fd, bytes(n * 1024))
                os.fsync(fd)
            elif kind != "append":
                raise ValueError(f"unknown kind {kind!r}")
            if churner is not None:
                churner.start()
            for i in range(n):
                os.pwrite(fd, b"x" * 1024, i * 1024)
                t0 = time.perf_counter()
                os.fdatasync(fd)
                out.append(time.perf_counter() - t0)
        finally:
            stop.set()
            if churner is not None:
                churner.join()
    return out


def _churn(directory: Path, stop: threading.Event, delete: bool) -> None:
    block = os.urandom(1 << 20)
    fd, path = tempfile.mkstemp(dir=directory, prefix="churn-")
    try:
        while not stop.is_set():
            if delete:  # a new file each time, the last one's blocks freed
                os.close(fd)
                os.unlink(path)
                fd, path = tempfile.mkstemp(dir=directory, prefix="churn-")
            for i in range(4):
                os.pwrite(fd, block, i << 20)
            os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)


def _line(name: str, lat: list[float]) -> str:
    ms = [x * 1000 for x in lat]
    return (f"{name}: p50 {percentile(ms, 50):.3f} ms, p99 {percentile(ms, 99):.3f} ms, max {max(ms):.3f} ms "
            f"({1 / statistics.median(lat):,.0f}/s one at a time)")


@attrs.frozen
class Floor:
    """One measurement of the floor: the lines to print and the floor of one acked send."""

    lines: list[str]
    seconds: float  # 2 round trips (reply from the handler thread) + 1 fdatasync, medians
    # 2 round trips + both replicas' fdatasyncs together on this one disk (``paired_fdatasyncs``)
    paired_seconds: float
    lean_seconds: float  # 2 lean round trips + 1 fdatasync: the stack ordq's data path runs on

    @property
    def sends_per_s(self) -> float:
        return 1 / self.seconds


def measure(round_trips_n: int, syncs_n: int, directory: Path) -> Floor:
    """Both gRPC round-trip kinds against a fresh echo server process, the lean round trips
    against another, then the fdatasyncs."""
    with _echo_server("--serve") as (address, pid):
        inline, client_cpu, server_cpu = round_trips(address, "inline", round_trips_n, pid)
        handoff, _, _ = round_trips(address, "handoff", round_trips_n, pid)
    with tempfile.TemporaryDirectory(prefix="ordq-floor-pki-") as pki:
        client = ensure_pki(Path(pki))[1]  # made here, once: the echo process only reads them
        with _echo_server("--serve-lean", pki) as (address, pid):
            lean, lean_client_cpu, lean_server_cpu = lean_round_trips(address, client, round_trips_n, pid)
    syncs = fdatasyncs(directory, syncs_n)
    paced = fdatasyncs(directory, syncs_n, pause_s=SEND_CADENCE_S)
    pairs = paired_fdatasyncs(directory, syncs_n)
    best = 2 * statistics.median(inline) + statistics.median(syncs)
    paired = 2 * statistics.median(inline) + statistics.median(pairs)
    lean_best = 2 * statistics.median(lean) + statistics.median(syncs)
    lean_paced = 2 * statistics.median(lean) + statistics.median(paced)
    return Floor(seconds=best, paired_seconds=paired, lean_seconds=lean_best, lines=[
        _line("gRPC round trip, reply from the handler thread", inline),
        _line("gRPC round trip, one thread hand-off in the server", handoff),
        f"CPU per round trip (one message each way, handler-thread server): client {client_cpu * 1e6:.0f} µs, "
        f"server {server_cpu * 1e6:.0f} µs",
        _line("lean round trip (TLS frames on an event loop, as ordq's data path)", lean),
        f"CPU per lean round trip: client {lean_client_cpu * 1e6:.0f} µs, server {lean_server_cpu * 1e6:.0f} µs",
        _line(f"fdatasync of a 1 KiB append in {directory}", syncs),
        f"floor of one acked send (2 round trips + 1 sync): {best * 1000:.2f} ms, "
        f"at most {1 / best:,.0f} synchronous sends/s; load average {os.getloadavg()[0]:.1f}",
        _line(f"two fdatasyncs let go together, each of a 1 KiB append to its own file in {directory}"
              " (both replicas on this one disk)", pairs),
        f"floor with both replicas' syncs on this one disk (2 round trips + the pair): {paired * 1000:.2f} ms, "
        f"at most {1 / paired:,.0f} synchronous sends/s (the goal is judged against the floor above)",
        f"floor on the lean links (2 lean round trips + 1 sync): {lean_best * 1000:.2f} ms, "
        f"at most {1 / lean_best:,.0f} synchronous sends/s",
        _line(f"fdatasync of a 1 KiB append {SEND_CADENCE_S * 1000:g} ms after the last (a synchronous send's "
              "cadence)", paced),
        f"floor on the lean links with that sync (2 lean round trips + 1 sync at the send's cadence): "
        f"{lean_paced * 1000:.2f} ms, at most {1 / lean_paced:,.0f} synchronous sends/s",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=3000)
    ap.add_argument("--syncs", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where to fdatasync")
    ap.add_argument("--disk", action="store_true", help="only fdatasyncs: append, fallocated, overwrite; "
                    "quiet and beside a churn of files written and deleted")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-lean", type=Path, metavar="PKI", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    if args.serve_lean:
        lean_serve(args.serve_lean)
        return
    if args.disk:
        for churn in CHURNS:
            for kind in SYNC_KINDS:
                lat = disk_syncs(args.dir, args.syncs, kind, churn=churn)
                beside = {"rewrite": ", beside a rewrite", "delete": ", beside writes and deletes"}.get(churn, "")
                print(_line(f"fdatasync of 1 KiB, {kind}{beside}", lat), flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
        return
    print("\n".join(measure(args.round_trips, args.syncs, args.dir).lines))


if __name__ == "__main__":
    main()
