"""Which kind of Spark session a job was given: classic PySpark or a Spark Connect client.

The two run the same DataFrame operations, but only classic has a ``sparkContext``
(accumulators, job descriptions, RDDs); the modules that need one or the other ask here.
"""

from __future__ import annotations

from typing import Any


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect client session (``sc://``), False for a classic one."""
    session = getattr(spark, "underlying_session", spark)  # runner.LazySparkSession starts it here
    return type(session).__module__.startswith("pyspark.sql.connect")
