"""Per-batch commits: Spark tasks aggregate, the driver commits the whole batch in one transaction.

1. cut big ranges into pieces (``min_partitions``), one Spark task each;
2. the tasks aggregate and send back partial deltas, message counts, bad
   messages, the fingerprint of each piece's last message, or a refusal
   (:func:`~txstore.spark.ranges.deltas.aggregate_batch`); the driver sums the deltas
   exactly;
3. a refusal (recreated topic) commits nothing; a bad message stops the job
   unless ``on_bad_message`` is ``skip``;
4. the driver commits every result and every range's offset move in one
   transaction (:func:`commit_on_driver`), again on a new connection if the
   old one drops: a commit whose acknowledgement was lost is then found
   already committed.

:mod:`txstore.modes.dataframe` shares steps 3 and 4 (:func:`commit_result`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg

from txstore.core.errors import (
    AlreadyCommitted,
    BatchFailed,
    DatabaseUnavailable,
    OffsetGap,
    OffsetOverlap,
    committed_past_start,
    first_line,
)
from txstore.core.failpoints import FailPoints, InjectedFailure
from txstore.core.ranges import OffsetRange, TopicPartition, split_ranges
from txstore.kafka.bad_messages import SKIP, BadOffset
from txstore.modes import bad_message
from txstore.postgres.driverdb import DriverConnection
from txstore.postgres.sink import TransactionalSink
from txstore.settings import JobSettings
from txstore.spark.ranges.deltas import BatchResult, aggregate_batch
from txstore.spark.ranges.range_task import (
    ALREADY_COMMITTED,
    COMMITTED,
    REFUSED,
    REPORTED_BAD_MESSAGES,
    Aggregate,
    RangeReport,
)

DRIVER_COMMIT_ATTEMPTS = 3

log = logging.getLogger("txstore")


@dataclass(frozen=True)
class PerBatchMode:
    tasks_commit: ClassVar[bool] = False
    spark: Any
    settings: JobSettings
    aggregate: Aggregate
    failpoints: FailPoints
    connection: DriverConnection
    number: int  # the batch's, for error lines

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        if not ranges:
            return [], 0.0
        pieces = split_ranges(ranges, s.min_partitions)
        skip = s.on_bad_message == SKIP
        result = aggregate_batch(
            self.spark, pieces, s.kafka_conf, self.aggregate, description, skip, s.job, s.min_partitions
        )
        return commit_result(s, ranges, result, self.failpoints, self.connection, self.number)


def commit_result(
    settings: JobSettings,
    ranges: list[OffsetRange],
    result: BatchResult,
    failpoints: FailPoints,
    connection: DriverConnection,
    number: int,
) -> tuple[list[RangeReport], float]:
    """Steps 3 and 4: commit a batch's collected result on the driver; a report per range."""
    s = settings
    if result.refused:  # a recreated topic: nothing is committed
        return [
            RangeReport(r, REFUSED, error=result.refused.get(r.key), error_kind="TopicRecreated")
            for r in ranges
            if r.key in result.refused
        ], 0.0
    deltas, messages, bad = result.deltas, result.messages, result.bad
    if bad and s.on_bad_message != SKIP:
        raise bad_message(s, bad[0])  # nothing was committed
    started = time.perf_counter()
    outcome = commit_on_driver(s, connection, failpoints, number, ranges, deltas, bad, result.last)
    commit_ms = (time.perf_counter() - started) * 1000
    skipped = {r.key: [b for b in bad if (b.topic, b.partition) == r.key] for r in ranges} if bad else {}
    reports = [
        RangeReport(r, outcome, messages.get(r.key, 0))
        if outcome != COMMITTED or not skipped.get(r.key)
        else RangeReport(
            r,
            outcome,
            messages.get(r.key, 0),
            bad_messages=tuple(skipped[r.key][:REPORTED_BAD_MESSAGES]),
            skipped=len(skipped[r.key]),
        )
        for r in ranges
    ]
    return reports, commit_ms


def commit_on_driver(
    settings: JobSettings,
    connection: DriverConnection,
    failpoints: FailPoints,
    number: int,
    ranges: list[OffsetRange],
    deltas: Any,
    bad: Sequence[BadOffset] = (),
    last: Mapping[TopicPartition, Any] | None = None,
) -> str:
    """Commit on the driver; if the connection drops, commit again on a new one.

    A commit whose acknowledgement was lost is then found already
    committed; one that did not happen commits now. Gaps and overlaps
    roll back everything and stop the job.
    """

    def commit(conn: psycopg.Connection, attempt: int) -> None:
        sink = TransactionalSink(
            conn, settings.job, failpoints, settings.publish_topic, settings.publish_max_bytes
        )
        sink.commit_batch(ranges, deltas, attempt, bad, last)

    return commit_with_retries(settings, connection, number, commit)


def commit_with_retries(
    settings: JobSettings,
    connection: DriverConnection,
    number: int,
    commit: Callable[[psycopg.Connection, int], None],
) -> str:
    """Run ``commit(connection, attempt)`` (one transaction: results and every offset move, or
    nothing); if the connection drops, again on a new one. Returns the outcome.

    ``commit`` raises a :class:`~txstore.core.errors.CommitConflict` when the offsets were not at
    the batch's start: all at its end is an earlier attempt (or another instance) that
    committed, and the batch is ``ALREADY_COMMITTED``; gaps and overlaps stop the job.
    """
    s = settings
    for attempt in range(DRIVER_COMMIT_ATTEMPTS):
        try:
            commit(connection.get(), attempt)
            return COMMITTED
        except AlreadyCommitted:
            if attempt == 0:
                log.warning("job %s: this batch was already committed by another instance", s.job)
            return ALREADY_COMMITTED
        except (OffsetGap, OffsetOverlap) as e:
            raise BatchFailed(
                str(e), transient=False, replan=committed_past_start(e), conflict=type(e).__name__
            ) from None
        except (psycopg.OperationalError, InjectedFailure) as e:
            connection.drop()
            if attempt + 1 == DRIVER_COMMIT_ATTEMPTS:
                raise DatabaseUnavailable(
                    f"committing job {s.job!r} batch {number} failed: {first_line(e)}; "
                    "nothing or all of it was committed, and the next batch plans from what was"
                ) from None
            log.warning(
                "job %s: batch commit interrupted (%s); committing again, a commit that landed "
                "is recognised as already committed",
                s.job,
                first_line(e),
            )
    raise AssertionError("unreachable")
