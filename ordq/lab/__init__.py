"""A lab of hosts on one machine (network namespaces joined by a bridge, each host its own
address) and the partition nemesis that cuts its links. Needs root.

``Lab`` (``ordq/lab/lab.py``) makes and removes a lab and runs processes in its hosts;
``ordq.lab.partition`` describes partitions as data (no I/O); ``Nemesis``
(``ordq/lab/nemesis.py``) installs them with iptables inside the hosts; the reaper
(``ordq/lab/reaper.py``) removes a lab whose owner died. ``LabCluster``
(``ordq/lab/cluster.py``) deploys a whole ordq cluster in a lab, host by host.
"""

from __future__ import annotations

from ordq.lab.lab import Lab, registered, status, sweep
from ordq.lab.nemesis import Nemesis
from ordq.lab.partition import Cut, Partition, bridge, cut_pair, flaky, isolate, one_way, split

__all__ = ["Cut", "Lab", "Nemesis", "Partition", "bridge", "cut_pair", "flaky", "isolate", "one_way", "registered",
           "split", "status", "sweep"]
