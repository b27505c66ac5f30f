"""spark_order_check."""
