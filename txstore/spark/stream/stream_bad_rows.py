"""The stream sink's rows PostgreSQL refuses, named by their message; or skipped and recorded.

A results-table micro-batch (:mod:`txstore.spark.stream.stream_sink`) reaches the sink's commit as
``COPY`` text, a line per row, and beside each chunk the message of each of its rows (its
``topic``, ``partition`` and ``offset``, :func:`origins_of`). When PostgreSQL refuses the
micro-batch's rows (a NULL key, a value out of its column's range, text that is not the
column's type, a check constraint: a data exception or an integrity violation), the commit has
rolled back and the batch job's search runs over those rows, on the failure path only:
:func:`~txstore.spark.ranges.bad_rows.find_bad_offsets` bisects the micro-batch's ranges by offset, each
piece's rows copied and merged, then rolled back
(:func:`~txstore.postgres.results.results_merge.rows_refused`, the batch job's test of a piece). Nothing is
read again: the rows are the ones the tasks made.

- ``txstore.onBadMessage`` ``fail`` (the default): the query stops at the first such message,
  in one line (:class:`StreamBadMessage`) naming job, micro-batch, topic, partition, offset, the
  column and PostgreSQL's reason; nothing committed.
- ``skip``: every such message is found, and the micro-batch commits without its rows,
  recording it in ``txn_bad_messages`` in the same transaction as the offsets
  (:func:`~txstore.postgres.results.results_merge.copy_and_merge` with ``bad``, as the batch job). A
  replay of the micro-batch finds its offsets moved and records nothing again.
- Bounded as the batch job is: past :data:`~txstore.spark.ranges.bad_rows.MAX_BAD_MESSAGES` in one
  micro-batch the search stops (:class:`~txstore.core.errors.TooManyBadMessages`), nothing
  committed or recorded: a table that refuses every row is not the messages' fault.

If no single message's rows are refused (a sum past what its column holds, or a constraint
several messages break together), the original error stops the query, as in the batch job.
On this path the micro-batch's rows are held in the driver's planner worker a second time, as
Python bytes per row (bounded by ``maxOffsetsPerTrigger``, as the rows are).
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from txstore.core.errors import BadMessage, TooManyBadMessages, TxstoreError
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import BadOffset, describe_skipped
from txstore.postgres.results.results_merge import Chunk, rows_refused
from txstore.postgres.results.results_table import ResultsTable, table_identifier
from txstore.spark.ranges.bad_rows import MAX_BAD_MESSAGES, failure_reason, find_bad_offsets, is_row_failure

log = logging.getLogger("txstore")

Message = tuple[str, int, int]
"""A row's message: topic, partition, offset."""


class StreamBadMessage(BadMessage):
    """PostgreSQL refuses the row(s) of one message of a micro-batch, every time."""

    def __init__(
        self,
        job: str,
        batch_id: int,
        topic: str,
        partition: int,
        offset: int,
        reason: str,
        table: str,
        column: str,
    ) -> None:
        self.job, self.topic, self.partition, self.offset, self.reason = job, topic, partition, offset, reason
        self.stage = f"merge into {table}"
        self.batch_id, self.table, self.column = batch_id, table, column
        why = f"column {column}: {reason}" if column else reason
        TxstoreError.__init__(
            self,
            f"job {job!r} micro-batch {batch_id} topic {topic!r} partition {partition} offset {offset}: "
            f"{table} refused this message's row ({why}); nothing was committed, and retrying cannot "
            "help: fix the table or the query, or set .option('txstore.onBadMessage', 'skip') to leave "
            "such messages out and record them in txn_bad_messages; then restart the query",
        )

    def __reduce__(self) -> Any:
        return (
            StreamBadMessage,
            (
                self.job,
                self.batch_id,
                self.topic,
                self.partition,
                self.offset,
                self.reason,
                self.table,
                self.column,
            ),
        )


