"""A DataFrame aggregate's counts, computed in part by the tasks that read the messages.

Every message a DataFrame job reads crosses from its Python reader into
Spark's JVM as a row, and Spark then groups the rows: about 150 ns a row on
two cores, plus the columns' own cost, which the per-range count path never
pays (its tasks count in Python and hand Spark one report per range). The
most common aggregates are counts grouped by plain columns, per topic or per
key. For those, once per job, before the first batch (Spark's own sources
push such aggregates down, DSv2's ``SupportsPushDownAggregates``):

1. the aggregate is explained over a batch-shaped frame of the columns the
   job reads (:func:`~txstore.spark.source.used_columns.explained_plan`; no Spark job);
2. :func:`partial_count_in_plan` matches the whole optimized plan against
   one shape: an ``Aggregate`` grouped by Kafka-source columns whose outputs
   are those columns (renamed or not) and ``count(1)`` / ``count(column)``,
   over a ``Project`` of source columns, over the source. Anything else
   (a filter, a window, a ``distinct``, ``sum``, a sort, a join, a global
   count, a plan it cannot read) is not matched: the aggregate runs as
   written;
3. the tasks then count each Arrow batch they read per group with pyarrow
   (:func:`partial_counts`) and merge those counts per group
   (:func:`task_counts`), so Spark sees about one row per group and task,
   not one per message; the driver collects them and sums them per group
   (:func:`final_counts`: the aggregate's rows, no shuffle), or for a
   results table, whose rows Spark hands over, Spark sums them
   (:func:`pushed_query`);
4. :func:`infer_pushdown` keeps it only if that query's columns (names and
   types, in order) are the aggregate's.

Why it is the same result: ``count(1)`` and ``count(c)`` add 1 per row (per
row whose ``c`` is not null) to the row's group; adding those ones per group
and batch first, then the batch sums per group, adds the same ones to the
same groups, whatever the batches are (pyarrow groups nulls, equal bytes,
strings and instants exactly as Spark does). Every group has at least one
row, so no sum is null, and counts are whole numbers: nothing is rounded.
A retried task re-reads its ranges, so it produces the same partial counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstore.core.errors import first_line
from txstore.spark.source.probing import QueryRefused, analysed_fields, quiet_analysis_errors
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, kafka_source_schema
from txstore.spark.source.used_columns import explained_plan, optimized_section, probe_frame

GROUPABLE = tuple(c for c in KAFKA_SOURCE_COLUMNS if c != "headers")
"""Source columns a partial count can group by (pyarrow cannot group by a list)."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ATTRIBUTE = re.compile(rf"^({_NAME})#(\d+)L?$")
_RENAMED = re.compile(rf"^({_NAME})#(\d+)L? AS ({_NAME})#\d+L?$")
_COUNT_ROWS = re.compile(rf"^count\(1\) AS ({_NAME})#\d+L$")
_COUNT_COLUMN = re.compile(rf"^count\(({_NAME})#(\d+)L?\) AS ({_NAME})#\d+L$")
_TREE = re.compile(r"^[\s:|+-]*")


@dataclass(frozen=True)
class Count:
    """``count(1)`` (``column`` None: rows) or ``count(column)`` (rows where it is not null)."""

    column: str | None

    @property
    def partial(self) -> str:
        """The partial count's column in what the tasks hand Spark."""
        return "__txstore_rows" if self.column is None else f"__txstore_count_{self.column}"

    def __str__(self) -> str:
        return f"count({self.column or 1})"


@dataclass(frozen=True)
class PartialCount:
    """A grouped count the reading tasks compute in part: grouped by ``group`` (source
    columns, in the source's order), counting each of ``counts``, giving ``outputs`` (each
    output column's name and the group column or count it is), in the aggregate's order."""

    group: tuple[str, ...]
    counts: tuple[Count, ...]
    outputs: tuple[tuple[str, str | Count], ...]

    def read_columns(self) -> tuple[str, ...]:
        """The source columns the tasks must read: the groups' and the counted ones."""
        used = set(self.group) | {c.column for c in self.counts if c.column is not None}
        return tuple(c for c in KAFKA_SOURCE_COLUMNS if c in used)

    def describe(self) -> str:
        return f"{', '.join(str(c) for c in self.counts)} grouped by {', '.join(self.group)}"


@dataclass(frozen=True)
class Pushdown:
    """What :func:`infer_pushdown` found: the partial count to push down (None: none) and why."""

    partial: PartialCount | None
    reason: str


def _split_top(text: str) -> list[str]:
    """``a, f(b, c) AS d`` -> ``["a", "f(b, c) AS d"]``: split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    if last:
        items.append(last)
    return items


def _bracketed_lists(text: str) -> list[str] | None:
    """The top-level ``[...]`` lists of a plan line's arguments, or None if unbalanced."""
    lists, depth, start = [], 0, -1
    for i, char in enumerate(text):
        if char == "[":
            if depth == 0:
                start = i + 1
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                lists.append(text[start:i])
    return lists if depth == 0 else None


