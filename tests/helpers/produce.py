"""A producer process for the failover tests: waits to lead, then sends seqs up to a total.

usage: python -m tests.helpers.produce --zk HOSTS --root ROOT --queue Q --writer W --total N
           --out FILE [--size BYTES] [--rate MSGS_PER_S] [--send-timeout S] [--session-timeout S]
           [--audit DIR] [--gate FILE --gate-at SEQ]

Prints ``STARTED`` once connected (it may then wait as a standby) and ``LEADER <next_seq>``
when elected; then sends messages ``next_seq .. N-1`` (each payload carries its seq and W,
``tests.helpers.load.make_payload``), so a standby that takes over completes the same stream.
With ``--gate``, it waits before sending seq ``--gate-at`` until FILE exists: a test's fault
(kill -9, SIGSTOP) then lands while this producer still has seqs to send, however late the
test saw the acks it waited for (the loaded tier: a leader sent all 16,000 of its seqs before its
test noticed 4,000 acks, and the SIGSTOP found it gone).
Writes to FILE (JSON lines, flushed as they happen):
  {"event": "leader", "next_seq": n, "last": {"seq", "seg", "offset", "payload_seq"} | null}
  {"a": seq, "crc": crc32}                        one per acked message, in seq order
  {"event": "done", "stats": {...}}              everything acked, producer closed (exit 0)
  {"event": "fenced", "error": "..."}            another leader took over (exit 3)
  {"event": "error", "type": "...", "error": "..."}  anything else (exit 2)
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
import zlib
from pathlib import Path

import attrs

from ordq.common.errors import FencedError
from ordq.common.proc import announce
from ordq.sdk import Producer, ProducerConfig, SendFuture
from ordq.sdk._producer_core import BatchingConfig
from tests.helpers.load import (
    RecordWriter,
    make_payload,
    parse_payload,
    program_logging,
    record_failure,
    wait_for_file,
)

EXIT_FENCED = 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--writer", required=True)
    ap.add_argument("--total", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--go", type=Path, default=None, help="wait until this file exists before connecting")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--send-timeout", type=float, default=1.0)
    ap.add_argument("--session-timeout", type=float, default=1.0)
    ap.add_argument("--audit", type=Path, default=None)
    ap.add_argument("--gate", type=Path, default=None, help="before sending seq --gate-at, wait for this file")
    ap.add_argument("--gate-at", type=int, default=None)
    args = ap.parse_args(argv)
    if (args.gate is None) != (args.gate_at is None):
        ap.error("--gate and --gate-at go together")
    program_logging()

    out = RecordWriter(args.out)
    cfg = ProducerConfig(zk_hosts=args.zk, root=args.root, queue=args.queue, send_timeout_s=args.send_timeout,
                         lease_ttl_s=args.session_timeout, audit_dir=args.audit,
                         producer_id=f"{args.writer}", batching=BatchingConfig(linger_ms=2.0))
    producer = Producer(cfg)
    announce("STARTED")
    if args.go is not None:
        wait_for_file(args.go)
    pending: collections.deque[tuple[int, int, SendFuture]] = collections.deque()
    cv = threading.Condition()
    sending_done = threading.Event()
    failure: list[BaseException] = []

    def record_acks() -> None:
        """Write acks in seq order as their futures resolve (they resolve in order)."""
        while True:
            with cv:
                while not pending and not sending_done.is_set():
                    cv.wait(0.05)
                if not pending:
                    return
                items = list(pending)
            batch = []
            for seq, crc, fut in items:
                try:
                    res = fut.result()
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    failure.append(exc)
                    out.write(*batch)
                    return
                if res.seq != seq:
                    failure.append(AssertionError(f"sent as seq {seq} but acked as seq {res.seq}"))
                    out.write(*batch)
                    return
                batch.append({"a": seq, "crc": crc})
                with cv:
                    pending.popleft()
                if len(batch) >= 256:
                    out.write(*batch)
                    batch = []
            out.write(*batch)

    try:
        producer.start()
        last = producer.last_committed()
        next_seq = last.seq + 1 if last is not None else 0
        last_doc = None
        if last is not None:
            pseq = parse_payload(last.message.payload).seq if last.message is not None else None
            last_doc = {"seq": last.seq, "seg": last.seg, "offset": last.offset, "payload_seq": pseq}
        out.write({"event": "leader", "next_seq": next_seq, "last": last_doc})
        announce(f"LEADER {next_seq}")
        recorder = threading.Thread(target=record_acks, name="acks", daemon=True)
        recorder.start()
        t0 = time.monotonic()
        for i, seq in enumerate(range(next_seq, args.total)):
            if failure:
                raise failure[0]
            if seq == args.gate_at:
                wait_for_file(args.gate)
                if args.rate:  # the rate goes on from here: no burst of the seqs it held
                    t0 = time.monotonic() - i / args.rate
            if args.rate:
                pause = t0 + i / args.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            payload = make_payload(seq, args.writer, args.size)
            fut = producer.send(payload)
            with cv:
                pending.append((seq, zlib.crc32(payload), fut))
                cv.notify_all()
        producer.flush(timeout_s=120)
        sending_done.set()
        recorder.join(timeout=60)
        if failure:
            raise failure[0]
        producer.close()
        out.write({"event": "done", "stats": attrs.asdict(producer.statistics())})
        print("DONE", flush=True)
        return 0
    except FencedError as exc:
        out.write({"event": "fenced", "error": str(exc)})
        print(f"FENCED {exc}", flush=True)
        return EXIT_FENCED
    except BaseException as exc:  # noqa: BLE001 - reported to the test through the out file
        return record_failure(out, exc, "producer")
    finally:
        sending_done.set()
        try:
            producer.close(timeout_s=5)
        except Exception:  # noqa: BLE001 - already failed: the record says why
            pass
        out.close()


if __name__ == "__main__":
    sys.exit(main())
