"""The Python process of a doc session (tests/helpers/doc_session.py): runs the doc's Python
blocks in order in one namespace, like a REPL session.

Reads one JSON request per line from stdin (``code``, ``filename``, ``line``, ``token``),
runs the code with tracebacks pointing at the doc's lines, and prints ``<token> <exit code>``
on a line of its own after what the block printed (0, 1 for an exception, or a SystemExit's
code). The blocks themselves read an empty stdin.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - for the whole process
    namespace: dict[str, object] = {"__name__": "__main__"}
    for raw in requests:
        req = json.loads(raw)
        code = 0
        try:
            compiled = compile("\n" * (req["line"] - 1) + req["code"], req["filename"], "exec")
            exec(compiled, namespace)  # noqa: S102 - running the doc is the point
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported as the block's failure
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"{req['token']} {code}", flush=True)


if __name__ == "__main__":
    main()
