"""Failover drills: scripted faults under steady load, each verified by spark_order_check.

``ordq drill NAME|all`` runs them (docs/OPERATIONS.md); the catalogue is ``drills.catalog``,
the machinery ``drills.runner``, the producer/consumer processes ``drills.workload``.
"""