def origins_of(batch: Any) -> bytes:
    """The message of each of ``batch``'s rows (its provenance columns), as Arrow IPC bytes: the
    topic dictionary-encoded, compressed (offsets in a row compress well)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    topic, partition, offset = (
        batch.column(batch.schema.get_field_index(c)) for c in ("topic", "partition", "offset")
    )
    small = pa.record_batch(
        [pc.dictionary_encode(topic), partition, offset], names=["topic", "partition", "offset"]
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, small.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(small)
    return bytes(sink.getvalue().to_pybytes())


class RowsByMessage:
    """A micro-batch's COPY lines with the message each came from (failure path only)."""

    def __init__(self, chunks: Sequence[tuple[Chunk, bytes]]) -> None:
        import pyarrow as pa

        self.rows: list[tuple[Message, bytes]] = []  # in the tasks' order
        for (n, text), origins in chunks:
            lines = text.split(b"\n")[:-1]
            table = pa.ipc.open_stream(origins).read_all()
            messages = list(
                zip(
                    table.column("topic").to_pylist(),
                    table.column("partition").to_pylist(),
                    table.column("offset").to_pylist(),
                    strict=True,
                )
            )
            if len(lines) != n or len(messages) != n:
                raise TxstoreError(
                    f"a chunk of {n} rows has {len(lines)} COPY lines and {len(messages)} origins"
                )
            self.rows.extend(zip(messages, (line + b"\n" for line in lines), strict=True))
        by_partition: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for i, ((topic, partition, offset), _) in enumerate(self.rows):
            by_partition.setdefault((topic, partition), []).append((offset, i))
        self.by_partition = {k: sorted(v) for k, v in by_partition.items()}

    def of(self, piece: OffsetRange) -> Iterator[Chunk]:
        """The rows of the messages in ``piece``, in the tasks' order, as one chunk."""
        found = self.by_partition.get(piece.key, [])
        low = bisect.bisect_left(found, (piece.from_offset, -1))
        high = bisect.bisect_left(found, (piece.until_offset, -1))
        rows = sorted(i for _, i in found[low:high])
        if rows:
            yield len(rows), b"".join(self.rows[i][1] for i in rows)

    def without(self, bad: Sequence[BadOffset]) -> Iterator[Chunk]:
        """Every row but the ``bad`` messages', in the tasks' order, as one chunk."""
        skipped = {(b.topic, b.partition, b.offset) for b in bad}
        kept = [line for message, line in self.rows if message not in skipped]
        if kept:
            yield len(kept), b"".join(kept)


def find_refused(
    conn: psycopg.Connection,
    job: str,
    batch_id: int,
    table: ResultsTable,
    types: dict[str, str],
    ranges: Sequence[OffsetRange],
    rows: RowsByMessage,
    skip: bool,
    failure: Exception,
) -> tuple[BadOffset, ...]:
    """The messages whose rows PostgreSQL refuses (every one with ``skip``); without ``skip``,
    :class:`StreamBadMessage` naming the first. Raises ``failure`` when no single message's rows
    are refused, and :class:`~txstore.core.errors.TooManyBadMessages` past the batch job's bound."""
    errors: dict[Message, Exception] = {}

    def fails(piece: OffsetRange) -> str | None:
        refused = rows_refused(conn, table, types, rows.of(piece), is_row_failure)
        if refused is None:
            return None
        if piece.size == 1:
            errors[(piece.topic, piece.partition, piece.from_offset)] = refused
        return failure_reason(refused)

    bad = find_bad_offsets(ranges, fails, not skip, MAX_BAD_MESSAGES)
    if not bad:
        raise failure
    first = bad[0]
    if len(bad) > MAX_BAD_MESSAGES:
        where = f"topic {first.topic!r} partition {first.partition} offset {first.offset} ({first.reason})"
        raise TooManyBadMessages(job, MAX_BAD_MESSAGES, where)
    if not skip:
        error = errors.get((first.topic, first.partition, first.offset))
        column = refused_column(conn, table, error) if error is not None else ""
        raise StreamBadMessage(
            job, batch_id, first.topic, first.partition, first.offset, first.reason, table.label, column
        )
    return bad


_COPY_CONTEXT = re.compile(r"^COPY \S+, line \d+, column (.+?)(?:: .*)?$")


def refused_column(conn: psycopg.Connection, table: ResultsTable, error: BaseException) -> str:
    """The column PostgreSQL's ``error`` is about ("" when it names none): the one it names, the
    one the COPY was at, or the columns of the constraint it names."""
    diag = getattr(error, "diag", None)
    if diag is None:
        return ""
    if diag.column_name:
        return str(diag.column_name)
    found = _COPY_CONTEXT.match((diag.context or "").splitlines()[0] if diag.context else "")
    if found:
        return found.group(1)
    if not diag.constraint_name:
        return ""
    try:
        row = conn.execute(
            "SELECT string_agg(a.attname, ', ' ORDER BY a.attnum) FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
            "WHERE c.conrelid = to_regclass(%s) AND c.conname = %s",
            (table_identifier(table).as_string(conn), diag.constraint_name),
        ).fetchone()
    finally:
        conn.rollback()
    return str(row[0]) if row and row[0] else ""


def log_skipped(
    job: str, batch_id: int, table: ResultsTable, ranges: Sequence[OffsetRange], bad: Sequence[BadOffset]
) -> None:
    """A warning per range with skipped messages, as the batch job's report says it."""
    for r in ranges:
        mine = [b for b in bad if (b.topic, b.partition) == r.key]
        if mine:
            log.warning(
                "job %s: micro-batch %d: range %s: skipped %d message%s %s refused, recorded in "
                "txn_bad_messages: %s",
                job,
                batch_id,
                r,
                len(mine),
                "" if len(mine) == 1 else "s",
                table.label,
                describe_skipped(mine, len(mine)),
            )
