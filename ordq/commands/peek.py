"""ordq peek QUEUE --seq N: one stored message by seq, from whichever replica answers."""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command, admin_call, int_in, wants_json
from ordq.output import emit_json

LIMIT_BYTES = 256  # payload, key and header values shown without --full


def register(subparsers: Any) -> None:
    peek = add_command(
        subparsers, "peek", func=cmd_peek,
        help="show the message with a given seq (read from the master, or the slave when it is down)",
        description="Show one stored message by seq: where it is (seg, offset, group, replica read), its "
        "key, headers, timestamp and payload. Payload, key and header values are shown as text when "
        f"printable UTF-8, else as hex, cut at {LIMIT_BYTES} bytes unless --full. Nothing is consumed.",
    )
    peek.add_argument("queue")
    peek.add_argument("--seq", type=int_in(0, 2**63 - 1), required=True, help="the message's seq")
    peek.add_argument("--full", action="store_true", help=f"show all bytes (default: first {LIMIT_BYTES})")


def _show(value: dict[str, Any], size: int | None = None) -> str:
    text = value["value"] if value["encoding"] == "text" else f"(hex) {value['value']}"
    if value["truncated"]:
        text += f" ... ({size} bytes in all; --full shows them)" if size is not None else " ... (--full shows all)"
    return text


def cmd_peek(args: argparse.Namespace) -> int:
    doc = admin_call(args, "peek", queue=args.queue, seq=args.seq, full=args.full, limit=LIMIT_BYTES)
    if wants_json(args):
        emit_json(doc)
        return 0
    print(f"queue      {doc['queue']}")
    print(f"seq        {doc['seq']}")
    print(f"position   seg {doc['seg']} offset {doc['offset']} on group {doc['gid']} (read from {doc['read_from']})")
    print(f"timestamp  {doc['timestamp']} ({doc['timestamp_us']} us)")
    print(f"key        {_show(doc['key']) if doc['key'] is not None else '(none)'}")
    if doc["headers"]:
        for header in doc["headers"]:
            print(f"header     {header['name']}: {_show(header)}")
    else:
        print("headers    (none)")
    print(f"payload    {doc['payload_bytes']} bytes")
    print(_show(doc["payload"], doc["payload_bytes"]))
    return 0
