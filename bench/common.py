"""What every benchmark shares (:mod:`bench.run`, :mod:`bench.race`, :mod:`bench.stream`,
:mod:`bench.partitions`): positive-count arguments, a database of its own made and dropped, a
SparkSession built the same way with its Python workers started, and the machine's load."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import secrets
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from txstore.postgres.db import connect
from txstore.postgres.migrate import upgrade

RESULTS = Path(__file__).resolve().parent / "results"


def positive_count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(value)


def positive_counts(text: str) -> list[int]:
    return [positive_count(part) for part in text.split(",") if part.strip()] if text.strip() else []


@contextlib.contextmanager
def bench_database(url: str | None) -> Iterator[str]:
    if url:
        upgrade(url)
        yield url
        return
    host = os.environ.get("PGHOST", "127.0.0.1")
    port = os.environ.get("PGPORT", "5432")
    user = os.environ.get("PGUSER", "postgres")
    password = os.environ.get("PGPASSWORD", "")
    auth = f"{user}:{password}" if password else user
    # The pid alone is not unique: runs in other pid namespaces (CI, other work trees) share the
    # machine's PostgreSQL, and a run whose pid matched dropped another run's database mid-run.
    name = f"txstore_bench_{os.getpid()}_{secrets.token_hex(4)}"
    admin = f"postgresql://{auth}@{host}:{port}/postgres"
    with connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql://{auth}@{host}:{port}/{name}"
        upgrade(url)
        yield url
    finally:
        with connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_spark(master: str, spark: Any = None) -> tuple[Any, dict[str, float]]:
    """A SparkSession like a job's, and its start-up cost: session, then first Python workers.

    Both are paid once per job process, before its first batch, so no batch
    measured here includes them; they are reported on their own. ``spark``:
    use this running session instead (the smoke test shares its session).
    """
    started = time.monotonic()
    # spark.sql.shuffle.partitions: as the Connect server's (bench/paths.py)
    spark = spark or local_session(master, "txstore bench", {"spark.sql.shuffle.partitions": "2"})
    session = time.monotonic()
    warm_up(spark)
    warm = time.monotonic()
    return spark, {
        "session_seconds": round(session - started, 3),
        "python_workers_seconds": round(warm - session, 3),
    }


def local_session(master: str, app: str, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession as every benchmark builds it: no UI or progress bar, the driver on
    127.0.0.1, its Python workers this Python, logs at ERROR; ``conf`` on top."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config(map=dict(conf or {}))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def warm_up(spark: Any) -> None:
    """Run what a job's first batch would run first: a ``mapInArrow`` over ``spark.range`` (as
    :mod:`txstore.spark.ranges.tasks` runs every task group) that starts the Python workers and imports
    txstore there. Spark SQL's first such job also loads and compiles its own code: measured at
    35 s on the busy machine, which an RDD warm-up (what the job ran before) did not pay."""
    from txstore.spark.ranges.tasks import default_parallelism

    cores = default_parallelism(spark)

    def import_txstore(batches: Any) -> Any:  # nested: pickled by value, not by module name
        __import__("txstore.spark.ranges.range_task")
        yield from batches

    spark.range(0, cores, 1, cores).mapInArrow(import_txstore, "id long").collect()


def spark_jobs(spark: Any) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def say(text: str) -> None:
    print(text, flush=True)


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
