"""A results table of the user's own: a DataFrame aggregate merged into it, committed per batch.

1. the batch's ranges, cut into pieces like per-batch commits, become one
   DataFrame with Spark's Kafka-source columns, or only the ``read_columns``
   declared (:func:`~txstore.spark.ranges.tasks.read_ranges`);
   the user's aggregate (or ``--sql`` over the view ``batch``) turns it into
   rows of the table's key and merged columns;
2. the driver checks the offsets are still at the batch's start (a batch an
   earlier attempt or another instance committed is recognised without
   running the query), then runs the query: the Spark tasks turn its rows
   into ``COPY`` text (:mod:`txstore.postgres.results.copy_text`), and the driver streams the
   chunks (``toLocalIterator``, a partition at a time) into ``COPY`` to a
   temporary table, so it never holds the result;
3. in the same transaction: every range's offset moves conditionally
   (:data:`~txstore.postgres.sink.MOVE_OFFSETS`), then one statement merges the rows
   into the table by their rules, in key order
   (:func:`~txstore.postgres.results.results_table.merge_statement`), then COMMIT; a range
   not at its start rolls everything back and is classified like every
   per-batch commit (already committed, gap, overlap), and a dropped
   connection commits again on a new one
   (:func:`~txstore.modes.per_batch.commit_with_retries`);
4. a batch that fails on one message's value (the query's, or PostgreSQL's
   refusing its row) is tried again piece by piece to find the message
   (:mod:`txstore.spark.ranges.bad_rows`): the job stops naming it, or with
   ``--on-bad-message skip`` the batch commits without it and records it in
   ``txn_bad_messages``, in the same transaction.

The Spark work of step 2 starts before the transaction (the first row is
awaited outside it), so a slow query holds no transaction open; the rows
are then copied as fast as Spark hands them over.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg

from txstore.core.errors import BadMessage, ResultsTableInvalid, TooManyBadMessages
from txstore.core.failpoints import FailPoints
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, TopicPartition, split_ranges
from txstore.kafka.bad_messages import SKIP, BadOffset
from txstore.kafka.reader import last_messages
from txstore.modes.per_batch import commit_with_retries
from txstore.postgres.driverdb import DriverConnection
from txstore.postgres.results.copy_text import CHUNK_SCHEMA, CopyChunks
from txstore.postgres.results.results_check import describe_table, table_problems
from txstore.postgres.results.results_merge import (
    Chunk,
    copy_and_merge,
    rows_refused,
    temp_table_types,
)
from txstore.postgres.results.results_table import ResultsTable
from txstore.postgres.sink import classify_batch_conflict
from txstore.postgres.store import stored_offsets
from txstore.settings import JobSettings
from txstore.spark.ranges.bad_rows import (
    MAX_BAD_MESSAGES,
    failure_reason,
    find_bad_offsets,
    is_row_failure,
    without,
)
from txstore.spark.ranges.range_counts import RangeCounts
from txstore.spark.ranges.range_task import COMMITTED, REPORTED_BAD_MESSAGES, RangeReport
from txstore.spark.ranges.tasks import job_description, read_ranges
from txstore.spark.source.probing import QueryRefused, analysed_fields
from txstore.spark.source.pushdown import PartialCount, batch_frame

log = logging.getLogger("txstore")


@dataclass(frozen=True)
class ResultsTableMode:
    tasks_commit: ClassVar[bool] = False
    spark: Any
    settings: JobSettings
    dataframe_aggregate: Callable[[Any], Any]
    table: ResultsTable
    types: dict[str, str]  # each column's type and collation, for the temp table (temp_table_types)
    failpoints: FailPoints
    connection: DriverConnection
    number: int  # the batch's, for error lines
    read_columns: Sequence[str] | None = None  # the Kafka-source columns the aggregate uses; None: all
    # counted in part by the reading tasks (txstore.spark.source.pushdown)
    pushdown: PartialCount | None = None

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        if not ranges:
            return [], 0.0
        pieces = split_ranges(ranges, s.min_partitions)
        last: dict[TopicPartition, Fingerprint] = {}  # each range's last message, stored with its offset
        # the messages the last query run read (txstore.spark.ranges.range_counts)
        counted: list[RangeCounts] = []
        started = time.perf_counter()
        try:
            outcome = self._commit(ranges, pieces, last, counted, description)
        except Exception as e:
            if not is_row_failure(e):
                raise
            failure = e
        else:
            messages = reported_messages(counted, ranges)
            return [RangeReport(r, outcome, messages[r.key]) for r in ranges], (
                time.perf_counter() - started
            ) * 1000
        # One message's value, every time: find it (txstore.spark.ranges.bad_rows), on this path only.
        skip = s.on_bad_message == SKIP
        with job_description(self.spark, f"{description}: finding the message it fails on"):
            bad = find_bad_offsets(ranges, self._fails, not skip, MAX_BAD_MESSAGES)
        if not bad:
            raise failure
        if len(bad) > MAX_BAD_MESSAGES:
            b = bad[0]
            first = f"topic {b.topic!r} partition {b.partition} offset {b.offset} ({b.reason})"
            raise TooManyBadMessages(s.job, MAX_BAD_MESSAGES, first)
        if not skip:
            raise BadMessage(
                s.job, bad[0].topic, bad[0].partition, bad[0].offset, bad[0].reason, self._stage(bad[0])
            )
        started = time.perf_counter()
        counted.clear()
        outcome = self._commit(ranges, without(pieces, bad), last, counted, description, bad)
        commit_ms = (time.perf_counter() - started) * 1000
        messages = reported_messages(counted, ranges, bad)
        reports = []
        for r in ranges:
            mine = tuple(b for b in bad if (b.topic, b.partition) == r.key)
            if outcome == COMMITTED and mine:
                reports.append(
                    RangeReport(
                        r,
                        outcome,
                        messages[r.key],
                        bad_messages=mine[:REPORTED_BAD_MESSAGES],
                        skipped=len(mine),
                    )
                )
            else:
                reports.append(RangeReport(r, outcome, messages[r.key]))
        return reports, commit_ms

    def _commit(
        self,
        ranges: list[OffsetRange],
        pieces: list[OffsetRange],
        last: dict[TopicPartition, Fingerprint],
        counted: list[RangeCounts],
        description: str,
        bad: Sequence[BadOffset] = (),
    ) -> str:
        """The batch's rows (the query over ``pieces``) merged and every range's offset moved, in
        one transaction, again on a new connection if it drops; ``bad`` recorded beside them.
        ``counted`` ends with the counts of the last query run, if one ran."""
        s = self.settings
        columns = list(self.table.columns)
        skipped = {(b.topic, b.partition, b.offset) for b in bad}

        def chunks() -> Generator[Chunk, None, None]:
            last.clear()
            last.update(last_messages(s.kafka_conf, ranges, s.job))
            # A range whose last message is skipped ends its read before it: nothing to compare.
            ends = {k: f for k, f in last.items() if (*k, f.offset) not in skipped}
            counted[:] = [RangeCounts(self.spark)]
            return copy_chunks(self._frame(pieces, ends, counted[0]).select(*columns), self.table.ordered)

        def commit(conn: psycopg.Connection, attempt: int) -> None:
            with job_description(self.spark, description):
                commit_rows(
                    conn, s.job, self.table, self.types, ranges, chunks, self.failpoints, attempt, last, bad
                )

        return commit_with_retries(s, self.connection, self.number, commit)

    def _frame(
        self,
        pieces: Sequence[OffsetRange],
        last: Mapping[TopicPartition, Fingerprint],
        counts: RangeCounts | None = None,
    ) -> Any:
        s = self.settings
        return batch_frame(
            self.dataframe_aggregate,
            self.pushdown,
            lambda columns, partial: read_ranges(
                self.spark, pieces, s.kafka_conf, s.job, last, s.min_partitions, columns, partial, counts
            ),
            self.read_columns,
        )

    def _fails(self, piece: OffsetRange) -> str | None:
        """The query over ``piece`` alone, its rows copied and merged, then rolled back: why that
        failed (None: it did not). :data:`txstore.spark.ranges.bad_rows.Fails`.

        A data exception from the merge itself (not from copying the rows) is a sum past what
        the column holds, the stored value's doing as much as any message's: it is raised, not
        blamed on a message (the batch then fails as before, naming the column's error).
        """
        conn = self.connection.get()
        produced = copy_chunks(self._frame([piece], {}).select(*self.table.columns), self.table.ordered)
        with contextlib.closing(produced):
            refused = rows_refused(conn, self.table, self.types, produced, is_row_failure)
        return None if refused is None else failure_reason(refused)

    def _stage(self, bad: BadOffset) -> str:
        """What failed on the message, for its error line: PostgreSQL taking its row, or the query."""
        name = bad.reason.split(":", 1)[0]
        if isinstance(getattr(psycopg.errors, name, None), type):
            return f"merge into {self.table.label}"
        return "query"


def reported_messages(
    counted: Sequence[RangeCounts], ranges: Sequence[OffsetRange], skipped: Sequence[BadOffset] = ()
) -> dict[TopicPartition, int]:
    """Each range's messages for its report: as the last query run's tasks counted them
    (:mod:`txstore.spark.ranges.range_counts`), plus the ``skipped`` ones of the range, which it did not
    read; a range no query read to its end (a batch found committed before, a query that stops
    early) reports its offset span."""
    found = counted[-1].messages(ranges) if counted else {}
    return {
        r.key: found[r.key] + sum(1 for b in skipped if (b.topic, b.partition) == r.key)
        if r.key in found
        else r.size
        for r in ranges
    }


def copy_chunks(frame: Any, ordered: bool) -> Generator[Chunk, None, None]:
    """The frame's rows as COPY text made by the Spark tasks (:mod:`txstore.postgres.results.copy_text`),
    a partition at a time, the next one computed while this one is copied."""
    rows = frame.mapInArrow(CopyChunks(ordered), CHUNK_SCHEMA).toLocalIterator(prefetchPartitions=True)
    try:
        for row in rows:
            yield int(row[0]), row[1]
    finally:
        close = getattr(rows, "close", None)
        if close is not None:  # a commit that stops early: Spark stops serving partitions
            close()


def commit_rows(
    conn: psycopg.Connection,
    job: str,
    table: ResultsTable,
    types: dict[str, str],
    ranges: list[OffsetRange],
    chunks: Callable[[], Generator[Chunk, None, None]],
    failpoints: FailPoints,
    attempt: int,
    last: Mapping[TopicPartition, Fingerprint] | None = None,
    bad: Sequence[BadOffset] = (),
) -> None:
    """One transaction: the batch's rows merged into ``table`` and every range's offset moved, or
    nothing and a :class:`~txstore.core.errors.CommitConflict` saying why. ``last``: each range's last
    message, stored beside its offset (filled by ``chunks`` when it reads them); ``bad``:
    messages left out of ``chunks`` (``--on-bad-message skip``), recorded in
    ``txn_bad_messages``."""
    stored = stored_offsets(conn, job, ranges)
    if any(stored.get(r.key) != r.from_offset for r in ranges):
        raise classify_batch_conflict(job, ranges, stored)  # committed before: no query to run
    produced = chunks()
    with contextlib.closing(produced):
        copy_and_merge(conn, job, table, types, ranges, produced, failpoints, attempt, last, bad)


def query_columns(
    spark: Any, aggregate: Callable[[Any], Any], read_columns: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """The aggregate's output columns as (name, Spark type), from its plan over an empty batch
    (of ``read_columns`` only, if given; :func:`~txstore.spark.source.probing.analysed_fields`: nothing is
    read). A query Spark refuses is one line."""
    try:
        fields = analysed_fields(spark, aggregate, read_columns)
    except QueryRefused as e:
        line = f"query: Spark cannot run it: {e}"
        if read_columns is not None:
            line = f"{line.rstrip(';')}; it reads only {', '.join(read_columns)}: add the columns it uses"
        raise ResultsTableInvalid([line]) from None
    return [(f.name, f.dataType.simpleString()) for f in fields]


def check_results_table(
    spark: Any,
    conn: psycopg.Connection,
    table: ResultsTable,
    aggregate: Callable[[Any], Any],
    read_columns: Sequence[str] | None = None,
    job: str | None = None,
) -> dict[str, str]:
    """Refuse, with every problem (:class:`ResultsTableInvalid`), a table the batches could not
    merge into; else return each column's definition for the temporary table."""
    if not table.name or not table.keys:
        raise ResultsTableInvalid(table.problems())
    output = query_columns(spark, aggregate, read_columns)
    facts = describe_table(conn, table)
    problems = table_problems(table, facts, output, f"role {conn.info.user}", job=job)
    if problems:
        raise ResultsTableInvalid(problems)
    assert facts is not None
    return temp_table_types(conn, table)
