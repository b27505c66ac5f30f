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

import argparse
import logging
import random
import sys
import threading
import time
from pathlib import Path

from sdk import CommitConfig, Consumer, ConsumerConfig, Delivered
from tests.helpers.load import RecordWriter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--sub", required=True)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--commit-every", type=int, default=1000)
    ap.add_argument("--commit-ms", type=float, default=200.0)
    ap.add_argument("--session-timeout", type=float, default=2.0)
    ap.add_argument("--block-key", default=None)
    ap.add_argument("--block-from", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)

    out = RecordWriter(args.out)
    cfg = ConsumerConfig(zk_hosts=args.zk, root=args.root, queue=args.queue, subscription=args.sub,
                         commit=CommitConfig(every_messages=args.commit_every, every_ms=args.commit_ms),
                         zk_session_timeout_s=args.session_timeout)
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
    print("STARTED", flush=True)
    try:
        consumer.start()
        first = consumer.statistics().last_seq + 1
        out.write({"event": "leader", "last_seq": first - 1})
        print(f"LEADER {first - 1}", flush=True)
        try:
            consumer.run_keyed(handler, workers=args.workers, stop=stop)
        finally:
            consumer.close()  # commits what finished (run_keyed left nothing else)
        out.write({"event": "done"})
        print("DONE", flush=True)
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the test through the out file
        out.write({"event": "error", "type": type(exc).__name__, "error": str(exc)})
        logging.exception("consumer failed")
        return 2
    finally:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
