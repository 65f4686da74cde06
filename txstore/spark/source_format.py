"""``format("txstore")``: the one data source Spark registers, for batch reads
(:mod:`txstore.spark.datasource`), stream reads (:mod:`txstore.spark.stream_source`) and the
exactly-once stream sink (:mod:`txstore.spark.stream_sink`).

Apart from both so that the stream side can build on the batch side without either importing
the other's entry point.
"""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql.datasource import DataSource

from txstore.spark.datasource import FORMAT, TxstoreReader, check_explicit_offsets, parse_read_options
from txstore.spark.stream_sink import stream_writer
from txstore.spark.stream_source import (
    COUNT_MESSAGES_OPTION,
    COUNT_SCHEMA,
    parse_count_messages,
    stream_reader,
)


class TxstoreDataSource(DataSource):  # type: ignore[misc]
    """``format("txstore")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from txstore.spark.source_columns import kafka_source_schema

        # A bad option fails at load(), not at the action; the stream-only option is checked by
        # streamReader (txstore.spark.stream_source), and refused by reader() for a batch read.
        stream_only = ("maxoffsetspertrigger", COUNT_MESSAGES_OPTION)
        given = {k: v for k, v in self.options.items() if str(k).lower() not in stream_only}
        options = parse_read_options(given, os.environ)
        check_explicit_offsets(options)
        counting = {str(k).lower(): v for k, v in self.options.items()}.get(COUNT_MESSAGES_OPTION)
        if parse_count_messages(counting):
            return COUNT_SCHEMA
        return kafka_source_schema()

    def reader(self, schema: Any) -> TxstoreReader:
        return TxstoreReader(parse_read_options(self.options, os.environ), schema)

    def streamReader(self, schema: Any) -> Any:
        """``spark.readStream.format("txstore")``: see :mod:`txstore.spark.stream_source`."""
        return stream_reader(self.options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """``writeStream.format("txstore")``: see :mod:`txstore.spark.stream_sink`."""
        return stream_writer(self.options, schema, overwrite)


def register(spark: Any) -> None:
    """Make ``spark.read.format("txstore")`` available in this session (classic or Spark Connect)."""
    spark.dataSource.register(TxstoreDataSource)