def _source_ids(line: str) -> dict[str, str] | None:
    """The ``MapInArrow`` line of the Kafka-source columns: attribute id -> column."""
    if not line.startswith("MapInArrow "):
        return None
    lists = _bracketed_lists(line)
    if not lists:
        return None
    found = [_ATTRIBUTE.match(item) for item in _split_top(lists[-1])]
    if not all(found):
        return None
    ids = {m.group(2): m.group(1) for m in found if m}
    if sorted(ids.values()) != sorted(KAFKA_SOURCE_COLUMNS) or len(ids) != len(found):
        return None
    return ids


def partial_count_in_plan(plan: str) -> PartialCount | None:
    """The grouped count an optimized logical plan is, or None when it is anything else (the
    module's step 2: the whole plan must be ``Aggregate``, an optional ``Project`` of source
    columns, the ``MapInArrow`` source and its ``Range``, nothing more)."""
    lines = [_TREE.sub("", line).rstrip() for line in plan.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) not in (3, 4) or not lines[-1].startswith("Range ("):
        return None
    ids = _source_ids(lines[-2])
    if ids is None:
        return None
    if len(lines) == 4:
        project = _bracketed_lists(lines[1]) if lines[1].startswith("Project [") else None
        if not project or len(project) != 1:
            return None
        for item in _split_top(project[0]):
            m = _ATTRIBUTE.match(item)
            if m is None or ids.get(m.group(2)) != m.group(1):
                return None
    if not lines[0].startswith("Aggregate ["):
        return None
    lists = _bracketed_lists(lines[0])
    if lists is None or len(lists) != 2:
        return None
    group_ids: dict[str, str] = {}
    for item in _split_top(lists[0]):
        m = _ATTRIBUTE.match(item)
        if m is None or ids.get(m.group(2)) != m.group(1) or m.group(1) not in GROUPABLE:
            return None
        group_ids[m.group(2)] = m.group(1)
    if not group_ids:  # a global count has a row even for no messages: not a sum of groups
        return None
    outputs: list[tuple[str, str | Count]] = []
    for item in _split_top(lists[1]):
        if (m := _ATTRIBUTE.match(item)) and m.group(2) in group_ids:
            outputs.append((m.group(1), group_ids[m.group(2)]))
        elif (m := _RENAMED.match(item)) and m.group(2) in group_ids:
            outputs.append((m.group(3), group_ids[m.group(2)]))
        elif m := _COUNT_ROWS.match(item):
            outputs.append((m.group(1), Count(None)))
        elif (m := _COUNT_COLUMN.match(item)) and ids.get(m.group(2)) == m.group(1):
            outputs.append((m.group(3), Count(m.group(1))))
        else:
            return None
    counts = tuple(dict.fromkeys(o for _, o in outputs if isinstance(o, Count)))
    if not counts:
        return None
    group = tuple(c for c in KAFKA_SOURCE_COLUMNS if c in group_ids.values())
    return PartialCount(group, counts, tuple(outputs))


def partial_schema(partial: PartialCount) -> Any:
    """What the tasks hand Spark: the group columns (source types), then one ``long`` per count."""
    from pyspark.sql.types import LongType, StructField

    schema = kafka_source_schema(partial.group)
    for count in partial.counts:
        schema = schema.add(StructField(count.partial, LongType(), False))
    return schema


def partial_arrow_schema(partial: PartialCount) -> pa.Schema:
    from txstore.spark.source.arrow import arrow_schema

    fields = list(arrow_schema(partial.group))
    return pa.schema(fields + [pa.field(c.partial, pa.int64(), nullable=False) for c in partial.counts])


