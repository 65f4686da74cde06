"""Spark's Kafka-source columns: their names, their Spark schema, and a checked selection of them.

The one list every part of txstore reads columns by (the range readers' Arrow batches, the
data source, read-column inference, pushdown), kept apart so that each can import it without
importing the Spark glue (:mod:`txstore.spark.ranges.tasks`) that uses them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

WITHOUT_HEADERS = tuple(c for c in KAFKA_SOURCE_COLUMNS if c != "headers")
"""The columns of ``format("kafka")`` (and ``format("txstore")``) unless ``includeHeaders`` is true."""


class ColumnsInvalid(ValueError):
    """A column selection that is not a non-empty set of distinct Kafka-source columns."""


def check_columns(columns: Sequence[str], where: str) -> tuple[str, ...]:
    """``columns`` as a tuple, or :class:`ColumnsInvalid` in one line naming ``where`` they came from."""
    chosen = tuple(columns)
    unknown = [c for c in chosen if c not in KAFKA_SOURCE_COLUMNS]
    if unknown:
        raise ColumnsInvalid(
            f"{where}: {', '.join(map(repr, unknown))} is not a Kafka-source column; "
            f"choose from {', '.join(KAFKA_SOURCE_COLUMNS)}"
        )
    if not chosen:
        raise ColumnsInvalid(f"{where}: no columns; name at least one of {', '.join(KAFKA_SOURCE_COLUMNS)}")
    if len(set(chosen)) != len(chosen):
        raise ColumnsInvalid(f"{where}: a column is named twice: {', '.join(chosen)}")
    return chosen


def kafka_source_schema(columns: Sequence[str] | None = None) -> Any:
    """Spark's Kafka-source columns as a ``StructType``; with ``columns``, only those, in that order."""
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

    full = StructType(
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
    if columns is None:
        return full
    return StructType([full[c] for c in check_columns(columns, "columns")])
