"""ordq produce / ordq consume: the SDK from the shell (lines on stdin, or generated load)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import attrs

from ordq.bootstrap import check_queue, cluster_options, topic_partitions
from ordq.commands import MAX_PAYLOAD_BYTES, add_command, int_in, rate, saying, seconds
from ordq.common.errors import ConfigError, HandlerError, LeaseLost, OrdqError
from ordq.output import emit_json


def register(subparsers: Any) -> None:
    prod = add_command(subparsers, "produce", func=cmd_produce,
                       help="send stdin lines (or generated messages) to a queue, in order",
                       description="Send stdin lines (or --count generated messages) to QUEUE, in order; or to "
                       "the partition of a keyed topic that --key routes to (--topic T --key K).")
    prod.add_argument("queue", nargs="?", help="the queue (not with --topic)")
    prod.add_argument("--topic", default=None, help="send to this keyed topic, to the partition of --key (required)")
    prod.add_argument("--count", type=int_in(1, 10**12), default=None,
                      help="generate this many messages instead of reading stdin")
    prod.add_argument("--size", type=int_in(12, MAX_PAYLOAD_BYTES), default=100,
                      help="bytes per generated message (12 at least: the counter; default %(default)s)")
    prod.add_argument("--rate", type=rate(), default=None, help="messages per second (default: as fast as acked)")
    prod.add_argument("--key", default=None, help="key for every message")
    prod.add_argument("--audit-dir", type=Path, default=None, help="write the audit files here (docs/AUDIT_FORMAT.md)")
    prod.add_argument("--send-timeout", type=seconds(), default=2.0, help="ack deadline before failover, seconds")

    cons = add_command(subparsers, "consume", func=cmd_consume,
                       help="read a queue in order through a subscription and print or count messages")
    cons.add_argument("queue", nargs="?", default=None)
    cons.add_argument("--subscription", "-s", default=None)
    cons.add_argument("--topic", default=None, help="join a consumer group of this keyed topic instead (--group)")
    cons.add_argument("--group", "-g", default=None, help="with --topic: the consumer group (docs/SDK.md)")
    cons.add_argument("--member", default=None, help="with --topic: this member's id (default: host-pid-random)")
    cons.add_argument("--start", choices=["earliest", "latest"], default="earliest",
                      help="where a new subscription starts (default %(default)s)")
    cons.add_argument("--count", type=int_in(1, 10**12), default=None, help="stop after this many messages")
    cons.add_argument("--idle-exit", type=seconds(allow_zero=True), default=None, metavar="SECONDS",
                      help="stop when nothing arrives for this long")
    cons.add_argument("--quiet", action="store_true", help="only count, print a summary")
    cons.add_argument("--audit-dir", type=Path, default=None)
    cons.add_argument("--workers", type=int_in(1, 1024), default=None, metavar="N",
                      help="keyed parallel delivery: N workers by key, per-key order only (docs/SDK.md)")


def preflight(args: argparse.Namespace) -> None:
    """What the CLI checks before the SDK starts, so that a command that cannot work says why
    in one line at once: the coordinators answer within --zk-timeout (the SDK waits longer),
    the queue exists, and the token has a role on it (the coordinator's Describe answers all
    three; the role itself is checked when the client asks for its lease). A wait longer than a
    second says so (issue 42: a busy box's coordinator may take seconds)."""
    with saying(f"waiting for the cluster's coordinators to answer for queue {args.queue}"):
        check_queue(args, args.queue)


def route(args: argparse.Namespace) -> None:
    """``produce --topic T --key K``: ``args.queue`` becomes the partition of K (TopicNotFound)."""
    if args.topic is None:
        if args.queue is None:
            raise ConfigError("give the QUEUE (or --topic T --key K)")
        return
    from ordq.coordinator.topics import partition_of, partition_queue

    if args.queue is not None or not args.key:
        raise ConfigError("with --topic give no QUEUE, and a --key: it picks the partition")
    args.partition = partition_of(args.key.encode(), topic_partitions(args, args.topic))
    args.queue = partition_queue(args.topic, args.partition)


def cmd_produce(args: argparse.Namespace) -> int:
    route(args)
    preflight(args)
    return _produce(args)


def _producer(args: argparse.Namespace) -> Any:
    """The queue's producer, or a topic's leading only the partition of --key (preflight found it)."""
    options = {**cluster_options(args), "audit_dir": args.audit_dir,
               "connect_timeout_s": args.zk_timeout, "send_timeout_s": args.send_timeout}
    if args.topic is not None:
        from ordq.sdk import TopicProducer, TopicProducerConfig

        return TopicProducer(TopicProducerConfig(topic=args.topic, partitions=(args.partition,), **options))
    from ordq.sdk import Producer, ProducerConfig  # only these (the SDK loads each name on first use)

    return Producer(ProducerConfig(queue=args.queue, **options))


def _produce(args: argparse.Namespace) -> int:
    key = args.key.encode() if args.key else None
    sent = 0
    first = last = None
    refused: OrdqError | None = None  # a stdin line the producer refused (line sent + 1)
    producer = None
    try:
        with _Interrupt() as interrupt, contextlib.ExitStack() as stack:
            # Ctrl-C (or SIGTERM) while it connects and waits for its lease stops it at once: a
            # standby started in the background ignored SIGINT until it led (issue 42).
            with interrupt.blocking(), saying(f"waiting to be elected the producer of {args.queue} (Ctrl-C stops)"):
                producer = stack.enter_context(_producer(args))
            # The clock starts once this process leads: --rate paces from here (with the election
            # counted, the first messages went out in a burst to catch up), and msgs/s is the rate.
            start = time.monotonic()
            for payload in _payloads(args, interrupt):
                if args.rate:
                    pause = start + sent / args.rate - time.monotonic()
                    if pause > 0 and interrupt.stop.wait(pause):
                        break
                try:
                    last = producer.send(payload, key=key)
                except OrdqError as exc:
                    if args.count is not None:
                        raise
                    refused = exc  # the lines before it are flushed and said acked below
                    break
                first = first or last
                sent += 1
                if interrupt.stop.is_set():
                    break
            producer.flush()
            stats = _statistics(producer, args.queue)
    except OrdqError:
        # The error ends the run (in a send, the flush or the close): once messages went out, say
        # first how far it got (a cluster lost mid-run had 10,280 of 20,000 acked, and only the
        # error was printed). Before any went out, the error is the one line.
        if producer is not None and sent:
            print(f"acked {_statistics(producer, args.queue).acked} of {sent} messages to {args.queue} "
                  "before the error", file=sys.stderr)
        raise
    elapsed = time.monotonic() - start
    result = {"queue": args.queue, "sent": sent, "acked": stats.acked, "failovers": stats.failovers,
              "rolls": stats.rolls, "seconds": round(elapsed, 3),
              "msgs_per_s": round(sent / elapsed, 1) if elapsed else None,
              "last": attrs.asdict(last.result()) if last is not None else None}
    if args.json:
        emit_json(result)
    else:
        print(f"acked {stats.acked} of {sent} messages to {args.queue} in {elapsed:.2f}s "
              f"({result['msgs_per_s']} msgs/s, {stats.failovers} failovers, {stats.rolls} rolls)", file=sys.stderr)
    if refused is not None:
        # Issue 42: a re-run of the whole batch would store the acked lines twice: say which were.
        if first is None or last is None:
            done = "no line before it was sent"
        else:
            seqs = f"seq {first.result().seq}" if sent == 1 else f"seqs {first.result().seq}-{last.result().seq}"
            done = (f"{'line 1 was' if sent == 1 else f'lines 1-{sent} were'} acked ({seqs}): "
                    f"re-send from line {sent + 1} only")
        print(f"ordq: error: line {sent + 1} refused: {refused}; {done}", file=sys.stderr)
        return 1
    return 0 if stats.acked == sent else 1


def _statistics(producer: Any, queue: str) -> Any:
    stats = producer.statistics()
    return stats[queue] if isinstance(stats, dict) else stats  # a topic's producer: the partition it led


def _payloads(args: argparse.Namespace, interrupt: _Interrupt) -> Iterator[bytes]:
    if args.count is not None:
        pad = b"x" * max(args.size - 12, 0)
        for i in range(args.count):
            yield b"%012d" % i + pad
        return
    while True:
        try:
            with interrupt.blocking():
                line = sys.stdin.buffer.readline()
        except KeyboardInterrupt:  # Ctrl-C while waiting for input: what was sent is flushed
            return
        if not line:
            return
        yield line.rstrip(b"\n")


class _Interrupt:
    """Ctrl-C (or SIGTERM) asks ``produce``/``consume`` to stop at a clean point, so the
    summary and the commit account for exactly what was sent or printed: a signal raising
    KeyboardInterrupt could land between printing a message and counting it, or inside the
    SDK. Only a blocking read of stdin is interrupted at once; a second signal interrupts
    anything."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop if stop is not None else threading.Event()
        self._in_blocking_read = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        again = self.stop.is_set()
        self.stop.set()
        if again or self._in_blocking_read:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        self._in_blocking_read = True
        try:
            yield
        finally:
            self._in_blocking_read = False


def cmd_consume(args: argparse.Namespace) -> int:
    if args.topic is not None:
        from ordq.commands.topic_group import consume_group

        with _Interrupt() as interrupt:
            return consume_group(args, interrupt)
    if args.queue is None or args.subscription is None:
        raise ConfigError("give a queue and --subscription (or --topic and --group)")
    preflight(args)
    return _consume_command(args)


def _consume_command(args: argparse.Namespace) -> int:
    from ordq.sdk import Consumer, ConsumerConfig

    cfg = ConsumerConfig(**cluster_options(args), queue=args.queue, subscription=args.subscription,
                         start=args.start, audit_dir=args.audit_dir, connect_timeout_s=args.zk_timeout)
    if args.workers is not None:
        n, last_seq = _consume_keyed(args, Consumer(cfg))
    else:
        n, last_seq = _consume(args, Consumer(cfg))
    summary = {"queue": args.queue, "subscription": args.subscription, "delivered": n, "last_seq": last_seq}
    if args.json:
        emit_json(summary)
    else:
        last = "" if last_seq is None else f", last seq {last_seq}"  # (none delivered: no "last seq None")
        print(f"delivered {n} messages from {args.queue}/{args.subscription}{last}", file=sys.stderr)
    return 0


def _consume(args: argparse.Namespace, consumer: Any) -> tuple[int, int | None]:
    """Print (or count) messages; commit exactly the ones printed: ``poll`` hands out no more
    than ``--count`` still needs, and on Ctrl-C the batch in hand is printed to its end and
    the commit covers exactly what was printed."""
    n = 0
    last = None
    idle_since = time.monotonic()
    with _Interrupt() as interrupt, contextlib.ExitStack() as stack:
        # One consumer of a subscription at a time: a second one waits for the lease, and says so
        # after a second (issue 42: it waited without a word); Ctrl-C stops it there at once.
        with interrupt.blocking(), saying(_waiting_to_consume(args)):
            stack.enter_context(consumer)
        while (args.count is None or n < args.count) and not interrupt.stop.is_set():
            batch = consumer.poll(max_messages=(args.count - n) if args.count is not None else None)
            if not batch:
                if args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                    break
                continue
            idle_since = time.monotonic()
            for m in batch:
                if not args.quiet and not args.json:
                    sys.stdout.buffer.write(b"%d\t" % m.seq + m.payload + b"\n")
                n += 1
                last = m
        if last is not None:
            try:
                # Through a coordinator's failover (up to the consumer's coordinator_outage_s),
                # saying so; a signal now interrupts it (what was printed comes again next time).
                with interrupt.blocking(), saying(_COMMIT_WAIT):
                    consumer.commit(through=last)
            except LeaseLost as exc:
                # Frozen past its lease, another consumer holds the subscription now: what was
                # printed since the last commit is delivered again (at-least-once), not lost.
                print(f"ordq: warning: not committed ({exc.reason}): the messages printed since the last commit "
                      "are delivered again", file=sys.stderr)
    return n, (last.seq if last is not None else None)


_COMMIT_WAIT = ("committing what was printed: no coordinator answers yet (Ctrl-C leaves it uncommitted: "
                "the next consume of the subscription prints it again)")


def _waiting_to_consume(args: argparse.Namespace) -> str:
    return (f"waiting to be the consumer of {args.queue}/{args.subscription} (one at a time: another holds it; "
            "Ctrl-C stops)")


def _consume_keyed(args: argparse.Namespace, consumer: Any) -> tuple[int, int | None]:
    """``Consumer.run_keyed`` with a handler that prints; ``--count`` counts handled messages
    (the queued rest is abandoned, not committed); ``last_seq`` is the highest handled."""
    lock = threading.Lock()
    stop = threading.Event()
    done = _Handled(at=time.monotonic())

    def handler(m: Any) -> None:
        with lock:
            if args.count is not None and done.n >= args.count:
                stop.set()
                raise _Enough  # not handled: not committed
            done.n += 1
            done.last = m.seq if done.last is None else max(m.seq, done.last)
            done.at = time.monotonic()
            if not args.quiet and not args.json:
                sys.stdout.buffer.write(b"%d\t" % m.seq + m.payload + b"\n")
            if args.count is not None and done.n >= args.count:
                stop.set()

    def watch_idle() -> None:
        while not stop.wait(0.1):
            with lock:
                if time.monotonic() - done.at > args.idle_exit:
                    stop.set()

    if args.idle_exit is not None:
        threading.Thread(target=watch_idle, daemon=True).start()
    with _Interrupt(stop) as interrupt, contextlib.ExitStack() as stack:
        with interrupt.blocking(), saying(_waiting_to_consume(args)):
            stack.enter_context(consumer)
        try:
            consumer.run_keyed(handler, workers=args.workers, stop=stop, drain=False)
        except HandlerError as exc:
            if not isinstance(exc.__cause__, _Enough):
                raise
    stop.set()
    return done.n, done.last


@attrs.define
class _Handled:
    at: float  # when the last message was handled (or the start)
    n: int = 0
    last: int | None = None


class _Enough(Exception):
    """--count reached in a worker while others still held messages."""