def partial_counts(batch: pa.RecordBatch, partial: PartialCount) -> pa.RecordBatch:
    """One record batch of messages (with at least the partial's read columns) as one row per
    group: its group columns and each count over the batch's rows in that group."""
    aggregations: list[tuple[Any, ...]] = []
    names = []
    for count in partial.counts:
        if count.column is None:
            aggregations.append(([], "count_all"))
            names.append("count_all")
        else:
            aggregations.append((count.column, "count", pc.CountOptions(mode="only_valid")))
            names.append(f"{count.column}_count")
    table = pa.Table.from_batches([batch.select(list(partial.read_columns()))])
    grouped = table.group_by(list(partial.group), use_threads=False).aggregate(aggregations)
    schema = partial_arrow_schema(partial)
    columns = [grouped.column(name) for name in partial.group] + [grouped.column(n) for n in names]
    arrays = [column.combine_chunks().cast(field.type) for column, field in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


MERGE_ROWS = 500_000
"""A task merges its batches' partial counts once they hold this many rows, and hands them to
Spark when a merge still leaves half as many (groups that are mostly distinct: memory stays
bounded by about this many rows, not by the task's messages)."""

MERGE_BYTES = 32 * 1024 * 1024
"""The same in Arrow bytes: wide groups (8 KiB keys) reach it long before :data:`MERGE_ROWS`,
and held by rows alone a task's counts grew to gigabytes (and past Arrow's 2 GiB binary
offsets). A task's Arrow memory peaks at about five times this, whatever its total (measured
with 8 KiB keys: 172 MiB; the held counts, Arrow's hash grouping of them, the piece handed on)."""


def merge_counts(parts: Sequence[pa.RecordBatch | pa.Table], partial: PartialCount) -> pa.Table:
    """Partial counts summed per group: one row per group. ``parts`` have the columns of
    :func:`partial_arrow_schema`, cast to its types (what Spark hands back may use large strings
    and binaries, or the session's time zone: the same values)."""
    schema = partial_arrow_schema(partial)
    table = pa.concat_tables(
        [
            (part if isinstance(part, pa.Table) else pa.Table.from_batches([part])).cast(schema)
            for part in parts
        ]
        or [schema.empty_table()]
    )
    summed = table.group_by(list(partial.group), use_threads=False).aggregate(
        [(c.partial, "sum") for c in partial.counts]
    )
    names = list(partial.group) + [f"{c.partial}_sum" for c in partial.counts]
    return pa.Table.from_arrays(
        [summed.column(n).cast(f.type) for n, f in zip(names, schema, strict=True)], schema=schema
    )


def task_counts(batches: Iterable[pa.RecordBatch], partial: PartialCount) -> Iterator[pa.RecordBatch]:
    """A task's record batches of messages as its partial counts: each batch counted per
    group as it comes (:func:`partial_counts`), merged per group (:func:`merge_counts`), so a
    task hands Spark about one row per group, not one per group and batch."""
    held: list[pa.RecordBatch | pa.Table] = []
    rows = size = 0
    for batch in batches:
        counted = partial_counts(batch, partial)
        held.append(counted)
        rows += counted.num_rows
        size += counted.nbytes
        if rows >= MERGE_ROWS or size >= MERGE_BYTES:
            merged = merge_counts(held, partial)
            held = []  # the merge holds what is left: let the parts go now
            if merged.num_rows >= MERGE_ROWS // 2 or merged.nbytes >= MERGE_BYTES // 2:
                yield from merged.combine_chunks().to_batches()  # mostly distinct groups: on now
                rows = size = 0
            else:
                held, rows, size = [merged], merged.num_rows, merged.nbytes
    if held:
        yield from merge_counts(held, partial).combine_chunks().to_batches()


def final_counts(table: pa.Table, partial: PartialCount) -> pa.Table:
    """The aggregate's result from every task's partial counts, on the driver: summed per
    group (:func:`merge_counts`), then the aggregate's output columns, named and in order."""
    merged = merge_counts([table], partial)
    return pa.Table.from_arrays(
        [merged.column(what if isinstance(what, str) else what.partial) for _, what in partial.outputs],
        names=[name for name, _ in partial.outputs],
    )


def pushed_query(frame: Any, partial: PartialCount) -> Any:
    """Over the tasks' partial counts (:func:`partial_schema`), the aggregate's result: each
    group's counts summed, named and ordered as the aggregate's outputs. SQL text, not
    ``pyspark.sql.functions``: the functions module picks classic or Connect per process, while
    a process may hold both kinds of session."""
    sums = frame.groupBy(*partial.group).agg({c.partial: "sum" for c in partial.counts})
    return sums.selectExpr(
        *(
            f"`{what if isinstance(what, str) else f'sum({what.partial})'}` AS `{name}`"
            for name, what in partial.outputs
        )
    )


def _columns(fields: Sequence[Any]) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in fields]


def infer_pushdown(spark: Any, aggregate: Callable[[Any], Any], columns: Sequence[str] | None) -> Pushdown:
    """The module's steps over ``aggregate`` reading ``columns`` (None: every one)."""
    from pyspark.errors import AnalysisException

    try:
        with quiet_analysis_errors():
            plan = optimized_section(explained_plan(spark, aggregate, columns))
            partial = partial_count_in_plan(plan or "")
            if partial is None:
                return Pushdown(None, "the query is not a count grouped by Kafka-source columns")
            found = _columns(pushed_query(probe_frame(spark, partial_schema(partial)), partial).schema.fields)
        expected = _columns(analysed_fields(spark, aggregate, columns))
    except AnalysisException as e:
        return Pushdown(None, f"the query did not analyse: {first_line(e)}")
    except QueryRefused as e:
        return Pushdown(None, f"the query did not analyse: {e}")
    if found != expected:
        return Pushdown(None, f"counting in the tasks would give columns {found}, not {expected}")
    return Pushdown(partial, f"{partial.describe()}, counted in part by the reading tasks")


def batch_frame(
    aggregate: Callable[[Any], Any],
    pushdown: PartialCount | None,
    read: Callable[[Sequence[str] | None, PartialCount | None], Any],
    columns: Sequence[str] | None,
) -> Any:
    """A batch's aggregated DataFrame: ``aggregate`` over ``read(columns, None)``, or with a
    ``pushdown``, :func:`pushed_query` over the tasks' partial counts ``read(..., pushdown)``."""
    if pushdown is None:
        return aggregate(read(columns, None))
    return pushed_query(read(pushdown.read_columns(), pushdown), pushdown)
