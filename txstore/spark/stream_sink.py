"""``writeStream.format("txstore")``: the exactly-once stream's sink.

A Python streaming data sink (``DataSourceStreamWriter``, PySpark 4.0 or newer;
``DataSourceStreamArrowWriter`` on 4.1+, handed Arrow batches) for the rows of a
``readStream.format("txstore")`` query (:mod:`txstore.spark.stream_source`) of the same
``txstore.job``. Steps of a micro-batch:

- ``write(iterator)`` (each task): counts its rows per ``topic`` (txstore's own counts,
  ``txn_data`` topic totals, as ``count_topic``), and hands them to the driver;
- ``commit(messages, batchId)`` (the driver): loads the ranges the source planned for this
  micro-batch (:func:`~txstore.postgres.stream_plans.load_plan`), then adds the counts and
  moves every planned range's offset in one transaction with the conditional update
  (:class:`~txstore.postgres.sink.TransactionalSink`). A batch already committed
  (:class:`~txstore.core.errors.AlreadyCommitted`, a replay after a crash between
  PostgreSQL's commit and Spark's commit log) is skipped; any other conflict stops the query;
- ``abort``: nothing to undo, the tasks write nothing.

The offsets committed are the planned ranges', never derived from the rows: a partition
with no message in the batch (or only aborted transactions' offsets) still moves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from txstore.core.errors import AlreadyCommitted, ConfigError, TxstoreError
from txstore.core.failpoints import FailPoints
from txstore.core.results import TOPIC_TOTAL
from txstore.postgres.db import DATABASE_URL_ENV, connect, resolve_database_url
from txstore.postgres.sink import TransactionalSink
from txstore.postgres.stream_plans import load_plan

log = logging.getLogger("txstore")

_WriterBase: Any = DataSourceStreamWriter
try:  # PySpark 4.1+: the sink is handed Arrow batches, no row becomes a Python object
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _WriterBase = DataSourceStreamArrowWriter
except ImportError:
    pass


@dataclass
class TopicCounts(WriterCommitMessage):  # type: ignore[misc]
    """One write task's rows per topic."""

    counts: dict[str, int]


@dataclass(frozen=True)
class SinkOptions:
    job: str
    database_url: str
    failpoints: str = ""  # tests: txstore.core.failpoints, as TXSTORE_FAILPOINTS (txstore.core.failpoints)


def parse_sink_options(options: Mapping[str, str], environ: Mapping[str, str]) -> SinkOptions:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    known = {"txstore.job", "txstore.databaseurl", "txstore.failpoints", "checkpointlocation", "path"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} for writeStream.format('txstore'); it takes txstore.job "
            "and txstore.databaseUrl"
        )
    job = given.get("txstore.job", "").strip()
    if not job:
        raise ConfigError("option txstore.job is required by writeStream.format('txstore')")
    url = given.get("txstore.databaseurl") or environ.get(DATABASE_URL_ENV)
    if not url:
        raise ConfigError(
            f"writeStream.format('txstore') needs the job's database: .option('txstore.databaseUrl', "
            f"'postgresql://...') or {DATABASE_URL_ENV} on the driver"
        )
    failpoints = given.get("txstore.failpoints", "")
    FailPoints.parse(failpoints)  # a bad one fails at start()
    return SinkOptions(job, resolve_database_url(url), failpoints)


def _count_topics(iterator: Iterator[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in iterator:
        if hasattr(item, "num_rows"):  # an Arrow record batch (PySpark 4.1+)
            column = item.column(item.schema.get_field_index("topic"))
            for value in column.value_counts().to_pylist():
                counts[value["values"]] = counts.get(value["values"], 0) + int(value["counts"])
        else:
            topic = item["topic"]
            counts[topic] = counts.get(topic, 0) + 1
    return counts


class TxstoreStreamWriter(_WriterBase):  # type: ignore[misc]
    """Counts each micro-batch's rows per topic and commits them with the batch's ranges."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        if "topic" not in schema.names:
            raise ConfigError(
                "writeStream.format('txstore') counts messages per topic: the DataFrame needs the "
                "topic column of readStream.format('txstore')"
            )
        self.options = options

    def write(self, iterator: Iterator[Any]) -> TopicCounts:
        return TopicCounts(_count_topics(iterator))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        job = self.options.job
        totals: dict[str, int] = {}
        for m in messages:
            if isinstance(m, TopicCounts):
                for topic, n in m.counts.items():
                    totals[topic] = totals.get(topic, 0) + n
        with connect(self.options.database_url) as conn:
            ranges = [r for r in load_plan(conn, job) if r.size > 0]
            deltas = {(t, TOPIC_TOTAL): n for t, n in sorted(totals.items()) if n}
            if not ranges:
                if deltas:
                    raise TxstoreError(f"job {job!r} batch {batchId}: rows but no planned range")
                return
            try:
                failpoints = FailPoints.parse(self.options.failpoints)
                TransactionalSink(conn, job, failpoints).commit_batch(ranges, deltas)
            except AlreadyCommitted:
                log.info(
                    "job %s: micro-batch %d (%s) already committed; skipped",
                    job,
                    batchId,
                    ", ".join(map(str, ranges)),
                )

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: tasks write nothing, the commit is one transaction."""


def stream_writer(options: Mapping[str, str], schema: Any) -> TxstoreStreamWriter:
    """The sink for ``writeStream.format("txstore")`` (options checked here)."""
    return TxstoreStreamWriter(parse_sink_options(options, os.environ), schema)
