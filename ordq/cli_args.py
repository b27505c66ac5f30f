"""The argparse pieces the top-level parser needs, kept apart from ``ordq.commands`` so that
``ordq --help`` imports nothing else of ordq's (issue 42: 0.1 s of CPU for ``--help``).

Rules: the standard library's argparse only.
"""

from __future__ import annotations

import argparse

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
