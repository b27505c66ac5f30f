"""``ordq`` run as the CLI runs it, with the wall-clock times of an admin call's steps on stderr
(issue 43: a listing of 10^5 queues waited 13 s for an answer its coordinator's handler spent
7.4 s on, and the rest could not be placed). Not a test: bench_queues runs its timed listing
through it, and the coordinator's log line of the same call (``Admin queue list: ...``) gives
the server's side on the same clock.

    .venv/bin/python -m bench.timed_cli ORDQ-ARGS...

The last stderr line is JSON: ``started`` (this process's code began), ``ready`` (the CLI's
modules imported), ``asked`` (the first admin request made, about to be sent), ``answers``
(each admin answer: when its bytes had arrived whole and were read, their size), ``ended``
(the command done, its output written); times are ``time.time()``.

With ``TIMED_CLI_WAIT=1`` in its environment it first reads one line from stdin: a profiler
attached to it meanwhile (bench_queues' ``--spy-kill``) samples it from its first step, however
short the run (py-spy attaching to a process that ends while it attaches writes nothing).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    if os.environ.get("TIMED_CLI_WAIT") == "1":
        sys.stdin.readline()  # the go: the profiler is attached
    times: dict[str, Any] = {"started": time.time(), "answers": []}
    from ordq.cli import main as ordq_main
    from ordq.wire import admin_messages

    read, request = admin_messages.read_admin_answer, admin_messages.admin_request

    def timed_read(data: bytes) -> Any:  # gRPC's deserializer: called once the answer is whole
        times["answers"].append({"at": time.time(), "bytes": len(data)})
        return read(data)

    def timed_request(verb: str, args_json: bytes) -> bytes:  # made just before the call is sent
        times.setdefault("asked", time.time())
        return request(verb, args_json)

    # the stub takes the reader when it makes the Admin method; the client imports the writer
    # when it calls
    admin_messages.read_admin_answer = timed_read
    admin_messages.admin_request = timed_request
    times["ready"] = time.time()
    try:
        return ordq_main(argv)
    finally:
        sys.stdout.flush()
        times["ended"] = time.time()
        print(json.dumps(times), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
