"""ordq verify: check an ordq run from its audit files with Spark (spark_order_check).

Same options, output and exit codes as ``python -m spark_order_check``: 0 clean, 1 violations,
2 could not verify. PySpark is imported only when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from ordq.commands import add_command
from spark_order_check.cli import DESCRIPTION, add_arguments, run


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "verify", help="verify a run from its audit files (Spark)",
                         func=cmd_verify, description=DESCRIPTION)
    add_arguments(parser)


def cmd_verify(args: argparse.Namespace) -> int:
    return run(args, prog="ordq verify")
