"""``writeStream.format("txstore")``: the exactly-once stream's sink.

A Python streaming data sink (``DataSourceStreamWriter``, PySpark 4.0 or newer;
``DataSourceStreamArrowWriter`` on 4.1+, handed Arrow batches) for the rows of a
``readStream.format("txstore")`` query (:mod:`txstore.spark.stream.stream_source`) of the same
``txstore.job``. It keeps either txstore's own counts (the default) or a results table of the user's
(``txstore.table``, ``txstore.key``, ``txstore.merge``: the options, checks and merge rules of
``jobs/aggregate.py --table/--key/--merge``, :mod:`txstore.postgres.results.results_table`). Steps of a
micro-batch:

- creating the writer (a Python planner worker of the driver, when Spark plans each
  micro-batch's write before any task reads, and again for its commit; the first in a worker
  freezes its heap, :mod:`~txstore.spark.runtime.worker_heap`): the options are checked
  (:mod:`~txstore.spark.stream.stream_sink_options`), and with a results table,
  :func:`check_table_query` refuses what could not be merged
  exactly once: a column that would round, a collation or time zone that would merge two keys
  (:func:`~txstore.postgres.results.results_check.table_problems`), complete mode's running totals, and
  rows without the ``topic``/``partition``/``offset`` of their message (an aggregation's);
- ``write(iterator)`` (each task, :mod:`~txstore.spark.stream.stream_write_tasks`; the first in a
  Python worker freezes its heap, :mod:`~txstore.spark.runtime.worker_heap`): counts its rows per ``topic`` (``txn_data`` topic totals, as
  ``count_topic``), or adds their ``txstore_messages`` when the source counted them
  (``txstore.countMessages``); or, for a table, turns its Arrow batches into ``COPY`` text of the table's
  columns (:mod:`txstore.postgres.results.copy_text`) and notes the lowest and highest offset per
  partition its rows came from;
- ``commit(messages, batchId)`` (the driver, a planner worker again, through a connection kept
  for the worker's next commit, :mod:`~txstore.postgres.kept`): loads the ranges the source planned for this
  micro-batch (:func:`~txstore.postgres.stream_plans.load_plan`), then in one transaction with
  the conditional offset update adds the counts
  (:class:`~txstore.postgres.sink.TransactionalSink`) or copies the rows into a temporary table
  and merges them, grouped by key under the rules
  (:func:`~txstore.postgres.results.results_merge.copy_and_merge`). A row whose message is outside the
  planned ranges (state kept in the checkpoint, re-emitted) stops the query before anything is
  written (:func:`check_rows_in_batch`). Rows PostgreSQL refuses (a NULL key, a value out of
  range): their message is found and named, nothing committed, or with ``txstore.onBadMessage``
  ``skip`` left out and recorded in ``txn_bad_messages`` with the offsets
  (:mod:`~txstore.spark.stream.stream_bad_rows`). A batch already committed
  (:class:`~txstore.core.errors.AlreadyCommitted`, a replay after a crash between PostgreSQL's
  commit and Spark's commit log) is skipped; any other conflict stops the query;
- ``abort``: nothing to undo, the tasks write nothing.

Why per-message rows, aggregated by the sink: Structured Streaming's update and complete modes
hand a sink the running totals of a streaming aggregation every micro-batch; merged by ``sum``
they would count every message again in every later batch, and the aggregation's state would
live in the checkpoint, which txstore does not trust. Each micro-batch's own rows, grouped by
``txstore.key`` under ``txstore.merge``, are a delta, applied once with the offsets. Spark
refuses update mode for this sink by itself.

The micro-batch's rows travel to the driver as ``COPY`` text in the tasks' commit messages: a
micro-batch's projected rows must fit in the driver's memory (bound them with
``maxOffsetsPerTrigger``).

The offsets committed are the planned ranges', never derived from the rows: a partition
with no message in the batch (or only aborted transactions' offsets) still moves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from txstore.core.errors import AlreadyCommitted, ConfigError, ResultsTableInvalid
from txstore.core.failpoints import FailPoints
from txstore.core.micro_batch import Delivery, RowsOutsideBatch, spans_from_array, verify_micro_batch
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.kafka.bad_messages import SKIP
from txstore.postgres.kept import kept_connection
from txstore.postgres.reconnect import connect_retrying
from txstore.postgres.results.results_check import describe_table, table_problems
from txstore.postgres.results.results_merge import copy_and_merge, temp_table_types
from txstore.postgres.sink import TransactionalSink, classify_batch_conflict
from txstore.postgres.store import stored_offsets
from txstore.postgres.stream_plans import load_plan, load_reads, stream_privileges
from txstore.spark.runtime.worker_heap import freeze_once
from txstore.spark.runtime.worker_log import worker_info_to_stderr
from txstore.spark.stream.stream_advice import restating
from txstore.spark.stream.stream_bad_rows import RowsByMessage, find_refused, log_skipped
from txstore.spark.stream.stream_sink_options import SinkOptions, parse_sink_options
from txstore.spark.stream.stream_write_tasks import (
    COUNTED,
    PROVENANCE,
    TableRows,
    TopicCounts,
    deliver,
    table_rows,
)

log = logging.getLogger("txstore")

_WriterBase: Any = DataSourceStreamWriter
try:  # PySpark 4.1+: the sink is handed Arrow batches, no row becomes a Python object
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _WriterBase = DataSourceStreamArrowWriter
except ImportError:
    pass


def _reconnect(url: str) -> psycopg.Connection:
    """A new connection for the sink, before it writes anything: a server restarting (the kept
    connection's session ended) is waited for, within :mod:`~txstore.postgres.reconnect`'s bounds."""
    return connect_retrying(
        url, given_by="writeStream's .option('txstore.databaseUrl') (or TXSTORE_DATABASE_URL)"
    )


def _unplaceable(names: Sequence[str]) -> list[str]:
    """The columns a counting sink needs to name each row's message, missing from ``names``."""
    if COUNTED in names:
        return [c for c in ("topic", "partition", "txstore_from", "txstore_until") if c not in names]
    return [c for c in PROVENANCE if c not in names]


def check_table_query(options: SinkOptions, schema: Any, overwrite: bool) -> dict[str, str]:
    """Refuse, before anything is read, a query whose rows the sink could not merge exactly once
    into ``options.table``; else each column's definition for the temporary table.

    The sink merges each micro-batch's own rows, grouped by key under the merge rules. So it
    takes only rows that come from one message each, with the message's ``topic``,
    ``partition`` and ``offset``: a streaming aggregation's output (running totals in update or
    complete mode, re-emitted every batch) would be merged again and again, and any state kept
    in the checkpoint would be lost with it. The rest is aggregate.py's check
    (:func:`~txstore.postgres.results.results_check.table_problems`): columns that would round,
    collations, time zones, keys, privileges.
    """
    table = options.table
    assert table is not None
    job = options.job
    if overwrite:
        raise ConfigError(
            f"job {job}: writeStream.format('txstore') with txstore.table does not take outputMode"
            "('complete'): its rows are running totals, merged again every micro-batch (double "
            "counted); write the messages' rows in append mode and let txstore.merge aggregate them"
        )
    if _WriterBase is DataSourceStreamWriter:
        raise ConfigError(
            f"job {job}: writeStream.format('txstore') with txstore.table needs PySpark 4.1 or newer "
            "(the Arrow stream writer); this is PySpark before 4.1"
        )
    missing = [c for c in PROVENANCE if c not in schema.names]
    if missing:
        raise ConfigError(
            f"job {job}: writeStream.format('txstore') with txstore.table merges each micro-batch's "
            f"own rows, one or more per message, and the query's rows have no {', '.join(missing)} "
            "column: a streaming aggregation's rows (running totals, re-emitted every micro-batch) "
            "would be merged again (double counted); keep readStream's topic, partition and offset "
            "columns and no groupBy: txstore.merge aggregates each micro-batch by txstore.key"
        )
    output = [
        (f.name, f.dataType.simpleString())
        for f in schema.fields
        if f.name in table.columns or f.name not in PROVENANCE
    ]
    with kept_connection(options.database_url, _reconnect) as conn:
        facts = describe_table(conn, table)
        problems = table_problems(table, facts, output, f"role {conn.info.user}", job=job)
        if problems:
            raise ResultsTableInvalid(problems)
        return temp_table_types(conn, table)


def check_rows_in_batch(
    job: str, batch_id: int, ranges: Sequence[OffsetRange], seen: Mapping[tuple[str, int], tuple[int, int]]
) -> None:
    """Raise :class:`RowsOutsideBatch` (one line) unless every row's message is in ``ranges``.

    A row of an earlier micro-batch's message comes from state kept in the checkpoint (an
    aggregation, deduplication or join emitting later): merging it would not be exactly once.
    """
    planned = {r.key: r for r in ranges}
    for (topic, partition), (low, high) in sorted(
        seen.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)
    ):
        r = planned.get((topic, partition))
        if r is None or low < r.from_offset or high >= r.until_offset:
            where = "none" if r is None else f"[{r.from_offset}, {r.until_offset})"
            raise RowsOutsideBatch(
                f"job {job!r} micro-batch {batch_id}: the sink received rows of topic {topic!r} "
                f"partition {partition} offsets {low}..{high}, outside this micro-batch's range "
                f"{where}: a stateful operator (aggregation, deduplication, join) emits rows of "
                "earlier micro-batches from state kept in the checkpoint, which txstore cannot merge "
                "exactly once; nothing was written. Write each micro-batch's own rows (no groupBy) "
                "and let txstore.merge aggregate them"
            )


