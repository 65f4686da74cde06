"""The writing tasks of ``writeStream.format("txstore")``: each task's rows, as its commit message.

Spark runs :meth:`~txstore.spark.stream.stream_sink.TxstoreStreamWriter.write` in its executors'
Python workers; what it returns travels to the driver's commit, which checks it against the
micro-batch's plan and commits it with the offsets (:mod:`txstore.spark.stream.stream_sink`).

- counting (the default): :func:`deliver` counts the rows per ``topic`` and notes, per
  partition, the offsets of its rows as spans (:func:`_batch_spans`, numpy over Arrow; rows on
  PySpark before 4.1, :func:`_row_spans`), so the commit can prove the rows are the planned
  messages, each once; with ``txstore.countMessages`` the source's count rows are summed instead
  and handed over as they are;
- a results table: :func:`table_rows` turns the Arrow batches into ``COPY`` text of the table's
  columns (:mod:`txstore.postgres.results.copy_text`) and notes the lowest and highest offset per
  partition its rows came from, and each row's message, to name one PostgreSQL refuses.

Each message carries the query, micro-batch and run its task ran in (:data:`Run`), which the
commit checks against the receipts of the reading tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from txstore.core.micro_batch import merge_spans, spans_array
from txstore.postgres.results.copy_text import ORDER_BITS, copy_text
from txstore.postgres.results.results_table import ResultsTable
from txstore.spark.ranges.range_task import task_run
from txstore.spark.stream.stream_bad_rows import origins_of

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


def deliver(iterator: Iterator[Any], counted: bool) -> TopicCounts:
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


PROVENANCE = ("topic", "partition", "offset")
"""The source's columns that say which message a row came from; a results-table sink needs them."""


def table_rows(table: ResultsTable, iterator: Iterator[Any]) -> TableRows:
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
