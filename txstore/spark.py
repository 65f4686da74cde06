"""Spark glue: one Spark partition per offset range, and ranges as DataFrames.

Ranges are planned on the driver; ``parallelize(ranges, len(ranges))`` puts
exactly one range in each Spark partition, so a task is a range and a retry
of the task re-reads the same range.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from txstore.kafka import RangeReader
from txstore.ranges import OffsetRange

T = TypeVar("T")

# The columns of Spark's own Kafka source, so existing DataFrame code fits.
KAFKA_SOURCE_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)


def kafka_source_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("key", BinaryType(), True),
            StructField("value", BinaryType(), True),
            StructField("topic", StringType(), False),
            StructField("partition", IntegerType(), False),
            StructField("offset", LongType(), False),
            StructField("timestamp", TimestampType(), True),
            StructField("timestampType", IntegerType(), False),
            StructField(
                "headers",
                ArrayType(
                    StructType(
                        [StructField("key", StringType(), False), StructField("value", BinaryType(), True)]
                    )
                ),
                True,
            ),
        ]
    )


def run_ranges(
    spark: Any,
    ranges: Sequence[OffsetRange],
    task: Callable[[Iterator[OffsetRange]], Iterable[T]],
    description: str,
) -> list[T]:
    """Run ``task`` over the ranges, one Spark task per range; return its outputs."""
    if not ranges:
        return []  # never launch a Spark job for nothing
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        result: list[T] = sc.parallelize(list(ranges), len(ranges)).mapPartitions(task).collect()
    finally:
        sc.setJobDescription(None)
    return result


@dataclass(frozen=True)
class _RangeRows:
    kafka_conf: Mapping[str, Any]

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[tuple[Any, ...]]:
        utc = timezone.utc
        for offset_range in ranges:
            for batch in RangeReader(self.kafka_conf, offset_range):
                for m in batch:
                    ts_type, ts = m.timestamp()
                    headers = m.headers()
                    yield (
                        m.key(),
                        m.value(),
                        m.topic(),
                        m.partition(),
                        m.offset(),
                        datetime.fromtimestamp(ts / 1000, utc) if ts_type else None,
                        ts_type - 1,  # librdkafka 0/1/2 -> Kafka's -1 none / 0 create / 1 log append
                        [(k, v) for k, v in headers] if headers else None,  # type: ignore[str-unpack]
                    )


def read_ranges(spark: Any, ranges: Sequence[OffsetRange], kafka_conf: Mapping[str, Any]) -> Any:
    """The messages of ``ranges`` as a DataFrame with Spark's Kafka-source columns.

    One Spark partition per range, read exactly like the plain-Python path.
    """
    sc = spark.sparkContext
    schema = kafka_source_schema()
    if not ranges:
        return spark.createDataFrame(sc.emptyRDD(), schema)
    rows = sc.parallelize(list(ranges), len(ranges)).mapPartitions(_RangeRows(dict(kafka_conf)))
    return spark.createDataFrame(rows, schema)


_PY_ERROR_LINE = re.compile(
    r"^(?:[\w.]+\.)?"
    r"(\w+(?:Error|Unavailable|Missing|Loss|Committed|Gap|Overlap|Log|Failure|Exception)): (.+)$"
)


def spark_failure_reason(error: BaseException) -> str:
    """The one line that matters from a failed Spark job: the Python error raised in the task."""
    text = str(error)
    for line in reversed(text.splitlines()):
        match = _PY_ERROR_LINE.match(line.strip())
        if match and match.group(1) not in ("Py4JJavaError", "PythonException", "SparkException"):
            return f"{match.group(1)}: {match.group(2)}"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0][:500] if lines else type(error).__name__
