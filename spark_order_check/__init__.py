"""spark_order_check: prove from audit files that an ordq run lost nothing and reordered nothing.

``verify(acks=..., deliveries=..., segments=None, master=..., spark=None) -> Report``; the
CLI is ``python -m ordq.spark_order_check`` or ``ordq verify``. Rules and report: docs/VERIFIER.md.
PySpark is imported lazily, so importing this package needs only the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ordq.spark_order_check.report import CLASSES, ClassResult, Latency, Report

if TYPE_CHECKING:
    from ordq.spark_order_check._verify import verify as verify
else:

    def verify(**kwargs: Any) -> Report:
        """See :func:`ordq.spark_order_check._verify.verify` (imports PySpark on first use)."""
        from ordq.spark_order_check._verify import verify as _verify

        return _verify(**kwargs)


__all__ = ["CLASSES", "ClassResult", "Latency", "Report", "verify"]
