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
  freezes its heap, :mod:`~txstore.spark.runtime.worker_heap`): with a results table, :func:`check_table_query` refuses what could not be merged
  exactly once: a column that would round, a collation or time zone that would merge two keys
  (:func:`~txstore.postgres.results.results_check.table_problems`), complete mode's running totals, and
  rows without the ``topic``/``partition``/``offset`` of their message (an aggregation's);
- ``write(iterator)`` (each task; the first in a Python worker freezes its heap,
  :mod:`~txstore.spark.runtime.worker_heap`): counts its rows per ``topic`` (``txn_data`` topic totals, as
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
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from txstore.core.errors import AlreadyCommitted, ConfigError, ResultsTableInvalid
from txstore.core.failpoints import FailPoints
from txstore.core.micro_batch import (
    Delivery,
    RowsOutsideBatch,
    merge_spans,
    spans_array,
    spans_from_array,
    verify_micro_batch,
)
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.kafka.bad_messages import FAIL, ON_BAD_MESSAGE, SKIP
from txstore.postgres.db import DATABASE_URL_ENV, resolve_database_url
from txstore.postgres.kept import kept_connection
from txstore.postgres.reconnect import connect_retrying
from txstore.postgres.results.copy_text import ORDER_BITS, copy_text
from txstore.postgres.results.results_check import describe_table, table_problems
from txstore.postgres.results.results_merge import copy_and_merge, temp_table_types
from txstore.postgres.results.results_table import ResultsTable, parse_results_table
from txstore.postgres.sink import TransactionalSink, classify_batch_conflict
from txstore.postgres.store import stored_offsets
from txstore.postgres.stream_plans import load_plan, load_reads, stream_privileges
from txstore.spark.ranges.range_task import task_run
from txstore.spark.runtime.worker_heap import freeze_once
from txstore.spark.runtime.worker_log import worker_info_to_stderr
from txstore.spark.stream.stream_advice import restating
from txstore.spark.stream.stream_bad_rows import RowsByMessage, find_refused, log_skipped, origins_of

log = logging.getLogger("txstore")

_WriterBase: Any = DataSourceStreamWriter
try:  # PySpark 4.1+: the sink is handed Arrow batches, no row becomes a Python object
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _WriterBase = DataSourceStreamArrowWriter
except ImportError:
    pass


Run = tuple[str | None, int | None, str | None]
"""The streaming query, micro-batch and run a writing task ran in (:func:`~txstore.spark.ranges.range_task.task_run`)."""


def _run() -> Run:
    run = task_run()
    return (run.query_id, run.batch_id, run.run_id)


@dataclass
class TopicCounts(WriterCommitMessage):  # type: ignore[misc]
    """One write task's rows per topic, and what proves which messages they are: per
    (topic, partition) the offsets of its rows as spans (:func:`~txstore.core.micro_batch.spans_array`),
    or the counting source's rows ``(topic, partition, from, until, messages)``; rows missing
    their topic, partition or offset (``unplaced``), and the query and micro-batch it ran in."""

    counts: dict[str, int]
    spans: dict[tuple[str, int], bytes] = field(default_factory=dict)
    counted: list[tuple[str, int, int, int, int]] | None = None
    unplaced: int = 0
    run: Run = (None, None, None)


@dataclass
class TableRows(WriterCommitMessage):  # type: ignore[misc]
    """One write task's rows for a results table: COPY text chunks (row count, text), and the
    lowest and highest offset of the messages they came from, per (topic, partition); for
    each chunk the message of each of its rows, to name one PostgreSQL refuses
    (:func:`~txstore.spark.stream.stream_bad_rows.origins_of`); and the query and micro-batch it ran in."""

    chunks: list[tuple[int, bytes]]
    seen: dict[tuple[str, int], tuple[int, int]]
    origins: list[bytes] = field(default_factory=list)
    run: Run = (None, None, None)


@dataclass(frozen=True)
class SinkOptions:
    job: str
    database_url: str
    failpoints: str = ""  # tests: txstore.core.failpoints, as TXSTORE_FAILPOINTS (txstore.core.failpoints)
    table: ResultsTable | None = None  # txstore.table/key/merge: merge the rows into it; None: count
    on_bad_message: str = FAIL  # txstore.onBadMessage: a row the table refuses stops the query, or skip


_TABLE_OPTIONS = ("txstore.table", "txstore.key", "txstore.merge")


def _reconnect(url: str) -> psycopg.Connection:
    """A new connection for the sink, before it writes anything: a server restarting (the kept
    connection's session ended) is waited for, within :mod:`~txstore.postgres.reconnect`'s bounds."""
    return connect_retrying(
        url, given_by="writeStream's .option('txstore.databaseUrl') (or TXSTORE_DATABASE_URL)"
    )


def parse_sink_options(options: Mapping[str, str], environ: Mapping[str, str]) -> SinkOptions:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    known = {
        "txstore.job",
        "txstore.databaseurl",
        "txstore.failpoints",
        "txstore.onbadmessage",
        "checkpointlocation",
        "path",
    }
    unknown = sorted(set(given) - known - set(_TABLE_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r} for writeStream.format('txstore'); it takes txstore.job, "
            "txstore.databaseUrl, and txstore.table, txstore.key, txstore.merge and txstore.onBadMessage"
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
    table = None
    if any(name in given for name in _TABLE_OPTIONS):
        missing = [name for name in _TABLE_OPTIONS if not given.get(name, "").strip()]
        if missing:
            raise ConfigError(
                f"writeStream.format('txstore') merging into a results table needs {', '.join(missing)} "
                "too: .option('txstore.table', '[schema.]name').option('txstore.key', 'COL[,COL...]')"
                ".option('txstore.merge', 'COL=RULE[,...]')"
            )
        try:
            table = parse_results_table(given["txstore.table"], given["txstore.key"], given["txstore.merge"])
        except ValueError as e:
            raise ConfigError(str(e).replace("--", "txstore.", 1)) from None
        if problems := table.problems():
            raise ResultsTableInvalid(problems)
    on_bad_message = given.get("txstore.onbadmessage", FAIL).strip().lower()
    if on_bad_message not in ON_BAD_MESSAGE:
        raise ConfigError(
            f"option txstore.onBadMessage must be {' or '.join(ON_BAD_MESSAGE)}, got "
            f"{given['txstore.onbadmessage']!r}"
        )
    if on_bad_message == SKIP and table is None:
        raise ConfigError(
            f"job {job}: txstore.onBadMessage skip needs txstore.table: it skips the messages whose rows "
            "a results table refuses, and counting messages refuses none"
        )
    return SinkOptions(job, resolve_database_url(url), failpoints, table, on_bad_message)


COUNTED = "txstore_messages"
"""The column of a source that counted its messages (``txstore.countMessages``): summed, not
counted as rows."""


def _batch_spans(batch: Any) -> tuple[dict[tuple[str, int], list[tuple[int, int]]], int]:
    """An Arrow batch's rows as spans of offsets per (topic, partition), a message with two rows
    as two spans that overlap; and how many rows lack their topic, partition or offset.

    Vectorised (numpy): rows of a txstore source come sorted by partition and offset, so the
    sort is skipped unless they are not; a span ends where the partition changes or the next
    offset is not the one after."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [batch.column(batch.schema.get_field_index(c)) for c in ("topic", "partition", "offset")]
    unplaced = 0
    if any(c.null_count for c in columns):
        valid = pc.and_(pc.and_(pc.is_valid(columns[0]), pc.is_valid(columns[1])), pc.is_valid(columns[2]))
        unplaced = len(valid) - pc.sum(valid).as_py()
        columns = [pc.filter(c, valid) for c in columns]
    if not len(columns[0]):
        return {}, unplaced
    topics = pc.dictionary_encode(columns[0])
    if isinstance(topics, pa.ChunkedArray):
        topics = topics.combine_chunks()
    names = topics.dictionary.to_pylist()
    codes = (topics.indices.to_numpy(zero_copy_only=False).astype(np.int64) << 32) | (
        columns[1].to_numpy(zero_copy_only=False).astype(np.int64) & 0xFFFFFFFF
    )
    offsets = columns[2].to_numpy(zero_copy_only=False).astype(np.int64)
    same = codes[1:] == codes[:-1]
    if not np.all((codes[1:] > codes[:-1]) | (same & (offsets[1:] >= offsets[:-1]))):
        order = np.lexsort((offsets, codes))
        codes, offsets = codes[order], offsets[order]
        same = codes[1:] == codes[:-1]
    breaks = np.flatnonzero(~same | (offsets[1:] - offsets[:-1] != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(offsets)]))
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for first, stop in zip(starts.tolist(), ends.tolist(), strict=True):
        code = int(codes[first])
        key = (names[code >> 32], (code & 0xFFFFFFFF) - ((code & 0x80000000) << 1))
        spans.setdefault(key, []).append((int(offsets[first]), int(offsets[stop - 1]) + 1))
    return spans, unplaced


def _row_spans(rows: Sequence[Any]) -> tuple[dict[tuple[str, int], list[tuple[int, int]]], int]:
    """:func:`_batch_spans` for rows (PySpark before 4.1 hands the writer rows, not Arrow)."""
    found: dict[tuple[str, int], list[int]] = {}
    unplaced = 0
    for row in rows:
        if row["topic"] is None or row["partition"] is None or row["offset"] is None:
            unplaced += 1
        else:
            found.setdefault((row["topic"], int(row["partition"])), []).append(int(row["offset"]))
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for key, offsets in found.items():
        offsets.sort()
        out = spans.setdefault(key, [])
        for offset in offsets:
            if out and offset == out[-1][1]:
                out[-1] = (out[-1][0], offset + 1)
            else:
                out.append((offset, offset + 1))
    return spans, unplaced


def _task_spans(
    parts: Sequence[dict[tuple[str, int], list[tuple[int, int]]]],
) -> dict[tuple[str, int], bytes]:
    """A task's spans per partition, merged (a message two rows had keeps an overlapping span, so
    the commit names it)."""
    out: dict[tuple[str, int], bytes] = {}
    for key in {k for part in parts for k in part}:
        merged, repeated = merge_spans(part.get(key, ()) for part in parts)
        if repeated is not None:
            merged.append((repeated, repeated + 1))
        out[key] = spans_array(merged)
    return out


def _deliver(iterator: Iterator[Any], counted: bool) -> TopicCounts:
    """A write task's :class:`TopicCounts`: its rows per topic and what proves which messages they are."""
    if counted:
        rows: list[tuple[str, int, int, int, int]] = []
        for item in iterator:
            if hasattr(item, "num_rows"):
                rows.extend(
                    tuple(r.values())  # type: ignore[misc]
                    for r in item.select(
                        ["topic", "partition", "txstore_from", "txstore_until", COUNTED]
                    ).to_pylist()
                )
            else:
                rows.append(
                    (
                        item["topic"],
                        item["partition"],
                        item["txstore_from"],
                        item["txstore_until"],
                        item[COUNTED],
                    )
                )
        counts: dict[str, int] = {}
        unplaced = 0
        for topic, partition, low, high, n in rows:
            if None in (topic, partition, low, high, n):
                unplaced += 1
                continue
            counts[topic] = counts.get(topic, 0) + int(n)
        placed = [r for r in rows if None not in r]
        return TopicCounts(counts, counted=placed, unplaced=unplaced, run=_run())
    counts = {}
    parts = []
    unplaced = 0
    pending: list[Any] = []
    for item in iterator:
        if hasattr(item, "num_rows"):
            if item.num_rows == 0:
                continue
            spans, missing = _batch_spans(item)
            column = item.column(item.schema.get_field_index("topic"))
            for v in column.value_counts().to_pylist():
                if v["values"] is not None:
                    counts[v["values"]] = counts.get(v["values"], 0) + int(v["counts"])
        else:
            pending.append(item)
            continue
        parts.append(spans)
        unplaced += missing
    if pending:
        spans, missing = _row_spans(pending)
        parts.append(spans)
        unplaced += missing
        for row in pending:
            if row["topic"] is not None:
                counts[row["topic"]] = counts.get(row["topic"], 0) + 1
    return TopicCounts(counts, _task_spans(parts), None, unplaced, _run())


def _count_topics(iterator: Iterator[Any], counted: bool = False) -> dict[str, int]:
    """Messages per topic: a row each, or (``counted``) the sum of the rows' ``txstore_messages``."""
    counts: dict[str, int] = {}
    for item in iterator:
        if hasattr(item, "num_rows"):  # an Arrow record batch (PySpark 4.1+)
            if counted:
                # A row per range, not per message: summed in Python, without pyarrow's group_by
                # (whose first use in a worker costs more than a micro-batch's rows).
                topics = item.column(item.schema.get_field_index("topic")).to_pylist()
                numbers = item.column(item.schema.get_field_index(COUNTED)).to_pylist()
                pairs = list(zip(topics, numbers, strict=True))
            else:
                column = item.column(item.schema.get_field_index("topic"))
                pairs = [(v["values"], v["counts"]) for v in column.value_counts().to_pylist()]
            for topic, n in pairs:
                counts[topic] = counts.get(topic, 0) + int(n)
        else:
            topic = item["topic"]
            counts[topic] = counts.get(topic, 0) + (int(item[COUNTED]) if counted else 1)
    return counts


def _unplaceable(names: Sequence[str]) -> list[str]:
    """The columns a counting sink needs to name each row's message, missing from ``names``."""
    if COUNTED in names:
        return [c for c in ("topic", "partition", "txstore_from", "txstore_until") if c not in names]
    return [c for c in PROVENANCE if c not in names]


PROVENANCE = ("topic", "partition", "offset")
"""The source's columns that say which message a row came from; a results-table sink needs them."""


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


def _table_rows(table: ResultsTable, iterator: Iterator[Any]) -> TableRows:
    """A write task's Arrow batches as COPY text of the table's columns (numbered in Spark's
    output order when a rule needs it), and the offsets of the messages they came from."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    position = (context.partitionId() << ORDER_BITS) if context is not None else 0
    chunks: list[tuple[int, bytes]] = []
    seen: dict[tuple[str, int], tuple[int, int]] = {}
    origins: list[bytes] = []
    columns = list(table.columns)
    for batch in iterator:
        if batch.num_rows == 0:
            continue
        where = pa.Table.from_batches([batch.select(list(PROVENANCE))])
        spans = where.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
        for item in spans.to_pylist():
            key = (item["topic"], item["partition"])
            low, high = item["offset_min"], item["offset_max"]
            if None in (*key, low, high):
                low, high = -1, -1  # a row without its message: refused by commit
            if key in seen:
                low, high = min(low, seen[key][0]), max(high, seen[key][1])
            seen[key] = (low, high)
        chunks.append((batch.num_rows, copy_text(batch.select(columns), position if table.ordered else None)))
        origins.append(origins_of(batch))
        position += batch.num_rows
    return TableRows(chunks, seen, origins, _run())


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
            return _table_rows(self.options.table, iterator)
        return _deliver(iterator, self.counted)

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
