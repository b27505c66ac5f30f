"""``python -m ordq.spark_order_check``: the same command as ``ordq verify``."""

from __future__ import annotations

import sys

from ordq.spark_order_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
