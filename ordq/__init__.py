"""ordq: a strictly ordered, replicated message queue.

Packages: ``coordinator`` (state machine, ZooKeeper store, daemon), ``broker_group``
(segment log, master/slave broker), ``sdk`` (producer, consumer, audit), ``spark_order_check``
(verifier); this package holds what they share: errors, names and the ``ordq`` CLI.
"""

__version__ = "0.1.0"
