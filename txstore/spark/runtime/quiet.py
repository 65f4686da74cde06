"""Spark's driver, quiet: its errors only, no banner, no warnings a user cannot act on.

Spark's default log4j2 profile prints, before and during a job, its banner (twice), the
hostname/loopback, NativeCodeLoader and SparkUI-port warnings, and on a streaming query the
adaptive-execution warning and DAGScheduler's cancel warnings on stop. A driver JVM started with
:data:`QUIET_LOG4J2` (a log4j2 configuration shipped in the package) logs Spark's errors only.
The jobs and the demo start it so unless ``--verbose``; your own session can too:

    from txstore.spark.runtime.quiet import java_options

    SparkSession.builder.config("spark.driver.extraJavaOptions", java_options())

(only where the JVM is started by this Python process: ``python script.py``, not ``spark-submit``,
whose driver JVM exists before; give it ``--driver-java-options "$(...)"`` instead).
"""

from __future__ import annotations

import os
from pathlib import Path

QUIET_LOG4J2 = Path(__file__).resolve().parent / "log4j2-quiet.properties"
SUBMIT_OPTS_ENV = "SPARK_SUBMIT_OPTS"  # spark-submit's JVM options for the driver it launches
CONFIG_PROPERTY = "log4j2.configurationFile"


def java_options() -> str:
    """The driver JVM option that makes it log with :data:`QUIET_LOG4J2`."""
    return f"-D{CONFIG_PROPERTY}={QUIET_LOG4J2.as_uri()}"


def quiet_driver_launch(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Have the driver JVM this process is about to launch log with :data:`QUIET_LOG4J2`, through
    ``SPARK_SUBMIT_OPTS`` (a log4j2 configuration given in ``spark.driver.extraJavaOptions`` comes
    after it, and wins). False if none will be launched (``spark-submit`` started it) or one is
    already configured there."""
    if "PYSPARK_GATEWAY_PORT" in environ:
        return False
    given = environ.get(SUBMIT_OPTS_ENV, "")
    if CONFIG_PROPERTY in given:
        return False
    environ[SUBMIT_OPTS_ENV] = f"{given} {java_options()}".strip()
    return True
