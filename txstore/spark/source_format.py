"""``format("txstore")``: the one data source Spark registers, for batch reads
(:mod:`txstore.spark.source.datasource`), stream reads (:mod:`txstore.spark.stream.stream_source`) and the
exactly-once stream sink (:mod:`txstore.spark.stream.stream_sink`).

Apart from both so that the stream side can build on the batch side without either importing
the other's entry point.

:func:`register` also hands the stream source the session's parallelism, as the default of its
``txstore.tasks`` option: a stream's planner runs in a Python worker with no SparkSession to ask
(and under Spark Connect there is no ``sparkContext`` at all), so the number travels inside the
registered class (:func:`registered_source`), which Spark pickles by value.
"""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql.datasource import DataSource

from txstore.spark.ranges.tasks import default_parallelism
from txstore.spark.source.datasource import FORMAT, TxstoreReader
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.read_planning import check_explicit_offsets
from txstore.spark.stream.stream_options import (
    COUNT_MESSAGES_OPTION,
    COUNT_SCHEMA,
    STREAM_ONLY_OPTIONS,
    parse_count_messages,
)
from txstore.spark.stream.stream_sink import stream_writer
from txstore.spark.stream.stream_source import stream_reader


class TxstoreDataSource(DataSource):  # type: ignore[misc]
    """``format("txstore")``: see the module docstring for the options."""

    default_tasks: int | None = None
    """The stream source's ``txstore.tasks`` when its options do not give it: set by
    :func:`registered_source` (None: a Spark task per range)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from txstore.spark.source.source_columns import kafka_source_schema

        # A bad option fails at load(), not at the action; the stream-only options are checked by
        # streamReader (txstore.spark.stream.stream_source), and refused by reader() for a batch read.
        given = {k: v for k, v in self.options.items() if str(k).lower() not in STREAM_ONLY_OPTIONS}
        options = parse_read_options(given, os.environ)
        check_explicit_offsets(options)
        counting = {str(k).lower(): v for k, v in self.options.items()}.get(COUNT_MESSAGES_OPTION)
        if parse_count_messages(counting):
            return COUNT_SCHEMA
        return kafka_source_schema(options.columns)

    def reader(self, schema: Any) -> TxstoreReader:
        return TxstoreReader(parse_read_options(self.options, os.environ), schema)

    def streamReader(self, schema: Any) -> Any:
        """``spark.readStream.format("txstore")``: see :mod:`txstore.spark.stream.stream_source`."""
        return stream_reader(self.options, schema, self.default_tasks)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """``writeStream.format("txstore")``: see :mod:`txstore.spark.stream.stream_sink`."""
        return stream_writer(self.options, schema, overwrite)


def registered_source(tasks: int | None) -> type[TxstoreDataSource]:
    """:class:`TxstoreDataSource` whose stream source reads a micro-batch in at most ``tasks``
    Spark tasks unless ``txstore.tasks`` says otherwise.

    A subclass made here, named ``<locals>``, is not importable by name: cloudpickle (PySpark's,
    on classic Spark and on a Spark Connect client alike) pickles it by value, with ``tasks``,
    and its base class by reference (txstore must be installed where Spark runs Python, as for
    any use of the source).
    """
    return type(
        "TxstoreDataSource",
        (TxstoreDataSource,),
        {
            "default_tasks": tasks,
            "__qualname__": "registered_source.<locals>.TxstoreDataSource",
            "__doc__": TxstoreDataSource.__doc__,
        },
    )


def register(spark: Any) -> None:
    """Make ``spark.read.format("txstore")`` available in this session (classic or Spark Connect),
    with the session's parallelism as the stream source's default ``txstore.tasks``
    (:func:`~txstore.spark.ranges.tasks.default_parallelism`: ``sparkContext.defaultParallelism``, or
    under Spark Connect one tiny Spark job, once per session)."""
    spark.dataSource.register(registered_source(default_parallelism(spark)))
