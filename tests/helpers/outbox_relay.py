"""``ordq outbox relay`` that kills itself (SIGKILL) at a named point of its loop, for the
crash windows a kill from outside hits only by chance.

usage: python -m tests.helpers.outbox_relay --crash-at POINT:N ORDQ-ARGS...
    POINT: ``sent`` (a read's rows handed to the producer, not yet acked) or ``acked`` (acks
    taken, the rows not yet deleted nor the position recorded); N: at its Nth time.
    ORDQ-ARGS: as for ``ordq``, e.g. ``--zk H --root R outbox relay DB QUEUE``.
"""

from __future__ import annotations

import os
import signal
import sys

from ordq.cli import build_parser
from ordq.commands.outbox import run_relay
from ordq.common.errors import OrdqError
from ordq.outbox.relay import Relay


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--crash-at":
        print(__doc__, file=sys.stderr)
        return 2
    point, _, nth = argv[1].partition(":")
    target = int(nth or 1)

    class CrashingRelay(Relay):
        seen = 0

        def _checkpoint(self, name: str) -> None:
            if name == point:
                CrashingRelay.seen += 1
                if CrashingRelay.seen == target:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)

    args = build_parser().parse_args(argv[2:])
    try:
        return run_relay(args, relay_class=CrashingRelay)
    except OrdqError as exc:
        print(f"ordq: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
