"""Failover drills: scripted faults under steady load, each verified by spark_order_check.

``ordq drill NAME|all`` runs them (docs/OPERATIONS.md); the catalogue is ``ordq.drills.catalog``,
the machinery ``ordq.drills.runner``, the producer/consumer processes ``ordq.drills.workload``.
"""
