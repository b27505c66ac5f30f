"""One SparkSession for every Spark test (a session start costs ~7 s).

Import the fixture into a test module with ``spark = spark_fixtures.spark``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.util import C1_JVM_FLAGS


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from ordq.spark_order_check._session import make_session

    session = make_session(
        "local[2]",
        app_name="ordq-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "1g",
            # Test inputs are tiny: the C2 JIT compiler spent more CPU compiling Spark's
            # generated code than it saved (measured: ~2x less JVM CPU per verify with C1 only).
            "spark.driver.extraJavaOptions": C1_JVM_FLAGS,
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
