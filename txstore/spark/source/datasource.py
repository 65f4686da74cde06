"""``spark.read.format("txstore")``: Kafka as a DataFrame, on classic Spark and Spark Connect.

A PySpark Python data source (``pyspark.sql.datasource``, PySpark 4.0 or
newer), registered with :func:`register` (``spark.dataSource.register``, so
it works under Spark Connect too, where there is no ``sparkContext`` and no
RDD). It reads like Spark's own Kafka batch source and has its columns
(:func:`txstore.spark.source.source_columns.kafka_source_schema`)::

    txstore.register(spark)
    df = (spark.read.format("txstore")
          .option("kafka.bootstrap.servers", "kafka:9092")
          .option("subscribe", "events,orders")
          .load())

Options: :mod:`txstore.spark.source.read_options`; what a read plans:
:mod:`txstore.spark.source.read_planning`.

Columns: Spark's Kafka-source columns (``headers`` only with ``includeHeaders``), or only those a schema names
(``.schema("topic string, timestamp timestamp")``, any order, Spark's types;
:func:`schema_columns`). Spark cannot prune a Python reader's columns itself,
so this is how a query that needs two columns stops paying for keys, values
and headers: only the named columns are built and handed to Spark.

Lowest PySpark: 4.0 (Python data sources, and ``read`` yielding Arrow
batches); tested with 4.3.

Steps: ``schema()`` checks the options (so a bad option fails at
``load()``); ``partitions()`` runs once when Spark plans the read, in a
Python worker of the driver (the Connect server under Connect): it asks
Kafka for the watermarks (and the database for the job's offsets) and plans
one :class:`~txstore.core.ranges.OffsetRange` per partition with data, each in
its own :class:`RangePartition`; ``read(partition)`` runs in a task and
yields one Arrow record batch (:func:`txstore.spark.source.arrow.messages_to_record_batch`)
per batch of messages the :class:`~txstore.kafka.reader.RangeReader` delivers, so
no row ever becomes a Python tuple. A task retried by Spark reads the same
range again.

Option parsing and planning are pure functions over frozen dataclasses
(:func:`~txstore.spark.source.read_options.parse_read_options`,
:func:`~txstore.spark.source.read_planning.plan_read_ranges`,
:func:`~txstore.spark.source.read_planning.plan_job_ranges`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from txstore.core.errors import ConfigError
from txstore.core.ranges import (
    OffsetRange,
)
from txstore.kafka.reader import RangeReader
from txstore.spark.source.read_options import ReadOptions
from txstore.spark.source.read_planning import plan

FORMAT = "txstore"


def schema_columns(schema: Any, include_headers: bool = True) -> tuple[str, ...]:
    """The Kafka-source columns a user-given schema (``.schema(...)``) names, checked.

    Each field must be one of the Kafka-source columns, with its Spark type
    (nullability aside); a column that can be null (``key``, ``value``,
    ``timestamp``, ``headers``) cannot be declared NOT NULL; ``headers`` only
    with ``include_headers`` (option ``includeHeaders``). Anything else is
    :class:`ConfigError`, one line naming the column.
    """
    from txstore.spark.source.source_columns import kafka_source_schema

    ours = kafka_source_schema()
    names: list[str] = []
    for f in schema.fields:
        if f.name not in ours.names:
            raise ConfigError(
                f"schema: {f.name!r} is not a column of format('txstore'); name some of "
                f"{', '.join(ours.names)}, or leave out .schema() for all of them"
            )
        expected = ours[f.name]
        if f.dataType.simpleString() != expected.dataType.simpleString():
            raise ConfigError(
                f"schema: column {f.name} is {expected.dataType.simpleString()}, not "
                f"{f.dataType.simpleString()}; declare it as {f.name} {expected.dataType.simpleString()} "
                "and cast it after load()"
            )
        if expected.nullable and not f.nullable:
            raise ConfigError(f"schema: column {f.name} can be null; do not declare it NOT NULL")
        if f.name == "headers" and not include_headers:
            raise ConfigError(
                "schema: column headers is there only with .option('includeHeaders', 'true'), as in "
                "Spark's Kafka source; add the option or leave headers out of the schema"
            )
        names.append(f.name)
    if len(set(names)) != len(names):
        raise ConfigError(f"schema: a column is named twice: {', '.join(names)}")
    if not names:
        raise ConfigError("schema: no columns; name at least one, or leave out .schema() for all of them")
    return tuple(names)


class RangePartition(InputPartition):  # type: ignore[misc]
    """One Spark task's input: an offset range, fixed when the read was planned."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


class RangesPartition(InputPartition):  # type: ignore[misc]
    """One Spark task's input: neighbouring offset ranges, read in order, fixed when the read was
    planned (a streaming micro-batch's run of ranges, :func:`~txstore.core.ranges.group_ranges`)."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def partition_ranges(partition: InputPartition) -> tuple[OffsetRange, ...]:
    """The ranges a task reads: a :class:`RangePartition`'s one, a :class:`RangesPartition`'s
    all; none for Spark's ``InputPartition(None)`` (an empty read)."""
    if isinstance(partition, RangesPartition):
        return partition.ranges
    if isinstance(partition, RangePartition):
        return (partition.range,)
    return ()


class TxstoreReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: ReadOptions, schema: Any) -> None:
        self.options = options
        self.columns = schema_columns(schema, options.include_headers)
        self.schema = schema  # Spark's, for the Arrow schema Spark expects (its nullability)

    def partitions(self) -> list[InputPartition]:
        """Plan the ranges (once, when Spark plans the read); none means an empty DataFrame."""
        return [RangePartition(r) for r in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from txstore.spark.source.arrow import arrow_schema

        # Nothing to read for Spark's InputPartition(None) (it stands for an empty partitions()).
        ranges = partition_ranges(partition)
        if not ranges:
            return
        built = arrow_schema(self.columns)
        expected = _spark_arrow_schema(self.schema)
        # A declared schema may differ from the source's in nullability only: a free cast.
        cast = None if built.equals(expected) else expected
        conf = self.options.kafka_conf
        for offset_range in ranges:  # in the planned order
            # Spark may stop pulling early (limit): the garbage collector is paused per batch only.
            reader = RangeReader(conf, offset_range, job=self.options.job or "", pause_gc=False)
            yield from self.read_range(reader, built, cast)

    def read_range(self, reader: RangeReader, built: Any = None, cast: Any = None) -> Iterator[Any]:
        """One range's messages as record batches of the read's columns (``reader.messages`` and
        ``reader.last`` tell what was read, once they are all yielded)."""
        from txstore.spark.source.arrow import arrow_schema, coalesce, record_batches

        if built is None:
            built = arrow_schema(self.columns)
            expected = _spark_arrow_schema(self.schema)
            cast = None if built.equals(expected) else expected
        for batch in coalesce(record_batches(reader, built, reader.range.key)):
            yield batch if cast is None else batch.cast(cast)


def _spark_arrow_schema(schema: Any) -> Any:
    """The Arrow schema PySpark expects ``read`` to yield for ``schema`` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")  # PySpark 4.1+, as it checks the batches
    except TypeError:  # PySpark 4.0: no timezone argument; timestamps are UTC by default
        return to_arrow_schema(schema)
