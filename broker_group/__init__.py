"""broker_group."""