class TxstoreStreamWriter(_WriterBase):  # type: ignore[misc]
    """Counts each micro-batch's rows per topic, or merges them into a results table, and commits
    that with the batch's ranges."""

    @restating
    def __init__(self, options: SinkOptions, schema: Any, overwrite: bool = False) -> None:
        # Made in a PySpark planner worker twice a micro-batch (the writer factory, the commit):
        # freezing its heap keeps the daemon's collection after each call off the tasks' cores.
        freeze_once()
        self.options = options
        self.types: dict[str, str] = {}
        if options.table is not None:
            self.types = check_table_query(options, schema, overwrite)
        elif overwrite:
            raise ConfigError(
                f"job {options.job}: writeStream.format('txstore') counts the rows of each micro-batch "
                "and does not take outputMode('complete') (running totals, counted again every "
                "micro-batch); write the messages' rows in append mode"
            )
        elif missing := _unplaceable(schema.names):
            raise ConfigError(
                f"job {options.job}: writeStream.format('txstore') counts each message of the "
                "micro-batch once and checks every row against the offsets its source planned: the "
                f"query's rows have no {', '.join(missing)} column; keep readStream.format('txstore')'s "
                "topic, partition and offset columns (or, with txstore.countMessages, its rows as they are)"
            )
        self.counted = options.table is None and COUNTED in schema.names

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        freeze_once()  # PySpark's collection after each task then skips the imports' objects
        if self.options.table is not None:
            return table_rows(self.options.table, iterator)
        return deliver(iterator, self.counted)

    @restating
    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.table is not None:
            self._commit_table([m for m in messages if isinstance(m, TableRows)], batchId)
            return
        job = self.options.job
        delivered = [m for m in messages if isinstance(m, TopicCounts)]
        unplaced = sum(m.unplaced for m in delivered)
        if unplaced:
            raise RowsOutsideBatch(
                f"job {job!r} micro-batch {batchId}: {unplaced} rows have no topic, partition or "
                f"{'txstore_from' if self.counted else 'offset'}, so no message of the micro-batch "
                "can be named for them; nothing was written. Keep readStream.format('txstore')'s "
                "columns as they are"
            )
        totals: dict[str, int] = {}
        spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for m in delivered:
            for topic, n in m.counts.items():
                totals[topic] = totals.get(topic, 0) + n
            for key, data in m.spans.items():
                spans.setdefault(key, []).extend(spans_from_array(data))
        counts = None
        if self.counted:
            counts = [
                (OffsetRange(t, p, low, high), n) for m in delivered for t, p, low, high, n in m.counted or ()
            ]
        delivery = Delivery(frozenset(m.run for m in delivered), spans, counts)
        with (
            stream_privileges(job, f"committing micro-batch {batchId}"),
            kept_connection(self.options.database_url, _reconnect) as conn,
        ):
            plan = load_plan(conn, job)
            reads = verify_micro_batch(job, batchId, plan, load_reads(conn, job, plan.plan_id), delivery)
            ranges = list(plan.reading)
            deltas = {(t, TOPIC_TOTAL): n for t, n in sorted(totals.items()) if n}
            if not ranges:
                return
            last = {key: read.last for key, read in reads.items() if read.last is not None}
            try:
                failpoints = FailPoints.parse(self.options.failpoints)
                TransactionalSink(conn, job, failpoints).commit_batch(ranges, deltas, last=last)
            except AlreadyCommitted:
                _skipped(job, batchId, ranges)

    def _commit_table(self, messages: Sequence[TableRows], batch_id: int) -> None:
        """The micro-batch's rows merged into the table and its ranges' offsets moved, in one
        transaction (:func:`~txstore.postgres.results.results_merge.copy_and_merge`, as aggregate.py).
        Rows PostgreSQL refuses: their message named, or skipped and recorded
        (``txstore.onBadMessage``, :mod:`~txstore.spark.stream.stream_bad_rows`)."""
        job, table = self.options.job, self.options.table
        assert table is not None
        seen: dict[tuple[str, int], tuple[int, int]] = {}
        for m in messages:
            for key, (low, high) in m.seen.items():
                old = seen.get(key, (low, high))
                seen[key] = (min(low, old[0]), max(high, old[1]))
        with (
            stream_privileges(job, f"committing micro-batch {batch_id}"),
            kept_connection(self.options.database_url, _reconnect) as conn,
        ):
            plan = load_plan(conn, job)
            ranges = list(plan.reading)
            check_rows_in_batch(job, batch_id, ranges, seen)
            delivery = Delivery(frozenset(m.run for m in messages))
            reads = verify_micro_batch(job, batch_id, plan, load_reads(conn, job, plan.plan_id), delivery)
            if not ranges:
                return
            stored = stored_offsets(conn, job, ranges)
            conn.rollback()
            failpoints = FailPoints.parse(self.options.failpoints)
            last = {key: read.last for key, read in reads.items() if read.last is not None}
            try:
                if any(stored.get(r.key) != r.from_offset for r in ranges):
                    raise classify_batch_conflict(job, ranges, stored)  # a replay: nothing to copy
                chunks = (chunk for m in messages for chunk in m.chunks)
                copy_and_merge(conn, job, table, self.types, ranges, chunks, failpoints, 0, last=last)
            except AlreadyCommitted:
                _skipped(job, batch_id, ranges)
                return
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as refused:
                failure: Exception = refused  # rolled back: find the message(s) whose rows it refuses
            else:
                return
            rows = RowsByMessage([(c, o) for m in messages for c, o in zip(m.chunks, m.origins, strict=True)])
            skip = self.options.on_bad_message == SKIP
            bad = find_refused(conn, job, batch_id, table, self.types, ranges, rows, skip, failure)
            try:
                copy_and_merge(
                    conn, job, table, self.types, ranges, rows.without(bad), failpoints, 0, last=last, bad=bad
                )
            except AlreadyCommitted:
                _skipped(job, batch_id, ranges)
                return
            log_skipped(job, batch_id, table, ranges, bad)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: tasks write nothing, the commit is one transaction."""


def _skipped(job: str, batch_id: int, ranges: Sequence[OffsetRange]) -> None:
    worker_info_to_stderr()
    log.info(
        "job %s: micro-batch %d (%s) already committed; skipped", job, batch_id, ", ".join(map(str, ranges))
    )


def stream_writer(options: Mapping[str, str], schema: Any, overwrite: bool = False) -> TxstoreStreamWriter:
    """The sink for ``writeStream.format("txstore")`` (options checked here, and a results table
    against the query and the database)."""
    return TxstoreStreamWriter(parse_sink_options(options, os.environ), schema, overwrite)
