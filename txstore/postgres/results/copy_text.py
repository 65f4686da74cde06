"""Result rows as PostgreSQL ``COPY`` text, made by the Spark tasks, Arrow batch by batch.

The driver of a results-table job (:mod:`txstore.modes.results_table`)
only passes chunks of ready ``COPY ... FROM STDIN`` text from Spark to
PostgreSQL: the tasks (``mapInArrow``, classic and Spark Connect alike)
turn each Arrow batch of result rows into text with Arrow's vectorised
casts, so a million rows cost the driver a hundred chunks, not a million
Python objects.

Text format: columns separated by tabs, rows ended by newlines, NULL as
``\\N``; backslash, tab, newline and carriage return escaped in strings;
``bytea`` as ``\\\\x`` and hex. Numbers are written as Arrow prints them
(decimals exactly, floats the shortest text that reads back the same).

Instants (Spark's ``timestamp``, Arrow timestamps with a zone, which Spark hands
over in its session's time zone) are written in UTC, ``2026-10-25
00:30:00.000000+00``, whatever the session's zone: the text never depends on it,
and even a ``timestamp`` column without time zone (which drops the offset; the
start-up check refuses it, :mod:`txstore.postgres.results.results_check`) would hold UTC wall
times, so the two 02:30 of a daylight-saving fold never become one value. Wall
times (``timestamp_ntz``) and dates have no zone and are written as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

CHUNK_SCHEMA = "rows int, chunk binary"
ORDER_BITS = 40
"""A row's position is ``partition << ORDER_BITS | index in its partition`` (Spark's output order)."""

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))


def text_column(column: Any) -> Any:
    """One Arrow column as COPY text values (a string array without nulls)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        values = [None if v is None else "\\\\x" + v.hex() for v in column.to_pylist()]
        text = pa.array(values, pa.string())
    elif pa.types.is_timestamp(kind) and kind.tz is not None:
        utc = pc.cast(column, pa.timestamp(kind.unit))  # the zone dropped: the UTC wall time
        text = pc.binary_join_element_wise(pc.cast(utc, pa.string()), "+00", "")  # NULL stays NULL
    else:
        text = pc.cast(column, pa.string())
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            for plain, escaped in _ESCAPES:
                text = pc.replace_substring(text, plain, escaped)
    return text.fill_null("\\N")


def copy_text(batch: Any, first_position: int | None = None) -> bytes:
    """A record batch as COPY text; with ``first_position`` a last column numbering the rows from it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [text_column(c) for c in batch.columns]
    if first_position is not None:
        positions = pa.array(range(first_position, first_position + batch.num_rows), pa.int64())
        columns.append(pc.cast(positions, pa.string()))
    lines = columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, "\t")
    lines = pc.binary_join_element_wise(lines, pa.scalar("", pa.string()), "\n")  # each line + "\n"
    _, offsets, values = lines.buffers()  # a string array: validity, int32 offsets, characters
    bounds = memoryview(offsets).cast("i")
    start, end = bounds[lines.offset], bounds[lines.offset + len(lines)]
    data: bytes = values[start:end].to_pybytes()
    return data


@dataclass(frozen=True)
class CopyChunks:
    """mapInArrow function: each Arrow batch of result rows as one row (its row count and COPY text).

    ``ordered``: number the rows by their place in Spark's output (partition, then position).
    """

    ordered: bool = False

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        position = (context.partitionId() << ORDER_BITS) if context is not None else 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            text = copy_text(batch, position if self.ordered else None)
            position += batch.num_rows
            yield pa.RecordBatch.from_pydict(
                {"rows": [batch.num_rows], "chunk": [text]},
                schema=pa.schema([("rows", pa.int32()), ("chunk", pa.binary())]),
            )
