"""A consumer process for the failover tests: waits to lead the subscription, then records
every delivered message until it delivered seq ``--until``.

usage: python -m tests.helpers.consume --zk HOSTS --root ROOT --queue Q --sub S --until SEQ
           --out FILE [--commit-every N] [--commit-ms MS] [--session-timeout S] [--audit DIR]
           [--crash-at SEQ]

Prints ``STARTED`` once connected (it may then wait as a standby) and ``LEADER <last_seq>``
when elected (``last_seq``: of the committed cursor it resumes from). Writes to FILE (JSON
lines; each poll's messages are written and flushed before the next poll, which is when the
SDK may commit them):
  {"event": "leader", "last_seq": n, "seg": s, "offset": o}
  {"event": "rejoined", "last_seq": n, "seg": s, "offset": o}   lease lost and granted back
  {"d": seq, "pseq": payload seq, "w": writer, "ok": intact, "crc": crc32}   per delivery
  {"event": "done", "stats": {...}}        delivered --until, consumer closed (exit 0)
  {"event": "error", "type": ..., "error": ...}   (exit 2)

``--crash-at SEQ``: kill -9 itself while handling the message SEQ (before recording it): an
application that dies in the middle of a delivered batch.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import attrs

from ordq.common.proc import announce
from ordq.sdk import Consumer
from tests.helpers.load import (
    RecordWriter,
    consumer_arguments,
    consumer_config,
    delivery_of,
    program_logging,
    record_failure,
    wait_for_file,
)


def main(argv: list[str] | None = None) -> int:
    ap = consumer_arguments(session_timeout_s=1.0)
    ap.add_argument("--go", type=Path, default=None, help="wait until this file exists before connecting")
    ap.add_argument("--audit", type=Path, default=None)
    ap.add_argument("--crash-at", type=int, default=None)
    args = ap.parse_args(argv)
    program_logging()

    out = RecordWriter(args.out)
    cfg = consumer_config(args, audit_dir=args.audit)
    consumer = Consumer(cfg)
    announce("STARTED")
    if args.go is not None:
        wait_for_file(args.go)
    try:
        consumer.start()
        st = consumer.statistics()
        out.write({"event": "leader", "last_seq": st.last_seq, "seg": st.seg, "offset": st.offset})
        announce(f"LEADER {st.last_seq}")
        last, rejoins = st.last_seq, st.rejoins
        while last < args.until:
            records = []
            batch = consumer.poll(0.2)
            st = consumer.statistics()
            if st.rejoins != rejoins:
                # Its lease was lost (a pause past it) and granted back: it reads on from the
                # committed cursor, whatever it delivered before.
                rejoins, last = st.rejoins, st.last_seq
                out.write({"event": "rejoined", "last_seq": st.last_seq, "seg": st.seg, "offset": st.offset})
            for m in batch:
                if m.seq == args.crash_at:
                    out.write(*records)
                    os.kill(os.getpid(), signal.SIGKILL)
                d = delivery_of(m.seq, m.payload)
                records.append({"d": d.seq, "pseq": d.payload_seq, "w": d.writer, "ok": d.intact, "crc": d.crc})
                last = m.seq
            out.write(*records)
        consumer.commit()  # every message handed out is recorded: finished
        consumer.close()
        out.write({"event": "done", "stats": attrs.asdict(consumer.statistics())})
        print("DONE", flush=True)
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the test through the out file
        return record_failure(out, exc, "consumer")
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - already failed: the record says why
            pass
        out.close()


if __name__ == "__main__":
    sys.exit(main())
