"""The argparse pieces the top-level parser needs, kept apart from ``ordq.commands`` so that
``ordq --help`` imports nothing else of ordq's (issue 42: 0.1 s of CPU for ``--help``).

Rules: the standard library only (argparse, threading).
"""

from __future__ import annotations

import argparse
import threading

TYPE_CHECKING = False  # not typing's: see ordq/__init__.py
if TYPE_CHECKING:
    from typing import Any


class Given(argparse._StoreAction):
    """Store the value and note that it was given (``args.given``), so that a config file
    does not override a flag whose value came from the command line rather than a default
    (``ordq.commands.process_config.apply_globals``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


# Set by the CLI's SIGINT handler (ordq/cli.py), cleared when a command starts: a loop that
# redraws (``ordq top``) checks it at every turn, so that a KeyboardInterrupt swallowed on its
# way (in a library's callback, a finaliser) cannot keep it running (issue 42). It lives here,
# in a module the CLI imports before it takes SIGINT: a handler that imported ``ordq.commands``
# failed with ImportError when the signal came while that package was half imported.
INTERRUPTED = threading.Event()
