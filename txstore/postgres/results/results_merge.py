"""A batch's rows merged into a results table with its offsets moved, in one transaction.

Shared by the results-table jobs (:mod:`txstore.modes.results_table`, rows from a Spark
query over the batch's ranges) and the stream sink (:mod:`txstore.spark.stream.stream_sink`, a
micro-batch's rows from its write tasks): the rows arrive as chunks of ``COPY`` text
(:mod:`txstore.postgres.results.copy_text`), go into a temporary table typed like the results
table's columns, collations included (:func:`temp_table_types`), and are merged by the
table's rules in one statement (:func:`~txstore.postgres.results.results_table.merge_statement`)
after every range's offset moved conditionally (:func:`copy_and_merge`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from txstore.core.failpoints import FailPoints
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, TopicPartition
from txstore.postgres.results.results_table import (
    ResultsTable,
    copy_rows,
    create_temp_table,
    merge_statement,
    table_identifier,
)
from txstore.postgres.sink import commit_if_offsets_move, move_offsets_params

if TYPE_CHECKING:
    from txstore.kafka.bad_messages import BadOffset

Chunk = tuple[int, bytes]
"""A number of result rows and their COPY text."""

log = logging.getLogger("txstore")


def copy_and_merge(
    conn: psycopg.Connection,
    job: str,
    table: ResultsTable,
    types: dict[str, str],
    ranges: list[OffsetRange],
    produced: Iterator[Chunk],
    failpoints: FailPoints,
    attempt: int,
    last: Mapping[TopicPartition, Fingerprint] | None = None,
    bad: Sequence[BadOffset] = (),
) -> None:
    """Copy the batch's rows (``produced``) to a temporary table, move every range's offset, and
    only then merge the rows into ``table`` and commit, all in one transaction
    (:func:`~txstore.postgres.sink.commit_if_offsets_move`, the conflict it raises included)."""
    first = next(produced, None)  # Spark computes the result before the transaction opens
    copied = 0

    def copy(cur: psycopg.Cursor[Any]) -> None:
        nonlocal copied
        if first is not None:
            copied = copy_to_temp_table(cur, table, types, itertools.chain([first], produced))

    def merge(cur: psycopg.Cursor[Any]) -> None:
        if first is not None:
            merge_rows(conn, cur, table)
            log.debug("job %s: merged %d result rows into %s", job, copied, table.label)

    params = move_offsets_params(job, ranges, last)
    commit_if_offsets_move(conn, job, ranges, params, failpoints, attempt, bad, write=copy, then=merge)


def copy_to_temp_table(
    cur: psycopg.Cursor[Any], table: ResultsTable, types: Mapping[str, str], chunks: Iterable[Chunk]
) -> int:
    """The batch's temporary table, created and filled with ``chunks`` through ``COPY``; how
    many rows went in."""
    rows = 0
    cur.execute(create_temp_table(table, types))
    with cur.copy(copy_rows(table)) as copy:
        for n, text in chunks:
            copy.write(text)
            rows += n
    return rows


def merge_rows(conn: psycopg.Connection, cur: psycopg.Cursor[Any], table: ResultsTable) -> None:
    """Merge the copied rows as they are; if a key comes twice, grouped by key instead."""
    try:
        with conn.transaction():  # a savepoint: a duplicate key undoes only this statement
            cur.execute(merge_statement(table, grouped=False))
    except psycopg.errors.CardinalityViolation:
        cur.execute(merge_statement(table, grouped=True))


def rows_refused(
    conn: psycopg.Connection,
    table: ResultsTable,
    types: Mapping[str, str],
    produced: Iterator[Chunk],
    row_failure: Callable[[BaseException], bool],
) -> Exception | None:
    """Copy ``produced`` to the temporary table and merge it into ``table``, then roll back: the
    error a row caused (``row_failure``: PostgreSQL refusing a value, a query failing on one), or
    None if every row went in. Finding bad messages tries their pieces this way
    (:data:`txstore.spark.ranges.bad_rows.Fails`), in the batch job and in the stream sink.

    A data exception from the merge itself (not from copying the rows) is a sum past what the
    column holds, the stored value's doing as much as any message's: it is raised, not blamed on
    a message, as is every error ``row_failure`` does not take.
    """
    merging = False
    try:
        first = next(produced, None)
        if first is not None:
            with conn.cursor() as cur:
                copy_to_temp_table(cur, table, types, itertools.chain([first], produced))
                merging = True
                merge_rows(conn, cur, table)
    except Exception as e:
        if not row_failure(e) or (merging and isinstance(e, psycopg.errors.DataError)):
            raise
        return e
    finally:
        if not conn.closed:
            conn.rollback()
    return None


# Each column as the temporary table declares it: its type and, where it has one, its
# collation, qualified and quoted (format_type() alone drops it).
_COLUMN_DEFINITIONS = """
SELECT a.attname,
       format_type(a.atttypid, a.atttypmod)
       || coalesce(' COLLATE ' || quote_ident(n.nspname) || '.' || quote_ident(c.collname), '')
FROM pg_attribute a
LEFT JOIN pg_collation c ON c.oid = a.attcollation
LEFT JOIN pg_namespace n ON n.oid = c.collnamespace
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""


def temp_table_types(conn: psycopg.Connection, table: ResultsTable) -> dict[str, str]:
    """Each of the table's columns' definition for the batch's temporary table: the declared type
    and the column's collation.

    The collation matters twice. Rows whose keys are equal under the column's collation (a
    case-insensitive one: ``'Apple'`` and ``'apple'``) are one key in the table, so the
    batch's rows must be grouped by that equality, or the merge updates one row twice and
    fails on every run. And ``min``/``max`` of text must combine a batch's rows in the
    column's order, as ``least``/``greatest`` then merge them with the stored value.
    """
    try:
        with conn.cursor() as cur:
            cur.execute(_COLUMN_DEFINITIONS, (table_identifier(table).as_string(conn),))
            definitions: dict[str, str] = dict(cur.fetchall())
    finally:
        conn.rollback()
    return {c: definitions[c] for c in table.columns}
