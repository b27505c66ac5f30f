"""Where a local cluster (``ordq up``) keeps itself: its folder and the file that records it, as
plain constants, so that ``ordq status`` finds out whether one is here without loading the
cluster's classes (``ordq.cluster_config`` loads attrs and the ZooKeeper server code; issue 42:
``ordq status`` of a running cluster ≤ 0.25 s on a quiet box).

Rules: constants and file tests only; the standard library only.
"""

from __future__ import annotations

from pathlib import Path

STATE_FILE = "ordq-cluster.json"
DEFAULT_FOLDER = Path(".ordq")


def holds_cluster(folder: Path) -> bool:
    """Whether ``folder`` records a local cluster (``LocalCluster.exists``)."""
    return (Path(folder) / STATE_FILE).exists()
