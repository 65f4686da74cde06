"""What Spark itself costs to take rows from a Python worker, without Kafka.

``python -m bench.spark_intake [--rows 2000000] [--rounds 3] [--master local[2]]``

A ``mapInArrow`` over ``spark.range(0, 2, 1, 2)`` (two tasks, as a job's task
groups on two cores) yields ``--rows`` rows in all of one column, as ready-made
Arrow batches (no reading, no conversion), and Spark counts them, or groups
them by the column (``groupBy().count()``, what the benchmark's DataFrame path
runs). Each is timed against the same job yielding 10 rows, so the difference
is Spark's own work per row: the batches crossing from the Python worker,
becoming rows, and being aggregated. Batches of 10,000 rows (what the reader
fetches) and 100,000 (what ``txstore.spark.source.arrow.coalesce`` hands Spark); a string
column (``topic``) and an int one (``partition``).

This is the part of the DataFrame aggregate path's cost that no change in
txstore's reader can remove: the per-range count path hands Spark one row per
range. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def _rows(total: int, batch_rows: int, string: bool) -> Callable[[Iterable[Any]], Iterator[Any]]:
    def produce(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass
        left = total // 2  # two tasks
        while left > 0:
            n = min(batch_rows, left)
            if string:
                yield pa.RecordBatch.from_arrays([pa.repeat(pa.scalar("events", pa.string()), n)], ["topic"])
            else:
                yield pa.RecordBatch.from_arrays([pa.repeat(pa.scalar(3, pa.int32()), n)], ["partition"])
            left -= n

    return produce


def _median_ms(action: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _measure(spark: Any, rows: int, rounds: int, string: bool, schema: str, column: str) -> None:
    """Print the counts and groupings of ``rows`` rows of one column, beyond a 10-row job."""

    def frame(total: int, batch_rows: int) -> Any:
        return spark.range(0, 2, 1, 2).mapInArrow(_rows(total, batch_rows, string), schema)

    def count(total: int, batch_rows: int) -> Callable[[], object]:
        return lambda: frame(total, batch_rows).count()

    def group(total: int, batch_rows: int) -> Callable[[], object]:
        return lambda: frame(total, batch_rows).groupBy(column).count().collect()

    for batch_rows in (10, 10_000):  # Spark SQL compiles each plan's code once: not timed
        group(rows if batch_rows > 10 else 10, batch_rows)()
        count(10, 10)()
    base_count = _median_ms(count(10, 10), rounds)
    base_group = _median_ms(group(10, 10), rounds)
    for batch_rows in (10_000, 100_000):
        counted = _median_ms(count(rows, batch_rows), rounds)
        grouped = _median_ms(group(rows, batch_rows), rounds)
        print(
            f"{rows:,} rows of {schema!r} in {batch_rows:,}-row batches: count {counted:,.0f} ms "
            f"({counted - base_count:+,.0f} over 10 rows), groupBy {grouped:,.0f} ms "
            f"({grouped - base_group:+,.0f} over 10 rows)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spark_intake", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from bench.common import start_spark

    spark, _ = start_spark(args.master)
    try:
        for string, schema, column in (
            (True, "topic string", "topic"),
            (False, "partition int", "partition"),
        ):
            _measure(spark, args.rows, args.rounds, string, schema, column)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
