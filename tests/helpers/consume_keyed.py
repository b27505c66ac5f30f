"""A keyed consumer process (``Consumer.run_keyed``) for the keyed-delivery tests: waits to lead
the subscription, then hands messages to N workers until it handled seq ``--until`` and every
seq before it, or forever when a key is blocked.

usage: python -m tests.helpers.consume_keyed --zk HOSTS --root ROOT --queue Q --sub S --until SEQ
           --out FILE --workers N [--commit-every N] [--commit-ms MS] [--block-key KEY --block-from SEQ]

Prints ``STARTED`` once connected and ``LEADER <last_seq>`` when elected. Writes to FILE (JSON
lines, each flushed before the handler returns, i.e. before the message can be committed):
  {"event": "leader", "last_seq": n}
  {"h": seq, "k": key, "p": payload}                handled (the handler is about to return)
  {"blocked": seq}     the handler blocks forever on this message (--block-key, seq >= --block-from)
  {"event": "done"} / {"event": "error", "type": ..., "error": ...}
"""

from __future__ import annotations

import random
import sys
import threading
import time

from ordq.common.proc import announce
from ordq.sdk import Consumer, Delivered
from tests.helpers.load import RecordWriter, consumer_arguments, consumer_config, program_logging, record_failure


def main(argv: list[str] | None = None) -> int:
    ap = consumer_arguments(session_timeout_s=2.0)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--block-key", default=None)
    ap.add_argument("--block-from", type=int, default=0)
    args = ap.parse_args(argv)
    program_logging()

    out = RecordWriter(args.out)
    cfg = consumer_config(args)
    block = args.block_key.encode() if args.block_key is not None else None
    stop = threading.Event()
    lock = threading.Lock()
    handled: set[int] = set()

    def handler(m: Delivered) -> None:
        if m.key == block and m.seq >= args.block_from:
            out.write({"blocked": m.seq})
            threading.Event().wait()  # a handler stuck on one key, until the process dies
        time.sleep(random.random() * 0.002)
        out.write({"h": m.seq, "k": (m.key or b"").decode(), "p": m.payload.decode()})
        with lock:
            handled.add(m.seq)
            if len(handled) == args.until - first + 1:
                stop.set()

    consumer = Consumer(cfg)
    announce("STARTED")
    try:
        consumer.start()
        first = consumer.statistics().last_seq + 1
        out.write({"event": "leader", "last_seq": first - 1})
        announce(f"LEADER {first - 1}")
        try:
            consumer.run_keyed(handler, workers=args.workers, stop=stop)
        finally:
            consumer.close()  # commits what finished (run_keyed left nothing else)
        out.write({"event": "done"})
        print("DONE", flush=True)
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the test through the out file
        return record_failure(out, exc, "consumer")
    finally:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
